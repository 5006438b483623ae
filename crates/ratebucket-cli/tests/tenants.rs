//! Lines that name a tenant and a priority class: interactive lines go ahead of the batch
//! lines queued before them, and bad names and weights are refused before anything is
//! sent.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use support::{records, spawn, temp_dir};

/// `batch` lines of the batch class, then `interactive` interactive lines of tenant 2,
/// each tagged with its id in `user`.
fn write_lines(dir: &Path, batch: usize, interactive: usize) -> PathBuf {
    let path = dir.join("input.jsonl");
    let mut text = String::new();
    for i in 0..batch + interactive {
        let (id, extra) = if i < batch {
            (format!("batch-{i:04}"), serde_json::json!({ "priority": "batch", "tenant": 1 }))
        } else {
            (format!("chat-{i:04}"), serde_json::json!({ "priority": "interactive", "tenant": 2 }))
        };
        let mut line = serde_json::json!({
            "custom_id": id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{ "role": "user", "content": format!("Say {i}.") }],
                "max_tokens": 20,
                "user": id,
            },
        });
        line.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).expect("input");
    path
}

#[test]
fn interactive_lines_go_ahead_of_the_batch_lines_queued_before_them() {
    let second = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(20).window(second))
            .tpm(LimitSpec::per_minute(1_000_000).window(second)),
    )
    .expect("fake provider");
    let dir = temp_dir("tenants");
    let input = write_lines(&dir, 60, 6);
    let output = dir.join("output.jsonl");
    let args = ["--rpm", "20", "--window", "1", "--concurrency", "80", "--weight", "2=3"];
    let run = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert_eq!(records(&output).len(), 66);
    let order: Vec<String> = sim.log().into_iter().filter_map(|e| e.user).collect();
    // Every line was queued at once; the interactive ones, last in the file, leave within
    // the first burst's worth of requests after they queue.
    let positions: Vec<usize> = order
        .iter()
        .enumerate()
        .filter(|(_, user)| user.starts_with("chat-"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(positions.len(), 6);
    assert!(
        positions.iter().all(|&p| p < 30),
        "interactive lines at {positions:?} of {}",
        order.len()
    );
    assert!(sim.log().iter().all(|e| e.status != Some(429)));
}

#[test]
fn a_bad_priority_or_weight_is_refused_before_anything_is_sent() {
    let dir = temp_dir("tenants-bad");
    let input = dir.join("input.jsonl");
    std::fs::write(
        &input,
        r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]},"priority":"urgent"}"#,
    )
    .expect("input");
    let output = dir.join("output.jsonl");
    let bad_line =
        spawn(&input, &output, "http://127.0.0.1:9", &[]).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&bad_line.stderr);
    assert_ne!(bad_line.status.code(), Some(0));
    assert!(stderr.contains("line 1") && stderr.contains("urgent"), "{stderr}");
    for (flag, value, says) in [
        ("--priority", "urgent", "interactive, default or batch"),
        ("--weight", "3", "TENANT=WEIGHT"),
        ("--weight", "3=0", "1..="),
    ] {
        let run = spawn(&input, &output, "http://127.0.0.1:9", &[flag, value])
            .wait_with_output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_ne!(run.status.code(), Some(0), "{flag} {value}");
        assert!(stderr.contains(says), "{flag} {value}: {stderr}");
    }
}

/// `n` lines of each tenant, alternating, each tagged with its id in `user`.
fn write_tenant_lines(dir: &Path, n: usize) -> PathBuf {
    let path = dir.join("input.jsonl");
    let mut text = String::new();
    for i in 0..2 * n {
        let tenant = 1 + i % 2;
        let id = format!("t{tenant}-{i:04}");
        let line = serde_json::json!({
            "custom_id": id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "tenant": tenant,
            "body": {
                "model": "gpt-4o-mini",
                "messages": [{ "role": "user", "content": format!("Say {i}.") }],
                "max_tokens": 20,
                "user": id,
            },
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).expect("input");
    path
}

#[test]
fn a_capped_tenants_lines_take_at_most_its_share_and_the_rest_go_to_the_others() {
    let second = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(40).window(second))
            .tpm(LimitSpec::per_minute(1_000_000).window(second)),
    )
    .expect("fake provider");
    let dir = temp_dir("tenants-cap");
    let input = write_tenant_lines(&dir, 30);
    let output = dir.join("output.jsonl");
    let args = ["--rpm", "40", "--window", "1", "--concurrency", "100", "--cap", "1=0.25"];
    let run = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert_eq!(records(&output).len(), 60);
    let order: Vec<String> = sim.log().into_iter().filter_map(|e| e.user).collect();
    // Equal weights would give tenant 1 half of the first 30 requests; its cap, a quarter
    // of the rate (and of the burst), gives it about a quarter.
    let capped = order[..30].iter().filter(|u| u.starts_with("t1-")).count();
    assert!(capped <= 11, "tenant 1 sent {capped} of the first 30: {order:?}");
    assert!(sim.log().iter().all(|e| e.status != Some(429)));
    let bad = spawn(&input, &output, &sim.base_url(), &["--cap", "1=2"])
        .wait_with_output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("at most 1"));
}

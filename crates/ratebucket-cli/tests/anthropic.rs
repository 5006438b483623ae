//! Anthropic's Message Batches format: requests of `{"custom_id", "params"}` run against
//! the fake provider's Messages API, results written in the Message Batches results format.

mod support;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ratebucket_sim::{Dialect, LimitSpec, Sim, SimConfig, SimHandle};
use serde_json::{Value, json};
use support::{executed, spawn, temp_dir};

/// `n` Message Batches requests, `msg-0000`..., each tagged with its id in
/// `metadata.user_id` (the fake provider logs it); those in `too_large` ask for more output
/// tokens than the provider's limit allows at all, which it refuses as invalid.
fn write_requests(dir: &Path, n: usize, too_large: &[usize]) -> PathBuf {
    let path = dir.join("requests.jsonl");
    let mut text = String::new();
    for i in 0..n {
        let id = format!("msg-{i:04}");
        let max_tokens = if too_large.contains(&i) { 1_000_000 } else { 40 };
        let line = json!({
            "custom_id": id,
            "params": {
                "model": "claude-sonnet-4-5",
                "max_tokens": max_tokens,
                "messages": [{ "role": "user", "content": format!("Write a line about {i}.") }],
                "metadata": { "user_id": id },
            },
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(&path, text).expect("input");
    path
}

/// The fake provider speaking Anthropic, its limits per second.
fn provider() -> SimHandle {
    let second = Duration::from_secs(1);
    Sim::start(
        SimConfig::default()
            .dialect(Dialect::Anthropic)
            .rpm(LimitSpec::per_minute(150).window(second))
            .itpm(LimitSpec::per_minute(20_000).window(second))
            .otpm(LimitSpec::per_minute(3_000).window(second)),
    )
    .expect("fake provider")
}

/// The results, by `custom_id`, each checked to be a whole Message Batches result.
fn results(output: &Path) -> HashMap<String, Value> {
    let text = std::fs::read_to_string(output).unwrap_or_default();
    text.lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).expect("each line is JSON");
            let id = record["custom_id"].as_str().expect("custom_id").to_owned();
            let result = &record["result"];
            match result["type"].as_str() {
                Some("succeeded") => assert!(result["message"].is_object(), "{record}"),
                Some("errored") => {
                    assert_eq!(result["error"]["type"], "error", "{record}");
                    assert!(result["error"]["error"]["type"].is_string(), "{record}");
                    assert!(result["error"]["error"]["message"].is_string(), "{record}");
                }
                _ => panic!("a result succeeded or errored: {record}"),
            }
            (id, record)
        })
        .collect()
}

#[test]
fn a_message_batches_file_runs_against_the_messages_api_and_writes_its_results_format() {
    const LINES: usize = 90;
    let sim = provider();
    let dir = temp_dir("anthropic");
    let input = write_requests(&dir, LINES, &[17]);
    let output = dir.join("results.jsonl");
    let limits = ["--rpm", "150", "--itpm", "20000", "--otpm", "3000", "--window", "1", "--quiet"];
    let run = spawn(&input, &output, &sim.base_url(), &limits).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    // One line refused by the provider: recorded, and the run says some failed.
    assert_eq!(run.status.code(), Some(3), "{stderr}");

    let results = results(&output);
    assert_eq!(results.len(), LINES, "one result per request");
    for (id, record) in &results {
        let result = &record["result"];
        if id == "msg-0017" {
            assert_eq!(result["type"], "errored");
            assert_eq!(result["error"]["error"]["type"], "invalid_request_error");
            continue;
        }
        assert_eq!(result["type"], "succeeded", "{record}");
        let message = &result["message"];
        assert_eq!(message["type"], "message");
        assert!(message["usage"]["output_tokens"].as_u64().unwrap_or(0) <= 40);
    }
    // Each went once, with Anthropic's headers, and the provider never refused for rate.
    let log = sim.log();
    assert_eq!(log.iter().filter(|e| e.status == Some(429)).count(), 0);
    let executed = executed(&sim);
    assert_eq!(executed.len(), LINES - 1, "every other request executed");
    assert!(executed.values().all(|&n| n == 1), "none executed twice");

    // Run again: everything has its result, nothing is sent.
    let before = sim.log().len();
    let again = spawn(&input, &output, &sim.base_url(), &limits).wait_with_output().expect("runs");
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    assert_eq!(sim.log().len(), before, "nothing sent again");
    assert_eq!(self::results(&output).len(), LINES);
}

#[test]
fn message_batches_limits_are_learned_from_anthropics_headers_when_not_given() {
    const LINES: usize = 60;
    let sim = provider();
    let dir = temp_dir("anthropic-learned");
    let input = write_requests(&dir, LINES, &[]);
    let output = dir.join("results.jsonl");
    // The limits are the provider's, per its (one-second) window.
    let run = spawn(&input, &output, &sim.base_url(), &["--window", "1", "--quiet"])
        .wait_with_output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let results = results(&output);
    assert_eq!(results.len(), LINES);
    assert!(
        results.values().all(|r| r["result"]["type"] == "succeeded"),
        "every request succeeded"
    );
    let refused = sim.log().iter().filter(|e| e.status == Some(429)).count();
    assert_eq!(refused, 0, "learned from the first reply, before a burst left");
}

#[test]
fn openai_limits_are_refused_for_a_message_batches_file() {
    let dir = temp_dir("anthropic-args");
    let input = write_requests(&dir, 2, &[]);
    for (args, says) in [
        (&["--azure-deployment", "d"][..], "--azure-deployment"),
        (&["--dialect", "openai"][..], "drop --dialect"),
    ] {
        let run = spawn(&input, &dir.join("out.jsonl"), "http://127.0.0.1:9", args)
            .wait_with_output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

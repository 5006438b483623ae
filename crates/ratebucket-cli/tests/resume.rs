//! A 1,000-line batch killed with SIGKILL at five random points and resumed each time:
//! every line is recorded exactly once, and the provider executed no request twice
//! except those the journal marks ambiguous.

mod support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use ratebucket_sim::{Latency, LimitSpec, Sim, SimConfig};
use support::{count_lines, executed, journal_marks, records, spawn, temp_dir, write_input};

const LINES: usize = 1_000;

#[test]
fn a_batch_killed_five_times_and_resumed_records_each_line_once() {
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(400).window(Duration::from_secs(1)))
            .tpm(LimitSpec::per_minute(10_000_000).window(Duration::from_secs(1)))
            .latency(Latency::Fixed(Duration::from_millis(30))),
    )
    .expect("fake provider");
    let dir = temp_dir("resume");
    let input = write_input(&dir, LINES);
    let output = dir.join("output.jsonl");
    let limits = ["--rpm", "400", "--tpm", "10000000", "--window", "1", "--quiet"];
    let mut rng = fastrand::Rng::with_seed(0x5eed);

    for kill in 0..5 {
        let before = count_lines(&output);
        assert!(before < LINES, "kill {kill}: the batch is not done yet");
        // Somewhere in the next stretch of the run.
        let at = (before + rng.usize(1..180)).min(LINES - 1);
        let mut child = spawn(&input, &output, &sim.base_url(), &limits);
        let started = Instant::now();
        while count_lines(&output) < at && child.try_wait().expect("wait").is_none() {
            assert!(started.elapsed() < Duration::from_secs(60), "kill {kill}: no progress");
            std::thread::sleep(Duration::from_millis(rng.u64(1..8)));
        }
        child.kill().expect("SIGKILL");
        child.wait().expect("reaped");
    }

    // The last run finishes the batch.
    let finished =
        spawn(&input, &output, &sim.base_url(), &limits).wait_with_output().expect("runs");
    assert!(finished.status.success(), "{finished:?}");

    let records = records(&output);
    let ids: Vec<&str> = records.iter().map(|r| r["custom_id"].as_str().expect("id")).collect();
    let unique: HashSet<&str> = ids.iter().copied().collect();
    assert_eq!(ids.len(), LINES, "one record per line");
    assert_eq!(unique.len(), LINES, "no line recorded twice");

    let ambiguous = journal_marks(&output, "ambiguous");
    for record in &records {
        let id = record["custom_id"].as_str().expect("id");
        if record["error"]["code"] == "ambiguous" {
            assert!(ambiguous.contains(id), "{id}: ambiguous without a journal mark");
        } else {
            assert_eq!(record["response"]["status_code"], 200, "{record}");
        }
    }
    for (id, times) in executed(&sim) {
        assert!(
            times == 1 || ambiguous.contains(&id),
            "{id} executed {times} times without being marked ambiguous"
        );
    }

    // Sending the ambiguous lines again completes every line, still once each.
    let retried =
        spawn(&input, &output, &sim.base_url(), &[&limits[..], &["--retry-ambiguous"]].concat())
            .wait_with_output()
            .expect("runs");
    assert!(retried.status.success(), "{retried:?}");
    let records = support::records(&output);
    assert_eq!(records.len(), LINES);
    let unique: HashSet<&str> =
        records.iter().map(|r| r["custom_id"].as_str().expect("id")).collect();
    assert_eq!(unique.len(), LINES);
    assert!(records.iter().all(|r| r["response"]["status_code"] == 200), "every line answered");
    eprintln!("{} line(s) were in flight at a kill and marked ambiguous", ambiguous.len());
}

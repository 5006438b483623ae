//! Ctrl-C: the first stops sending and waits for what is in flight; a second abandons it,
//! recorded as ambiguous. Either way every request the provider executed has its record.

mod support;

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use ratebucket_sim::{Latency, LimitSpec, Sim, SimConfig, SimHandle};
use support::{count_lines, executed, records, spawn, temp_dir, write_input};

const LINES: usize = 200;
const ARGS: &[&str] = &["--rpm", "40", "--tpm", "10000000", "--window", "1", "--concurrency", "16"];

fn slow_provider() -> SimHandle {
    Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(40).window(Duration::from_secs(1)))
            .tpm(LimitSpec::per_minute(10_000_000).window(Duration::from_secs(1)))
            .latency(Latency::Fixed(Duration::from_millis(300))),
    )
    .expect("fake provider")
}

fn interrupt(child: &Child) {
    let status =
        Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill runs");
    assert!(status.success());
}

/// Waits until `output` has `lines` records.
fn wait_for_records(output: &Path, lines: usize) {
    let started = Instant::now();
    while count_lines(output) < lines {
        assert!(started.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Every request the provider executed has a record; no line is recorded twice.
fn assert_every_execution_recorded(sim: &SimHandle, output: &Path) -> Vec<serde_json::Value> {
    let records = records(output);
    let ids: HashSet<String> =
        records.iter().map(|r| r["custom_id"].as_str().expect("id").to_owned()).collect();
    assert_eq!(ids.len(), records.len(), "no line recorded twice");
    for (id, times) in executed(sim) {
        assert!(ids.contains(&id), "{id} was executed and has no record");
        assert_eq!(times, 1, "{id} executed {times} times");
    }
    records
}

#[test]
fn the_first_ctrl_c_sends_nothing_more_and_waits_for_what_is_in_flight() {
    let sim = slow_provider();
    let dir = temp_dir("interrupt-once");
    let input = write_input(&dir, LINES);
    let output = dir.join("output.jsonl");
    let child = spawn(&input, &output, &sim.base_url(), ARGS);
    wait_for_records(&output, 5);
    interrupt(&child);
    let result = child.wait_with_output().expect("exits");
    assert_eq!(result.status.code(), Some(130), "{result:?}");
    let records = assert_every_execution_recorded(&sim, &output);
    assert!(records.len() < LINES, "stopped early");
    assert!(
        records.iter().all(|r| r["response"]["status_code"] == 200),
        "nothing was abandoned: in-flight requests were waited for"
    );

    // Running again finishes the rest, each line once.
    let rest = spawn(&input, &output, &sim.base_url(), ARGS).wait_with_output().expect("runs");
    assert!(rest.status.success(), "{rest:?}");
    let records = assert_every_execution_recorded(&sim, &output);
    assert_eq!(records.len(), LINES);
}

#[test]
fn a_second_ctrl_c_abandons_what_is_in_flight_as_ambiguous() {
    let sim = slow_provider();
    let dir = temp_dir("interrupt-twice");
    let input = write_input(&dir, LINES);
    let output = dir.join("output.jsonl");
    let child = spawn(&input, &output, &sim.base_url(), ARGS);
    wait_for_records(&output, 5);
    interrupt(&child);
    std::thread::sleep(Duration::from_millis(20));
    interrupt(&child);
    let result = child.wait_with_output().expect("exits");
    assert_eq!(result.status.code(), Some(130), "{result:?}");
    let records = assert_every_execution_recorded(&sim, &output);
    let answered: HashSet<&str> = records
        .iter()
        .filter(|r| r["response"]["status_code"] == 200)
        .map(|r| r["custom_id"].as_str().expect("id"))
        .collect();
    // What was executed but not answered in time is on record as ambiguous.
    for record in &records {
        let id = record["custom_id"].as_str().expect("id");
        assert!(answered.contains(id) || record["error"]["code"] == "ambiguous", "{record}");
    }
}

#[test]
fn a_file_that_is_not_batch_input_is_refused_before_anything_is_sent() {
    let sim = slow_provider();
    let dir = temp_dir("bad-input");
    let input = dir.join("input.jsonl");
    std::fs::write(
        &input,
        "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n\
         {\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n\
         not json\n",
    )
    .expect("input");
    let output = dir.join("output.jsonl");
    let result = spawn(&input, &output, &sim.base_url(), ARGS).wait_with_output().expect("exits");
    assert_eq!(result.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("line 2: custom_id `a` appears twice"), "{stderr}");
    assert!(stderr.contains("line 3: not a request line"), "{stderr}");
    assert!(sim.log().is_empty(), "nothing was sent");
    assert!(!output.exists(), "nothing was written");
}

//! An outage is not an answer: lines the provider never took are left for the next run,
//! the exit status says so, a provider that stays unreachable stops the run, and once it
//! is back the same command completes every line.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use support::{records, spawn, temp_dir, write_input};

const LINES: usize = 12;

#[test]
fn an_outage_leaves_every_line_for_the_run_that_finds_the_provider_up() {
    let dir = temp_dir("outage");
    let input = write_input(&dir, LINES);
    let output = dir.join("output.jsonl");
    // An address nobody listens on, until the provider comes up on it.
    let addr = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port");
    let base = format!("http://{addr}");
    let args = |give_up: &'static str| {
        [
            "--rpm",
            "1000",
            "--tpm",
            "10000000",
            "--window",
            "1",
            "--concurrency",
            "12",
            "--give-up-after",
            give_up,
        ]
    };

    // Down, with time to spare: every line fails, none is recorded, the status says so.
    let down = spawn(&input, &output, &base, &args("600")).wait_with_output().expect("runs");
    let stdout = String::from_utf8_lossy(&down.stdout);
    let stderr = String::from_utf8_lossy(&down.stderr);
    assert_eq!(down.status.code(), Some(3), "{stdout}\n{stderr}");
    assert!(records(&output).is_empty(), "an outage is not an answer");
    assert!(
        stdout.contains(&format!("left for the next run: {LINES} ({LINES} unavailable)")),
        "{stdout}"
    );

    // Down, and told to give up at once: the run stops, keeping everything.
    let stopped = spawn(&input, &output, &base, &args("0")).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert_eq!(stopped.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("has answered nothing"), "{stderr}");
    assert!(records(&output).is_empty());

    // Up on the same address: the same command sends every line, each once.
    let mut config = SimConfig::default()
        .rpm(LimitSpec::per_minute(1_000).window(Duration::from_secs(1)))
        .tpm(LimitSpec::per_minute(10_000_000).window(Duration::from_secs(1)));
    config.addr = addr;
    let sim = Sim::start(config).expect("the provider comes up");
    let up = spawn(&input, &output, &base, &args("600")).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&up.stderr);
    assert_eq!(up.status.code(), Some(0), "{stderr}");
    let records = records(&output);
    assert_eq!(records.len(), LINES);
    assert!(records.iter().all(|r| r["response"]["status_code"] == 200), "{records:?}");
    assert_eq!(sim.log().len(), LINES, "each line sent once");
}

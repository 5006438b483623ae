//! What a user sees: the last progress line with the whole count, the summary on lines of
//! its own, a resumed run's bound with its ratio, and the library's log on request.

mod support;

use std::time::Duration;

use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use support::{spawn, temp_dir, write_input};

const LINES: usize = 40;
const ARGS: &[&str] = &["--rpm", "600", "--tpm", "10000000", "--window", "1"];

#[test]
fn the_last_line_counts_everything_and_a_resumed_run_has_a_ratio() {
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(600).window(Duration::from_secs(1)))
            .tpm(LimitSpec::per_minute(10_000_000).window(Duration::from_secs(1))),
    )
    .expect("fake provider");
    let dir = temp_dir("progress");
    let output = dir.join("output.jsonl");

    // Half the file, then all of it: the second run resumes.
    let half = write_input(&dir, LINES / 2);
    let first = spawn(&half, &output, &sim.base_url(), ARGS).wait_with_output().expect("runs");
    assert_eq!(first.status.code(), Some(0));
    let whole = write_input(&dir, LINES);
    let mut args = ARGS.to_vec();
    args.extend(["--log", "ratebucket=debug"]);
    let second = spawn(&whole, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stdout = String::from_utf8_lossy(&second.stdout);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(0), "{stderr}");

    let last_progress =
        stderr.lines().rfind(|l| l.starts_with("progress:")).expect("a progress line");
    let half = LINES / 2;
    assert!(last_progress.starts_with(&format!("progress: {half}/{half} done")), "{last_progress}");
    assert!(
        stdout.lines().any(|l| l.starts_with("ratebucket batch: ")),
        "the summary starts a line: {stdout}"
    );
    let bound = stdout.lines().find(|l| l.starts_with("makespan")).expect("a bound line");
    assert!(bound.contains("a resumed run"), "{bound}");
    assert!(bound.contains("x);"), "a ratio: {bound}");
    assert!(
        stderr.contains("ratebucket.attempt") || stderr.contains("attempt finished"),
        "the library's log: {stderr}"
    );
}

//! A batch killed with SIGKILL in full flow and resumed at once, against a provider that
//! sends no rate-limit headers (so nothing but the journal tells the new run what the
//! provider is still counting): the resumed run starts where the provider's count is, with
//! no wave of 429s.

mod support;

use std::time::{Duration, Instant};

use ratebucket_sim::{Headers, Latency, LimitSpec, LogEntry, Model, Sim, SimConfig};
use support::{count_lines, journal_marks, spawn, temp_dir, write_input};

const LINES: usize = 300;

#[test]
fn a_batch_resumed_at_once_after_a_kill_meets_no_wave_of_429s() {
    // 100 requests in any 4 s, counted by the provider alone; the run is told 84 (a burst
    // of 14, 21 a second), so it meets no 429 of its own.
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(100).window(Duration::from_secs(4)).model(Model::SlidingLog))
            .headers(Headers::None)
            .latency(Latency::Fixed(Duration::from_millis(20))),
    )
    .expect("fake provider");
    let dir = temp_dir("restart");
    let input = write_input(&dir, LINES);
    let output = dir.join("output.jsonl");
    let limits = ["--rpm", "84", "--tpm", "100000000", "--window", "4", "--quiet"];

    // Killed in full flow: past its first burst, sending at the rate.
    let mut first = spawn(&input, &output, &sim.base_url(), &limits);
    let started = Instant::now();
    while count_lines(&output) < 200 && first.try_wait().expect("wait").is_none() {
        assert!(started.elapsed() < Duration::from_secs(60), "no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    first.kill().expect("SIGKILL");
    first.wait().expect("reaped");
    // Whose requests are whose, by the line each carries: the first run's are those its
    // journal marked sent (a request in flight at the kill may reach the provider late,
    // on a loaded machine after the resumed run's first).
    let first_sent = journal_marks(&output, "sent");
    let ours = |e: &&LogEntry| e.user.as_ref().is_some_and(|u| first_sent.contains(u));

    let resumed =
        spawn(&input, &output, &sim.base_url(), &limits).wait_with_output().expect("runs");
    assert!(resumed.status.success(), "{resumed:?}");
    let log = sim.log();
    let (first_log, resumed_log): (Vec<&LogEntry>, Vec<&LogEntry>) = log.iter().partition(ours);
    let first_429s = first_log.iter().filter(|e| e.status == Some(429)).count();
    let resumed_429s = resumed_log.iter().filter(|e| e.status == Some(429)).count();
    eprintln!(
        "first run: {} requests, {first_429s} 429s; resumed run: {} requests, {resumed_429s} 429s",
        first_log.len(),
        resumed_log.len()
    );
    assert!(
        resumed_429s <= 3,
        "the resumed run met {resumed_429s} 429s: it did not start where the provider's count was"
    );
    // It starts where the first run's pacing left the bucket (about empty, plus what 21 a
    // second refilled while no run was sending), not with a fresh burst (a sixth of the
    // limit, 14): in its first 400 ms, at most the first request, that refill and the
    // rate's 21 a second, give or take two.
    let last = first_log.iter().map(|e| e.arrived).max().expect("sent");
    let start = resumed_log.iter().map(|e| e.arrived).min().expect("sent");
    let gap = start.saturating_sub(last).as_secs_f64();
    let early =
        resumed_log.iter().filter(|e| e.arrived < start + Duration::from_millis(400)).count();
    let bound = 1.0 + (21.0 * gap).min(14.0) + 21.0 * 0.4 + 2.0;
    eprintln!(
        "resumed run: {early} requests in its first 400 ms, {gap:.3} s after the last (bound {bound:.1})"
    );
    assert!(
        early as f64 <= bound,
        "the resumed run sent {early} requests in its first 400 ms ({bound:.1} allowed): a burst the provider's count had no room for"
    );
}

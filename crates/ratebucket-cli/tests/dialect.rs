//! `--dialect`: a provider's dialect named on the command line, and a name that is none.

mod support;

use std::time::Duration;

use ratebucket_sim::{Dialect, LimitSpec, Sim, SimConfig};
use support::{records, spawn, temp_dir, write_input};

#[test]
fn a_groq_batch_reads_groqs_headers_and_meets_no_refusal() {
    let second = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(200).window(second))
            .tpm(LimitSpec::per_minute(1_000_000).window(second))
            .rpd(LimitSpec::per_minute(100_000))
            .dialect(Dialect::Groq),
    )
    .expect("fake provider");
    let dir = temp_dir("dialect");
    let input = write_input(&dir, 30);
    let output = dir.join("output.jsonl");
    let args = ["--rpm", "200", "--window", "1", "--dialect", "groq"];
    let run = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    assert_eq!(records(&output).len(), 30);
    let refused = sim.log().iter().filter(|e| e.status == Some(429)).count();
    assert_eq!(refused, 0);
}

#[test]
fn an_unknown_dialect_is_refused_with_the_names_there_are() {
    let dir = temp_dir("dialect-unknown");
    let input = write_input(&dir, 1);
    let run =
        spawn(&input, &dir.join("output.jsonl"), "http://127.0.0.1:9", &["--dialect", "gemmini"])
            .wait_with_output()
            .expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("gemmini") && stderr.contains("openai, azure, gemini, groq"),
        "{stderr}"
    );
}

#[test]
fn a_spent_daily_quota_stops_the_batch_saying_when_to_resume_and_keeps_the_rest() {
    // Groq's requests family counts per day: 12 a day, 40 lines.
    let second = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(200).window(second))
            .tpm(LimitSpec::per_minute(1_000_000).window(second))
            .rpd(LimitSpec::per_minute(12).window(Duration::from_secs(86_400)))
            .dialect(Dialect::Groq),
    )
    .expect("fake provider");
    let dir = temp_dir("dialect-daily");
    let input = write_input(&dir, 40);
    let output = dir.join("output.jsonl");
    let args = ["--rpm", "200", "--window", "1", "--dialect", "groq"];
    let started = std::time::Instant::now();
    let run = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    // Which limit, what the provider said of it, and when.
    assert!(
        stderr.contains("is spent; it resets in")
            && stderr.contains("on requests (limit 12, 0 remaining")
            && stderr.contains("resume after 20"),
        "{stderr}"
    );
    // It stopped at once, not after waiting for the day.
    assert!(started.elapsed() < Duration::from_secs(30), "{stderr}");
    // The day's twelve are answered; the rest are left for the next run, none sent twice.
    assert_eq!(records(&output).len(), 12, "{stderr}");
    let admitted = sim.log().iter().filter(|e| e.admitted).count();
    assert_eq!(admitted, 12);
}

/// A batch told more than the provider allows meets 429s; the summary says which limit
/// they named (OpenRouter's requests, whose headers come on its 429s only).
#[test]
fn the_summary_names_the_limit_the_429s_named() {
    let second = Duration::from_secs(1);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(20).window(second))
            .tpm(LimitSpec::per_minute(1_000_000).window(second))
            .dialect(Dialect::Openrouter),
    )
    .expect("fake provider");
    let dir = temp_dir("dialect-named");
    let input = write_input(&dir, 40);
    let output = dir.join("output.jsonl");
    // Told 200 a second against the provider's 20, with a burst of them at once.
    let args = ["--rpm", "200", "--tpm", "1000000", "--window", "1", "--dialect", "openrouter"];
    let run = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stdout}{stderr}");
    let refused = sim.log().iter().filter(|e| e.status == Some(429)).count();
    assert!(refused > 0, "the provider refused some: {stdout}");
    assert!(stdout.contains(&format!("429s {refused} ({refused} on requests)")), "{stdout}");
}

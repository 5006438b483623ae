//! `cargo xtask fuzz`: runs the fuzz targets under `fuzz/` (cargo-fuzz, nightly toolchain)
//! for a time budget each and reports how many inputs each one ran. Not part of CI.

use std::process::Command;

/// The targets, in `fuzz/fuzz_targets/`.
const TARGETS: &[&str] = &["headers", "sse", "error_body"];

/// Runs `cargo xtask fuzz [--secs N] [TARGET...]`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut secs: u64 = 60;
    let mut max_len: Option<u64> = None;
    let mut chosen: Vec<String> = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--secs" => {
                let value = args.next().ok_or("--secs needs a value")?;
                secs = value
                    .parse()
                    .map_err(|_| format!("--secs takes a whole number, not `{value}`"))?;
            }
            "--max-len" => {
                let value = args.next().ok_or("--max-len needs a value")?;
                max_len = Some(
                    value
                        .parse()
                        .map_err(|_| format!("--max-len takes a whole number, not `{value}`"))?,
                );
            }
            target if TARGETS.contains(&target) => chosen.push(target.to_owned()),
            other => {
                return Err(format!(
                    "fuzz: unknown argument `{other}` (targets: {})",
                    TARGETS.join(", ")
                ));
            }
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.iter().map(|t| (*t).to_owned()).collect();
    }
    let has_fuzz = Command::new("cargo")
        .args(["+nightly", "fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_fuzz {
        return Err("fuzz: needs the nightly toolchain and cargo-fuzz: \
                    `rustup toolchain install nightly` and `cargo install cargo-fuzz`"
            .into());
    }
    let mut rows = Vec::new();
    let mut crashed = Vec::new();
    for target in &chosen {
        // No sanitizer (the targets are safe Rust), but debug assertions on, so an
        // arithmetic overflow is a crash.
        eprintln!("$ cargo +nightly fuzz run -s none -a {target} -- -max_total_time={secs}");
        let mut command = Command::new("cargo");
        command
            .args(["+nightly", "fuzz", "run", "-s", "none", "-a", target, "--"])
            .arg(format!("-max_total_time={secs}"))
            .arg("-print_final_stats=1");
        if let Some(max_len) = max_len {
            command.arg(format!("-max_len={max_len}"));
        }
        let output = command.output().map_err(|e| format!("could not run cargo fuzz: {e}"))?;
        let log = String::from_utf8_lossy(&output.stderr);
        let stat = |name: &str| {
            log.lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim_start_matches(':').trim().parse::<u64>().ok())
        };
        let runs = stat("stat::number_of_executed_units").unwrap_or(0);
        let speed = stat("stat::average_exec_per_sec").unwrap_or(0);
        let ok = output.status.success();
        if !ok {
            // The panic, and where cargo-fuzz saved the input.
            for line in log.lines().filter(|l| {
                l.contains("panicked") || l.contains("crash-") || l.starts_with("thread")
            }) {
                eprintln!("{line}");
            }
            crashed.push(target.clone());
        }
        rows.push((target.clone(), runs, speed, ok));
    }
    println!("| target | inputs run | inputs/s | crashes |");
    println!("|---|---:|---:|---:|");
    for (target, runs, speed, ok) in &rows {
        println!("| {target} | {runs} | {speed} | {} |", if *ok { 0 } else { 1 });
    }
    if crashed.is_empty() {
        Ok(())
    } else {
        Err(format!("fuzz: {} crashed (artifacts in fuzz/artifacts)", crashed.join(", ")))
    }
}

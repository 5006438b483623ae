//! Project automation: `cargo xtask ci` runs every check CI runs; `microbench`, `waiters`
//! and `bench` measure ratebucket beside its peers.

mod bench;
mod counted;
mod microbench;
mod waiters;

use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  ci           cargo fmt --check, clippy -D warnings (all targets and features), the test
               suite, cargo doc
  microbench   the core state machine: reserve+commit vs governor, grant cost, memory
  waiters      many waiters on one limiter: ratebucket vs governor and leaky-bucket
  bench [NAME] four engines against the fake provider; writes bench/results.json and
               bench/timeline.png (NAME runs only the scenarios whose name contains it,
               writing to bench/out instead)
";

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let result = match task.as_deref() {
        Some("ci") => ci(),
        Some("microbench") => microbench::run(),
        Some("waiters") => waiters::run(),
        Some("bench") => bench::run(std::env::args().nth(2).as_deref()),
        _ => {
            eprint!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// The whole CI gate, in the order that fails fastest.
fn ci() -> Result<(), String> {
    cargo(&["fmt", "--all", "--check"], &[])?;
    cargo(
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ],
        &[],
    )?;
    cargo(&["test", "--workspace", "--all-targets"], &[])?;
    cargo(&["test", "--workspace", "--doc"], &[])?;
    cargo(
        &["doc", "--workspace", "--no-deps"],
        &[("RUSTDOCFLAGS", "-D warnings")],
    )?;
    Ok(())
}

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("$ cargo {}", args.join(" "));
    let status = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

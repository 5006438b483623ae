//! Project automation: `cargo xtask ci` runs every check CI runs; `microbench`, `waiters`
//! and `bench` measure ratebucket beside its peers.

mod bench;
mod counted;
mod fuzz;
mod microbench;
mod prove;
mod readme;
mod screenshot;
mod stress;
mod waiters;

use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  ci           cargo fmt --check, clippy -D warnings (all targets and features), smol-only
               builds, the test suite, cargo doc, the examples, the README check, the loom models
  tidy         the house's shape (xtask/tests/tidy.rs): no library file over 600 lines,
               `Arbiter` and `Limiter` at most 25 public methods, no `use super::*`
               outside tests, every inherent impl in its type's file, every file's `//!`
  examples     the integration examples, each run against the fake provider
  readme       the README quick start, compiled in a project of its own that depends
               only on `ratebucket`, and its fake-provider half run; then every other
               Rust block of the README compiled
  microbench   criterion microbenchmarks side by side with governor (uncontended, through the
               tokio handle, 8 tasks contending, grant cost with N queued), then the ratios
               and the heap cost of a queued waiter
  waiters      many waiters on one limiter: ratebucket vs governor and leaky-bucket
  prove        the headline invariants, live, each beside the naive mechanism it
               replaces: on a virtual clock, then against the fake provider
  loom         model-check the async layer's synchronization (RUSTFLAGS=--cfg loom)
  stress [--runs N] [--jobs J] [--timeout SECS] [--filter TEXT]
               the async test binaries, each run N times (default 20) while every core
               is busy, each run under a deadline (default 300 s: the real-process
               Redis suite alone takes two minutes); reports hangs and failures per
               test and fails on any
  fuzz [--secs N] [--max-len BYTES] [TARGET...]
               the fuzz targets under fuzz/ (headers, sse, error_body) for N seconds each
               (default 60), inputs up to BYTES long (libFuzzer's default otherwise), on
               the nightly toolchain with cargo-fuzz; not part of CI
  screenshot   a terminal capture of `ratebucket batch` on the example file, drawn to
               docs/batch-progress.png (needs script(1) and the DejaVu Sans Mono font)
  spread [--runs N]
               ratebucket's makespan over N runs (default 20) of each learning workload
               (W1, W2; limits unknown and known): best, worst and the spread between
  bench [NAME] four engines against the fake provider; writes bench/results.json and
               bench/timeline.png (NAME runs only the scenarios whose name contains it,
               writing to bench/out instead)
";

fn main() -> ExitCode {
    let task = std::env::args().nth(1);
    let result = match task.as_deref() {
        Some("ci") => ci(),
        Some("tidy") => tidy(),
        Some("microbench") => microbench::run(),
        Some("waiters") => waiters::run(),
        Some("bench") => bench::run(std::env::args().nth(2).as_deref()),
        Some("spread") => spread(),
        Some("loom") => loom(),
        Some("prove") => prove::run(),
        Some("readme") => readme::run(),
        Some("screenshot") => screenshot::run(),
        Some("examples") => examples(),
        Some("fuzz") => fuzz::run(&std::env::args().skip(2).collect::<Vec<_>>()),
        Some("stress") => stress::run(&std::env::args().skip(2).collect::<Vec<_>>()),
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

/// `spread [--runs N]`.
fn spread() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let runs = match args.as_slice() {
        [] => 20,
        [flag, n] if flag == "--runs" => n.parse().map_err(|_| format!("not a count: {n}"))?,
        _ => return Err("usage: cargo xtask spread [--runs N]".to_owned()),
    };
    bench::spread(runs)
}

/// The tidy test alone: the house's shape.
fn tidy() -> Result<(), String> {
    cargo(&["test", "-p", "xtask", "--test", "tidy", "--quiet"], &[])
}

/// The whole CI gate, in the order that fails fastest.
fn ci() -> Result<(), String> {
    ensure_redis_server()?;
    cargo(&["fmt", "--all", "--check"], &[])?;
    // The tidy test (`xtask/tests/tidy.rs`) runs with the workspace's tests below, from
    // the same build.
    cargo(
        &["clippy", "--workspace", "--all-targets", "--all-features", "--", "-D", "warnings"],
        &[],
    )?;
    // Runtimes without the default one: a smol-only build must not need tokio's modules.
    for (package, features) in
        [("ratebucket-http", "smol,tls"), ("ratebucket", "smol,openai,tls,blocking")]
    {
        cargo(&["check", "-p", package, "--no-default-features", "--features", features], &[])?;
    }
    // With the features the examples need, so they are built here, once, and run below.
    cargo(&["test", "--workspace", "--all-targets", "--features", EXAMPLE_FEATURES], &[])?;
    cargo(&["test", "--workspace", "--doc"], &[])?;
    cargo(&["doc", "--workspace", "--no-deps"], &[("RUSTDOCFLAGS", "-D warnings")])?;
    examples()?;
    readme::run()?;
    loom()?;
    Ok(())
}

/// Makes sure `redis-server` is there for `ratebucket-redis`'s tests (each starts its own):
/// found on `PATH` (or at `$REDIS_SERVER`), else installed from the Debian package when
/// this machine can (`apt-get`, as root), else a clear error saying what to do.
fn ensure_redis_server() -> Result<(), String> {
    let found = || {
        std::env::var_os("REDIS_SERVER").is_some_and(|p| std::path::Path::new(&p).is_file())
            || std::env::var_os("PATH").is_some_and(|paths| {
                std::env::split_paths(&paths).any(|dir| dir.join("redis-server").is_file())
            })
    };
    if found() {
        return Ok(());
    }
    let advice = "redis-server is needed by ratebucket-redis's tests: install it \
                  (Debian/Ubuntu: `apt-get install redis-server`) or set REDIS_SERVER to its path";
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() == "0");
    let has_apt = Command::new("apt-get").arg("--version").output().is_ok();
    if !(is_root && has_apt) {
        return Err(advice.to_owned());
    }
    eprintln!("$ apt-get install -y redis-server   (redis-server not found)");
    let quiet = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    let installed = quiet(&["install", "-y", "-qq", "redis-server"])
        || (quiet(&["update", "-qq"]) && quiet(&["install", "-y", "-qq", "redis-server"]));
    if installed && found() {
        Ok(())
    } else {
        Err(format!("installing redis-server failed; {advice}"))
    }
}

/// The integration examples, each run to the end against the fake provider.
fn examples() -> Result<(), String> {
    let examples: &[(&str, &str, &str)] = &[
        ("ratebucket", "sim", "quickstart_sim"),
        ("ratebucket", "sim,metrics", "prometheus"),
        ("ratebucket-openai", "", "batch"),
        ("ratebucket-openai", "", "budget"),
        ("ratebucket-anthropic", "", "messages"),
        ("ratebucket-http", "", "fetch"),
        ("ratebucket-http", "", "learn"),
        ("ratebucket-http", "", "custom_transport"),
        ("ratebucket-http", "reqwest", "reqwest"),
        ("ratebucket-http", "tower", "tower_axum"),
        ("ratebucket-async-openai", "", "paced"),
        ("ratebucket-redis", "", "shared"),
    ];
    // Built by the test step (`--all-targets` with [`EXAMPLE_FEATURES`]): run as they are.
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or("target".into(), PathBuf::from);
    let dir = target.join("debug/examples");
    for (package, features, example) in examples {
        let binary = match built(&dir, example) {
            Some(binary) => binary,
            None => {
                let mut args = vec!["build", "--quiet", "-p", package, "--example", example];
                if !features.is_empty() {
                    args.extend(["--features", features]);
                }
                cargo(&args, &[])?;
                dir.join(example)
            }
        };
        eprintln!("$ {}", binary.display());
        let status = Command::new(&binary)
            .status()
            .map_err(|e| format!("could not run {}: {e}", binary.display()))?;
        if !status.success() {
            return Err(format!("the example {example} of {package} failed ({status})"));
        }
    }
    Ok(())
}

/// The newest build of `example` in `dir` (the test step leaves `name-<hash>`, unlinked).
fn built(dir: &std::path::Path, example: &str) -> Option<PathBuf> {
    let prefix = format!("{example}-");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name.strip_prefix(&prefix)
                .is_some_and(|hash| hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .max()
        .map(|(_, path)| path)
}

/// The features the examples and the simulated fleets need beside the defaults, for the
/// test build that makes them.
const EXAMPLE_FEATURES: &str = "ratebucket/sim,ratebucket/metrics,ratebucket-http/reqwest,\
     ratebucket-http/tower,ratebucket-redis/fleet";

/// The loom models of the async layer, built with `--cfg loom` in a target directory of
/// their own (so the ordinary build is not invalidated), optimised (loom explores many
/// thousands of interleavings).
fn loom() -> Result<(), String> {
    cargo(
        &[
            "test",
            "-p",
            "ratebucket-rt",
            "--test",
            "loom",
            "--release",
            "--target-dir",
            "target/loom",
        ],
        &[("RUSTFLAGS", "--cfg loom")],
    )
}

fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    eprintln!("$ cargo {}", args.join(" "));
    let started = std::time::Instant::now();
    let status = Command::new(cargo)
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    eprintln!("  ({:.1} s)", started.elapsed().as_secs_f64());
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

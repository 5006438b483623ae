//! `cargo xtask stress`: the async test binaries, run many times while every core is busy,
//! each run under a deadline; hangs and failures reported per test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

/// The packages whose tests run on a runtime (the core's are sans-IO and single-threaded).
const ASYNC_PACKAGES: &[&str] = &[
    "ratebucket-rt",
    "ratebucket-tokio",
    "ratebucket-smol",
    "ratebucket-http",
    "ratebucket-openai",
    "ratebucket-anthropic",
    "ratebucket-sim",
    "ratebucket-async-openai",
    "ratebucket-cli",
    "ratebucket-redis",
    "ratebucket",
];

/// Options of one stress run.
struct Options {
    runs: u32,
    timeout: Duration,
    jobs: usize,
    filter: Option<String>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Options, String> {
        let mut options =
            Options { runs: 20, timeout: Duration::from_secs(300), jobs: 2, filter: None };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut value =
                |name: &str| args.next().ok_or_else(|| format!("{name} needs a value")).cloned();
            match arg.as_str() {
                "--runs" => options.runs = number(&value("--runs")?, "--runs")?,
                "--timeout" => {
                    options.timeout =
                        Duration::from_secs(number(&value("--timeout")?, "--timeout")?);
                }
                "--jobs" => options.jobs = number(&value("--jobs")?, "--jobs")?,
                "--filter" => options.filter = Some(value("--filter")?),
                other => return Err(format!("stress: unknown argument `{other}`")),
            }
        }
        if options.runs == 0 || options.jobs == 0 {
            return Err("stress: --runs and --jobs must be at least 1".into());
        }
        Ok(options)
    }
}

fn number<T: std::str::FromStr>(text: &str, name: &str) -> Result<T, String> {
    text.parse().map_err(|_| format!("{name} takes a whole number, not `{text}`"))
}

/// One test binary of the workspace.
#[derive(Clone)]
struct Binary {
    /// `package/target`, for the report.
    name: String,
    path: PathBuf,
    tests: Vec<String>,
}

/// What one test did over every run.
#[derive(Default)]
struct Tally {
    passed: u32,
    failed: u32,
    hung: u32,
    /// The first failure's or hang's output, for the report.
    first_output: Option<String>,
}

/// Runs the stress task with the arguments after `stress`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let options = Options::parse(args)?;
    let binaries = build(options.filter.as_deref())?;
    if binaries.is_empty() {
        return Err("stress: no test binary matched".into());
    }
    let cores = thread::available_parallelism().map_or(2, usize::from);
    eprintln!(
        "stress: {} binaries, {} tests, {} runs each, {} at a time, {} s deadline per run, {cores} busy loops",
        binaries.len(),
        binaries.iter().map(|b| b.tests.len()).sum::<usize>(),
        options.runs,
        options.jobs,
        options.timeout.as_secs(),
    );
    let hog = Hog::start(cores);
    let started = Instant::now();
    let tallies = run_all(&binaries, &options);
    drop(hog);
    report(&binaries, &tallies, options.runs, started.elapsed())
}

/// Builds every test binary of the async packages once and lists their tests.
fn build(filter: Option<&str>) -> Result<Vec<Binary>, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut command = Command::new(cargo);
    command.args(["test", "--no-run", "--message-format=json"]);
    for package in ASYNC_PACKAGES {
        command.args(["-p", package]);
    }
    eprintln!("$ cargo test --no-run -p {}", ASYNC_PACKAGES.join(" -p "));
    let output = command
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("could not run cargo: {e}"))?;
    if !output.status.success() {
        return Err("stress: building the test binaries failed".into());
    }
    let mut binaries = Vec::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(message) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test =
            message["reason"] == "compiler-artifact" && message["profile"]["test"] == true;
        let Some(path) = message["executable"].as_str().filter(|_| is_test) else {
            continue;
        };
        let package = message["package_id"].as_str().and_then(package_name).unwrap_or("?");
        let target = message["target"]["name"].as_str().unwrap_or("?");
        let name = format!("{package}/{target}");
        if filter.is_some_and(|f| !name.contains(f)) {
            continue;
        }
        let tests = list_tests(Path::new(path))?;
        if !tests.is_empty() {
            binaries.push(Binary { name, path: PathBuf::from(path), tests });
        }
    }
    binaries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(binaries)
}

/// The package name in a workspace package id (`path+file:///…/ratebucket-http#0.1.0`).
fn package_name(id: &str) -> Option<&str> {
    id.rsplit('/').next()?.split(['#', '@']).next()
}

fn list_tests(path: &Path) -> Result<Vec<String>, String> {
    let output = Command::new(path)
        .args(["--list", "--format", "terse"])
        .output()
        .map_err(|e| format!("could not list {}: {e}", path.display()))?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect())
}

/// Runs every binary `runs` times, `jobs` runs at a time, and tallies each test.
fn run_all(binaries: &[Binary], options: &Options) -> BTreeMap<(String, String), Tally> {
    let mut queue: Vec<(usize, u32)> = Vec::new();
    for run in 0..options.runs {
        for index in 0..binaries.len() {
            queue.push((index, run));
        }
    }
    queue.reverse();
    let queue = std::sync::Mutex::new(queue);
    let tallies = std::sync::Mutex::new(BTreeMap::new());
    let total = options.runs as usize * binaries.len();
    // Never two runs of one binary at once: the load asked for is the busy loops and one
    // other suite, not a suite beside itself (the fleet tests start 72 processes each).
    let running = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let next = || loop {
        {
            let mut queue = queue.lock().expect("queue");
            let mut running = running.lock().expect("running");
            let Some(position) = queue.iter().rposition(|(index, _)| !running.contains(index))
            else {
                if queue.is_empty() {
                    return None;
                }
                drop((queue, running));
                thread::sleep(Duration::from_millis(50));
                continue;
            };
            let (index, run) = queue.remove(position);
            running.insert(index);
            return Some((index, run));
        }
    };
    let done = std::sync::atomic::AtomicUsize::new(0);
    thread::scope(|scope| {
        for _ in 0..options.jobs {
            scope.spawn(|| {
                loop {
                    let Some((index, _run)) = next() else {
                        return;
                    };
                    let binary = &binaries[index];
                    let outcome = run_once(binary, options.timeout);
                    running.lock().expect("running").remove(&index);
                    let mut tallies = tallies.lock().expect("tallies");
                    for test in &binary.tests {
                        let tally: &mut Tally =
                            tallies.entry((binary.name.clone(), test.clone())).or_default();
                        match outcome.results.get(test) {
                            Some(true) => tally.passed += 1,
                            Some(false) => {
                                tally.failed += 1;
                                tally.first_output.get_or_insert_with(|| outcome.output.clone());
                            }
                            None if outcome.timed_out => {
                                tally.hung += 1;
                                tally.first_output.get_or_insert_with(|| outcome.output.clone());
                            }
                            // The run died before this test reported (a crash).
                            None => {
                                tally.failed += 1;
                                tally.first_output.get_or_insert_with(|| outcome.output.clone());
                            }
                        }
                    }
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    let verdict = if outcome.timed_out {
                        "HUNG"
                    } else if outcome.results.values().all(|ok| *ok)
                        && outcome.results.len() == binary.tests.len()
                    {
                        "ok"
                    } else {
                        "FAILED"
                    };
                    eprintln!(
                        "stress: [{finished}/{total}] {} {verdict} in {:.1} s",
                        binary.name,
                        outcome.elapsed.as_secs_f64()
                    );
                }
            });
        }
    });
    tallies.into_inner().expect("tallies")
}

/// One run of one binary.
struct RunOutcome {
    /// Each test that reported: passed or not.
    results: BTreeMap<String, bool>,
    timed_out: bool,
    output: String,
    elapsed: Duration,
}

fn run_once(binary: &Binary, timeout: Duration) -> RunOutcome {
    let started = Instant::now();
    let child = Command::new(&binary.path)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            return RunOutcome {
                results: BTreeMap::new(),
                timed_out: false,
                output: format!("could not start: {e}"),
                elapsed: started.elapsed(),
            };
        }
    };
    let stdout = child.stdout.take().expect("piped");
    let mut stderr = child.stderr.take().expect("piped");
    let reader = thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(stdout).lines() {
            match line {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        lines
    });
    let errors = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut timed_out = false;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > timeout => {
                timed_out = true;
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(_) => break,
        }
    }
    let lines = reader.join().unwrap_or_default();
    let errors = errors.join().unwrap_or_default();
    let mut results = BTreeMap::new();
    for line in &lines {
        if let Some(rest) = line.strip_prefix("test ") {
            if let Some(name) = rest.strip_suffix(" ... ok") {
                results.insert(name.to_owned(), true);
            } else if let Some(name) = rest.strip_suffix(" ... FAILED") {
                results.insert(name.to_owned(), false);
            }
        }
    }
    let mut output = lines.join("\n");
    if !errors.is_empty() {
        output.push_str("\n--- stderr ---\n");
        output.push_str(&errors);
    }
    if timed_out {
        let unreported: Vec<&str> =
            binary.tests.iter().filter(|t| !results.contains_key(*t)).map(String::as_str).collect();
        output.push_str(&format!(
            "\n--- killed after {} s; still running: {} ---",
            timeout.as_secs(),
            unreported.join(", ")
        ));
    }
    RunOutcome { results, timed_out, output, elapsed: started.elapsed() }
}

fn report(
    binaries: &[Binary],
    tallies: &BTreeMap<(String, String), Tally>,
    runs: u32,
    elapsed: Duration,
) -> Result<(), String> {
    let log_dir = PathBuf::from("target/stress");
    let _ = std::fs::create_dir_all(&log_dir);
    println!("| binary | test | runs | passed | failed | hung |");
    println!("|---|---|---:|---:|---:|---:|");
    let (mut failed, mut hung) = (0, 0);
    for binary in binaries {
        let mut shown = 0;
        let mut quiet = 0;
        for test in &binary.tests {
            let Some(tally) = tallies.get(&(binary.name.clone(), test.clone())) else {
                continue;
            };
            failed += tally.failed;
            hung += tally.hung;
            if tally.failed + tally.hung > 0 {
                shown += 1;
                println!(
                    "| {} | {test} | {runs} | {} | {} | {} |",
                    binary.name, tally.passed, tally.failed, tally.hung
                );
                if let Some(output) = &tally.first_output {
                    let file = log_dir.join(format!(
                        "{}-{}.log",
                        binary.name.replace('/', "-"),
                        test.replace("::", "-")
                    ));
                    let _ = std::fs::write(&file, output);
                }
            } else {
                quiet += 1;
            }
        }
        let which = if shown == 0 { "all" } else { "the other" };
        println!(
            "| {} | {which} {quiet} tests | {runs} | {} | 0 | 0 |",
            binary.name,
            quiet as u32 * runs
        );
    }
    println!("\nstress: {failed} failures, {hung} hangs in {:.0} s", elapsed.as_secs_f64());
    if failed + hung > 0 {
        for ((binary, test), tally) in tallies {
            if let Some(output) = &tally.first_output {
                println!("\n==== {binary} :: {test} ====");
                println!("{}", tail(output, 60));
            }
        }
        println!("(first outputs also in {})", log_dir.display());
        Err(format!("stress: {failed} failures and {hung} hangs"))
    } else {
        Ok(())
    }
}

/// The last `lines` lines of `text`.
fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Busy loops on every core, stopped when dropped.
struct Hog {
    stop: Arc<AtomicBool>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Hog {
    fn start(threads: usize) -> Hog {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..threads)
            .map(|_| {
                let stop = Arc::clone(&stop);
                thread::spawn(move || {
                    let mut x: u64 = 1;
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            x = std::hint::black_box(
                                x.wrapping_mul(6364136223846793005).wrapping_add(1),
                            );
                        }
                    }
                })
            })
            .collect();
        Hog { stop, threads }
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

//! `ratebucket batch`: runs a file of OpenAI Batch API requests against any
//! OpenAI-compatible endpoint as fast as its limits allow, resumable after a crash, each
//! request sent once.
//!
//! ```text
//! ratebucket batch INPUT.jsonl -o OUTPUT.jsonl --base-url https://api.openai.com --rpm 500 --tpm 200000
//! ratebucket batch examples/batch.jsonl --sim
//! ```
//!
//! Exit status: 0 when every line has a successful record, 3 when some lines failed (their
//! count by class is in the summary: those the provider never took, unreachable or
//! throttled until retries ran out, are left for the next run, which sends them again;
//! refusals are recorded), 1 when the run stopped early (the provider refused the account,
//! stayed unreachable longer than `--give-up-after`, or the output could not be written;
//! run again to continue), 130 after Ctrl-C, 2 for bad arguments or input.

mod batch;
mod input;
mod progress;
mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

/// How far back a resumed run replays the journal's sends to seed its limiter.
const RECENT: Duration = Duration::from_secs(24 * 60 * 60);

use clap::{Args, Parser, Subcommand};
use ratebucket_http::dialect::Dialect;
use ratebucket_openai::Limits;
use ratebucket_sim::{LimitSpec, Sim, SimConfig, SimHandle};

use crate::batch::{Halt, Report, Runner, Settings, Stats};
use crate::input::{Line, Target};
use crate::progress::{Progress, human};
use crate::store::{Store, journal_path};

#[derive(Parser)]
#[command(
    name = "ratebucket",
    version,
    about = "Pace calls to rate-limited APIs."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a Batch API input file against an OpenAI-compatible endpoint, resumably.
    Batch(BatchArgs),
}

#[derive(Args)]
struct BatchArgs {
    /// The requests: JSON lines in the OpenAI Batch API's input format.
    input: PathBuf,
    /// Where the results go, in the Batch API's output format (default: INPUT's name with
    /// `.output.jsonl`). A journal is kept beside it; re-running skips finished lines.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// The endpoint: `https://api.openai.com`, an Azure resource, any compatible server.
    #[arg(long, env = "OPENAI_BASE_URL")]
    base_url: Option<String>,
    /// The API key (default: the OPENAI_API_KEY environment variable).
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Sends to this Azure OpenAI deployment of the resource at --base-url.
    #[arg(long)]
    azure_deployment: Option<String>,
    /// The Azure OpenAI API version.
    #[arg(long, default_value = "2024-10-21")]
    api_version: String,
    /// Requests per window (per minute unless --window says otherwise); learned from the
    /// provider's headers when not given.
    #[arg(long)]
    rpm: Option<u64>,
    /// Tokens per window; learned from the provider's headers when not given.
    #[arg(long)]
    tpm: Option<u64>,
    /// The window the limits count over, in seconds.
    #[arg(long)]
    window: Option<f64>,
    /// The provider's dialect of rate-limit signals: openai, azure, gemini, groq, cerebras,
    /// openrouter or ietf. Unset, one is recognised from the replies where that is
    /// unambiguous, and OpenAI's read otherwise (Groq's per-day `x-ratelimit-*-requests`
    /// need `--dialect groq`).
    #[arg(long, value_parser = parse_dialect)]
    dialect: Option<&'static Dialect>,
    /// Requests waiting for quota or in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Sends again the lines a previous run recorded as ambiguous (they may have been
    /// executed and billed), and retries ambiguous failures in this run.
    #[arg(long)]
    retry_ambiguous: bool,
    /// The completion limit assumed for a request that sets none.
    #[arg(long, default_value_t = 4096)]
    default_max_tokens: u64,
    /// Seconds to wait for one answer.
    #[arg(long, default_value_t = 600.0)]
    read_timeout: f64,
    /// A PEM file of root certificates to trust beside the bundled ones: a private CA (a
    /// self-hosted server, a company's TLS proxy).
    #[arg(long, value_name = "FILE")]
    ca_cert: Option<PathBuf>,
    /// Seconds the provider may answer nothing at all (unreachable, refused connections,
    /// untrusted certificates) before the run stops, keeping everything for the next.
    #[arg(long, default_value_t = 300.0)]
    give_up_after: f64,
    /// Prints nothing but errors.
    #[arg(short, long)]
    quiet: bool,
    /// Writes the library's spans and events to stderr, filtered as `RUST_LOG` is
    /// (`ratebucket=debug`: every attempt, its class and wait, every pause). Without it,
    /// `RUST_LOG` is read when set.
    #[arg(long, value_name = "FILTER")]
    log: Option<String>,
    /// Prints the estimated tokens and the time the limits imply, and sends nothing.
    #[arg(long)]
    dry_run: bool,
    /// Runs against the fake provider, started in this process (no key needed).
    #[arg(long)]
    sim: bool,
}

/// A dialect by name, for `--dialect`.
fn parse_dialect(name: &str) -> Result<&'static Dialect, String> {
    Dialect::named(name).ok_or_else(|| {
        let names: Vec<&str> = ratebucket_http::dialect::ALL
            .iter()
            .map(|d| d.name)
            .collect();
        format!("no dialect {name:?}; one of {}", names.join(", "))
    })
}

fn main() -> ExitCode {
    let Command::Batch(args) = Cli::parse().command;
    match batch(args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("ratebucket batch: {message}");
            ExitCode::from(2)
        }
    }
}

/// The fake provider's limits for `--sim`: per second, so the example runs in seconds.
const SIM_WINDOW: Duration = Duration::from_secs(1);
const SIM_RPM: u64 = 60;
const SIM_TPM: u64 = 40_000;

fn batch(args: BatchArgs) -> Result<ExitCode, String> {
    if args.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
    }
    if args.rpm == Some(0) || args.tpm == Some(0) {
        return Err("--rpm and --tpm must be above 0".into());
    }
    let window = match args.window {
        Some(secs) => Duration::try_from_secs_f64(secs)
            .ok()
            .filter(|w| !w.is_zero())
            .ok_or("--window must be a positive number of seconds")?,
        None if args.sim => SIM_WINDOW,
        None => Duration::from_secs(60),
    };
    let read_timeout = Duration::try_from_secs_f64(args.read_timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .ok_or("--read-timeout must be a positive number of seconds")?;
    let give_up_after = Duration::try_from_secs_f64(args.give_up_after)
        .map_err(|_| "--give-up-after must be a non-negative number of seconds")?;
    let logging = start_logging(args.log.as_deref())?;
    let lines = input::read(&args.input).map_err(|e| e.to_string())?;
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| default_output(&args.input));
    let limits = Limits {
        requests_per_minute: args.rpm,
        tokens_per_minute: args.tpm,
        window,
        ..Limits::default()
    };
    if args.dry_run {
        dry_run(&lines, &limits, args.default_max_tokens);
        return Ok(ExitCode::SUCCESS);
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    // Kept alive for the whole run.
    let sim: Option<SimHandle> = if args.sim {
        let config = SimConfig::default()
            .rpm(LimitSpec::per_minute(SIM_RPM).window(SIM_WINDOW))
            .tpm(LimitSpec::per_minute(SIM_TPM).window(SIM_WINDOW));
        let sim = Sim::start(config).map_err(|e| format!("cannot start the fake provider: {e}"))?;
        if !args.quiet {
            eprintln!(
                "fake provider at {}: {SIM_RPM} requests and {SIM_TPM} tokens per {} window",
                sim.base_url(),
                human(SIM_WINDOW)
            );
        }
        Some(sim)
    } else {
        None
    };
    let target = match (&sim, &args.base_url, &args.azure_deployment) {
        (Some(sim), _, _) => Target::OpenAi(sim.base_url()),
        (None, Some(base), Some(deployment)) => Target::Azure {
            resource: base.clone(),
            deployment: deployment.clone(),
            api_version: args.api_version.clone(),
        },
        (None, Some(base), None) => Target::OpenAi(base.clone()),
        (None, None, _) => {
            return Err(
                "give --base-url (or OPENAI_BASE_URL), or --sim for the fake provider".into(),
            );
        }
    };
    let key = args
        .api_key
        .clone()
        .or_else(|| sim.as_ref().map(|_| "sk-sim".to_owned()));

    let (store, resume) = Store::open(&output, args.retry_ambiguous)
        .map_err(|e| format!("cannot open {}: {e}", output.display()))?;
    let store = Arc::new(store);
    let pending: Vec<Line> = lines
        .iter()
        .filter(|l| !resume.finished.contains(&l.custom_id))
        .cloned()
        .collect();
    let skipped = lines.len() - pending.len();
    if !args.quiet && (skipped > 0 || resume.retried > 0) {
        eprintln!(
            "resuming {}: {skipped} line(s) already have a record ({} of them marked ambiguous now: in flight when the previous run stopped), {} ambiguous line(s) sent again",
            output.display(),
            resume.marked_ambiguous,
            resume.retried
        );
    }
    if pending.is_empty() {
        if !args.quiet {
            println!(
                "nothing to send: every line of {} has its record in {}",
                args.input.display(),
                output.display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let total = pending.len() as u64;
    let mean_upper = pending
        .iter()
        .map(|l| l.upper_bound(args.default_max_tokens))
        .sum::<u64>()
        .checked_div(total)
        .unwrap_or(0);
    // What previous runs sent in the last day: where the limiter's buckets stand, and what
    // the provider may still be counting.
    let upper_of: HashMap<&str, u64> = lines
        .iter()
        .map(|l| (l.custom_id.as_str(), l.upper_bound(args.default_max_tokens)))
        .collect();
    let recent = resume
        .recent(RECENT, SystemTime::now())
        .into_iter()
        .map(|(send, ago)| {
            let tokens = resume
                .usage
                .get(&send.id)
                .or_else(|| upper_of.get(send.id.as_str()))
                .copied()
                .unwrap_or(args.default_max_tokens);
            (ago, [1, tokens])
        })
        .collect();
    let settings = Settings {
        target,
        key,
        limits,
        concurrency: args.concurrency,
        retry_ambiguous: args.retry_ambiguous,
        default_max_tokens: args.default_max_tokens,
        read_timeout,
        ca_cert: args.ca_cert.clone(),
        give_up_after,
        recent,
        dialect: args.dialect,
    };
    let quiet = args.quiet;
    let limits_known = args.rpm.is_some() && args.tpm.is_some();
    let report = runtime.block_on(async move {
        let (stopper, stop) = tokio::sync::watch::channel(0u8);
        let stats = Arc::new(Stats::default());
        let runner = Arc::new(Runner::new(settings, Arc::clone(&store), Arc::clone(&stats), stop.clone())?);
        let progress = Progress::new(total, quiet, logging);
        let (stop_showing, showing) = tokio::sync::watch::channel(false);
        let shower = tokio::spawn(batch::show(
            progress,
            Arc::clone(&runner),
            total,
            mean_upper,
            limits_known,
            showing,
        ));
        let interrupts = tokio::spawn(async move {
            let mut interrupted = Interrupts::new();
            for level in 1..=2u8 {
                if !interrupted.next().await {
                    return;
                }
                let _ = stopper.send(level);
                if level == 1 && !quiet {
                    eprintln!(
                        "\nstopping: nothing more is sent; waiting for the requests in flight (Ctrl-C again to abandon them, recorded as ambiguous)"
                    );
                }
            }
        });
        let report = Arc::clone(&runner).run(pending, stop).await;
        interrupts.abort();
        let _ = stop_showing.send(true);
        let _progress = shower.await.map_err(|e| e.to_string())?;
        Ok::<_, String>((report, runner, stats))
    })?;
    let (report, runner, stats) = report;
    if !args.quiet {
        summary(&lines, skipped, &output, &report, &runner, &stats, window);
    }
    drop(runner);
    let (recorded_failures, unfinished) = stats.failed();
    Ok(match report.halt {
        None if recorded_failures + unfinished == 0 => ExitCode::SUCCESS,
        None => {
            if unfinished > 0 {
                eprintln!(
                    "ratebucket batch: {unfinished} line(s) left unfinished (the provider did not take them); run the same command again to send them"
                );
            }
            ExitCode::from(3)
        }
        Some(Halt::Interrupted) => ExitCode::from(130),
        Some(Halt::Fatal(message)) => {
            eprintln!(
                "ratebucket batch: stopped: {message}; run the same command again to continue"
            );
            ExitCode::from(1)
        }
        Some(Halt::Outage(since)) => {
            eprintln!(
                "ratebucket batch: stopped: the provider has answered nothing for {}; everything is kept; run the same command again to continue once it is reachable",
                human(since)
            );
            ExitCode::from(1)
        }
        Some(Halt::Store(e)) => {
            eprintln!("ratebucket batch: stopped: the output or journal could not be written: {e}");
            ExitCode::from(1)
        }
    })
}

/// Log output on stderr when asked for (`--log FILTER`, or `RUST_LOG`); whether it is on.
fn start_logging(filter: Option<&str>) -> Result<bool, String> {
    use tracing_subscriber::EnvFilter;
    let filter = match filter {
        Some(filter) => EnvFilter::try_new(filter).map_err(|e| format!("--log {filter}: {e}"))?,
        None => match std::env::var("RUST_LOG") {
            Ok(filter) if !filter.is_empty() => {
                EnvFilter::try_new(&filter).map_err(|e| format!("RUST_LOG={filter}: {e}"))?
            }
            _ => return Ok(false),
        },
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .try_init()
        .map_err(|e| format!("cannot start the log: {e}"))?;
    Ok(true)
}

/// Ctrl-C, as a stream: one listener for the whole run, so a second press that comes
/// right after the first is not missed.
struct Interrupts {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Interrupts {
    fn new() -> Interrupts {
        Interrupts {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok(),
        }
    }

    /// The next Ctrl-C; `false` if none can be received.
    async fn next(&mut self) -> bool {
        #[cfg(unix)]
        {
            match &mut self.signal {
                Some(signal) => signal.recv().await.is_some(),
                None => false,
            }
        }
        #[cfg(not(unix))]
        {
            tokio::signal::ctrl_c().await.is_ok()
        }
    }
}

/// `batch.jsonl` → `batch.output.jsonl`, beside it.
fn default_output(input: &Path) -> PathBuf {
    let stem = input
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "batch".into());
    input.with_file_name(format!("{stem}.output.jsonl"))
}

/// The time a provider with these limits needs for `used` against `limit` per `window`,
/// starting with a full window's worth.
fn time_for(used: u64, limit: u64, window: Duration) -> Duration {
    let windows = used.saturating_sub(limit) as f64 / limit.max(1) as f64;
    Duration::try_from_secs_f64(window.as_secs_f64() * windows).unwrap_or(Duration::MAX)
}

fn dry_run(lines: &[Line], limits: &Limits, default_max_tokens: u64) {
    let requests = lines.len() as u64;
    let prompt: u64 = lines.iter().map(|l| l.prompt_tokens).sum();
    let upper: u64 = lines
        .iter()
        .map(|l| l.upper_bound(default_max_tokens))
        .sum();
    println!(
        "{requests} requests; tokens: about {prompt} in prompts (four characters a token), up to {upper} with every completion at its limit"
    );
    let window = human(limits.window);
    match (limits.requests_per_minute, limits.tokens_per_minute) {
        (None, None) => println!(
            "limits not given: they are learned from the provider's headers; give --rpm and --tpm for a time estimate"
        ),
        (rpm, tpm) => {
            let sustained = |used: u64, limit: Option<u64>| {
                limit.map_or(Duration::ZERO, |l| {
                    let secs = limits.window.as_secs_f64() * used as f64 / l as f64;
                    Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
                })
            };
            let burst = |used: u64, limit: Option<u64>| {
                limit.map_or(Duration::ZERO, |l| time_for(used, l, limits.window))
            };
            println!(
                "at {} requests and {} tokens per {window}: {} at the sustained rate ({} if every completion reaches its limit); as little as {} against a provider that starts with a full window's worth",
                rpm.map_or("unlimited".into(), |l| l.to_string()),
                tpm.map_or("unlimited".into(), |l| l.to_string()),
                human(sustained(requests, rpm).max(sustained(prompt, tpm))),
                human(sustained(requests, rpm).max(sustained(upper, tpm))),
                human(burst(requests, rpm).max(burst(prompt, tpm))),
            );
        }
    }
    println!("nothing was sent (--dry-run)");
}

fn summary(
    lines: &[Line],
    skipped: usize,
    output: &Path,
    report: &Report,
    runner: &Runner,
    stats: &Stats,
    window: Duration,
) {
    let by_kind = |map: &std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>| {
        let map = map.lock().unwrap_or_else(|e| e.into_inner());
        let kinds: Vec<String> = map.iter().map(|(k, n)| format!("{n} {k}")).collect();
        (map.values().sum::<u64>(), kinds.join(", "))
    };
    let (_, recorded) = by_kind(&stats.outcomes);
    let (unfinished, left) = by_kind(&stats.unfinished);
    let done = stats.done.load(Ordering::Relaxed);
    println!(
        "ratebucket batch: {} lines; this run recorded {done} ({}), {skipped} already recorded",
        lines.len(),
        if recorded.is_empty() {
            "none"
        } else {
            &recorded
        },
    );
    if unfinished > 0 {
        println!("left for the next run: {unfinished} ({left}), not recorded");
    }
    // The bound at the limits in force at the end (given, or learned): a provider that
    // starts with a full window's worth of each.
    let snapshot = runner.limiter().snapshot();
    let used = [done, stats.charged.load(Ordering::Relaxed)];
    let bound = snapshot
        .dimensions
        .iter()
        .zip(used)
        .map(|(dim, used)| {
            let per_window = (dim.state.rate.per_second_f64() * window.as_secs_f64()) as u64;
            time_for(used, per_window, window)
        })
        .max()
        .unwrap_or_default();
    // A resumed run meets a provider that is not full (the previous run spent its
    // window), so its bound is the sustained rate for the lines it sent.
    let sustained = snapshot
        .dimensions
        .iter()
        .zip(used)
        .map(|(dim, used)| {
            let per_second = dim.state.rate.per_second_f64();
            Duration::try_from_secs_f64(used as f64 / per_second).unwrap_or(Duration::MAX)
        })
        .max()
        .unwrap_or_default();
    let (bound, basis) = if skipped > 0 {
        (
            sustained,
            "at the sustained rate of the limits in force (a resumed run)",
        )
    } else {
        (bound, "at the limits in force")
    };
    let makespan = report.makespan;
    let ratio = if bound.is_zero() {
        " (within one window's burst)".to_owned()
    } else {
        format!(" ({:.2}x)", makespan.as_secs_f64() / bound.as_secs_f64())
    };
    println!(
        "makespan {}; lower bound {} {basis}{ratio}; 429s {}; tokens {}",
        human(makespan),
        human(bound),
        stats.throttled.load(Ordering::Relaxed),
        stats.tokens.load(Ordering::Relaxed),
    );
    println!(
        "output {} (journal {})",
        output.display(),
        journal_path(output).display()
    );
}

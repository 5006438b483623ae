//! `ratebucket batch`: runs a file of OpenAI Batch API requests against any
//! OpenAI-compatible endpoint, or of Anthropic Message Batches requests against Anthropic's
//! Messages API, as fast as its limits allow, resumable after a crash, each request sent
//! once.
//!
//! ```text
//! ratebucket batch INPUT.jsonl -o OUTPUT.jsonl --base-url https://api.openai.com --rpm 500 --tpm 200000
//! ratebucket batch REQUESTS.jsonl --rpm 50 --itpm 40000 --otpm 8000   # Anthropic
//! ratebucket batch INPUT.jsonl --budget 20/day --prices prices.json     # at most $20 a day
//! ratebucket batch examples/batch.jsonl --sim
//! ```
//!
//! Exit status: 0 when every line has a successful record, 3 when some lines failed (their
//! count by class is in the summary: those the provider never took, unreachable or
//! throttled until retries ran out, are left for the next run, which sends them again;
//! refusals are recorded), 1 when the run stopped early (the provider refused the account,
//! stayed unreachable longer than `--give-up-after`, or the output could not be written;
//! run again to continue), 130 after Ctrl-C, 2 for bad arguments or input.

mod api;
mod batch;
mod input;
mod outcome;
mod parse;
mod progress;
mod spend;
mod store;
mod summary;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// How far back a resumed run replays the journal's sends to seed its limiter.
const RECENT: Duration = Duration::from_secs(24 * 60 * 60);

use clap::{Args, Parser, Subcommand};
use ratebucket_http::dialect::Dialect;
use ratebucket_openai::Limits;
use ratebucket_rt::core::Priority;
use ratebucket_sim::{LimitSpec, Sim, SimConfig, SimHandle};

use crate::api::{Api, Quota};
use crate::batch::{Halt, Runner, Settings, Stats};
use crate::input::{Line, Target};
use crate::parse::{parse_cap, parse_dialect, parse_priority, parse_weight};
use crate::progress::{Progress, human};
use crate::store::Store;

#[derive(Parser)]
#[command(name = "ratebucket", version, about = "Pace calls to rate-limited APIs.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a batch file resumably: OpenAI Batch API lines against an OpenAI-compatible
    /// endpoint, or Anthropic Message Batches requests against the Messages API.
    Batch(BatchArgs),
}

#[derive(Args)]
struct BatchArgs {
    /// The requests: JSON lines in the OpenAI Batch API's input format
    /// (`{"custom_id", "method", "url", "body"}`), or Anthropic's Message Batches requests
    /// (`{"custom_id", "params"}`, one per line). The first line says which.
    input: PathBuf,
    /// Where the results go, in the input's API's output format: Batch API output records,
    /// or Message Batches results (default: INPUT's name with `.output.jsonl`). A journal
    /// is kept beside it; re-running skips finished lines.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// The endpoint: `https://api.openai.com`, an Azure resource, any compatible server
    /// (default: OPENAI_BASE_URL); for Anthropic requests, ANTHROPIC_BASE_URL or
    /// `https://api.anthropic.com`.
    #[arg(long)]
    base_url: Option<String>,
    /// The API key (default: OPENAI_API_KEY, or ANTHROPIC_API_KEY for Anthropic requests).
    #[arg(long)]
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
    /// Tokens per window (for Anthropic requests: input and output tokens together, for a
    /// server that counts them as one limit); learned from the provider's headers when not
    /// given.
    #[arg(long)]
    tpm: Option<u64>,
    /// Input tokens per window, for Anthropic requests; learned when not given.
    #[arg(long)]
    itpm: Option<u64>,
    /// Output tokens per window, for Anthropic requests; learned when not given.
    #[arg(long)]
    otpm: Option<u64>,
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
    /// The completion limit assumed for an OpenAI request that sets none.
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
    /// The priority class of the lines that name none (`interactive`, `default` or
    /// `batch`): a line's own `"priority"` field wins. Within one run, lines of a higher
    /// class are granted first, and lower classes age so their wait stays bounded.
    #[arg(long, default_value = "default", value_parser = parse_priority)]
    priority: Priority,
    /// A tenant's weight in the fair share of the quota, as `TENANT=WEIGHT` (repeatable;
    /// every tenant weighs 1 unless given). A line names its tenant with a `"tenant"` field
    /// (a number); lines that name none are tenant 0.
    #[arg(long, value_name = "TENANT=WEIGHT", value_parser = parse_weight)]
    weight: Vec<(u32, u32)>,
    /// A tenant's cap, as `TENANT=SHARE` (repeatable): its lines take at most that share
    /// (within (0, 1]) of every limit, and wait apart when the cap is spent, never ahead
    /// of another tenant's.
    #[arg(long, value_name = "TENANT=SHARE", value_parser = parse_cap)]
    cap: Vec<(u32, f64)>,
    /// A budget in dollars, as `DOLLARS/day` or `DOLLARS/month` (renewed at midnight UTC,
    /// or on the first): each line reserves its highest price and is charged what its
    /// usage cost; once the budget cannot cover a line the run stops, everything kept, and
    /// says when to resume. Earlier runs' spending of the period counts. Needs `--prices`.
    #[arg(long, value_name = "DOLLARS/PERIOD", value_parser = spend::parse_budget, requires = "prices")]
    budget: Option<(f64, ratebucket_rt::core::Period)>,
    /// The models' prices for `--budget`: a JSON object from model names to
    /// `{"input", "output"}` (and optionally `"cached_input"`, `"cache_write"`), in dollars
    /// per million tokens.
    #[arg(long, value_name = "FILE", requires = "budget")]
    prices: Option<PathBuf>,
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
const SIM_ITPM: u64 = 30_000;
const SIM_OTPM: u64 = 8_000;

/// Where Anthropic requests go when no base URL is given.
const ANTHROPIC_URL: &str = "https://api.anthropic.com";

/// The limits told for `api`, after checking that each given applies to it.
fn quota(args: &BatchArgs, api: Api, window: Duration) -> Result<Quota, String> {
    let zero = [args.rpm, args.tpm, args.itpm, args.otpm].contains(&Some(0));
    if zero {
        return Err("--rpm, --tpm, --itpm and --otpm must be above 0".into());
    }
    Ok(match api {
        Api::OpenAi => {
            if args.itpm.is_some() || args.otpm.is_some() {
                return Err(
                    "--itpm and --otpm are for Anthropic requests; this input is OpenAI's Batch API format (give --tpm)".into(),
                );
            }
            Quota::OpenAi(Limits {
                requests_per_minute: args.rpm,
                tokens_per_minute: args.tpm,
                window,
                ..Limits::default()
            })
        }
        Api::Anthropic => {
            if args.azure_deployment.is_some() {
                return Err("--azure-deployment is for OpenAI requests, not Anthropic's".into());
            }
            if args.dialect.is_some_and(|d| d.name != "anthropic") {
                return Err(
                    "Anthropic requests are read in Anthropic's dialect: drop --dialect".into()
                );
            }
            Quota::Anthropic(
                ratebucket_anthropic::Limits {
                    requests_per_minute: args.rpm,
                    input_tokens_per_minute: args.itpm,
                    output_tokens_per_minute: args.otpm,
                    tokens_per_minute: args.tpm,
                    ..ratebucket_anthropic::Limits::default()
                }
                .window(window),
            )
        }
    })
}

fn batch(args: BatchArgs) -> Result<ExitCode, String> {
    if args.concurrency == 0 {
        return Err("--concurrency must be at least 1".into());
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
    let (api, lines) = input::read(&args.input).map_err(|e| e.to_string())?;
    let limits = quota(&args, api, window)?;
    let output = args.output.clone().unwrap_or_else(|| default_output(&args.input));
    if args.dry_run {
        summary::dry_run(api, &lines, &limits, args.default_max_tokens);
        return Ok(ExitCode::SUCCESS);
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    // Kept alive for the whole run.
    let sim: Option<SimHandle> = if args.sim {
        let limit = |n| LimitSpec::per_minute(n).window(SIM_WINDOW);
        let (config, told) = match api {
            Api::OpenAi => (
                SimConfig::default().rpm(limit(SIM_RPM)).tpm(limit(SIM_TPM)),
                format!("{SIM_RPM} requests and {SIM_TPM} tokens"),
            ),
            Api::Anthropic => (
                SimConfig::default()
                    .dialect(ratebucket_sim::Dialect::Anthropic)
                    .rpm(limit(SIM_RPM))
                    .itpm(limit(SIM_ITPM))
                    .otpm(limit(SIM_OTPM)),
                format!("{SIM_RPM} requests, {SIM_ITPM} input and {SIM_OTPM} output tokens"),
            ),
        };
        let sim = Sim::start(config).map_err(|e| format!("cannot start the fake provider: {e}"))?;
        if !args.quiet {
            eprintln!(
                "fake provider at {}: {told} per {} window",
                sim.base_url(),
                human(SIM_WINDOW)
            );
        }
        Some(sim)
    } else {
        None
    };
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let base_url = args.base_url.clone().or_else(|| match api {
        Api::OpenAi => from_env("OPENAI_BASE_URL"),
        Api::Anthropic => from_env("ANTHROPIC_BASE_URL"),
    });
    let target = match (&sim, api, base_url, &args.azure_deployment) {
        (Some(sim), Api::OpenAi, _, _) => Target::OpenAi(sim.base_url()),
        (Some(sim), Api::Anthropic, _, _) => Target::Anthropic(sim.base_url()),
        (None, Api::Anthropic, base, _) => {
            Target::Anthropic(base.unwrap_or_else(|| ANTHROPIC_URL.to_owned()))
        }
        (None, Api::OpenAi, Some(base), Some(deployment)) => Target::Azure {
            resource: base,
            deployment: deployment.clone(),
            api_version: args.api_version.clone(),
        },
        (None, Api::OpenAi, Some(base), None) => Target::OpenAi(base),
        (None, Api::OpenAi, None, _) => {
            return Err(
                "give --base-url (or OPENAI_BASE_URL), or --sim for the fake provider".into()
            );
        }
    };
    let key =
        args.api_key.clone().or_else(|| sim.as_ref().map(|_| "sk-sim".to_owned())).or_else(|| {
            match api {
                Api::OpenAi => from_env("OPENAI_API_KEY"),
                Api::Anthropic => from_env("ANTHROPIC_API_KEY"),
            }
        });

    let (store, resume) = Store::open(&output, args.retry_ambiguous, api)
        .map_err(|e| format!("cannot open {}: {e}", output.display()))?;
    let store = Arc::new(store);
    let pending: Vec<Line> =
        lines.iter().filter(|l| !resume.finished.contains(&l.custom_id)).cloned().collect();
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
    let max_tokens = args.default_max_tokens;
    // Per token dimension, the mean a pending line reserves.
    let mean_upper: Vec<u64> = (1..api.dimensions())
        .map(|d| {
            let sum: u64 = pending.iter().map(|l| l.cost(api, max_tokens)[d]).sum();
            sum.checked_div(total).unwrap_or(0)
        })
        .collect();
    // What previous runs sent in the last day: where the limiter's buckets stand, and what
    // the provider may still be counting (each send's usage as recorded, or what its line
    // reserves).
    let upper_of: HashMap<&str, Vec<u64>> = lines
        .iter()
        .map(|l| (l.custom_id.as_str(), l.cost(api, max_tokens)[1..].to_vec()))
        .collect();
    let unknown = Line {
        custom_id: String::new(),
        url: String::new(),
        body: bytes::Bytes::new(),
        prompt_tokens: 0,
        max_tokens: None,
        choices: 1,
        tenant: 0,
        priority: None,
    }
    .cost(api, max_tokens)[1..]
        .to_vec();
    let recent = resume
        .recent(RECENT, SystemTime::now())
        .into_iter()
        .map(|(send, ago)| {
            let tokens = resume
                .usage
                .get(&send.id)
                .or_else(|| upper_of.get(send.id.as_str()))
                .unwrap_or(&unknown);
            let cost = std::iter::once(1).chain(tokens.iter().copied()).collect();
            (ago, cost)
        })
        .collect();
    let budget = match (args.budget, &args.prices) {
        (Some((dollars, period)), Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--prices {}: {e}", path.display()))?;
            let prices = ratebucket_http::price::Prices::from_json(&text)
                .map_err(|e| format!("--prices {}: {e}", path.display()))?;
            // A line the table cannot price could never be held to the budget.
            for line in &pending {
                spend::price_of(line, &prices)?;
            }
            let spend = ratebucket_http::price::Spend::new(dollars, period, prices);
            let by_id: HashMap<&str, &Line> =
                lines.iter().map(|l| (l.custom_id.as_str(), l)).collect();
            let spent = spend::spent_before(&resume, &by_id, &spend, max_tokens, SystemTime::now());
            Some(spend::Budgeted { dimension: api.dimensions(), spend, spent })
        }
        _ => None,
    };
    let settings = Settings {
        budget,
        api,
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
        priority: args.priority,
        weights: args.weight.clone(),
        caps: args.cap.clone(),
    };
    let quiet = args.quiet;
    let limits_known = limits.given().iter().all(Option::is_some);
    let report = runtime.block_on(async move {
        let (stopper, stop) = tokio::sync::watch::channel(0u8);
        let stats = Arc::new(Stats::default());
        let runner = Arc::new(Runner::new(settings, Arc::clone(&store), Arc::clone(&stats), stop.clone())?);
        let progress = Progress::new(total, quiet, logging);
        let (stop_showing, showing) = tokio::sync::watch::channel(false);
        let shower = tokio::spawn(progress::show(
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
        summary::summary(&lines, skipped, &output, &report, &runner, &stats, window);
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

//! `ratebucket-sim`: run the fake provider from the command line.

use std::time::Duration;

use clap::Parser;
use ratebucket_sim::{
    Charging, Dialect, FaultRule, Headers, Latency, LimitSpec, Model, Resets, Sim, SimConfig,
};

/// A fake OpenAI-compatible provider with real rate limits, on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Requests allowed per window.
    #[arg(long)]
    rpm: Option<u64>,
    /// Tokens allowed per window (with `--dialect anthropic`: input and output tokens
    /// together, sent as `anthropic-ratelimit-tokens-*` beside the requests only).
    #[arg(long)]
    tpm: Option<u64>,
    /// Input tokens allowed per window (`--dialect anthropic`).
    #[arg(long)]
    itpm: Option<u64>,
    /// Output tokens allowed per window (`--dialect anthropic`), reserved at `max_tokens`
    /// and settled to what was produced.
    #[arg(long)]
    otpm: Option<u64>,
    /// Requests allowed per day (per `--day` seconds).
    #[arg(long)]
    rpd: Option<u64>,
    /// The length of the day `--rpd` counts over, in seconds (shorter for a test).
    #[arg(long, default_value_t = 86_400.0)]
    day: f64,
    /// Whose rate-limit signals to speak.
    #[arg(long, value_enum, default_value = "openai")]
    dialect: Dialect,
    /// How limits are enforced.
    #[arg(long, value_enum, default_value = "token-bucket")]
    model: Model,
    /// Window length in seconds.
    #[arg(long, default_value_t = 60.0)]
    window: f64,
    /// How tokens are charged.
    #[arg(long, value_enum, default_value = "reserve-max-tokens")]
    charging: Charging,
    /// Which rate-limit headers are sent.
    #[arg(long, value_enum, default_value = "full")]
    headers: Headers,
    /// How finely resets are written: as the dialect's provider writes them, or finer
    /// (kinder than any provider).
    #[arg(long, value_enum, default_value = "as-provider")]
    resets: Resets,
    /// A fault to inject, `NAME[=ARG][@WHEN]` (repeatable): NAME one of status=CODE,
    /// overloaded=SECS, rate-limited=SECS, reset, stall=SECS, cut, error-chunk,
    /// insufficient-quota, unauthorized, too-large, stall-after-head=SECS,
    /// stall-mid-stream=SECS, error-in-200, absurd-usage, flood=BYTES, stream-rate-limit,
    /// stream-overloaded, stream-error-after-content, spend-limit, usage-limit,
    /// capacity-exceeded, retry-after-in-message=SECS, apim-rate-limit=SECS,
    /// long-retry-after=SECS; WHEN `every` (the default), `first` (each body's first
    /// arrival), a probability (`0.05`) or request numbers (`0,3,7`).
    #[arg(long = "fault", value_name = "FAULT")]
    faults: Vec<FaultRule>,
    /// Fixed answer latency in milliseconds.
    #[arg(long, default_value_t = 20)]
    latency_ms: u64,
    /// Seed for every draw.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The most requests in flight at once; one more is refused with a 429 that says
    /// "Concurrency limit exceeded".
    #[arg(long)]
    max_concurrent: Option<usize>,
    /// The most the requests arriving per second may rise above the second before's; one
    /// more is refused with a 429 naming a rate-of-change limit.
    #[arg(long)]
    max_ramp: Option<u64>,
    /// Require this API key.
    #[arg(long)]
    api_key: Option<String>,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let window = Duration::try_from_secs_f64(args.window)
        .ok()
        .filter(|w| !w.is_zero() && *w <= Duration::from_nanos(1 << 53))
        .ok_or("--window must be a positive number of seconds, at most 104 days")?;
    let day = Duration::try_from_secs_f64(args.day)
        .ok()
        .filter(|w| !w.is_zero() && *w <= Duration::from_nanos(1 << 53))
        .ok_or("--day must be a positive number of seconds, at most 104 days")?;
    let spec = |limit| LimitSpec::per_minute(limit).window(window).model(args.model);
    let mut config = SimConfig::default()
        .charging(args.charging)
        .headers(args.headers)
        .dialect(args.dialect)
        .resets(args.resets)
        .latency(Latency::Fixed(Duration::from_millis(args.latency_ms)))
        .seed(args.seed);
    config.addr.set_port(args.port);
    if let Some(rpm) = args.rpm {
        config = config.rpm(spec(rpm));
    }
    if let Some(tpm) = args.tpm {
        config = config.tpm(spec(tpm));
    }
    if let Some(itpm) = args.itpm {
        config = config.itpm(spec(itpm));
    }
    if let Some(otpm) = args.otpm {
        config = config.otpm(spec(otpm));
    }
    if let Some(rpd) = args.rpd {
        config = config.rpd(LimitSpec::per_minute(rpd).window(day).model(args.model));
    }
    if let Some(max) = args.max_concurrent {
        config = config.max_concurrent(max);
    }
    if let Some(slope) = args.max_ramp {
        config = config.max_ramp(slope);
    }
    for rule in args.faults {
        config = config.fault(rule.fault, rule.trigger);
    }
    if let Some(key) = args.api_key {
        config = config.api_key(key);
    }
    let sim = Sim::start(config)?;
    println!("ratebucket-sim listening on {}", sim.base_url());
    let path = match args.dialect {
        Dialect::Anthropic => "/v1/messages",
        _ => "/v1/chat/completions",
    };
    println!("POST {}{path}; Ctrl-C to stop", sim.base_url());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(tokio::signal::ctrl_c())?;
    let log = sim.log();
    let admitted = log.iter().filter(|e| e.admitted).count();
    println!("{} requests, {admitted} admitted", log.len());
    sim.shutdown();
    Ok(())
}

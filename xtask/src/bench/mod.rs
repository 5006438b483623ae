//! `cargo xtask bench`: the same batches through four engines against the same fake
//! provider, side by side; writes `bench/results.json` and `bench/timeline.png`.
//!
//! Windows are shortened to a quarter of a second so a run takes minutes, not hours; every
//! limit is "per window". Draws are seeded by request content, so every engine is served
//! the same completions and reruns match.

mod engines;
mod plot;
mod shared;
mod tenants;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use ratebucket_openai::{CharsPerToken, ChatRequest, Message, TokenEstimator};
use ratebucket_sim::{
    Charging, Dialect as SimDialect, Fault, FaultRule, Headers, Latency, LimitSpec, LogEntry,
    Model, Sim, SimConfig, Trigger,
};
use serde::Serialize;

pub(crate) use engines::{Engine, post};

/// The window every limit is counted over (a minute, compressed).
const WINDOW: Duration = Duration::from_millis(250);

/// One batch and the provider it meets.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Scenario {
    pub(crate) name: &'static str,
    pub(crate) description: &'static str,
    /// The provider's real limits, per window.
    pub(crate) provider_rpm: Option<u64>,
    pub(crate) provider_tpm: Option<u64>,
    /// What every engine is told the limits are.
    pub(crate) told_rpm: Option<u64>,
    pub(crate) told_tpm: Option<u64>,
    #[serde(skip)]
    pub(crate) charging: Charging,
    pub(crate) requests: usize,
    pub(crate) max_tokens: u64,
    pub(crate) completion_tokens: (u64, u64),
    #[serde(serialize_with = "secs")]
    pub(crate) latency: Duration,
    #[serde(skip)]
    pub(crate) faults: Vec<FaultRule>,
    #[serde(serialize_with = "secs")]
    pub(crate) read_timeout: Duration,
    #[serde(serialize_with = "secs")]
    pub(crate) window: Duration,
    /// How the provider enforces its limits.
    #[serde(serialize_with = "model_name")]
    pub(crate) model: Model,
    /// Which rate-limit headers the provider sends.
    #[serde(serialize_with = "headers_name")]
    pub(crate) headers: Headers,
    /// How far into the provider's first window the batch starts.
    #[serde(serialize_with = "secs")]
    pub(crate) start_offset: Duration,
    /// Whose dialect the provider speaks (ratebucket is told it; the peers read no
    /// headers of any dialect).
    #[serde(serialize_with = "dialect_name")]
    pub(crate) dialect: SimDialect,
    /// A requests-per-day limit beside the window's (its day 86,400 s: never binding in a
    /// batch, it fills the headers Groq and Cerebras send).
    pub(crate) provider_rpd: Option<u64>,
    /// Where in one of the wall clock's windows the provider starts, when that matters (a
    /// fixed window aligned to the provider's start, set against the clock's windows a
    /// client may suppose); `None`: wherever it happens to be.
    #[serde(serialize_with = "optional_secs")]
    pub(crate) clock_phase: Option<Duration>,
    /// The provider's output-tokens limit per window, and what ratebucket is told of it
    /// (Anthropic's dialect, where `provider_tpm` counts input tokens; the peers know two
    /// limits, requests and input tokens).
    pub(crate) provider_otpm: Option<u64>,
    pub(crate) told_otpm: Option<u64>,
    /// Characters of filler text each prompt carries (prompts of a realistic size, so
    /// counts rounded to thousands keep their meaning).
    pub(crate) filler: usize,
    /// For Anthropic's dialect: whether `provider_tpm` is one combined limit of input and
    /// output tokens (sent as `tokens-*` beside `requests-*` alone, as some
    /// Anthropic-compatible servers do) rather than the input-tokens limit.
    pub(crate) combined_tokens: bool,
    /// The most requests the provider takes in flight at once (refusing one more with a 429
    /// that says concurrency), and what ratebucket is told of it (`None`: learned).
    pub(crate) provider_concurrency: Option<usize>,
    pub(crate) told_concurrency: Option<u32>,
    /// The most the provider lets its arrivals per second rise above the second before's
    /// (refusing one more with a 429 naming a rate-of-change limit), and the ramp
    /// ratebucket is told to keep to on the requests dimension, per second per second.
    pub(crate) provider_ramp: Option<u64>,
    pub(crate) told_ramp: Option<u64>,
}

fn optional_secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

fn dialect_name<S: serde::Serializer>(d: &SimDialect, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format!("{d:?}").to_lowercase())
}

impl Scenario {
    /// The dialect ratebucket's client is told to read.
    pub(crate) fn dialect(&self) -> &'static ratebucket_http::dialect::Dialect {
        use ratebucket_http::dialect;
        match self.dialect {
            SimDialect::Azure => &dialect::AZURE,
            SimDialect::Gemini => &dialect::GEMINI,
            SimDialect::Groq => &dialect::GROQ,
            SimDialect::Cerebras => &dialect::CEREBRAS,
            SimDialect::Openrouter => &dialect::OPENROUTER,
            _ => &dialect::OPENAI,
        }
    }
}

fn headers_name<S: serde::Serializer>(h: &Headers, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match h {
        Headers::Full => "full",
        Headers::NoReset => "no-reset",
        _ => "none",
    })
}

fn model_name<S: serde::Serializer>(m: &Model, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match m {
        Model::TokenBucket => "token-bucket",
        Model::FixedWindow => "fixed-window",
        Model::SlidingLog => "sliding-log",
        Model::ClockWindow => "clock-window",
    })
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Scenario {
    pub(crate) fn bodies(&self) -> Vec<ChatRequest> {
        let filler = "lorem ipsum ".repeat(self.filler.div_ceil(12));
        (0..self.requests)
            .map(|i| {
                let mut request = ChatRequest::new(
                    "sim-model",
                    vec![Message::user(format!(
                        "Summarise document {i} of the {} batch.{}",
                        self.name,
                        &filler[..self.filler]
                    ))],
                )
                .max_tokens(self.max_tokens);
                request.user = Some(i.to_string());
                request
            })
            .collect()
    }

    /// Tokens an engine reserves for a request: prompt estimate plus `max_tokens` (the
    /// prompt alone against Anthropic's input-tokens limit).
    pub(crate) fn estimate(&self, request: &ChatRequest) -> u64 {
        let prompt = CharsPerToken.prompt_tokens(request);
        if self.is_anthropic() && !self.combined_tokens { prompt } else { prompt + self.max_tokens }
    }

    /// Whether the provider speaks Anthropic's Messages API.
    pub(crate) fn is_anthropic(&self) -> bool {
        self.dialect == SimDialect::Anthropic
    }

    /// The path requests are posted to.
    pub(crate) fn path(&self) -> &'static str {
        if self.is_anthropic() { "/v1/messages" } else { "/v1/chat/completions" }
    }

    /// The JSON body every engine sends for `request`, in the provider's API (the same
    /// bytes, so the fake provider draws the same answer for it).
    pub(crate) fn wire(&self, request: &ChatRequest) -> Bytes {
        if !self.is_anthropic() {
            return body(request);
        }
        let message = self.message(request);
        Bytes::from(serde_json::to_vec(&message).expect("a message request serialises"))
    }

    /// `request` as a Messages API request.
    pub(crate) fn message(&self, request: &ChatRequest) -> ratebucket_anthropic::MessagesRequest {
        let text = request.messages.iter().map(Message::text).collect::<String>();
        let mut message = ratebucket_anthropic::MessagesRequest::new(
            request.model.clone(),
            self.max_tokens,
            vec![ratebucket_anthropic::Message::user(text)],
        );
        if let Some(user) = &request.user {
            message.extra.insert("metadata".into(), serde_json::json!({ "user_id": user }));
        }
        message
    }

    /// What a request is expected to be charged: its prompt estimate and the mean answer
    /// (what a caller who knows its typical usage passes to `Limiter::estimate_drain`).
    pub(crate) fn expected_charge(&self, request: &ChatRequest) -> u64 {
        let (low, high) = self.completion_tokens;
        CharsPerToken.prompt_tokens(request) + (low + high) / 2
    }

    fn sim_config(&self) -> SimConfig {
        let spec = |limit| LimitSpec::per_minute(limit).window(self.window).model(self.model);
        let mut config = SimConfig::default()
            .charging(self.charging)
            .headers(self.headers)
            .dialect(self.dialect)
            .completion_tokens(self.completion_tokens.0, self.completion_tokens.1)
            .latency(Latency::Fixed(self.latency))
            .seed(0xbe9c);
        if let Some(rpm) = self.provider_rpm {
            config = config.rpm(spec(rpm));
        }
        match (self.is_anthropic() && !self.combined_tokens, self.provider_tpm) {
            (true, Some(itpm)) => config = config.itpm(spec(itpm)),
            (false, Some(tpm)) => config = config.tpm(spec(tpm)),
            _ => {}
        }
        if let Some(otpm) = self.provider_otpm {
            config = config.otpm(spec(otpm));
        }
        if let Some(rpd) = self.provider_rpd {
            let day = LimitSpec::per_minute(rpd).window(Duration::from_secs(86_400));
            config = config.rpd(day);
        }
        for rule in &self.faults {
            config = config.fault(rule.fault, rule.trigger.clone());
        }
        if let Some(max) = self.provider_concurrency {
            config = config.max_concurrent(max);
        }
        if let Some(slope) = self.provider_ramp {
            config = config.max_ramp(slope);
        }
        config
    }
}

impl Scenario {
    /// How long to wait after the provider started for the batch to begin `start_offset`
    /// into one of its windows: into its first, or for windows aligned to the wall clock,
    /// into the clock's next.
    fn until_start(&self) -> Duration {
        if self.model != Model::ClockWindow {
            return self.start_offset;
        }
        until_phase(self.window, self.start_offset)
    }
}

/// How long until the wall clock stands `phase` into one of its windows of `window`.
fn until_phase(window: Duration, phase: Duration) -> Duration {
    let window = window.as_nanos().max(1);
    let since_epoch =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let into = since_epoch.as_nanos() % window;
    let target = phase.as_nanos() % window;
    Duration::from_nanos(((target + window - into) % window) as u64)
}

pub(crate) fn scenarios() -> Vec<Scenario> {
    let two_limits = Scenario {
        name: "two-limits",
        description: "requests and tokens, token-bound, max_tokens three times the typical answer; \
                      the provider charges actual usage",
        provider_rpm: Some(100),
        provider_tpm: Some(4_000),
        told_rpm: Some(100),
        told_tpm: Some(4_000),
        charging: Charging::ActualUsage,
        requests: 1_700,
        max_tokens: 120,
        completion_tokens: (20, 60),
        latency: Duration::from_millis(20),
        faults: Vec::new(),
        read_timeout: Duration::from_secs(5),
        window: WINDOW,
        model: Model::TokenBucket,
        headers: Headers::Full,
        start_offset: Duration::ZERO,
        dialect: SimDialect::Openai,
        provider_rpd: None,
        clock_phase: None,
        provider_otpm: None,
        told_otpm: None,
        filler: 0,
        combined_tokens: false,
        provider_concurrency: None,
        told_concurrency: None,
        provider_ramp: None,
        told_ramp: None,
    };
    let short = Scenario {
        name: "two-limits-short",
        description: "the same, two windows' worth: the shallow client-side burst shows",
        requests: 150,
        ..two_limits.clone()
    };
    let one_limit = Scenario {
        name: "one-limit",
        description: "requests only: simple pacing should already be optimal",
        provider_tpm: None,
        told_tpm: None,
        requests: 2_200,
        ..two_limits.clone()
    };
    let lower = Scenario {
        name: "lower-than-told",
        description: "requests only; the provider allows 40 per window, every engine is told 100: 429s happen",
        provider_rpm: Some(40),
        provider_tpm: None,
        told_rpm: Some(100),
        told_tpm: None,
        requests: 600,
        ..two_limits.clone()
    };
    let faults = Scenario {
        name: "fault-mix",
        description: "5xx answers (3%), resets after send (1%), one stalled request",
        requests: 600,
        faults: vec![
            FaultRule { fault: Fault::Status(500), trigger: Trigger::Rate(0.02) },
            FaultRule { fault: Fault::Status(502), trigger: Trigger::Rate(0.01) },
            FaultRule { fault: Fault::ResetBeforeResponse, trigger: Trigger::Rate(0.01) },
            FaultRule {
                fault: Fault::Stall { stall: Duration::from_secs(10) },
                trigger: Trigger::Requests(vec![10]),
            },
        ],
        read_timeout: Duration::from_secs(1),
        ..two_limits.clone()
    };
    // The provider's own burst: 300 requests charging about 66,900 tokens (the requested
    // maximum, as OpenAI counts) against 600 requests and 60,000 tokens per 10 s window.
    let burst = |name, description, model| Scenario {
        name,
        description,
        provider_rpm: Some(600),
        provider_tpm: Some(60_000),
        told_rpm: Some(600),
        told_tpm: Some(60_000),
        charging: Charging::ReserveMaxTokens,
        requests: 300,
        max_tokens: 203,
        window: Duration::from_secs(10),
        model,
        ..two_limits.clone()
    };
    let burst_bucket = burst(
        "burst-token-bucket",
        "a short batch against a token bucket that starts full: its burst is worth taking",
        Model::TokenBucket,
    );
    let burst_fixed = burst(
        "burst-fixed-window",
        "the same batch against a fixed window: a full-window burst spills into 429s",
        Model::FixedWindow,
    );
    let burst_sliding =
        burst("burst-sliding-log", "the same batch against a sliding log", Model::SlidingLog);
    // The two workloads of short prompts with max_tokens 200 that a provider booking its own
    // estimate (a quarter of the body plus max_tokens) and reporting usage serves, with the
    // limits unknown to the client: W1 is 300 requests at 600 requests and 60,000 tokens per
    // window, W2 600 at 300 and 60,000.
    let workload = |name, description, requests, rpm| Scenario {
        name,
        description,
        provider_rpm: Some(rpm),
        provider_tpm: Some(60_000),
        told_rpm: None,
        told_tpm: None,
        charging: Charging::BooksEstimate,
        requests,
        max_tokens: 200,
        window: Duration::from_secs(10),
        ..two_limits.clone()
    };
    let w1 = workload(
        "w1-unknown",
        "W1, limits unknown: 300 requests, 600 and 60,000 per window, the provider books its estimate",
        300,
        600,
    );
    let w2 = workload(
        "w2-unknown",
        "W2, limits unknown: 600 requests, 300 and 60,000 per window",
        600,
        300,
    );
    let books = Scenario {
        name: "books-estimate",
        description: "W1 with the limits known: the provider books more than the client estimates",
        told_rpm: Some(600),
        told_tpm: Some(60_000),
        ..w1.clone()
    };
    let below_blind = Scenario {
        name: "below-no-headers",
        description: "requests only; the provider allows 40 per window, engines are told 100, and no header says so",
        headers: Headers::None,
        ..lower.clone()
    };
    let fixed_blind = Scenario {
        name: "fixed-no-reset",
        description: "a fixed window aligned to the clock that sends limit and remaining but no reset; four windows' worth, started 40% into a window",
        provider_rpm: Some(100),
        provider_tpm: None,
        told_rpm: Some(100),
        told_tpm: None,
        requests: 400,
        model: Model::ClockWindow,
        headers: Headers::NoReset,
        window: Duration::from_secs(1),
        start_offset: Duration::from_millis(400),
        ..two_limits.clone()
    };
    let fixed_unaligned = Scenario {
        name: "fixed-no-reset-unaligned",
        description: "the same window aligned to the provider's start, 30% into a window of the clock's: the clock's edges are supposed, and refuted",
        model: Model::FixedWindow,
        clock_phase: Some(Duration::from_millis(300)),
        ..fixed_blind.clone()
    };
    // The two-limit batch against each other dialect.
    let dialects = [
        ("two-limits-azure", SimDialect::Azure, "the two-limit batch against Azure's dialect: whole-second resets, -1 remaining on a 429; 5 s windows"),
        ("two-limits-gemini", SimDialect::Gemini, "the two-limit batch against Gemini's: no headers, the wait only in a 429's body"),
        ("two-limits-groq", SimDialect::Groq, "the two-limit batch against Groq's: the requests family counts per day"),
        ("two-limits-cerebras", SimDialect::Cerebras, "the two-limit batch against Cerebras's: per-minute tokens beside per-day requests"),
        ("two-limits-openrouter", SimDialect::Openrouter, "the two-limit batch against OpenRouter's: headers only on its 429s, epoch-millisecond resets"),
    ]
    .map(|(name, dialect, description)| Scenario {
        name,
        description,
        dialect,
        provider_rpd: Some(10_000_000),
        ..two_limits.clone()
    })
    .map(|scenario| match scenario.dialect {
        // Azure's resets come in whole seconds: over a window of 250 ms they cannot tell a
        // bucket from a window (a minute's can). The same rates over 5 s windows, and a
        // batch of as many windows' worth as the others (by tokens).
        SimDialect::Azure => Scenario {
            provider_rpm: Some(2_000),
            provider_tpm: Some(80_000),
            told_rpm: Some(2_000),
            told_tpm: Some(80_000),
            window: Duration::from_secs(5),
            requests: 6_800,
            ..scenario
        },
        _ => scenario,
    });
    // Anthropic's three buckets as it documents them, over its own window (a minute) and
    // with its resets as it writes them (RFC 3339 instants in whole seconds, token counts
    // rounded to thousands): 300 messages of about 125 input tokens against 1,200 requests,
    // 30,000 input and 20,000 output tokens per minute, input-bound (the output charged
    // max_tokens on admission, settled at the answer's length).
    let anthropic = Scenario {
        name: "anthropic-three-limits",
        description: "Anthropic's Messages API as it answers: requests, input and output tokens \
                      per minute, whole-second resets, counts rounded to thousands; input-bound, \
                      limits known",
        provider_rpm: Some(1_200),
        provider_tpm: Some(30_000),
        told_rpm: Some(1_200),
        told_tpm: Some(30_000),
        provider_otpm: Some(20_000),
        told_otpm: Some(20_000),
        dialect: SimDialect::Anthropic,
        requests: 300,
        max_tokens: 64,
        completion_tokens: (20, 60),
        latency: Duration::from_millis(50),
        window: Duration::from_secs(60),
        filler: 425,
        ..two_limits.clone()
    };
    let anthropic_unknown = Scenario {
        name: "anthropic-three-limits-unknown",
        description: "the same with the limits unknown: learned from the headers",
        told_rpm: None,
        told_tpm: None,
        told_otpm: None,
        ..anthropic.clone()
    };
    // A server sending only requests-* and a combined tokens-* (input and output
    // together, the output reserved at max_tokens): 300 messages of about 220 tokens
    // against 600 requests and 60,000 tokens per minute, limits unknown.
    let anthropic_combined = Scenario {
        name: "anthropic-combined-tokens",
        description: "an Anthropic-compatible server counting requests and tokens (input and \
                      output together) per minute, whole-second resets; limits unknown",
        provider_rpm: Some(600),
        provider_tpm: Some(60_000),
        told_rpm: None,
        told_tpm: None,
        provider_otpm: None,
        told_otpm: None,
        combined_tokens: true,
        max_tokens: 200,
        completion_tokens: (180, 220),
        filler: 0,
        ..anthropic.clone()
    };
    // A provider that takes 8 requests in flight, answering each in 100 ms: 600 requests
    // need 75 rounds, 7.5 s; its rates (6,000 requests a 10 s window) never bind.
    let concurrency = Scenario {
        name: "concurrency-known",
        description: "a provider taking 8 requests in flight at once, answering in 100 ms; \
                      ratebucket is told the 8",
        provider_rpm: Some(6_000),
        provider_tpm: None,
        told_rpm: Some(6_000),
        told_tpm: None,
        requests: 600,
        latency: Duration::from_millis(100),
        window: Duration::from_secs(10),
        provider_concurrency: Some(8),
        told_concurrency: Some(8),
        ..two_limits.clone()
    };
    let concurrency_unknown = Scenario {
        name: "concurrency-unknown",
        description: "the same, the 8 unknown: learned from the provider's refusals",
        told_concurrency: None,
        ..concurrency.clone()
    };
    // A provider of 100 requests a second (a bucket of one second's worth) that refuses a
    // rate rising by more than 20 requests a second each second: 1,000 requests from cold.
    let ramp = Scenario {
        name: "ramp",
        description: "100 requests per 1 s window, refusing arrivals per second that rise by more \
                      than 20 over the second before's; ratebucket is told the ramp",
        provider_rpm: Some(100),
        provider_tpm: None,
        told_rpm: Some(100),
        told_tpm: None,
        requests: 1_000,
        window: Duration::from_secs(1),
        provider_ramp: Some(20),
        told_ramp: Some(20),
        ..two_limits.clone()
    };
    let mut all = vec![
        two_limits,
        short,
        one_limit,
        lower,
        faults,
        burst_bucket,
        burst_fixed,
        burst_sliding,
        w1,
        w2,
        books,
        below_blind,
        fixed_blind,
        fixed_unaligned,
    ];
    all.extend(dialects);
    all.extend([anthropic, anthropic_unknown, anthropic_combined]);
    all.extend([concurrency, concurrency_unknown, ramp]);
    all
}

/// One engine's run of one scenario.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Run {
    pub(crate) engine: &'static str,
    pub(crate) makespan_s: f64,
    pub(crate) lower_bound_s: f64,
    pub(crate) ratio: f64,
    pub(crate) throttled: usize,
    pub(crate) seconds_lost: f64,
    pub(crate) completed: usize,
    pub(crate) failed: usize,
    pub(crate) polls_per_grant: Option<f64>,
    /// The ETA at the start, and its ratio to the makespan.
    pub(crate) eta_s: Option<f64>,
    #[serde(skip)]
    pub(crate) log: Vec<LogEntry>,
}

/// What an engine reports.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub(crate) makespan: Duration,
    pub(crate) completed: usize,
    pub(crate) failed: usize,
    pub(crate) polls: Option<(u64, u64)>,
    /// The ETA the limiter gave at the start (`Limiter::estimate_drain` over the batch's
    /// expected charge), for engines that can give one.
    pub(crate) eta: Option<Duration>,
}

#[derive(Serialize)]
struct Results<'a> {
    window_s: f64,
    lower_bound: &'static str,
    seconds_lost: &'static str,
    scenarios: Vec<ScenarioResult<'a>>,
    /// The `tenants` scenario: with tenants and classes, and as one first-come queue.
    #[serde(skip_serializing_if = "Option::is_none")]
    tenants: Option<Vec<tenants::TenantsRun>>,
}

#[derive(Serialize)]
struct ScenarioResult<'a> {
    scenario: &'a Scenario,
    runs: &'a [Run],
}

const LOWER_BOUND: &str = "the provider's own bound for what it admitted (the largest over the \
    engines), plus one answer's latency: \
    a token bucket of one window's limit that starts full and refills at limit/window admits R \
    requests and T tokens in no less than max((R - rpm) / rpm, (T - tpm) / tpm) windows; a fixed \
    window or sliding log in no less than max(ceil(R / rpm), ceil(T / tpm)) - 1 windows";
const SECONDS_LOST: &str = "the union, over every 429 answer, of the time from that answer to the \
    provider's next admission";

pub(crate) fn run(filter: Option<&str>) -> Result<(), String> {
    if cfg!(debug_assertions) {
        let mut args = vec!["run", "--release", "--quiet", "-p", "xtask", "--", "bench"];
        if let Some(f) = filter {
            args.push(f);
        }
        return crate::cargo(&args, &[]);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let mut all: Vec<(Scenario, Vec<Run>)> = Vec::new();
    for scenario in scenarios() {
        if filter.is_some_and(|f| !scenario.name.contains(f)) {
            continue;
        }
        eprintln!("scenario {}: {} requests", scenario.name, scenario.requests);
        let mut runs = Vec::new();
        for engine in Engine::ALL {
            if let Some(phase) = scenario.clock_phase {
                std::thread::sleep(until_phase(scenario.window, phase));
            }
            let sim = Sim::start(scenario.sim_config()).map_err(|e| e.to_string())?;
            // Begin `start_offset` into a window: the provider's first one, or the clock's.
            std::thread::sleep(scenario.until_start());
            let outcome = runtime.block_on(engine.run(&scenario, &sim.base_url()))?;
            let log = sim.log();
            sim.shutdown();
            let run = measure(&scenario, engine, outcome, log);
            let eta = run.eta_s.map_or(String::new(), |eta| {
                format!("  (ETA at start {eta:.2} s: {:.3}x)", eta / run.makespan_s)
            });
            eprintln!(
                "  {:<22} {:>7.2} s  {:>4} 429s  {} failed{eta}",
                run.engine, run.makespan_s, run.throttled, run.failed
            );
            runs.push(run);
        }
        // One bound per batch: the largest any engine's admissions imply (an engine that
        // gave up on requests got fewer admitted, which says nothing about the batch).
        let bound = runs.iter().map(|r| r.lower_bound_s).fold(0.0, f64::max);
        for run in &mut runs {
            run.lower_bound_s = bound;
            run.ratio = run.makespan_s / bound;
        }
        all.push((scenario, runs));
    }
    print_table(&all);
    let shared = if filter.is_none_or(|f| "shared-redis".contains(f)) {
        Some(shared::run(&runtime)?)
    } else {
        None
    };
    let tenants = if filter.is_none_or(|f| "tenants".contains(f)) {
        Some(tenants::run(&runtime)?)
    } else {
        None
    };
    // A partial run must not overwrite the published results: it goes to bench/out.
    let out = if filter.is_some() { Path::new("bench/out") } else { Path::new("bench") };
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let results = Results {
        window_s: WINDOW.as_secs_f64(),
        lower_bound: LOWER_BOUND,
        seconds_lost: SECONDS_LOST,
        scenarios: all.iter().map(|(scenario, runs)| ScenarioResult { scenario, runs }).collect(),
        tenants,
    };
    let json = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    std::fs::write(out.join("results.json"), json + "\n").map_err(|e| e.to_string())?;
    if let Some(shared) = shared {
        let json = serde_json::to_string_pretty(&shared).map_err(|e| e.to_string())?;
        std::fs::write(out.join("shared.json"), json + "\n").map_err(|e| e.to_string())?;
    }
    plot::timeline(&all, &out.join("timeline.png"))?;
    eprintln!("wrote {0}/results.json and {0}/timeline.png", out.display());
    Ok(())
}

fn measure(scenario: &Scenario, engine: Engine, outcome: Outcome, log: Vec<LogEntry>) -> Run {
    let admitted: Vec<&LogEntry> = log.iter().filter(|e| e.admitted).collect();
    let requests = admitted.len() as f64;
    let tokens: u64 = admitted.iter().map(|e| e.tokens_charged).sum();
    let output: u64 = admitted.iter().map(|e| e.output_tokens_charged).sum();
    let window = scenario.window.as_secs_f64();
    // Windows a provider of this model needs to admit `used` against `limit` per window.
    let windows = |used: f64, limit: Option<u64>| {
        limit.map_or(0.0, |l| {
            let l = l as f64;
            match scenario.model {
                Model::TokenBucket => ((used - l) / l).max(0.0),
                Model::FixedWindow | Model::SlidingLog | Model::ClockWindow => {
                    ((used / l).ceil() - 1.0).max(0.0)
                }
            }
        })
    };
    // A fixed window's next boundary comes `start_offset` sooner for a batch that starts
    // that far into one.
    let offset = match scenario.model {
        Model::FixedWindow | Model::ClockWindow => scenario.start_offset.as_secs_f64(),
        Model::TokenBucket | Model::SlidingLog => 0.0,
    };
    let whole = windows(requests, scenario.provider_rpm)
        .max(windows(tokens as f64, scenario.provider_tpm))
        .max(windows(output as f64, scenario.provider_otpm));
    let latency = scenario.latency.as_secs_f64();
    let rates = if whole > 0.0 { whole * window - offset } else { 0.0 } + latency;
    // In rounds of one answer's latency, as many at once as the provider takes.
    let rounds = scenario.provider_concurrency.map_or(0.0, |c| (requests / c as f64).ceil());
    let ramped =
        scenario.provider_ramp.map_or(0.0, |slope| ramp_bound(scenario, admitted.len(), slope));
    let lower_bound = rates.max(rounds * latency).max(ramped + latency);
    let makespan = outcome.makespan.as_secs_f64();
    let throttled = log.iter().filter(|e| e.status == Some(429)).count();
    Run {
        engine: engine.name(),
        makespan_s: makespan,
        lower_bound_s: lower_bound,
        ratio: makespan / lower_bound,
        throttled,
        seconds_lost: seconds_lost(&log),
        completed: outcome.completed,
        failed: outcome.failed,
        polls_per_grant: outcome.polls.map(|(polls, grants)| polls as f64 / grants.max(1) as f64),
        eta_s: outcome.eta.map(|eta| eta.as_secs_f64()),
        log,
    }
}

/// The least time a provider that lets its arrivals per second rise by at most `slope` over
/// the second before's, and a bucket of the scenario's requests limit that starts full,
/// takes to admit `requests`: second by second, as many as both allow.
fn ramp_bound(scenario: &Scenario, requests: usize, slope: u64) -> f64 {
    let limit = scenario.provider_rpm.unwrap_or(engines::UNLIMITED) as f64;
    let per_second = limit / scenario.window.as_secs_f64();
    let (mut level, mut previous, mut left, mut seconds) = (limit, 0.0_f64, requests as f64, 0.0);
    while left > 0.0 {
        let allowed = (previous + slope as f64).min(level.floor()).max(1.0);
        if allowed >= left {
            return seconds + left / allowed;
        }
        left -= allowed;
        level = (level - allowed + per_second).min(limit);
        previous = allowed;
        seconds += 1.0;
    }
    seconds
}

/// The union of [429 answered, next admission after it].
fn seconds_lost(log: &[LogEntry]) -> f64 {
    let mut admissions: Vec<Duration> =
        log.iter().filter(|e| e.admitted).map(|e| e.arrived).collect();
    admissions.sort_unstable();
    let mut intervals: Vec<(Duration, Duration)> = log
        .iter()
        .filter(|e| e.status == Some(429))
        .filter_map(|e| {
            let start = e.finished?;
            let next = admissions.iter().copied().find(|a| *a >= start)?;
            Some((start, next))
        })
        .collect();
    intervals.sort_unstable();
    let mut total = Duration::ZERO;
    let mut covered_until = Duration::ZERO;
    for (start, end) in intervals {
        let start = start.max(covered_until);
        if end > start {
            total += end - start;
            covered_until = end;
        }
    }
    total.as_secs_f64()
}

fn print_table(all: &[(Scenario, Vec<Run>)]) {
    println!(
        "{:<18} {:<22} {:>9} {:>9} {:>7} {:>6} {:>7} {:>9} {:>6} {:>11}",
        "scenario",
        "engine",
        "makespan",
        "bound",
        "ratio",
        "429s",
        "lost",
        "completed",
        "failed",
        "polls/grant"
    );
    for (scenario, runs) in all {
        for run in runs {
            let polls = run.polls_per_grant.map_or("-".to_owned(), |p| format!("{p:.1}"));
            println!(
                "{:<18} {:<22} {:>8.2}s {:>8.2}s {:>6.3}x {:>6} {:>6.2}s {:>9} {:>6} {:>11}",
                scenario.name,
                run.engine,
                run.makespan_s,
                run.lower_bound_s,
                run.ratio,
                run.throttled,
                run.seconds_lost,
                run.completed,
                run.failed,
                polls
            );
        }
    }
}

/// The JSON body every engine sends for `request` (the same bytes, so the fake provider
/// draws the same completion for it).
pub(crate) fn body(request: &ChatRequest) -> Bytes {
    Bytes::from(serde_json::to_vec(request).expect("a chat request serialises"))
}

/// The spread of ratebucket's makespan over `runs` runs of each learning workload (W1 and
/// W2, limits unknown and known): best, worst, and how far the worst is above the best.
pub(crate) fn spread(runs: u32) -> Result<(), String> {
    if cfg!(debug_assertions) {
        let runs = runs.to_string();
        let args = ["run", "--release", "--quiet", "-p", "xtask", "--", "spread", "--runs", &runs];
        return crate::cargo(&args, &[]);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let all = scenarios();
    let pick = |name: &str| {
        all.iter().find(|s| s.name == name).cloned().ok_or_else(|| format!("no scenario {name}"))
    };
    let w2 = pick("w2-unknown")?;
    let w2_known = Scenario {
        name: "w2-known",
        description: "W2 with the limits known",
        told_rpm: w2.provider_rpm,
        told_tpm: w2.provider_tpm,
        ..w2.clone()
    };
    let workloads = [pick("w1-unknown")?, pick("books-estimate")?, w2, w2_known];
    eprintln!("{runs} runs of each workload, ratebucket alone");
    for scenario in workloads {
        let mut measured = Vec::new();
        for _ in 0..runs {
            let sim = Sim::start(scenario.sim_config()).map_err(|e| e.to_string())?;
            std::thread::sleep(scenario.start_offset);
            let outcome = runtime.block_on(Engine::Ratebucket.run(&scenario, &sim.base_url()))?;
            let log = sim.log();
            sim.shutdown();
            measured.push(measure(&scenario, Engine::Ratebucket, outcome, log));
        }
        let makespans: Vec<f64> = measured.iter().map(|r| r.makespan_s).collect();
        let best = makespans.iter().copied().fold(f64::INFINITY, f64::min);
        let worst = makespans.iter().copied().fold(0.0, f64::max);
        let bound = measured.iter().map(|r| r.lower_bound_s).fold(0.0, f64::max);
        let throttled: usize = measured.iter().map(|r| r.throttled).sum();
        let failed: usize = measured.iter().map(|r| r.failed).sum();
        eprintln!(
            "  {:<15} best {best:.2} s ({:.3}x the bound), worst {worst:.2} s ({:.3}x): worst {:+.1}% of best; \
             429s {throttled} in all ({:.1} a run), {failed} failed",
            scenario.name,
            best / bound,
            worst / bound,
            (worst / best - 1.0) * 100.0,
            throttled as f64 / f64::from(runs),
        );
    }
    Ok(())
}

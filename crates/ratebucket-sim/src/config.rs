//! What the fake provider enforces and how it misbehaves.

use std::net::SocketAddr;
use std::time::Duration;

use crate::limits::LimitSpec;

/// How tokens are charged against the TPM limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Charging {
    /// On admission, charge the prompt plus `max_tokens` (OpenAI counts the requested
    /// maximum towards the limit).
    #[default]
    ReserveMaxTokens,
    /// On admission, charge the provider's own estimate, a quarter of the request body's
    /// characters plus `max_tokens`, while the usage reported is the prompt and the
    /// completion produced: the gap between what a provider books and what it reports.
    BooksEstimate,
    /// On admission, charge the prompt plus the completion actually produced.
    ActualUsage,
}

/// Which rate-limit headers the provider sends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Headers {
    /// `x-ratelimit-{limit,remaining,reset}-*` on every answer; `retry-after` and
    /// `retry-after-ms` with the exact wait on a 429.
    #[default]
    Full,
    /// Only `x-ratelimit-limit-*` and `x-ratelimit-remaining-*`, no reset; a 429 carries
    /// only a hint of a whole window (`retry-after`, in seconds), as some proxies send.
    NoReset,
    /// None at all, not even on a 429.
    None,
    /// IETF `RateLimit` (`"requests";r=7;t=3`, reset in whole seconds, rounded up) and
    /// `RateLimit-Policy` (`"requests";q=10;w=60`) for each limit, as a generic API sends
    /// them; `retry-after` on a 429.
    Ietf,
    /// The unsuffixed `x-ratelimit-limit`, `-remaining` and `-reset` (delta seconds) of the
    /// requests limit (of the tokens limit when there is no requests limit), as many
    /// generic APIs send them; `retry-after` on a 429.
    Plain,
    /// [`Headers::Plain`]'s family with the reset written as an RFC 3339 instant in whole
    /// seconds (`2026-12-06T13:40:12Z`), as some gateways send it.
    PlainRfc3339,
    /// [`Headers::Plain`]'s family with the reset written as an HTTP-date
    /// (`Sun, 06 Dec 2026 13:40:12 GMT`), as some gateways send it.
    PlainHttpDate,
}

/// How finely the provider writes the time until a limit is whole again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Resets {
    /// As the provider whose dialect is spoken writes it (the table in the crate docs):
    /// OpenAI's and Groq's Go durations in whole milliseconds below a second and in
    /// hundredths above, Azure's whole seconds (rounded up), Cerebras's two decimals,
    /// Anthropic's RFC 3339 instants in whole seconds (the fraction dropped).
    #[default]
    AsProvider,
    /// To the nanosecond (Go durations), the millisecond (instants) or three decimals
    /// (seconds): kinder than any provider, for tests that need a bucket told from a
    /// window over a short window.
    Fine,
}

/// Which provider's dialect of rate-limit signals the fake provider speaks: its header
/// names, its reset format, what each family counts, and its 429.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
#[non_exhaustive]
pub enum Dialect {
    /// OpenAI's, in the style the `headers` setting chooses, with `openai-processing-ms`
    /// on every admitted request's answer: the whole milliseconds from its admission
    /// (when it was counted) to its head.
    #[default]
    Openai,
    /// Azure OpenAI: OpenAI's names, resets in whole seconds (rounded up), the refused
    /// limit's remaining sent as `-1` on a 429, `retry-after` and `retry-after-ms`.
    Azure,
    /// Gemini's OpenAI-compatible endpoint: no rate-limit headers; a 429's body (a
    /// one-element list) carries `QuotaFailure` naming the quota and `RetryInfo`'s
    /// `retryDelay`.
    Gemini,
    /// Groq: `x-ratelimit-*-requests` for the requests-per-day limit, `-tokens` for the
    /// tokens limit, Go-duration resets; the per-minute requests limit only in a 429's
    /// message; `retry-after` in whole seconds.
    Groq,
    /// Cerebras: `x-ratelimit-*-requests-day` and `x-ratelimit-*-tokens-minute`, resets
    /// in float seconds; `retry-after` in whole seconds.
    Cerebras,
    /// OpenRouter: `x-ratelimit-{limit,remaining,reset}` of the requests limit, the reset
    /// in epoch milliseconds, on its 429s only, with `retry-after`.
    Openrouter,
    /// Anthropic's Messages API (`POST /v1/messages`, `x-api-key`, `anthropic-version`):
    /// requests, input tokens (the `itpm` setting) and output tokens (the `otpm`
    /// setting) per window, the output reserved at `max_tokens` on admission
    /// and settled to what was produced at the end;
    /// `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}`
    /// with RFC 3339 resets in whole seconds and token counts rounded to thousands,
    /// `tokens-*` the most restrictive of the token limits; `retry-after` on a 429, error
    /// bodies of `{"type":"error","error":{...}}`, and streams of Anthropic's events. With
    /// the `tpm` setting instead, one combined limit of input and output tokens (the input
    /// and `max_tokens` on admission, settled to the output produced), sent as `tokens-*`
    /// beside `requests-*` only, as some Anthropic-compatible servers do.
    Anthropic,
}

/// How long the provider takes to answer an admitted request. Drawn from a generator
/// seeded by the server's seed and the request's content, so reruns match.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Latency {
    /// Always the same.
    Fixed(Duration),
    /// Uniform between the two bounds.
    Uniform(Duration, Duration),
    /// Usually `base`; with probability `tail_probability`, `tail` instead.
    LongTail {
        /// The usual latency.
        base: Duration,
        /// The rare, slow latency.
        tail: Duration,
        /// How often the slow one happens, in [0, 1].
        tail_probability: f64,
    },
}

impl Default for Latency {
    fn default() -> Latency {
        Latency::Fixed(Duration::from_millis(20))
    }
}

/// Something that goes wrong, on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Answer with this 5xx status (500, 502, 503...), before admission: nothing charged.
    Status(u16),
    /// 503 with `retry-after` (whole seconds) and `retry-after-ms`, before admission.
    Overloaded {
        /// The requested wait.
        retry_after: Duration,
    },
    /// Admit (charge), then reset the connection without answering.
    ResetBeforeResponse,
    /// Admit (charge), then answer only after `stall`: longer than a client's read timeout.
    Stall {
        /// How long to hold the request.
        stall: Duration,
    },
    /// Admit (charge), start streaming, and cut the connection before `[DONE]` (for a
    /// non-streaming request, cut the body half-way).
    CutStream,
    /// 429 `rate_limit_exceeded` with `retry-after` and `retry-after-ms`, whatever the
    /// limits say (a scripted wave of throttles). Nothing charged.
    RateLimited {
        /// The requested wait.
        retry_after: Duration,
    },
    /// Admit (charge), stream some content, then a `data:` chunk carrying a top-level
    /// `error`, then `data: [DONE]` anyway (as vLLM does). A non-streaming request gets
    /// a normal answer.
    ErrorChunk,
    /// 429 `insufficient_quota`: the account is out of credit. Nothing charged.
    InsufficientQuota,
    /// 401 `invalid_api_key`.
    Unauthorized,
    /// 429 "Request too large" on tokens per minute. Nothing charged.
    RequestTooLarge,
    /// Admit (charge), send the response head, then hold the body (or the stream's first
    /// event) for `stall`: silence after the head.
    StallAfterHead {
        /// How long the body is held.
        stall: Duration,
    },
    /// Admit (charge), send half the body (or half the stream's events), then hold the
    /// rest for `stall`.
    StallMidStream {
        /// How long the rest is held.
        stall: Duration,
    },
    /// Admit (charge) and answer 200 with an `error` object instead of a completion (as
    /// some proxies do); a stream's first event is that error.
    ErrorIn200,
    /// Admit (charge) and report absurd usage: every count `u64::MAX`.
    AbsurdUsage,
    /// Admit (charge) and answer 200 with `bytes` bytes of `x` and no line end: a stream
    /// that never completes an event, or a body that is not JSON.
    Flood {
        /// How many bytes.
        bytes: usize,
    },
    /// Admit (charge), answer a stream with 200, and put an error event in it: a rate
    /// limit's (`rate_limit_exceeded`, Anthropic's `rate_limit_error`) or, when
    /// `overloaded`, the service's (`server_is_overloaded`, `overloaded_error`); before
    /// the first content delta, or after half the content when `after_content`. The stream
    /// ends there (OpenAI's with `data: [DONE]`). A non-streaming request gets a normal
    /// answer.
    StreamError {
        /// The service's overload rather than a rate limit.
        overloaded: bool,
        /// After half the content rather than before any.
        after_content: bool,
    },
    /// A quota spent until someone raises it: Anthropic's 429 `rate_limit_error` with
    /// `error.details.error_code: "enforced_spend_limit_reached"` and no `retry-after`
    /// (its monthly spend cap); elsewhere OpenAI's 429 `organization_spend_limit_exceeded`.
    /// Nothing charged.
    SpendLimit,
    /// Anthropic's 400 `invalid_request_error` "You have reached your specified API usage
    /// limits. You will regain access on DATE at 00:00 UTC." (the first of next month);
    /// elsewhere OpenAI's 429 `organization_usage_limit_exceeded`. Nothing charged.
    UsageLimit,
    /// Groq's 498 `capacity_exceeded` (its flex tier is busy): transient, to be retried
    /// with jitter. Nothing charged.
    CapacityExceeded,
    /// Azure OpenAI's 429 whose wait is only in its message, "Please retry after N
    /// seconds." (no `retry-after` header). Nothing charged.
    RetryAfterInMessage {
        /// The wait the message names, in whole seconds.
        retry_after: Duration,
    },
    /// Azure API Management's 429, `{"statusCode": 429, "message": "Rate limit is
    /// exceeded. Try again in N seconds."}`, its wait only in the message. Nothing charged.
    ApimRateLimit {
        /// The wait the message names, in whole seconds.
        retry_after: Duration,
    },
    /// A 429 whose `retry-after` is measured in days or hours, with a message saying so
    /// ("Monthly usage limit reached. Resets in 16 days."): spent until then, not a pause.
    /// Nothing charged.
    LongRetryAfter {
        /// The wait asked for.
        retry_after: Duration,
    },
}

/// When a fault strikes.
#[derive(Clone, Debug, PartialEq)]
pub enum Trigger {
    /// Each request is struck with this probability (seeded).
    Rate(f64),
    /// These request numbers (0-based, in arrival order) are struck.
    Requests(Vec<u64>),
    /// The first arrival of every distinct request body is struck; its retries are
    /// spared. Unlike [`Trigger::Requests`], which requests are struck does not depend on
    /// the order in which concurrent clients' requests happen to arrive.
    FirstArrivals,
}

/// A fault and its trigger.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultRule {
    /// What happens.
    pub fault: Fault,
    /// When.
    pub trigger: Trigger,
}

/// The whole configuration of a fake provider.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct SimConfig {
    /// Where to listen; 127.0.0.1 on a free port by default.
    pub addr: SocketAddr,
    /// The requests limit, if any.
    pub rpm: Option<LimitSpec>,
    /// The tokens limit, if any.
    pub tpm: Option<LimitSpec>,
    /// A second requests limit over a longer window (a day, unless a test shortens it):
    /// requests per day.
    pub rpd: Option<LimitSpec>,
    /// The input-tokens limit of the Anthropic dialect, if any.
    pub itpm: Option<LimitSpec>,
    /// The output-tokens limit of the Anthropic dialect, if any.
    pub otpm: Option<LimitSpec>,
    /// How tokens are charged.
    pub charging: Charging,
    /// Completion lengths are drawn uniformly from this range (then capped at the request's
    /// `max_tokens`).
    pub completion_tokens: (u64, u64),
    /// `max_tokens` when a request does not say.
    pub default_max_tokens: u64,
    /// Answer latency.
    pub latency: Latency,
    /// Faults, checked in order; the first that strikes wins.
    pub faults: Vec<FaultRule>,
    /// Seed for every draw.
    pub seed: u64,
    /// If set, requests must carry it (`Authorization: Bearer ...`, `api-key: ...`, or
    /// Anthropic's `x-api-key: ...`).
    pub api_key: Option<String>,
    /// Pause between streamed chunks.
    pub chunk_interval: Duration,
    /// How long the provider takes to decide on a request after it arrives (to admit it
    /// or refuse it): every answer, refusals and faults included, comes at least this late.
    /// Zero by default, so refusals are immediate.
    pub decision_delay: Duration,
    /// Which rate-limit headers it sends (in the OpenAI dialect).
    pub headers: Headers,
    /// Whose dialect it speaks.
    pub dialect: Dialect,
    /// How finely resets are written: as the dialect's provider does by default.
    pub resets: Resets,
    /// The most requests in flight at once, from arrival until the answer's body ends;
    /// one more is refused with a 429 that says concurrency. None by default.
    pub max_concurrent: Option<usize>,
    /// The most the arrivals per whole second may rise above the second before's; one more
    /// is refused with a 429 that names a rate-of-change limit. None by default.
    pub max_ramp: Option<u64>,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            rpm: None,
            tpm: None,
            rpd: None,
            itpm: None,
            otpm: None,
            charging: Charging::default(),
            completion_tokens: (20, 200),
            default_max_tokens: 1024,
            latency: Latency::default(),
            faults: Vec::new(),
            seed: 0,
            api_key: None,
            chunk_interval: Duration::from_millis(1),
            decision_delay: Duration::ZERO,
            headers: Headers::default(),
            dialect: Dialect::default(),
            resets: Resets::default(),
            max_concurrent: None,
            max_ramp: None,
        }
    }
}

impl SimConfig {
    /// Sets the requests limit.
    pub fn rpm(mut self, spec: LimitSpec) -> SimConfig {
        self.rpm = Some(spec);
        self
    }

    /// Sets the tokens limit.
    pub fn tpm(mut self, spec: LimitSpec) -> SimConfig {
        self.tpm = Some(spec);
        self
    }

    /// Sets the requests-per-day limit (its window is a day unless the spec says less).
    pub fn rpd(mut self, spec: LimitSpec) -> SimConfig {
        self.rpd = Some(spec);
        self
    }

    /// Sets the input-tokens limit (the Anthropic dialect's).
    pub fn itpm(mut self, spec: LimitSpec) -> SimConfig {
        self.itpm = Some(spec);
        self
    }

    /// Sets the output-tokens limit (the Anthropic dialect's), charged `max_tokens` on
    /// admission and settled to the tokens produced.
    pub fn otpm(mut self, spec: LimitSpec) -> SimConfig {
        self.otpm = Some(spec);
        self
    }

    /// Sets the dialect it speaks.
    pub fn dialect(mut self, dialect: Dialect) -> SimConfig {
        self.dialect = dialect;
        self
    }

    /// Sets how tokens are charged.
    pub fn charging(mut self, charging: Charging) -> SimConfig {
        self.charging = charging;
        self
    }

    /// Sets the completion length range.
    pub fn completion_tokens(mut self, low: u64, high: u64) -> SimConfig {
        self.completion_tokens = (low.min(high), high.max(low));
        self
    }

    /// Sets the latency.
    pub fn latency(mut self, latency: Latency) -> SimConfig {
        self.latency = latency;
        self
    }

    /// Sets the decision delay: how long after arriving a request is admitted or refused.
    pub fn decision_delay(mut self, delay: Duration) -> SimConfig {
        self.decision_delay = delay;
        self
    }

    /// Adds a fault.
    pub fn fault(mut self, fault: Fault, trigger: Trigger) -> SimConfig {
        self.faults.push(FaultRule { fault, trigger });
        self
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> SimConfig {
        self.seed = seed;
        self
    }

    /// Sets which rate-limit headers are sent.
    pub fn headers(mut self, headers: Headers) -> SimConfig {
        self.headers = headers;
        self
    }

    /// Sets how finely resets are written ([`Resets::Fine`] is kinder than any provider).
    pub fn resets(mut self, resets: Resets) -> SimConfig {
        self.resets = resets;
        self
    }

    /// Refuses a request that would make more than `max` in flight (0 is taken as 1).
    pub fn max_concurrent(mut self, max: usize) -> SimConfig {
        self.max_concurrent = Some(max.max(1));
        self
    }

    /// Refuses a request that would make this second's arrivals more than `slope` above
    /// the second before's (0 is taken as 1).
    pub fn max_ramp(mut self, slope: u64) -> SimConfig {
        self.max_ramp = Some(slope.max(1));
        self
    }

    /// Requires an API key.
    pub fn api_key(mut self, key: impl Into<String>) -> SimConfig {
        self.api_key = Some(key.into());
        self
    }
}

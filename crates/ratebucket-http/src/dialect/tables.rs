//! The dialects themselves: each provider family's header rows, reset format, body hint
//! and throttle statuses, as static tables.

use super::{BodyHint, Counts, Dialect, Family, Per, ResetFormat, Unit};

/// OpenAI's per-minute families: `x-ratelimit-{limit,remaining,reset}-{requests,tokens}`.
static OPENAI_FAMILIES: [Family; 2] = [
    Family::new(
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        Some("x-ratelimit-reset-requests"),
        Counts::new(Unit::Requests, Per::Minute),
    ),
    Family::new(
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        Some("x-ratelimit-reset-tokens"),
        Counts::new(Unit::Tokens, Per::Minute),
    ),
];

/// Groq: OpenAI's names, but `-requests` counts per day.
static GROQ_FAMILIES: [Family; 2] = [
    Family::new(
        "x-ratelimit-limit-requests",
        "x-ratelimit-remaining-requests",
        Some("x-ratelimit-reset-requests"),
        Counts::new(Unit::Requests, Per::Day),
    ),
    Family::new(
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-tokens",
        Some("x-ratelimit-reset-tokens"),
        Counts::new(Unit::Tokens, Per::Minute),
    ),
];

/// Cerebras: each family names its period.
static CEREBRAS_FAMILIES: [Family; 4] = [
    Family::new(
        "x-ratelimit-limit-requests-minute",
        "x-ratelimit-remaining-requests-minute",
        Some("x-ratelimit-reset-requests-minute"),
        Counts::new(Unit::Requests, Per::Minute),
    ),
    Family::new(
        "x-ratelimit-limit-tokens-minute",
        "x-ratelimit-remaining-tokens-minute",
        Some("x-ratelimit-reset-tokens-minute"),
        Counts::new(Unit::Tokens, Per::Minute),
    ),
    Family::new(
        "x-ratelimit-limit-requests-day",
        "x-ratelimit-remaining-requests-day",
        Some("x-ratelimit-reset-requests-day"),
        Counts::new(Unit::Requests, Per::Day),
    ),
    Family::new(
        "x-ratelimit-limit-tokens-day",
        "x-ratelimit-remaining-tokens-day",
        Some("x-ratelimit-reset-tokens-day"),
        Counts::new(Unit::Tokens, Per::Day),
    ),
];

/// OpenRouter: the unsuffixed family, on its own 429s.
static OPENROUTER_FAMILIES: [Family; 1] = [Family::new(
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    Some("x-ratelimit-reset"),
    Counts::new(Unit::Requests, Per::Minute),
)];

/// Anthropic: `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-*`, token
/// counts rounded to thousands.
static ANTHROPIC_FAMILIES: [Family; 4] = [
    Family::new(
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        Some("anthropic-ratelimit-requests-reset"),
        Counts::new(Unit::Requests, Per::Minute),
    ),
    Family::new(
        "anthropic-ratelimit-input-tokens-limit",
        "anthropic-ratelimit-input-tokens-remaining",
        Some("anthropic-ratelimit-input-tokens-reset"),
        Counts::new(Unit::InputTokens, Per::Minute),
    )
    .rounded(1000),
    Family::new(
        "anthropic-ratelimit-output-tokens-limit",
        "anthropic-ratelimit-output-tokens-remaining",
        Some("anthropic-ratelimit-output-tokens-reset"),
        Counts::new(Unit::OutputTokens, Per::Minute),
    )
    .rounded(1000),
    Family::new(
        "anthropic-ratelimit-tokens-limit",
        "anthropic-ratelimit-tokens-remaining",
        Some("anthropic-ratelimit-tokens-reset"),
        Counts::new(Unit::Tokens, Per::Minute),
    )
    .rounded(1000),
];

/// OpenAI: `x-ratelimit-*-{requests,tokens}` per minute, Go-duration resets, "try
/// again in" in the error message.
pub static OPENAI: Dialect = Dialect {
    name: "openai",
    families: &OPENAI_FAMILIES,
    reset: ResetFormat::GoDuration,
    ietf: None,
    body_hint: BodyHint::Message,
    throttle_statuses: &[],
};

/// Azure OpenAI: OpenAI's names, resets in whole seconds, a `remaining` that can be
/// negative (read as unknown). Its limits are checked over 1 s or 10 s windows, so a
/// burst is kept small; and a request without `max_tokens` is charged the model's
/// whole context, so state `max_tokens` on every request.
pub static AZURE: Dialect = Dialect {
    name: "azure",
    families: &OPENAI_FAMILIES,
    reset: ResetFormat::Seconds,
    ietf: None,
    body_hint: BodyHint::Message,
    throttle_statuses: &[],
};

/// Gemini's OpenAI-compatible endpoint: no rate-limit headers; a 429's body carries
/// `RetryInfo.retryDelay` and the `QuotaFailure` naming the quota spent.
pub static GEMINI: Dialect = Dialect {
    name: "gemini",
    families: &[],
    reset: ResetFormat::Seconds,
    ietf: None,
    body_hint: BodyHint::RetryInfo,
    throttle_statuses: &[],
};

/// Groq: OpenAI's names, but `x-ratelimit-*-requests` counts per **day** (read as per
/// minute it would be 1,440 times too high); `-tokens` per minute. Its per-minute
/// request limit appears only in a 429's message.
pub static GROQ: Dialect = Dialect {
    name: "groq",
    families: &GROQ_FAMILIES,
    reset: ResetFormat::GoDuration,
    ietf: None,
    body_hint: BodyHint::Message,
    throttle_statuses: &[],
};

/// Cerebras: `x-ratelimit-*-{requests,tokens}-{minute,day}` side by side, resets in
/// float seconds.
pub static CEREBRAS: Dialect = Dialect {
    name: "cerebras",
    families: &CEREBRAS_FAMILIES,
    reset: ResetFormat::Seconds,
    ietf: None,
    body_hint: BodyHint::Message,
    throttle_statuses: &[],
};

/// OpenRouter: `X-RateLimit-{Limit,Remaining,Reset}` of requests, resets as epoch
/// milliseconds; a 402 when the credit in flight is exceeded is transient (a throttle),
/// not a refusal of the account.
pub static OPENROUTER: Dialect = Dialect {
    name: "openrouter",
    families: &OPENROUTER_FAMILIES,
    reset: ResetFormat::EpochMillis,
    ietf: None,
    body_hint: BodyHint::Message,
    throttle_statuses: &[402],
};

/// The IETF `RateLimit` / `RateLimit-Policy` fields (draft-10, draft-07 and the older
/// `RateLimit-Limit` family), counting requests over the policy's window.
pub static IETF: Dialect = Dialect {
    name: "ietf",
    families: &[],
    reset: ResetFormat::Seconds,
    ietf: Some(Counts::new(Unit::Requests, Per::Minute)),
    body_hint: BodyHint::None,
    throttle_statuses: &[],
};

/// Anthropic's Messages API: continuous buckets of requests, input tokens (cache reads
/// not counted on most models) and output tokens per minute, plus `tokens` for the most
/// restrictive of them; resets as RFC 3339 instants (when the bucket is full again),
/// token counts rounded to thousands, `retry-after` on a 429, and 529 when the service is
/// overloaded (a throttle).
pub static ANTHROPIC: Dialect = Dialect {
    name: "anthropic",
    families: &ANTHROPIC_FAMILIES,
    reset: ResetFormat::Rfc3339,
    ietf: None,
    body_hint: BodyHint::None,
    throttle_statuses: &[529],
};

/// Every built-in dialect.
pub static ALL: [&Dialect; 8] =
    [&OPENAI, &AZURE, &GEMINI, &GROQ, &CEREBRAS, &OPENROUTER, &IETF, &ANTHROPIC];

//! What each dialect says about the limits: the headers on every answer, and a 429's
//! headers and body.

use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, header};
use serde_json::{Value, json};

use super::Limits;
use super::admission::Refused;
use crate::config::{Dialect, Headers, Resets, SimConfig};
use crate::dates;
use crate::limits::{Limit, go_duration};
use crate::log::Refusal;
use crate::openai::error;

/// Inserts `name: value`, skipping anything that is not a valid header.
fn insert(headers: &mut HeaderMap, name: &str, value: impl AsRef<str>) {
    if let (Ok(k), Ok(v)) =
        (HeaderName::from_bytes(name.as_bytes()), HeaderValue::from_str(value.as_ref()))
    {
        headers.insert(k, v);
    }
}

/// One family of `x-ratelimit-{limit,remaining,reset}{suffix}` for `limit`, the reset
/// written by `reset`; the remaining of the limit a 429 refused is `-1` when `overdrawn`.
fn family(
    headers: &mut HeaderMap,
    suffix: &str,
    limit: &mut Limit,
    now: Duration,
    reset: Option<fn(Duration) -> String>,
    overdrawn: bool,
) {
    insert(headers, &format!("x-ratelimit-limit{suffix}"), limit.spec().limit.to_string());
    let remaining = if overdrawn { "-1".to_owned() } else { limit.remaining(now).to_string() };
    insert(headers, &format!("x-ratelimit-remaining{suffix}"), remaining);
    if let Some(format) = reset {
        insert(headers, &format!("x-ratelimit-reset{suffix}"), format(limit.reset_after(now)));
    }
}

/// Whole seconds, rounded up (Azure's resets).
fn whole_seconds(d: Duration) -> String {
    d.as_secs_f64().ceil().to_string()
}

/// Float seconds with two decimals (Cerebras's resets).
fn float_seconds(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64())
}

/// Float seconds with three decimals (finer than any provider writes seconds).
fn milli_seconds(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// OpenAI's resets: a Go duration in whole milliseconds below a second and in hundredths
/// of a second from one second up (`547ms`, `7.66s`, `2m59.56s`, `6m0s`), rounded to the
/// nearest.
pub(crate) fn openai_reset(d: Duration) -> String {
    let ms = d.as_nanos().saturating_add(500_000) / 1_000_000;
    let ms = if ms < 1_000 { ms } else { (ms + 5) / 10 * 10 };
    go_duration(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)))
}

/// Epoch milliseconds of the instant `d` from now (OpenRouter's resets).
fn epoch_millis(d: Duration) -> String {
    dates::from_now(d).as_millis().to_string()
}

/// How `dialect` writes a reset given as a wait, at the resolution `resets` asks for
/// (Anthropic's instants are written by [`anthropic_headers`]).
fn reset_writer(dialect: Dialect, resets: Resets) -> fn(Duration) -> String {
    let fine = resets == Resets::Fine;
    match dialect {
        Dialect::Azure if fine => milli_seconds,
        Dialect::Azure => whole_seconds,
        Dialect::Cerebras if fine => milli_seconds,
        Dialect::Cerebras => float_seconds,
        Dialect::Openrouter => epoch_millis,
        _ if fine => go_duration,
        _ => openai_reset,
    }
}

/// The rate-limit headers of an answer; `refused` is the limit a 429 ran into.
pub(super) fn limit_headers(
    limits: &mut Limits,
    now: Duration,
    config: &SimConfig,
    refused: Option<Refusal>,
) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let h = &mut headers;
    let over = |which: Refusal| refused == Some(which);
    let writer = reset_writer(config.dialect, config.resets);
    match config.dialect {
        Dialect::Openai => openai_headers(h, limits, now, config.headers, writer),
        Dialect::Azure => {
            let reset = Some(writer);
            if let Some(l) = limits.requests.as_mut() {
                family(h, "-requests", l, now, reset, over(Refusal::Requests));
            }
            if let Some(l) = limits.tokens.as_mut() {
                family(h, "-tokens", l, now, reset, over(Refusal::Tokens));
            }
        }
        Dialect::Gemini => {}
        Dialect::Anthropic => return anthropic_headers(limits, now, config.resets),
        Dialect::Groq => {
            let reset = Some(writer);
            if let Some(l) = limits.daily.as_mut() {
                family(h, "-requests", l, now, reset, false);
            }
            if let Some(l) = limits.tokens.as_mut() {
                family(h, "-tokens", l, now, reset, false);
            }
        }
        Dialect::Cerebras => {
            let reset = Some(writer);
            if let Some(l) = limits.daily.as_mut() {
                family(h, "-requests-day", l, now, reset, false);
            }
            if let Some(l) = limits.tokens.as_mut() {
                family(h, "-tokens-minute", l, now, reset, false);
            }
        }
        Dialect::Openrouter => {
            // On its own 429s only.
            if refused.is_some()
                && let Some(l) = limits.requests.as_mut()
            {
                family(h, "", l, now, Some(writer), false);
            }
        }
    }
    headers
}

/// OpenAI's headers, in one of the styles [`Headers`] names, resets written by `writer`.
fn openai_headers(
    headers: &mut HeaderMap,
    limits: &mut Limits,
    now: Duration,
    style: Headers,
    writer: fn(Duration) -> String,
) {
    let named = [("requests", limits.requests.as_mut()), ("tokens", limits.tokens.as_mut())];
    let mut present = named.into_iter().filter_map(|(name, limit)| limit.map(|l| (name, l)));
    match style {
        Headers::None => {}
        Headers::Full | Headers::NoReset => {
            let reset = (style == Headers::Full).then_some(writer);
            for (name, limit) in present {
                family(headers, &format!("-{name}"), limit, now, reset, false);
            }
        }
        Headers::Ietf => {
            let (mut fields, mut policies) = (Vec::new(), Vec::new());
            for (name, limit) in present {
                let reset = limit.reset_after(now).as_secs_f64().ceil() as u64;
                let remaining = limit.remaining(now);
                fields.push(format!("\"{name}\";r={remaining};t={reset}"));
                let spec = limit.spec();
                let window = spec.window.as_secs().max(1);
                policies.push(format!("\"{name}\";q={};w={window}", spec.limit));
            }
            insert(headers, "ratelimit", fields.join(", "));
            insert(headers, "ratelimit-policy", policies.join(", "));
        }
        Headers::Plain | Headers::PlainRfc3339 | Headers::PlainHttpDate => {
            if let Some((_, limit)) = present.next() {
                let reset = limit.reset_after(now);
                insert(headers, "x-ratelimit-limit", limit.spec().limit.to_string());
                insert(headers, "x-ratelimit-remaining", limit.remaining(now).to_string());
                let reset = match style {
                    Headers::PlainRfc3339 => dates::rfc3339(dates::from_now(reset), false),
                    Headers::PlainHttpDate => dates::http_date(dates::from_now(reset)),
                    _ => format!("{:.3}", reset.as_secs_f64()),
                };
                insert(headers, "x-ratelimit-reset", reset);
            }
        }
    }
}

/// A 429's headers and body in the provider's dialect.
pub(super) fn refusal(
    limits: &mut Limits,
    now: Duration,
    config: &SimConfig,
    refused: Refused,
) -> (HeaderMap, Value) {
    let mut headers = limit_headers(limits, now, config, Some(refused.which));
    match config.dialect {
        Dialect::Openai => match config.headers {
            Headers::Full
            | Headers::Ietf
            | Headers::Plain
            | Headers::PlainRfc3339
            | Headers::PlainHttpDate => {
                retry_headers(&mut headers, refused.wait);
            }
            // A hint of a whole window, whatever the real wait.
            Headers::NoReset => {
                insert(&mut headers, "retry-after", refused.window.as_secs_f64().to_string());
            }
            Headers::None => {}
        },
        Dialect::Azure => retry_headers(&mut headers, refused.wait),
        Dialect::Gemini => return (headers, gemini_body(refused)),
        Dialect::Anthropic => return anthropic_refusal(limits, now, config.resets, refused),
        Dialect::Groq | Dialect::Cerebras | Dialect::Openrouter => {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(whole(refused.wait)));
        }
    }
    (headers, openai_body(refused))
}

/// Anthropic's headers: for requests, input and output tokens, the limit, what remains
/// (token counts rounded to the nearest thousand) and when the bucket is full again, as an
/// RFC 3339 instant in whole seconds (to the millisecond with [`Resets::Fine`]); then
/// `tokens`: the combined limit of input and output tokens where one is enforced (as some
/// Anthropic-compatible servers do), else the most restrictive of the token limits (the
/// one with the least remaining).
pub(super) fn anthropic_headers(limits: &mut Limits, now: Duration, resets: Resets) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let millis = resets == Resets::Fine;
    let mut family = |name: &str, limit: &mut Limit, rounded: bool| {
        let remaining = limit.remaining(now);
        let remaining = if rounded { (remaining + 500) / 1000 * 1000 } else { remaining };
        let at = dates::from_now(limit.reset_after(now));
        let prefix = format!("anthropic-ratelimit-{name}");
        insert(&mut headers, &format!("{prefix}-limit"), limit.spec().limit.to_string());
        insert(&mut headers, &format!("{prefix}-remaining"), remaining.to_string());
        insert(&mut headers, &format!("{prefix}-reset"), dates::rfc3339(at, millis));
        remaining
    };
    if let Some(l) = limits.requests.as_mut() {
        family("requests", l, false);
    }
    let input = limits.input.as_mut().map(|l| (family("input-tokens", l, true), 0));
    let output = limits.output.as_mut().map(|l| (family("output-tokens", l, true), 1));
    if let Some(l) = limits.tokens.as_mut() {
        family("tokens", l, true);
        return headers;
    }
    let tightest = match (input, output) {
        (Some(i), Some(o)) => Some(if o.0 < i.0 { o } else { i }),
        (i, o) => i.or(o),
    };
    match tightest {
        Some((_, 0)) => {
            if let Some(l) = limits.input.as_mut() {
                family("tokens", l, true);
            }
        }
        Some(_) => {
            if let Some(l) = limits.output.as_mut() {
                family("tokens", l, true);
            }
        }
        None => {}
    }
    headers
}

/// Anthropic's 429: its headers, `retry-after` in whole seconds, and a `rate_limit_error`
/// naming the limit.
pub(super) fn anthropic_refusal(
    limits: &mut Limits,
    now: Duration,
    resets: Resets,
    refused: Refused,
) -> (HeaderMap, Value) {
    let mut headers = anthropic_headers(limits, now, resets);
    headers.insert(header::RETRY_AFTER, HeaderValue::from(whole(refused.wait)));
    let per = match refused.which {
        Refusal::Requests => "requests per minute",
        Refusal::InputTokens => "input tokens per minute",
        Refusal::Tokens => "tokens per minute",
        _ => "output tokens per minute",
    };
    let message = format!(
        "This request would exceed the rate limit for your organization of {} {per}. \
         Used {}, requested {}.",
        refused.limit, refused.used, refused.requested
    );
    (headers, crate::anthropic::error("rate_limit_error", &message))
}

/// A wait in whole seconds, rounded up, at least one.
fn whole(wait: Duration) -> u64 {
    (wait.as_millis().max(1) as u64).div_ceil(1000).max(1)
}

/// OpenAI's 429 body (Groq's, Azure's and the others' are alike): which limit, how much is
/// used, and when to try again.
fn openai_body(refused: Refused) -> Value {
    let (kind, per) = match refused.which {
        Refusal::Daily => ("requests", "requests per day (RPD)"),
        Refusal::Requests => ("requests", "requests per min (RPM)"),
        _ => ("tokens", "tokens per min (TPM)"),
    };
    let message = format!(
        "Rate limit reached for sim-model in organization org-sim on {per}: \
         Limit {}, Used {}, Requested {}. Please try again in {}.",
        refused.limit,
        refused.used,
        refused.requested,
        go_duration(Duration::from_millis(
            u64::try_from(refused.wait.as_millis()).unwrap_or(u64::MAX).saturating_add(1)
        ))
    );
    error(&message, kind, Some("rate_limit_exceeded"))
}

/// Gemini's 429: `RESOURCE_EXHAUSTED`, the quota spent, and the delay, in a one-element
/// list as its OpenAI-compatible endpoint sends errors.
fn gemini_body(refused: Refused) -> Value {
    let quota_id = match refused.which {
        Refusal::Daily => "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
        Refusal::Requests => "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
        _ => "GenerateContentInputTokensPerModelPerMinute-FreeTier",
    };
    let delay = format!("{:.3}s", (refused.wait.as_millis() + 1) as f64 / 1000.0);
    json!([{
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": quota_id,
                        "quotaDimensions": {"location": "global", "model": "sim-model"},
                        "quotaValue": refused.limit.to_string(),
                    }]
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
            ]
        }
    }])
}

/// `retry-after` in whole seconds (at least 1) and the exact `retry-after-ms`.
pub(super) fn retry_headers(headers: &mut HeaderMap, wait: Duration) {
    let ms = wait.as_millis().max(1) as u64;
    headers.insert(header::RETRY_AFTER, HeaderValue::from(whole(wait)));
    headers.insert("retry-after-ms", HeaderValue::from(ms));
}

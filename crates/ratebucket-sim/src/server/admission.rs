//! Admission: whether the provider's limits let a request through, and the headers that say so.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, header};

use super::{Limits, Provider, lock};
use crate::config::Headers;
use crate::limits::go_duration;
use crate::log::Refusal;
use crate::openai::error;

pub(super) enum Admission {
    Admitted {
        headers: HeaderMap,
    },
    Throttled {
        headers: HeaderMap,
        body: serde_json::Value,
        refusal: Refusal,
    },
    TooLarge {
        limit: u64,
    },
}

/// Checks both limits at once and charges both, or neither.
pub(super) fn admit(provider: &Provider, tokens: u64) -> Admission {
    let now = provider.now();
    let mut limits = lock(&provider.limits);
    let Limits {
        requests,
        tokens: tpm,
    } = &mut *limits;
    if let Some(tpm) = tpm.as_mut()
        && tokens > tpm.spec().limit
    {
        return Admission::TooLarge {
            limit: tpm.spec().limit,
        };
    }
    // A limit that can never admit this (a limit of zero) refuses it for a day.
    let never = crate::limits::LONGEST_WAIT;
    let request_wait = requests
        .as_mut()
        .map(|l| l.wait_for(1, now).unwrap_or(never))
        .unwrap_or_default();
    let token_wait = tpm
        .as_mut()
        .map(|l| l.wait_for(tokens, now).unwrap_or(never))
        .unwrap_or_default();
    if request_wait.is_zero() && token_wait.is_zero() {
        if let Some(l) = requests.as_mut() {
            l.charge(1, now);
        }
        if let Some(l) = tpm.as_mut() {
            l.charge(tokens, now);
        }
        return Admission::Admitted {
            headers: limit_headers(&mut limits, now, provider.config.headers),
        };
    }
    let (kind, unit, limit, requested) = if !request_wait.is_zero() {
        (
            "requests",
            "RPM",
            requests.as_ref().map_or(0, |l| l.spec().limit),
            1,
        )
    } else {
        (
            "tokens",
            "TPM",
            tpm.as_ref().map_or(0, |l| l.spec().limit),
            tokens,
        )
    };
    let wait = request_wait.max(token_wait);
    let used = limit.saturating_sub(match kind {
        "requests" => requests.as_mut().map_or(0, |l| l.remaining(now)),
        _ => tpm.as_mut().map_or(0, |l| l.remaining(now)),
    });
    let message = format!(
        "Rate limit reached for sim-model in organization org-sim on {kind} per min ({unit}): \
         Limit {limit}, Used {used}, Requested {requested}. Please try again in {}.",
        go_duration(Duration::from_millis(
            u64::try_from(wait.as_millis())
                .unwrap_or(u64::MAX)
                .saturating_add(1)
        ))
    );
    let style = provider.config.headers;
    let window = match kind {
        "requests" => requests.as_ref().map(|l| l.spec().window),
        _ => tpm.as_ref().map(|l| l.spec().window),
    }
    .unwrap_or(Duration::from_secs(60));
    let mut headers = limit_headers(&mut limits, now, style);
    match style {
        Headers::Full | Headers::Ietf | Headers::Plain => retry_headers(&mut headers, wait),
        // A hint of a whole window, whatever the real wait.
        Headers::NoReset => {
            let secs = window.as_secs_f64().to_string();
            if let Ok(value) = HeaderValue::from_str(&secs) {
                headers.insert(header::RETRY_AFTER, value);
            }
        }
        Headers::None => {}
    }
    Admission::Throttled {
        headers,
        body: error(&message, kind, Some("rate_limit_exceeded")),
        refusal: if kind == "requests" {
            Refusal::Requests
        } else {
            Refusal::Tokens
        },
    }
}

pub(super) fn limit_headers(limits: &mut Limits, now: Duration, style: Headers) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let named = [
        ("requests", limits.requests.as_mut()),
        ("tokens", limits.tokens.as_mut()),
    ];
    let mut present = named
        .into_iter()
        .filter_map(|(name, limit)| limit.map(|l| (name, l)));
    let mut insert = |name: &str, value: String| {
        if let (Ok(k), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            headers.insert(k, v);
        }
    };
    match style {
        Headers::None => {}
        Headers::Full | Headers::NoReset => {
            for (name, limit) in present {
                insert(
                    &format!("x-ratelimit-limit-{name}"),
                    limit.spec().limit.to_string(),
                );
                insert(
                    &format!("x-ratelimit-remaining-{name}"),
                    limit.remaining(now).to_string(),
                );
                if style == Headers::Full {
                    insert(
                        &format!("x-ratelimit-reset-{name}"),
                        go_duration(limit.reset_after(now)),
                    );
                }
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
            insert("ratelimit", fields.join(", "));
            insert("ratelimit-policy", policies.join(", "));
        }
        Headers::Plain => {
            if let Some((_, limit)) = present.next() {
                insert("x-ratelimit-limit", limit.spec().limit.to_string());
                insert("x-ratelimit-remaining", limit.remaining(now).to_string());
                let reset = limit.reset_after(now).as_secs_f64();
                insert("x-ratelimit-reset", format!("{reset:.3}"));
            }
        }
    }
    headers
}

/// `retry-after` in whole seconds (at least 1) and the exact `retry-after-ms`.
pub(super) fn retry_headers(headers: &mut HeaderMap, wait: Duration) {
    let ms = wait.as_millis().max(1) as u64;
    let secs = ms.div_ceil(1000).max(1);
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers.insert("retry-after-ms", HeaderValue::from(ms));
}

//! Faults that strike before admission: the refusals they answer with, nothing charged.

use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode, header};

use super::Provider;
use super::dialects::retry_headers;
use super::replies::{refuse, too_large, unauthorized};
use crate::body::ResponseBody;
use crate::config::Fault;
use crate::limits::go_duration;
use crate::log::Refusal;
use crate::openai::error;

/// The answer `fault` gives request `id` before it is admitted (`asked`: the tokens it asks
/// for, prompt and `max_tokens`); `None` for a fault that strikes later, or none at all.
pub(super) fn before_admission(
    provider: &Provider,
    id: u64,
    fault: Fault,
    asked: u64,
) -> Option<http::Response<ResponseBody>> {
    let refused = |status, body: &serde_json::Value, headers| {
        refuse(provider, id, Refusal::Fault, status, body, headers)
    };
    let answer = match fault {
        Fault::Status(code) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = error(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
            );
            refused(status, &body, HeaderMap::new())
        }
        Fault::Overloaded { retry_after } => {
            let body = error(
                "The server is overloaded. Please try again later.",
                "server_error",
                Some("server_is_overloaded"),
            );
            let mut headers = HeaderMap::new();
            retry_headers(&mut headers, retry_after);
            refused(StatusCode::SERVICE_UNAVAILABLE, &body, headers)
        }
        Fault::RateLimited { retry_after } => {
            let message = format!(
                "Rate limit reached for requests. Please try again in {}.",
                go_duration(retry_after)
            );
            let body = error(&message, "requests", Some("rate_limit_exceeded"));
            let mut headers = HeaderMap::new();
            retry_headers(&mut headers, retry_after);
            refused(StatusCode::TOO_MANY_REQUESTS, &body, headers)
        }
        Fault::InsufficientQuota => {
            let body = error(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                Some("insufficient_quota"),
            );
            refused(StatusCode::TOO_MANY_REQUESTS, &body, HeaderMap::new())
        }
        Fault::SpendLimit => {
            let body = error(
                "You have exceeded your organization's spend limit for this month.",
                "insufficient_quota",
                Some("organization_spend_limit_exceeded"),
            );
            refused(StatusCode::TOO_MANY_REQUESTS, &body, HeaderMap::new())
        }
        Fault::UsageLimit => {
            let body = error(
                "Your organization has reached its usage limit for this month.",
                "insufficient_quota",
                Some("organization_usage_limit_exceeded"),
            );
            refused(StatusCode::TOO_MANY_REQUESTS, &body, HeaderMap::new())
        }
        Fault::CapacityExceeded => {
            let body = error(
                "Flex tier capacity exceeded. This is a temporary condition; please retry.",
                "capacity_exceeded",
                Some("capacity_exceeded"),
            );
            let status = StatusCode::from_u16(498).expect("498 is a status");
            refused(status, &body, HeaderMap::new())
        }
        Fault::RetryAfterInMessage { retry_after } => {
            let message = format!(
                "Requests to the ChatCompletions_Create Operation under Azure OpenAI API \
                 version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 \
                 pricing tier. Please retry after {} seconds. Please go here: \
                 https://aka.ms/oai/quotaincrease if you would like to further increase the \
                 default rate limit.",
                whole_seconds(retry_after)
            );
            let body = serde_json::json!({"error": {"code": "429", "message": message}});
            refused(StatusCode::TOO_MANY_REQUESTS, &body, HeaderMap::new())
        }
        Fault::ApimRateLimit { retry_after } => {
            let message = format!(
                "Rate limit is exceeded. Try again in {} seconds.",
                whole_seconds(retry_after)
            );
            let body = serde_json::json!({"statusCode": 429, "message": message});
            refused(StatusCode::TOO_MANY_REQUESTS, &body, HeaderMap::new())
        }
        Fault::LongRetryAfter { retry_after } => {
            let message =
                format!("Monthly usage limit reached. Resets in {}.", in_words(retry_after));
            let body = error(&message, "requests", Some("rate_limit_exceeded"));
            refused(StatusCode::TOO_MANY_REQUESTS, &body, long_retry_after(retry_after))
        }
        Fault::Unauthorized => unauthorized(provider, id, Refusal::Fault),
        Fault::RequestTooLarge => {
            let limit = provider.config.tpm.map_or(0, |s| s.limit);
            too_large(provider, id, Refusal::Fault, limit, asked)
        }
        _ => return None,
    };
    Some(answer)
}

/// A wait in whole seconds, rounded up.
pub(super) fn whole_seconds(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// A long wait as a message says it: `16 days`, `5 hours`, `40 minutes`.
pub(super) fn in_words(wait: Duration) -> String {
    let secs = whole_seconds(wait);
    match secs {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3_600 => format!("{} hours", s / 3_600),
        s => format!("{} minutes", s.div_ceil(60)),
    }
}

/// The `retry-after` header of a long wait, in whole seconds.
pub(super) fn long_retry_after(wait: Duration) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::RETRY_AFTER, HeaderValue::from(whole_seconds(wait)));
    headers
}

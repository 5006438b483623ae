//! Faults that strike before admission: the refusals they answer with, nothing charged.

use http::{HeaderMap, StatusCode};

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
        Fault::Unauthorized => unauthorized(provider, id, Refusal::Fault),
        Fault::RequestTooLarge => {
            let limit = provider.config.tpm.map_or(0, |s| s.limit);
            too_large(provider, id, Refusal::Fault, limit, asked)
        }
        _ => return None,
    };
    Some(answer)
}

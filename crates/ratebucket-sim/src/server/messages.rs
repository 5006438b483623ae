//! Anthropic's Messages API: `POST /v1/messages`, plain and streamed, against requests,
//! input tokens and output tokens at once.

use std::io;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use super::admission::{Admission, admit_messages, anthropic_headers_now, settle_output};
use super::dialects::retry_headers;
use super::replies::{json_response, refuse, stream_response};
use super::{Answer, MAX_BODY, Provider};
use crate::anthropic::{self, MessagesRequest, error};
use crate::config::Fault;
use crate::log::Refusal;

/// Anthropic's side: `POST /v1/messages` with `x-api-key` (when a key is set) and
/// `anthropic-version`.
pub(super) async fn handle(provider: &Provider, req: Request<Incoming>, path: &str) -> Answer {
    let id = provider.arrive();
    let http2 = req.version() == http::Version::HTTP_2;
    provider.record(id, |e| e.http2 = http2);
    if req.method() != Method::POST || !path.ends_with("/v1/messages") {
        provider.finish(id, Some(404));
        return not_found(provider, id, path);
    }
    let key = req.headers().get("x-api-key").and_then(|v| v.to_str().ok());
    let authorized = provider.config.api_key.as_deref().is_none_or(|k| key == Some(k));
    let versioned = req.headers().contains_key("anthropic-version");
    let Ok(collected) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
        provider.record(id, |e| e.refusal = Some(Refusal::BadRequest));
        provider.finish(id, Some(413));
        let body = crate::anthropic::error("request_too_large", "Request exceeds the maximum size");
        return Ok(json_response(StatusCode::PAYLOAD_TOO_LARGE, &body, HeaderMap::new()));
    };
    if !authorized {
        return unauthorized(provider, id, Refusal::Unauthorized);
    }
    let slot = match super::gauges::enter(provider, id) {
        Ok(slot) => slot,
        Err(refused) => return Ok(*refused),
    };
    answer(provider, id, &collected.to_bytes(), versioned).await.map(|response| slot.hold(response))
}

/// A request refused as invalid (400), before anything is charged.
fn invalid(provider: &Provider, id: u64, message: &str) -> Answer {
    Ok(refuse(
        provider,
        id,
        Refusal::BadRequest,
        StatusCode::BAD_REQUEST,
        &error("invalid_request_error", message),
        HeaderMap::new(),
    ))
}

/// The 401 of a missing or wrong `x-api-key`.
pub(super) fn unauthorized(provider: &Provider, id: u64, refusal: Refusal) -> Answer {
    Ok(refuse(
        provider,
        id,
        refusal,
        StatusCode::UNAUTHORIZED,
        &error("authentication_error", "invalid x-api-key"),
        HeaderMap::new(),
    ))
}

/// The 404 of any other path.
pub(super) fn not_found(provider: &Provider, id: u64, path: &str) -> Answer {
    Ok(refuse(
        provider,
        id,
        Refusal::BadRequest,
        StatusCode::NOT_FOUND,
        &error("not_found_error", &format!("Not found: {path}")),
        HeaderMap::new(),
    ))
}

/// Answers one Messages API request whose body is `bytes`; `versioned` says whether it
/// carried `anthropic-version`.
pub(super) async fn answer(provider: &Provider, id: u64, bytes: &Bytes, versioned: bool) -> Answer {
    let request: MessagesRequest = match serde_json::from_slice(bytes) {
        Ok(r) => r,
        Err(e) => return invalid(provider, id, &format!("messages: {e}")),
    };
    if !versioned {
        return invalid(provider, id, "anthropic-version: header is required");
    }
    let Some(max_tokens) = request.max_tokens else {
        return invalid(provider, id, "max_tokens: Field required");
    };
    if !provider.config.decision_delay.is_zero() {
        tokio::time::sleep(provider.config.decision_delay).await;
    }
    let config = &provider.config;
    let (mut rng, seen_before) = provider.rng_for(bytes);
    let input = request.input_tokens();
    let (lo, hi) = config.completion_tokens;
    let drawn = rng.u64(lo..=hi);
    let output = drawn.min(max_tokens);
    let stop_reason = if drawn > max_tokens { "max_tokens" } else { "end_turn" };
    provider.record(id, |e| {
        e.stream = request.stream;
        e.prompt_tokens = input;
        e.user = request.user();
    });
    let fault = provider.fault_for(id, seen_before, &mut rng);
    let fault_name = fault.map(|f| format!("{f:?}"));
    provider.record(id, |e| e.fault.clone_from(&fault_name));

    // Faults that strike before admission: nothing is charged.
    let refused = |status: StatusCode, kind: &str, message: &str, headers: HeaderMap| {
        Ok(refuse(provider, id, Refusal::Fault, status, &error(kind, message), headers))
    };
    match fault {
        Some(Fault::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return refused(status, "api_error", "Internal server error", HeaderMap::new());
        }
        Some(Fault::Overloaded { retry_after }) => {
            let mut headers = HeaderMap::new();
            retry_headers(&mut headers, retry_after);
            let overloaded = StatusCode::from_u16(529).expect("529 is a status");
            return refused(overloaded, "overloaded_error", "Overloaded", headers);
        }
        Some(Fault::RateLimited { retry_after }) => {
            let mut headers = HeaderMap::new();
            retry_headers(&mut headers, retry_after);
            let message = "This request would exceed the rate limit for your organization.";
            return refused(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message, headers);
        }
        Some(Fault::InsufficientQuota) => {
            let message = "Your credit balance is too low to access the Anthropic API.";
            return refused(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                message,
                HeaderMap::new(),
            );
        }
        Some(Fault::Unauthorized) => return unauthorized(provider, id, Refusal::Fault),
        Some(Fault::SpendLimit) => {
            // The monthly spend cap: no `retry-after`, a detail naming the cap.
            let mut body = error(
                "rate_limit_error",
                "You have reached your monthly spend limit. Access resumes when the limit is \
                 raised or the month turns.",
            );
            body["error"]["details"] = serde_json::json!({
                "error_code": "enforced_spend_limit_reached"
            });
            return Ok(refuse(
                provider,
                id,
                Refusal::Fault,
                StatusCode::TOO_MANY_REQUESTS,
                &body,
                HeaderMap::new(),
            ));
        }
        Some(Fault::UsageLimit) => {
            let now = crate::dates::from_now(std::time::Duration::ZERO);
            let message = format!(
                "You have reached your specified API usage limits. You will regain access on \
                 {} at 00:00 UTC.",
                crate::dates::next_month(now)
            );
            return refused(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                &message,
                HeaderMap::new(),
            );
        }
        Some(Fault::LongRetryAfter { retry_after }) => {
            let message = format!(
                "Monthly usage limit reached. Resets in {}.",
                super::faults::in_words(retry_after)
            );
            return refused(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                &message,
                super::faults::long_retry_after(retry_after),
            );
        }
        Some(
            fault @ (Fault::CapacityExceeded
            | Fault::RetryAfterInMessage { .. }
            | Fault::ApimRateLimit { .. }),
        ) => {
            // A gateway's refusal, in its own shape whatever the API behind it.
            if let Some(answer) = super::faults::before_admission(provider, id, fault, input) {
                return Ok(answer);
            }
        }
        _ => {}
    }

    let headers = match admit_messages(provider, input, max_tokens) {
        Admission::Admitted { headers } => headers,
        Admission::Throttled { headers, body, refusal } => {
            return Ok(refuse(
                provider,
                id,
                refusal,
                StatusCode::TOO_MANY_REQUESTS,
                &body,
                headers,
            ));
        }
        Admission::TooLarge { limit } => {
            let message = format!(
                "This request asks for more tokens than the rate limit of {limit} per minute \
                 allows at all: reduce the prompt or max_tokens."
            );
            return invalid(provider, id, &message);
        }
    };
    provider.record(id, |e| {
        e.admitted = true;
        e.requests_charged = u64::from(config.rpm.is_some());
        e.tokens_charged = if config.itpm.is_some() { input } else { 0 };
        e.completion_tokens = output;
    });
    // A combined limit counts the input and the output as settled.
    let combined = config.itpm.is_none() && config.tpm.is_some();
    let latency = provider.latency(&mut rng);
    let model = request.model.clone().unwrap_or_else(|| "sim-model".to_owned());
    let done = anthropic::Answer {
        id,
        model: &model,
        input_tokens: input,
        output_tokens: output,
        stop_reason,
    };
    // What the request took of the output limit, settled as the answer is made.
    let settle = |produced: u64| {
        settle_output(provider, max_tokens, produced);
        let charged = if config.otpm.is_some() { produced } else { 0 };
        provider.record(id, |e| {
            e.output_tokens_charged = charged;
            if combined {
                e.tokens_charged = input + produced;
            }
        });
    };
    match fault {
        Some(Fault::ResetBeforeResponse) => {
            tokio::time::sleep(latency).await;
            // Nobody knows what it produced: the reservation stands.
            settle(max_tokens);
            provider.finish(id, None);
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "injected reset"));
        }
        Some(Fault::Stall { stall }) => tokio::time::sleep(stall).await,
        _ => {}
    }
    if request.stream {
        let mut events = done.stream_events();
        let mut cut = fault == Some(Fault::CutStream);
        let mut hold = None;
        match fault {
            Some(Fault::StreamError { overloaded, after_content }) => {
                // `message_start`, then (after content) half the deltas, then the error.
                let keep = if after_content { 3 + (events.len() - 6).div_ceil(2) } else { 1 };
                events.truncate(keep);
                let (kind, message) = if overloaded {
                    ("overloaded_error", "Overloaded")
                } else {
                    ("rate_limit_error", "Rate limited: please slow down.")
                };
                events.push(anthropic::event("error", &error(kind, message)));
                cut = false;
            }
            Some(Fault::StallAfterHead { stall }) => hold = Some((0, stall)),
            Some(Fault::StallMidStream { stall }) => hold = Some((events.len() / 2, stall)),
            _ => {}
        }
        settle(output);
        return Ok(stream_response(provider, id, latency, events, cut, hold, headers));
    }
    tokio::time::sleep(latency).await;
    settle(output);
    // Written as the answer leaves: what remains then, and the instant the bucket is full.
    let headers = anthropic_headers_now(provider);
    provider.finish(id, Some(200));
    let body = match fault {
        Some(Fault::ErrorIn200) => error("api_error", "The upstream provider failed."),
        _ => done.body(),
    };
    Ok(json_response(StatusCode::OK, &body, headers))
}

//! The responses the provider sends: JSON bodies, refusals and event streams.

use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode, header};

use super::{Provider, lock};
use crate::body::{ChannelBody, ResponseBody, full};
use crate::log::Refusal;
use crate::openai::error;

pub(super) fn json_response(
    status: StatusCode,
    body: &serde_json::Value,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    json_response_bytes(status, Bytes::from(body.to_string()), headers)
}

/// A 200 JSON response whose body arrives through a channel, announcing `len` bytes.
pub(super) fn announced_json(
    body: ResponseBody,
    len: usize,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    response
}

/// A response labelled JSON whatever `body` holds.
pub(super) fn json_response_bytes(
    status: StatusCode,
    body: Bytes,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

pub(super) fn refuse(
    provider: &Provider,
    id: u64,
    refusal: Refusal,
    status: StatusCode,
    body: &serde_json::Value,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    provider.record(id, |e| e.refusal = Some(refusal));
    provider.finish(id, Some(status.as_u16()));
    json_response(status, body, headers)
}

pub(super) fn unauthorized(
    provider: &Provider,
    id: u64,
    refusal: Refusal,
) -> Response<ResponseBody> {
    let body =
        error("Incorrect API key provided.", "invalid_request_error", Some("invalid_api_key"));
    refuse(provider, id, refusal, StatusCode::UNAUTHORIZED, &body, HeaderMap::new())
}

pub(super) fn too_large(
    provider: &Provider,
    id: u64,
    refusal: Refusal,
    limit: u64,
    requested: u64,
) -> Response<ResponseBody> {
    let message = format!(
        "Request too large for sim-model in organization org-sim on tokens per min (TPM): \
         Limit {limit}, Requested {requested}. The input or output tokens must be reduced in \
         order to run successfully."
    );
    let body = error(&message, "tokens", Some("rate_limit_exceeded"));
    refuse(provider, id, refusal, StatusCode::TOO_MANY_REQUESTS, &body, HeaderMap::new())
}

pub(super) fn stream_response(
    provider: &Provider,
    id: u64,
    latency: Duration,
    events: Vec<String>,
    cut: bool,
    hold: Option<(usize, Duration)>,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    let (tx, body) = ChannelBody::channel();
    let interval = provider.config.chunk_interval;
    let log = Arc::clone(&provider.log);
    let start = provider.start;
    tokio::spawn(async move {
        tokio::time::sleep(latency).await;
        // A cut stream stops half-way, before the usage chunk and `[DONE]`.
        let keep = if cut { (events.len() / 2).max(1) } else { events.len() };
        for (n, event) in events.into_iter().take(keep).enumerate() {
            if let Some((at, stall)) = hold
                && n == at
            {
                tokio::time::sleep(stall).await;
            }
            if tx.send(Ok(Bytes::from(event))).await.is_err() {
                break;
            }
            tokio::time::sleep(interval).await;
        }
        if cut {
            let _ =
                tx.send(Err(io::Error::new(io::ErrorKind::ConnectionReset, "injected cut"))).await;
        }
        if let Some(entry) = lock(&log).get_mut(id as usize) {
            entry.finished = Some(start.elapsed());
            entry.status = Some(200);
        }
    });
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// `openai-processing-ms`: the whole milliseconds since `admitted_at`, rounded down (a
/// client reading it then never places the admission later than it was).
pub(super) fn processing_ms(headers: &mut HeaderMap, admitted_at: Instant) {
    let ms = u64::try_from(admitted_at.elapsed().as_millis()).unwrap_or(u64::MAX);
    headers.insert("openai-processing-ms", ms.into());
}

//! The HTTP side: accepting connections and answering chat completion requests.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::{ChannelBody, ResponseBody, full};
use crate::config::{Charging, Fault, Headers, Latency, SimConfig, Trigger};
use crate::limits::{Limit, go_duration};
use crate::log::{LogEntry, Refusal};
use crate::openai::{ChatRequest, Completion, error};
use serde_json::json;

const MAX_BODY: usize = 4 << 20;

/// Everything the handlers share.
pub(crate) struct Provider {
    config: SimConfig,
    start: Instant,
    limits: Mutex<Limits>,
    pub(crate) log: Arc<Mutex<Vec<LogEntry>>>,
    /// Connections accepted so far.
    pub(crate) connections: Arc<std::sync::atomic::AtomicU64>,
    /// How many times each request body has been seen, so retries draw afresh.
    seen: Mutex<HashMap<u64, u64>>,
}

struct Limits {
    requests: Option<Limit>,
    tokens: Option<Limit>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Provider {
    pub(crate) fn new(config: SimConfig) -> Provider {
        let limits = Limits {
            requests: config.rpm.map(Limit::new),
            tokens: config.tpm.map(Limit::new),
        };
        Provider {
            config,
            start: Instant::now(),
            limits: Mutex::new(limits),
            log: Arc::default(),
            connections: Arc::default(),
            seen: Mutex::default(),
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn arrive(&self) -> u64 {
        let mut log = lock(&self.log);
        let id = log.len() as u64;
        log.push(LogEntry {
            id,
            arrived: self.now(),
            admitted: false,
            refusal: None,
            finished: None,
            requests_charged: 0,
            tokens_charged: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            status: None,
            fault: None,
            stream: false,
            http2: false,
            user: None,
        });
        id
    }

    fn record(&self, id: u64, f: impl FnOnce(&mut LogEntry)) {
        if let Some(entry) = lock(&self.log).get_mut(id as usize) {
            f(entry);
        }
    }

    fn finish(&self, id: u64, status: Option<u16>) {
        let now = self.now();
        self.record(id, |e| {
            e.finished = Some(now);
            e.status = status;
        });
    }

    /// A generator for this request, seeded by the server's seed, the body and how many
    /// times this body was seen before (so a retry draws afresh, and reruns draw the same),
    /// and that count (0 for a body's first arrival).
    fn rng_for(&self, body: &[u8]) -> (fastrand::Rng, u64) {
        let mut hasher = DefaultHasher::new();
        body.hash(&mut hasher);
        let digest = hasher.finish();
        let mut seen = lock(&self.seen);
        let n = seen.entry(digest).or_insert(0);
        let attempt = *n;
        *n += 1;
        let rng = fastrand::Rng::with_seed(
            self.config.seed ^ digest ^ attempt.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        );
        (rng, attempt)
    }

    fn fault_for(&self, id: u64, seen_before: u64, rng: &mut fastrand::Rng) -> Option<Fault> {
        self.config.faults.iter().find_map(|rule| {
            let strikes = match &rule.trigger {
                Trigger::Rate(p) => rng.f64() < *p,
                Trigger::Requests(ids) => ids.contains(&id),
                Trigger::FirstArrivals => seen_before == 0,
            };
            strikes.then_some(rule.fault)
        })
    }

    fn latency(&self, rng: &mut fastrand::Rng) -> Duration {
        match self.config.latency {
            Latency::Fixed(d) => d,
            Latency::Uniform(lo, hi) => {
                let (lo, hi) = (lo.min(hi), hi.max(lo));
                lo + (hi - lo).mul_f64(rng.f64())
            }
            Latency::LongTail {
                base,
                tail,
                tail_probability,
            } => {
                if rng.f64() < tail_probability {
                    tail
                } else {
                    base
                }
            }
        }
    }
}

/// Serves until `shutdown` flips: HTTP/1.1 in the clear, or, with `tls`, HTTP/1.1 or
/// HTTP/2 as ALPN chose.
pub(crate) async fn serve(
    listener: TcpListener,
    provider: Arc<Provider>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                provider
                    .connections
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // Closing with linger 0 sends a reset, which is what the reset and cut
                // faults are meant to look like to the client.
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                let _ = stream.set_nodelay(true);
                let provider = Arc::clone(&provider);
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let provider = Arc::clone(&provider);
                        async move { handle(&provider, req).await }
                    });
                    match tls {
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            let Ok(stream) = acceptor.accept(stream).await else {
                                return;
                            };
                            let _ = hyper_util::server::conn::auto::Builder::new(
                                hyper_util::rt::TokioExecutor::new(),
                            )
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                        }
                    }
                });
            }
            _ = shutdown.changed() => return,
        }
    }
}

type Answer = Result<Response<ResponseBody>, io::Error>;

async fn handle(provider: &Provider, req: Request<Incoming>) -> Answer {
    let path = req.uri().path().to_owned();
    let is_chat = path.ends_with("/chat/completions");
    if req.method() != Method::POST || !is_chat {
        let id = provider.arrive();
        provider.record(id, |e| e.refusal = Some(Refusal::BadRequest));
        provider.finish(id, Some(404));
        let body = error(
            &format!("Unknown request URL: {} {path}", req.method()),
            "invalid_request_error",
            Some("unknown_url"),
        );
        return Ok(json_response(
            StatusCode::NOT_FOUND,
            &body,
            HeaderMap::new(),
        ));
    }
    let id = provider.arrive();
    let http2 = req.version() == http::Version::HTTP_2;
    provider.record(id, |e| e.http2 = http2);
    let authorized = provider.config.api_key.as_deref().is_none_or(|key| {
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let api_key = req.headers().get("api-key").and_then(|v| v.to_str().ok());
        bearer == Some(&format!("Bearer {key}")) || api_key == Some(key)
    });
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            provider.record(id, |e| e.refusal = Some(Refusal::BadRequest));
            provider.finish(id, Some(413));
            let body = error(
                "Request body too large or unreadable.",
                "invalid_request_error",
                None,
            );
            return Ok(json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &body,
                HeaderMap::new(),
            ));
        }
    };
    if !authorized {
        return Ok(unauthorized(provider, id, Refusal::Unauthorized));
    }
    let request: ChatRequest = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            provider.record(id, |entry| entry.refusal = Some(Refusal::BadRequest));
            provider.finish(id, Some(400));
            let body = error(
                &format!("We could not parse the JSON body of your request: {e}"),
                "invalid_request_error",
                None,
            );
            return Ok(json_response(
                StatusCode::BAD_REQUEST,
                &body,
                HeaderMap::new(),
            ));
        }
    };
    if !provider.config.decision_delay.is_zero() {
        tokio::time::sleep(provider.config.decision_delay).await;
    }
    answer(provider, id, &bytes, request).await
}

async fn answer(provider: &Provider, id: u64, bytes: &Bytes, request: ChatRequest) -> Answer {
    let config = &provider.config;
    let (mut rng, seen_before) = provider.rng_for(bytes);
    let prompt = request.prompt_tokens();
    let max_tokens = request
        .max_completion_tokens
        .or(request.max_tokens)
        .unwrap_or(config.default_max_tokens);
    let (lo, hi) = config.completion_tokens;
    let drawn = rng.u64(lo..=hi);
    let completion = drawn.min(max_tokens);
    let finish_reason = if drawn > max_tokens { "length" } else { "stop" };
    let stream = request.stream;
    let include_usage = request
        .stream_options
        .as_ref()
        .is_some_and(|o| o.include_usage);
    provider.record(id, |e| {
        e.stream = stream;
        e.prompt_tokens = prompt;
        e.user.clone_from(&request.user);
    });
    let fault = provider.fault_for(id, seen_before, &mut rng);
    let fault_name = fault.map(|f| format!("{f:?}"));
    provider.record(id, |e| e.fault.clone_from(&fault_name));

    // Faults that strike before admission: nothing is charged.
    match fault {
        Some(Fault::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let body = error(
                "The server had an error while processing your request. Sorry about that!",
                "server_error",
                None,
            );
            return Ok(refuse(
                provider,
                id,
                Refusal::Fault,
                status,
                &body,
                HeaderMap::new(),
            ));
        }
        Some(Fault::Overloaded { retry_after }) => {
            let body = error(
                "The server is overloaded. Please try again later.",
                "server_error",
                Some("server_is_overloaded"),
            );
            let mut headers = HeaderMap::new();
            retry_headers(&mut headers, retry_after);
            return Ok(refuse(
                provider,
                id,
                Refusal::Fault,
                StatusCode::SERVICE_UNAVAILABLE,
                &body,
                headers,
            ));
        }
        Some(Fault::RateLimited { retry_after }) => {
            let message = format!(
                "Rate limit reached for requests. Please try again in {}.",
                go_duration(retry_after)
            );
            let body = error(&message, "requests", Some("rate_limit_exceeded"));
            let mut headers = HeaderMap::new();
            retry_headers(&mut headers, retry_after);
            return Ok(refuse(
                provider,
                id,
                Refusal::Fault,
                StatusCode::TOO_MANY_REQUESTS,
                &body,
                headers,
            ));
        }
        Some(Fault::InsufficientQuota) => {
            let body = error(
                "You exceeded your current quota, please check your plan and billing details.",
                "insufficient_quota",
                Some("insufficient_quota"),
            );
            return Ok(refuse(
                provider,
                id,
                Refusal::Fault,
                StatusCode::TOO_MANY_REQUESTS,
                &body,
                HeaderMap::new(),
            ));
        }
        Some(Fault::Unauthorized) => return Ok(unauthorized(provider, id, Refusal::Fault)),
        Some(Fault::RequestTooLarge) => {
            let limit = config.tpm.map_or(0, |s| s.limit);
            return Ok(too_large(
                provider,
                id,
                Refusal::Fault,
                limit,
                prompt + max_tokens,
            ));
        }
        _ => {}
    }

    let tokens_charge = match config.charging {
        Charging::ReserveMaxTokens => prompt + max_tokens,
        Charging::BooksEstimate => (bytes.len() as u64).div_ceil(4) + max_tokens,
        Charging::ActualUsage => prompt + completion,
    };
    let admission = admit(provider, tokens_charge);
    let headers = match admission {
        Admission::TooLarge { limit } => {
            return Ok(too_large(
                provider,
                id,
                Refusal::TooLarge,
                limit,
                tokens_charge,
            ));
        }
        Admission::Throttled {
            headers,
            body,
            refusal,
        } => {
            return Ok(refuse(
                provider,
                id,
                refusal,
                StatusCode::TOO_MANY_REQUESTS,
                &body,
                headers,
            ));
        }
        Admission::Admitted { headers } => headers,
    };
    let requests_charged = u64::from(config.rpm.is_some());
    provider.record(id, |e| {
        e.admitted = true;
        e.requests_charged = requests_charged;
        e.tokens_charged = if config.tpm.is_some() {
            tokens_charge
        } else {
            0
        };
        e.completion_tokens = completion;
    });

    let latency = provider.latency(&mut rng);
    let model = request
        .model
        .clone()
        .unwrap_or_else(|| "sim-model".to_owned());
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let done = Completion {
        id,
        created,
        model: &model,
        prompt_tokens: prompt,
        completion_tokens: completion,
        finish_reason,
    };
    match fault {
        Some(Fault::ResetBeforeResponse) => {
            tokio::time::sleep(latency).await;
            provider.finish(id, None);
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "injected reset",
            ));
        }
        Some(Fault::Stall { stall }) => {
            tokio::time::sleep(stall).await;
        }
        _ => {}
    }
    let cut = fault == Some(Fault::CutStream);
    let absurd = json!({
        "prompt_tokens": u64::MAX,
        "completion_tokens": u64::MAX,
        "total_tokens": u64::MAX,
    });
    let proxy_error = error("The upstream provider failed.", "server_error", None);
    // Where a stream or a body is held, and for how long.
    let hold = match fault {
        Some(Fault::StallAfterHead { stall }) => Some((0, stall)),
        Some(Fault::StallMidStream { stall }) => Some((usize::MAX, stall)),
        _ => None,
    };
    if stream {
        let mut events = done.stream_events(include_usage);
        match fault {
            Some(Fault::ErrorChunk) => {
                // Content, then an error in place of the rest, then `[DONE]` regardless.
                events.truncate((events.len() / 2).max(1));
                let error = error("The model crashed while generating.", "server_error", None);
                events.push(format!("data: {error}\n\n"));
                events.push("data: [DONE]\n\n".to_owned());
            }
            Some(Fault::ErrorIn200) => {
                events = vec![format!("data: {proxy_error}\n\n")];
            }
            Some(Fault::AbsurdUsage) => {
                for event in &mut events {
                    if event.contains("\"usage\":{") {
                        let json = event.trim_start_matches("data: ").trim_end();
                        if let Ok(mut chunk) = serde_json::from_str::<serde_json::Value>(json) {
                            chunk["usage"] = absurd.clone();
                            *event = format!("data: {chunk}\n\n");
                        }
                    }
                }
            }
            Some(Fault::Flood { bytes }) => events = vec!["x".repeat(bytes)],
            _ => {}
        }
        let hold = hold.map(|(at, stall)| (at.min(events.len() / 2), stall));
        return Ok(stream_response(
            provider, id, latency, events, cut, hold, headers,
        ));
    }
    tokio::time::sleep(latency).await;
    let mut body = done.body();
    match fault {
        Some(Fault::ErrorIn200) => body = json!({ "error": proxy_error["error"].clone() }),
        Some(Fault::AbsurdUsage) => body["usage"] = absurd,
        Some(Fault::Flood { bytes }) => {
            provider.finish(id, Some(200));
            let flood = Bytes::from(vec![b'x'; bytes]);
            return Ok(json_response_bytes(StatusCode::OK, flood, headers));
        }
        _ => {}
    }
    if let Some((at, stall)) = hold {
        // The head now, the body (or its second half) after the stall.
        let bytes = Bytes::from(body.to_string());
        let full_len = bytes.len();
        let split = if at == 0 { 0 } else { full_len / 2 };
        let (tx, held_body) = ChannelBody::channel();
        provider.finish(id, Some(200));
        tokio::spawn(async move {
            if split > 0 && tx.send(Ok(bytes.slice(..split))).await.is_err() {
                return;
            }
            tokio::time::sleep(stall).await;
            let _ = tx.send(Ok(bytes.slice(split..))).await;
        });
        return Ok(announced_json(held_body, full_len, headers));
    }
    if cut {
        // Half the body, then a reset: the client sees a body cut mid-way.
        let bytes = Bytes::from(body.to_string());
        let full_len = bytes.len();
        let (tx, cut_body) = ChannelBody::channel();
        provider.finish(id, Some(200));
        tokio::spawn(async move {
            let _ = tx.send(Ok(bytes.slice(..full_len / 2))).await;
            let _ = tx
                .send(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "injected cut",
                )))
                .await;
        });
        return Ok(announced_json(cut_body, full_len, headers));
    }
    provider.finish(id, Some(200));
    Ok(json_response(StatusCode::OK, &body, headers))
}

enum Admission {
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
fn admit(provider: &Provider, tokens: u64) -> Admission {
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

fn limit_headers(limits: &mut Limits, now: Duration, style: Headers) -> HeaderMap {
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
fn retry_headers(headers: &mut HeaderMap, wait: Duration) {
    let ms = wait.as_millis().max(1) as u64;
    let secs = ms.div_ceil(1000).max(1);
    headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    headers.insert("retry-after-ms", HeaderValue::from(ms));
}

fn json_response(
    status: StatusCode,
    body: &serde_json::Value,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    json_response_bytes(status, Bytes::from(body.to_string()), headers)
}

/// A 200 JSON response whose body arrives through a channel, announcing `len` bytes.
fn announced_json(body: ResponseBody, len: usize, headers: HeaderMap) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
        .headers_mut()
        .insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    response
}

/// A response labelled JSON whatever `body` holds.
fn json_response_bytes(
    status: StatusCode,
    body: Bytes,
    headers: HeaderMap,
) -> Response<ResponseBody> {
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn refuse(
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

fn unauthorized(provider: &Provider, id: u64, refusal: Refusal) -> Response<ResponseBody> {
    let body = error(
        "Incorrect API key provided.",
        "invalid_request_error",
        Some("invalid_api_key"),
    );
    refuse(
        provider,
        id,
        refusal,
        StatusCode::UNAUTHORIZED,
        &body,
        HeaderMap::new(),
    )
}

fn too_large(
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
    refuse(
        provider,
        id,
        refusal,
        StatusCode::TOO_MANY_REQUESTS,
        &body,
        HeaderMap::new(),
    )
}

fn stream_response(
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
        let keep = if cut {
            (events.len() / 2).max(1)
        } else {
            events.len()
        };
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
            let _ = tx
                .send(Err(io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "injected cut",
                )))
                .await;
        }
        if let Some(entry) = lock(&log).get_mut(id as usize) {
            entry.finished = Some(start.elapsed());
            entry.status = Some(200);
        }
    });
    let mut response = Response::new(body);
    *response.headers_mut() = headers;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

//! The HTTP side: accepting connections and answering chat completion requests.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::body::{ChannelBody, ResponseBody};
use crate::config::{Charging, Dialect, Fault, Latency, SimConfig, Trigger};
use crate::limits::Limit;
use crate::log::{LogEntry, Refusal};
use crate::openai::{ChatRequest, Completion, error};
use serde_json::json;

mod admission;
mod dialects;
mod faults;
mod gauges;
mod messages;
mod replies;

use admission::{Admission, admit};
use replies::{
    announced_json, json_response, json_response_bytes, processing_ms, refuse, stream_response,
    too_large, unauthorized,
};

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
    /// Requests in flight, and arrivals per second.
    gauges: gauges::Gauges,
}

struct Limits {
    requests: Option<Limit>,
    tokens: Option<Limit>,
    daily: Option<Limit>,
    /// Anthropic's input tokens.
    input: Option<Limit>,
    /// Anthropic's output tokens.
    output: Option<Limit>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Provider {
    pub(crate) fn new(config: SimConfig) -> Provider {
        let limits = Limits {
            requests: config.rpm.map(Limit::new),
            tokens: config.tpm.map(Limit::new),
            daily: config.rpd.map(Limit::new),
            input: config.itpm.map(Limit::new),
            output: config.otpm.map(Limit::new),
        };
        Provider {
            config,
            start: Instant::now(),
            limits: Mutex::new(limits),
            log: Arc::default(),
            connections: Arc::default(),
            seen: Mutex::default(),
            gauges: gauges::Gauges::default(),
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
            output_tokens_charged: 0,
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
            Latency::LongTail { base, tail, tail_probability } => {
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
    let anthropic = provider.config.dialect == Dialect::Anthropic;
    if anthropic {
        return messages::handle(provider, req, &path).await;
    }
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
        return Ok(json_response(StatusCode::NOT_FOUND, &body, HeaderMap::new()));
    }
    let id = provider.arrive();
    let http2 = req.version() == http::Version::HTTP_2;
    provider.record(id, |e| e.http2 = http2);
    let authorized = provider.config.api_key.as_deref().is_none_or(|key| {
        let bearer = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let api_key = req.headers().get("api-key").and_then(|v| v.to_str().ok());
        bearer == Some(&format!("Bearer {key}")) || api_key == Some(key)
    });
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            provider.record(id, |e| e.refusal = Some(Refusal::BadRequest));
            provider.finish(id, Some(413));
            let body =
                error("Request body too large or unreadable.", "invalid_request_error", None);
            return Ok(json_response(StatusCode::PAYLOAD_TOO_LARGE, &body, HeaderMap::new()));
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
            return Ok(json_response(StatusCode::BAD_REQUEST, &body, HeaderMap::new()));
        }
    };
    if !provider.config.decision_delay.is_zero() {
        tokio::time::sleep(provider.config.decision_delay).await;
    }
    let slot = match gauges::enter(provider, id) {
        Ok(slot) => slot,
        Err(refused) => return Ok(*refused),
    };
    answer(provider, id, &bytes, request).await.map(|response| slot.hold(response))
}

async fn answer(provider: &Provider, id: u64, bytes: &Bytes, request: ChatRequest) -> Answer {
    let config = &provider.config;
    let (mut rng, seen_before) = provider.rng_for(bytes);
    let prompt = request.prompt_tokens();
    let max_tokens =
        request.max_completion_tokens.or(request.max_tokens).unwrap_or(config.default_max_tokens);
    let (lo, hi) = config.completion_tokens;
    let drawn = rng.u64(lo..=hi);
    let completion = drawn.min(max_tokens);
    let finish_reason = if drawn > max_tokens { "length" } else { "stop" };
    let stream = request.stream;
    let include_usage = request.stream_options.as_ref().is_some_and(|o| o.include_usage);
    provider.record(id, |e| {
        e.stream = stream;
        e.prompt_tokens = prompt;
        e.user.clone_from(&request.user);
    });
    let fault = provider.fault_for(id, seen_before, &mut rng);
    let fault_name = fault.map(|f| format!("{f:?}"));
    provider.record(id, |e| e.fault.clone_from(&fault_name));

    // Faults that strike before admission: nothing is charged.
    if let Some(refused) =
        fault.and_then(|fault| faults::before_admission(provider, id, fault, prompt + max_tokens))
    {
        return Ok(refused);
    }

    let tokens_charge = match config.charging {
        Charging::ReserveMaxTokens => prompt + max_tokens,
        Charging::BooksEstimate => (bytes.len() as u64).div_ceil(4) + max_tokens,
        Charging::ActualUsage => prompt + completion,
    };
    let admission = admit(provider, tokens_charge);
    let headers = match admission {
        Admission::TooLarge { limit } => {
            return Ok(too_large(provider, id, Refusal::TooLarge, limit, tokens_charge));
        }
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
        Admission::Admitted { headers } => headers,
    };
    // Counted now: the processing time a head reports runs from here.
    let admitted_at = Instant::now();
    let mut headers = headers;
    let processing = config.dialect == Dialect::Openai;
    let requests_charged = u64::from(config.rpm.is_some() || config.rpd.is_some());
    provider.record(id, |e| {
        e.admitted = true;
        e.requests_charged = requests_charged;
        e.tokens_charged = if config.tpm.is_some() { tokens_charge } else { 0 };
        e.completion_tokens = completion;
    });

    let latency = provider.latency(&mut rng);
    let model = request.model.clone().unwrap_or_else(|| "sim-model".to_owned());
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
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
            return Err(io::Error::new(io::ErrorKind::ConnectionReset, "injected reset"));
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
        if processing {
            processing_ms(&mut headers, admitted_at);
        }
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
            Some(Fault::StreamError { overloaded, after_content }) => {
                // Before the first chunk, or after half the content; then `[DONE]`.
                events.truncate(if after_content { events.len() / 2 } else { 0 });
                let error = if overloaded {
                    error("The server is overloaded.", "server_error", Some("server_is_overloaded"))
                } else {
                    error(
                        "Rate limit reached for requests.",
                        "requests",
                        Some("rate_limit_exceeded"),
                    )
                };
                events.push(format!("data: {error}\n\n"));
                events.push("data: [DONE]\n\n".to_owned());
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
        return Ok(stream_response(provider, id, latency, events, cut, hold, headers));
    }
    tokio::time::sleep(latency).await;
    if processing {
        processing_ms(&mut headers, admitted_at);
    }
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
            let _ =
                tx.send(Err(io::Error::new(io::ErrorKind::ConnectionReset, "injected cut"))).await;
        });
        return Ok(announced_json(cut_body, full_len, headers));
    }
    provider.finish(id, Some(200));
    Ok(json_response(StatusCode::OK, &body, headers))
}

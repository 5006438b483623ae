//! A fake OpenAI-compatible provider on localhost, with real rate limits, latency and
//! injectable faults: the judge that ratebucket's adapters and benchmark run against.
//!
//! It speaks `POST /v1/chat/completions` (plain and SSE streaming with
//! `stream_options.include_usage`), enforces RPM and TPM together with a selectable model
//! (token bucket, fixed window, sliding log) and window length, answers 429 with
//! `retry-after`, `retry-after-ms` and OpenAI's error body, sends
//! `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` on every response, draws latency
//! and completion lengths from a seeded generator, and injects faults by rate or by request
//! number. It speaks other providers' dialects too ([`Dialect`]: Azure, Gemini, Groq,
//! Cerebras, OpenRouter), with a requests-per-day limit beside the minute's, and
//! Anthropic's Messages API (`POST /v1/messages`) with its three buckets (requests, input
//! and output tokens), its headers, its errors and error events inside a stream. Every
//! request is logged with its arrival, admission, charge and completion.
//!
//! Its limit arithmetic is its own (see `limits`), independent of the client crates, so a
//! bug in the client cannot hide by being mirrored in the provider that grades it.
//!
//! # As strict as the providers
//!
//! Each dialect writes what its provider writes, resolution and rounding included, by
//! default: a fake kinder than the provider would hide exactly the defects users meet.
//! Finer resets are an option ([`Resets::Fine`], `--resets fine`), never the default. The
//! test `tests/shapes.rs` holds every dialect's headers to these shapes, beside one real
//! header set of each provider's:
//!
//! | dialect | a real header set (the provider's documentation) | the sim, by default |
//! |---|---|---|
//! | OpenAI | `x-ratelimit-{limit,remaining}-requests: 60`, `59`; `x-ratelimit-reset-requests: 1s`; `x-ratelimit-{limit,remaining}-tokens: 150000`, `149984`; `x-ratelimit-reset-tokens: 6m0s` (also `547ms`, `7.66s`, `2m59.56s`); `openai-processing-ms: 547`; a 429's `retry-after: 1`, `retry-after-ms: 644` | the same names; Go durations in whole milliseconds below a second and hundredths of a second above, rounded to the nearest; the processing time in whole milliseconds; a 429's `retry-after` in whole seconds (rounded up) and `retry-after-ms` |
//! | Azure | OpenAI's names, `x-ratelimit-reset-requests: 55` (whole seconds); a 429's `retry-after: 33`, `retry-after-ms: 33000`; a refused limit's `remaining: -1` | OpenAI's names, whole seconds rounded up, `-1` for the refused limit |
//! | Groq | `x-ratelimit-{limit,remaining}-requests: 14400`, `14370` (per day); `x-ratelimit-reset-requests: 2m59.56s`; `x-ratelimit-{limit,remaining}-tokens: 18000`, `17997`; `x-ratelimit-reset-tokens: 7.66s`; a 429's `retry-after: 2` | the day's requests and the minute's tokens under those names, OpenAI's Go durations |
//! | Cerebras | `x-ratelimit-{limit,remaining,reset}-requests-day`, `x-ratelimit-{limit,remaining,reset}-tokens-minute`, resets in float seconds (`11.38`) | the same names, two decimals |
//! | OpenRouter | on its own 429s only: `X-RateLimit-Limit: 20`, `X-RateLimit-Remaining: 0`, `X-RateLimit-Reset: 1741305600000` (epoch milliseconds), `Retry-After` | the same |
//! | Gemini | none; a 429's body carries `RetryInfo.retryDelay: "38s"` and `QuotaFailure` | the same |
//! | Anthropic | `anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}`; resets as RFC 3339 instants in whole seconds (`2026-12-02T08:12:41Z`); token counts rounded to thousands; `tokens-*` the most restrictive; a 429's `retry-after: 20` | the same; an instant's fraction dropped; with only a combined `tpm`, `requests-*` and `tokens-*` alone (as some Anthropic-compatible servers send) |
//!
//! Refusals that are not throttles are there too ([`Fault`], `--fault`): a quota spent
//! until someone raises it (Anthropic's spend limit, its usage limits, OpenAI's spend
//! codes), a wait in days, Groq's transient 498, and the waits Azure and API Management
//! write only in their messages; gateways' resets as RFC 3339 instants or HTTP-dates
//! ([`Headers::PlainRfc3339`], [`Headers::PlainHttpDate`]).
//!
//! ```no_run
//! use ratebucket_sim::{LimitSpec, Sim, SimConfig};
//!
//! let sim = Sim::start(
//!     SimConfig::default()
//!         .rpm(LimitSpec::per_minute(600))
//!         .tpm(LimitSpec::per_minute(90_000)),
//! )?;
//! println!("fake provider at {}", sim.base_url());
//! // ... point a client at it ...
//! let admitted = sim.log().iter().filter(|e| e.admitted).count();
//! sim.shutdown();
//! # let _ = admitted;
//! # Ok::<(), std::io::Error>(())
//! ```

mod anthropic;
mod body;
mod config;
mod dates;
mod limits;
mod log;
mod openai;
mod scripted;
mod server;
mod spec;
pub mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::sync::watch;

pub use config::{
    Charging, Dialect, Fault, FaultRule, Headers, Latency, Resets, SimConfig, Trigger,
};
pub use limits::{LimitSpec, Model, go_duration};
pub use log::{LogEntry, Refusal};
pub use scripted::{Script, Scripted, ScriptedHandle, Step};
pub use spec::FAULT_NAMES;

/// Starts fake providers.
#[derive(Debug)]
pub struct Sim;

impl Sim {
    /// Binds `config.addr` (127.0.0.1, port 0 by default) and serves on a thread of its own,
    /// so it works beside any async runtime or none.
    pub fn start(config: SimConfig) -> std::io::Result<SimHandle> {
        Sim::start_with(config, None)
    }

    /// Like [`Sim::start`], but speaks TLS with `tls` (HTTP/2 when its ALPN protocols
    /// offer `h2` and the client takes it, HTTP/1.1 otherwise); [`SimHandle::base_url`]
    /// is then `https://127.0.0.1:PORT`. [`tls::TestCertificate`] makes a certificate for
    /// it at run time.
    pub fn start_tls(
        config: SimConfig,
        tls: Arc<rustls::ServerConfig>,
    ) -> std::io::Result<SimHandle> {
        Sim::start_with(config, Some(tokio_rustls::TlsAcceptor::from(tls)))
    }

    fn start_with(
        config: SimConfig,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> std::io::Result<SimHandle> {
        let listener = std::net::TcpListener::bind(config.addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let provider = Arc::new(server::Provider::new(config));
        let log = Arc::clone(&provider.log);
        let connections = Arc::clone(&provider.connections);
        let (stop, stopped) = watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name(format!("ratebucket-sim {addr}")).spawn(
            move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => server::serve(listener, provider, tls, stopped).await,
                        Err(e) => eprintln!("ratebucket-sim: cannot listen: {e}"),
                    }
                });
            },
        )?;
        Ok(SimHandle { addr, scheme, log, connections, stop, thread: Some(thread) })
    }
}

/// A running fake provider. Dropping it shuts it down.
#[derive(Debug)]
pub struct SimHandle {
    addr: SocketAddr,
    scheme: &'static str,
    log: Arc<Mutex<Vec<LogEntry>>>,
    connections: Arc<std::sync::atomic::AtomicU64>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl SimHandle {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (`https://` when started with [`Sim::start_tls`]), to
    /// point a client at.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// Connections accepted so far (a client that reuses connections opens few).
    pub fn connections(&self) -> u64 {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A copy of the request log so far, in arrival order.
    pub fn log(&self) -> Vec<LogEntry> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops accepting, drops open connections, and waits for the server thread.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.stop_now();
    }
}

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
mod limits;
mod log;
mod openai;
mod scripted;
mod server;
pub mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use tokio::sync::watch;

pub use config::{Charging, Dialect, Fault, FaultRule, Headers, Latency, SimConfig, Trigger};
pub use limits::{LimitSpec, Model, go_duration};
pub use log::{LogEntry, Refusal};
pub use scripted::{Script, Scripted, ScriptedHandle, Step};

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
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name(format!("ratebucket-sim {addr}"))
            .spawn(move || {
                runtime.block_on(async move {
                    match tokio::net::TcpListener::from_std(listener) {
                        Ok(listener) => server::serve(listener, provider, tls, stopped).await,
                        Err(e) => eprintln!("ratebucket-sim: cannot listen: {e}"),
                    }
                });
            })?;
        Ok(SimHandle {
            addr,
            scheme,
            log,
            connections,
            stop,
            thread: Some(thread),
        })
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
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
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

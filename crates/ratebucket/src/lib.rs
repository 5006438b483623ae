//! ratebucket: pace calls to APIs that enforce several rate limits at once.
//!
//! An LLM provider counts requests per minute *and* tokens per minute. ratebucket grants a
//! call against every limit at once or not at all, reserves an upper bound and reconciles
//! it against the usage the provider reports, and pauses the whole pool once when the
//! provider answers 429. This crate gathers the parts behind features, so one line in
//! `Cargo.toml` is enough:
//!
//! | feature | default | what it brings |
//! |---|---|---|
//! | `tokio` | yes | [`limiter`] on tokio, the tokio transports, and `tokio` itself ([`tokio`](mod@tokio)) |
//! | `http` | yes | [`http`]: any HTTP request through a limiter, with retries and a shared 429 gate |
//! | `openai` | yes | [`openai`]: chat completions paced by requests and tokens |
//! | `anthropic` | no | `ratebucket::anthropic`: Anthropic's Messages API, paced by requests, input and output tokens |
//! | `tls` | yes | HTTPS on the built-in transports (rustls, HTTP/2 by ALPN) |
//! | `smol` | no | the limiter and transports on smol, and `smol` itself |
//! | `native-roots` | no | the system's root certificates instead of the bundled ones |
//! | `blocking` | no | `ratebucket::blocking`: a limiter for synchronous code, no runtime needed |
//! | `sim` | no | `ratebucket::sim`: the fake provider, to try things without a key |
//!
//! A paced chat completion:
//!
//! ```no_run
//! use ratebucket::openai::{ChatRequest, Client, Limits, Message};
//! use ratebucket::tokio;
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let client = Client::builder("https://api.openai.com")
//!         .api_key(std::env::var("OPENAI_API_KEY")?)
//!         .limits(Limits::per_minute(500, 200_000))
//!         .build()?;
//!     let request = ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hello.")]);
//!     let answer = client.complete(request).await?;
//!     println!("{}", answer.completion.text().unwrap_or_default());
//!     Ok(())
//! }
//! ```
//!
//! A bare limiter, for anything else:
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ratebucket::Limit;
//!
//! // 600 requests and 90,000 tokens a minute, granted together or not at all.
//! let limiter = ratebucket::limiter([Limit::per_minute(600), Limit::per_minute(90_000)])?;
//! let reservation = limiter.reserve(&[1, 1_200]).await?;
//! // ... make the call, learn it used 800 tokens ...
//! reservation.commit(&[1, 800])?;
//! # Ok(()) }
//! ```

pub use ratebucket_rt::core;
pub use ratebucket_rt::core::{
    ArbiterConfig, Caller, GateConfig, InvalidLimit, LearnedQuota, Limit, Priority, QuotaPolicy,
    QuotaReport, Rate, RetryPolicy, Tenant, TenantSnapshot,
};
pub use ratebucket_rt::{
    KeyedError, KeyedLimiter, Limiter, Reservation, Reserve, ReserveError, ReserveOptions, Stats,
    Timer,
};

#[cfg(feature = "tokio")]
pub use ratebucket_tokio::TokioTimer;
#[cfg(feature = "tokio")]
pub use tokio;

#[cfg(feature = "smol")]
pub use ratebucket_smol::SmolTimer;
#[cfg(feature = "smol")]
pub use smol;

/// A limiter enforcing `limits` (one per dimension, in the order costs name them), full
/// now, on tokio (call it inside a runtime).
#[cfg(feature = "tokio")]
pub fn limiter(limits: impl IntoIterator<Item = Limit>) -> Result<Limiter, InvalidLimit> {
    ratebucket_tokio::limiter_for(limits)
}

/// A limiter enforcing `limits` (one per dimension, in the order costs name them), full
/// now, on smol.
#[cfg(all(feature = "smol", not(feature = "tokio")))]
pub fn limiter(limits: impl IntoIterator<Item = Limit>) -> Result<Limiter, InvalidLimit> {
    ratebucket_smol::limiter_for(limits)
}

/// A limiter enforcing `limits`, full now, on smol (when tokio is the default runtime).
#[cfg(feature = "smol")]
pub fn smol_limiter(limits: impl IntoIterator<Item = Limit>) -> Result<Limiter, InvalidLimit> {
    ratebucket_smol::limiter_for(limits)
}

/// Any HTTP request through a limiter: the [`Fetcher`](http::Fetcher), the transports,
/// the header parsers, and the `http` crate's request and response types.
#[cfg(feature = "http")]
pub mod http {
    pub use ::http::{
        HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Uri,
    };
    pub use ratebucket_http::*;
}

/// OpenAI-compatible chat completions, paced by requests and tokens.
#[cfg(feature = "openai")]
pub use ratebucket_openai as openai;

/// Anthropic's Messages API, paced by requests, input tokens and output tokens.
#[cfg(feature = "anthropic")]
pub use ratebucket_anthropic as anthropic;

/// The fake provider: an OpenAI-compatible server on 127.0.0.1 with real limits.
#[cfg(feature = "sim")]
pub use ratebucket_sim as sim;

#[cfg(feature = "blocking")]
pub use ratebucket_smol::blocking;

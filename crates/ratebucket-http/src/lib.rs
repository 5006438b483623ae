//! http_fetch for ratebucket: any HTTP request through a multi-dimension limiter.
//!
//! A [`Fetcher`] runs each request as: reserve its cost (one request by default) → wait
//! for the pool-wide gate → send → classify (OK, throttled, retryable, ambiguous,
//! permanent, fatal) → fold the rate-limit headers into the limiter → commit on success or
//! release on failure → retry per the table. It returns the response, or a [`FetchError`]
//! saying which class ended it and after how many attempts.
//!
//! - [`headers`]: total parsers for Retry-After (seconds and all three HTTP-date forms),
//!   `retry-after-ms`, IETF `RateLimit` / `RateLimit-Policy` (draft-10, draft-07 and the
//!   older `RateLimit-Limit` family), `x-ratelimit-*`, `x-should-retry`, Go durations.
//! - [`dialect`]: providers' dialects as data (OpenAI, Azure, Gemini, Groq, Cerebras,
//!   OpenRouter, IETF): which header family counts what, per second, minute or day, how
//!   each writes its resets, and where a refusal's body says when to come back.
//! - [`failure_kind`]: hyper / hyper-util / io errors to failure kinds: a refused or
//!   timed-out connect never reached the server (retryable); a read timeout, a reset after
//!   send or a cut body may have been executed (ambiguous, not re-sent by default).
//! - [`Transport`]: the one-method seam to any HTTP stack. [`HyperTransport`] (feature
//!   `tokio`, default) is hyper-util's pooled client; `SmolTransport` (feature `smol`)
//!   runs without tokio, with a pool of its own. Both speak HTTPS through rustls with the
//!   `tls` feature (default; [`tls`] holds the settings), HTTP/2 when the server's ALPN
//!   picks it. An existing hyper client, reqwest or a tower service plugs in by
//!   implementing the trait.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use bytes::Bytes;
//! use ratebucket_http::{FetchConfig, Fetcher, HyperTransport};
//! use ratebucket_tokio::core::{Instant, TokenBucket};
//!
//! let limiter = ratebucket_tokio::limiter(vec![TokenBucket::per_minute(600, Instant::ZERO)?])?;
//! let fetcher = Fetcher::new(HyperTransport::default(), limiter, FetchConfig::default());
//! let request = http::Request::get("http://127.0.0.1:8080/items").body(Bytes::new())?;
//! let fetched = fetcher.fetch(request).await?;
//! println!("{} after {} attempt(s)", fetched.response.status(), fetched.attempts);
//! # Ok(()) }
//! ```

mod body;
mod client;
mod config;
pub mod dialect;
mod error;
mod events;
mod failure;
mod fetched;
pub mod headers;
pub mod price;
mod sse;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "tower")]
pub mod tower;
mod transport;
mod vendor;

pub use body::copy_request;
pub use client::Fetcher;
pub use config::FetchConfig;
pub use error::{FetchError, FetchErrorKind, LimitHit, Problem};
pub use events::{EventReader, StreamFailure, StreamLimits, not_an_event_stream, throttle_stream};
pub use failure::failure_kind;
pub use fetched::{Fetched, Opened};
pub use headers::{Quota, Signals, Written};
pub use sse::{EventTooLarge, SseDecoder};
#[cfg(feature = "tokio")]
pub use transport::HyperTransport;
#[cfg(feature = "smol")]
pub use transport::SmolTransport;
pub use transport::{
    BoxError, Departure, RequestBody, ResponseBody, SendFuture, Transport, TransportError,
    box_body, check_scheme,
};
#[cfg(feature = "reqwest")]
pub use transport::{ReqwestTransport, reqwest_failure};
pub use vendor::{NoVendor, ResponseHead, Vendor};

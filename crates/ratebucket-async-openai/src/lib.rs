//! async-openai, paced by ratebucket.
//!
//! [`PaceLayer`] is a tower layer for async-openai's HTTP service
//! (`async_openai::Client::with_http_service`, its `middleware` feature). Every call the
//! client makes then goes through the same loop as ratebucket's own clients:
//!
//! - it reserves 1 request and the tokens the request can use (its prompt, estimated from
//!   the messages, plus `max_completion_tokens` / `max_tokens` times `n`) on a two-dimension
//!   limiter, granted together or not at all;
//! - it waits for the pool-wide gate, sends, and classifies the answer with OpenAI's
//!   rules (`insufficient_quota` stops the run, a 429 pauses every caller once, a 5xx is
//!   retried with jitter, a request that may have run is not re-sent);
//! - it folds the `x-ratelimit-*` headers into the limiter, and commits the `usage` a
//!   completion reports (a stream stays charged as reserved: its usage is read by the
//!   caller, not here).
//!
//! The layer replaces async-openai's own retry layer, so fifty callers no longer back off
//! on their own. A final answer (a success, or an error the policy gave up on) is handed to
//! async-openai as the server sent it, so its errors read as usual; only a call that got no
//! answer (the limiter refused, the connection failed) fails with a
//! `OpenAIError::Boxed` holding the [`FetchError`](ratebucket_http::FetchError).
//!
//! ```no_run
//! # async fn run(limiter: ratebucket_rt::Limiter) -> Result<(), Box<dyn std::error::Error>> {
//! use async_openai::config::OpenAIConfig;
//! use async_openai::middleware::ReqwestService;
//! use ratebucket_async_openai::PaceLayer;
//! use ratebucket_openai::Limits;
//! use tower::Layer;
//!
//! let limits = Limits::per_minute(500, 200_000);
//! let client = async_openai::Client::with_config(OpenAIConfig::new().with_api_key("sk-..."))
//!     .with_http_service(PaceLayer::new(limiter, limits).layer(ReqwestService::default()));
//! # let _ = client; Ok(()) }
//! ```

mod layer;

pub use layer::{PaceLayer, Paced};

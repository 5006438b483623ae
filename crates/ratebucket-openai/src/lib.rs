//! openai_compat for ratebucket: chat completions, plain and streaming, paced by requests
//! and tokens at once.
//!
//! A [`Client`] reserves 1 request plus `prompt estimate + max_tokens` tokens for each
//! call, waits for the pool-wide gate, sends, and commits the `usage.total_tokens` the
//! server reports (the over-estimate goes back into the bucket). Streams
//! ([`Client::stream`]) ask for `stream_options.include_usage` and commit the final usage
//! chunk; a stream cut before `[DONE]` is ambiguous: not re-sent, its estimate stays
//! charged.
//!
//! OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers lower the
//! buckets (never raise them, with epochs so older replies cannot win), and the reported
//! limits are learned: a lower limit than configured lowers that dimension; a client
//! configured with [`Limits::unknown`] starts at one request at a time and adopts the
//! first limits it is told. Error bodies are classified: `rate_limit_exceeded` and
//! `slow_down` throttle the pool; `insufficient_quota` and the billing codes abort the
//! run; "Request too large" fails that request only.
//!
//! Works against OpenAI, Azure ([`Endpoint::Azure`], [`Auth::ApiKey`]), vLLM (integer
//! error codes, no rate-limit headers) and LiteLLM proxies. Token estimates are behind
//! [`TokenEstimator`]: [`CharsPerToken`] by default, `Tiktoken` with the `tiktoken` feature.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ratebucket_http::HyperTransport;
//! use ratebucket_openai::{Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig};
//! use ratebucket_tokio::core::Instant;
//!
//! let limits = Limits::per_minute(3_500, 90_000);
//! let limiter = ratebucket_tokio::limiter(limits.buckets(Instant::ZERO)?)?;
//! let config = OpenAiConfig::new(
//!     Endpoint::OpenAi("https://api.openai.com".into()),
//!     Auth::Bearer(std::env::var("OPENAI_API_KEY")?),
//! );
//! let client = Client::new(HyperTransport::default(), limiter, limits, config);
//! let request = ChatRequest::new("gpt-4o-mini", vec![Message::user("Hello!")]).max_tokens(256);
//! let answer = client.complete(request).await?;
//! println!("{:?}", answer.completion.text());
//! # Ok(()) }
//! ```

mod builder;
mod client;
mod error;
mod estimate;
mod stream;
mod types;
mod vendor;

pub use builder::{ClientBuilder, arbiter_config};
pub use client::{Auth, Client, Completion, Endpoint, OpenAiConfig, call_cost, usage_charge};
pub use error::OpenAiError;
#[cfg(feature = "tiktoken")]
pub use estimate::Tiktoken;
pub use estimate::{CharsPerToken, TokenEstimator};
pub use ratebucket_http::Problem;
pub use ratebucket_http::price::{Price, Prices, Spend};
pub use ratebucket_http::{EventTooLarge, SseDecoder};
pub use stream::ChunkStream;
pub use types::{
    ApiError, ChatCompletion, ChatCompletionChunk, ChatRequest, Choice, ChunkChoice, Delta,
    ErrorBody, ErrorCode, Message, PromptTokensDetails, ResponseMessage, StreamOptions, Usage,
    chat_token_bound,
};
pub use vendor::MONEY;
pub use vendor::{Burst, Limits, OpenAiVendor, REQUESTS, TOKENS, retry_hint, verdict_for};

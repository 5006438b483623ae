//! Anthropic's Messages API for ratebucket: plain and streamed messages, paced by
//! requests, input tokens and output tokens at once.
//!
//! Anthropic counts three continuous buckets per minute: requests, input tokens (cache
//! reads not counted on most models) and output tokens, the last charged `max_tokens` on
//! admission and settled to what was produced. A [`Client`] reserves the same: one
//! request, the input estimate ([`InputEstimator`], four characters per token by default)
//! and `max_tokens`, all or none, waits for the pool-wide gate, sends, and settles at the
//! usage the answer reports (`message_start` and `message_delta` for a stream).
//!
//! Its `anthropic-ratelimit-{requests,input-tokens,output-tokens}-*` headers (RFC 3339
//! resets, token counts rounded to thousands and read as the least they stand for) lower
//! the buckets and teach the limits: known ([`Limits::per_minute`]) or unknown
//! ([`Limits::unknown`]: one request at a time until the first reply tells), and once the
//! headers show a bucket refilling continuously its whole burst is lent. A 429 or 529, and
//! the `rate_limit_error` and `overloaded_error` bodies, pause the whole pool once,
//! honouring `retry-after`. So does such an `error` event inside a stream before its first
//! content delta, and the request is sent again; after the first delta it is ambiguous:
//! never re-sent, charged as reserved.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ratebucket_anthropic::{Client, Limits, Message, MessagesRequest};
//!
//! let client = Client::builder("https://api.anthropic.com")
//!     .api_key(std::env::var("ANTHROPIC_API_KEY")?)
//!     .limits(Limits::per_minute(50, 40_000, 8_000))
//!     .build()?;
//! let request = MessagesRequest::new("claude-sonnet-4-5", 256, vec![Message::user("Hello!")]);
//! let answer = client.complete(request).await?;
//! println!("{}", answer.message.text());
//! # Ok(()) }
//! ```

mod builder;
mod client;
mod error;
mod estimate;
mod stream;
mod types;
mod vendor;

pub use builder::ClientBuilder;
pub use client::{API_VERSION, AnthropicConfig, Client, Completion};
pub use error::AnthropicError;
pub use estimate::{CharsPerToken, InputEstimator};
pub use ratebucket_http::Problem;
pub use ratebucket_http::price::{Price, Prices, Spend};
pub use stream::MessageStream;
pub use types::{
    ApiError, ContentBlock, ErrorBody, Message, MessagesRequest, MessagesResponse, StreamEvent,
    Usage,
};
pub use vendor::{
    AnthropicVendor, INPUT_TOKENS, Limits, MONEY, OUTPUT_TOKENS, REQUESTS, TOKENS, retry_hint_at,
    usage_charge, verdict_for,
};

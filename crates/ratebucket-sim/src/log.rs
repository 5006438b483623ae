//! The request log: what arrived, what was admitted or refused, and when it finished.

use std::time::Duration;

use serde::Serialize;

/// Why a request was not admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Refusal {
    /// Over the requests limit (429).
    Requests,
    /// Over the tokens limit (429).
    Tokens,
    /// Over the requests-per-day limit (429).
    Daily,
    /// Over the input-tokens limit (429, the Anthropic dialect).
    InputTokens,
    /// Over the output-tokens limit (429, the Anthropic dialect).
    OutputTokens,
    /// Larger than the tokens limit itself (429 "Request too large").
    TooLarge,
    /// Too many requests in flight (429 naming a concurrency limit).
    Concurrency,
    /// The arrival rate rose faster than allowed (429 naming a rate-of-change limit).
    Ramp,
    /// Refused by an injected fault before admission.
    Fault,
    /// Missing or wrong API key (401).
    Unauthorized,
    /// Not a valid chat completion request (400/404).
    BadRequest,
}

/// One request, from arrival to completion.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LogEntry {
    /// Arrival order, from 0.
    pub id: u64,
    /// Arrival, since the server started.
    pub arrived: Duration,
    /// Whether it was admitted against the limits (and charged).
    pub admitted: bool,
    /// Why not, if not.
    pub refusal: Option<Refusal>,
    /// When the answer (or the failure) was complete, since the server started.
    pub finished: Option<Duration>,
    /// Requests charged (0 or 1).
    pub requests_charged: u64,
    /// Tokens charged (input tokens in the Anthropic dialect; input and output tokens as
    /// settled where it enforces one combined limit).
    pub tokens_charged: u64,
    /// Output tokens charged in the Anthropic dialect, as settled (0 elsewhere).
    pub output_tokens_charged: u64,
    /// Prompt tokens as estimated by the server.
    pub prompt_tokens: u64,
    /// Completion tokens produced (0 if none).
    pub completion_tokens: u64,
    /// HTTP status sent; `None` if the connection was reset or stalled without one.
    pub status: Option<u16>,
    /// The injected fault, if one struck.
    pub fault: Option<String>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The `user` field of the request, if any (clients use it to tag requests).
    pub user: Option<String>,
    /// Whether it came over HTTP/2 (only possible on a TLS server, through ALPN).
    pub http2: bool,
}

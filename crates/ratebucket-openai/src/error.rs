//! Why a chat completion did not come back.

use std::fmt;

use ratebucket_http::{FetchError, Problem};
use ratebucket_rt::core::Class;

use crate::types::{ApiError, ErrorBody};

/// A failed completion or stream.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenAiError {
    /// The request ended without a usable answer: the class and attempts are in the
    /// [`FetchError`], with the last response (and its OpenAI error body) if any.
    Fetch(FetchError),
    /// A 2xx answer that does not decode as a chat completion (not JSON, cut short, an
    /// event stream sent to a plain call). Ambiguous: the request was taken and probably
    /// billed, so it is not re-sent, and it stays charged.
    Decode(serde_json::Error),
    /// The stream stopped before `[DONE]`. Ambiguous: the request may have been executed
    /// and billed, so it is not re-sent, and its estimated cost stays charged.
    StreamCut,
    /// The stream carried an error chunk. Ambiguous, as a cut stream.
    StreamError(ApiError),
    /// The request could not be encoded.
    Request(String),
    /// The client is misconfigured (an endpoint that is not a URL, a key that cannot be a
    /// header); nothing was reserved or sent.
    Config(String),
    /// A 2xx answer that is not a chat completion: an error object (with it, when the body
    /// carried one) or no `choices`. The request was sent, so it stays charged.
    NotACompletion(Option<ApiError>),
    /// The stream went silent for longer than `stream_idle_timeout` (`idle`), or ran past
    /// `stream_deadline`. Ambiguous, as a cut stream.
    StreamTimedOut {
        /// Whether the idle timeout (rather than the whole-stream deadline) expired.
        idle: bool,
    },
    /// The stream broke the protocol (an event larger than `max_event_bytes`). Ambiguous,
    /// as a cut stream.
    StreamProtocol(String),
    /// A streaming call was answered with a 2xx that is not an event stream (a plain JSON
    /// completion from a server or proxy that does not stream): its content type.
    /// Ambiguous: the request was taken and probably billed, so it is not re-sent, and it
    /// stays charged as reserved.
    NotAStream(String),
}

impl OpenAiError {
    /// The class that ended it, when known.
    pub fn class(&self) -> Option<Class> {
        match self {
            OpenAiError::Fetch(e) => e.class(),
            OpenAiError::StreamCut
            | OpenAiError::StreamError(_)
            | OpenAiError::StreamTimedOut { .. }
            | OpenAiError::StreamProtocol(_)
            | OpenAiError::NotACompletion(_)
            | OpenAiError::NotAStream(_)
            // A 2xx answer that does not decode (not JSON, cut short, an event stream
            // sent to a plain call): the request was taken, and probably billed.
            | OpenAiError::Decode(_) => Some(Class::Ambiguous),
            OpenAiError::Request(_) | OpenAiError::Config(_) => Some(Class::Permanent),
        }
    }

    /// What happened, in the terms a caller acts on; [`Problem::advice`] says what to do.
    pub fn problem(&self) -> Problem {
        match self {
            OpenAiError::Fetch(e) => e.problem(),
            OpenAiError::StreamCut
            | OpenAiError::StreamError(_)
            | OpenAiError::StreamTimedOut { .. }
            | OpenAiError::StreamProtocol(_) => Problem::Ambiguous,
            OpenAiError::Decode(_)
            | OpenAiError::NotACompletion(_)
            | OpenAiError::NotAStream(_) => Problem::Unreadable,
            OpenAiError::Request(_) | OpenAiError::Config(_) => Problem::Config,
        }
    }

    /// The server's error, from the last response's body or the stream's error chunk.
    pub fn api_error(&self) -> Option<ApiError> {
        match self {
            OpenAiError::Fetch(e) => {
                let body = e.response()?.body();
                serde_json::from_slice::<ErrorBody>(body).ok().map(|b| b.error)
            }
            OpenAiError::StreamError(e) => Some(e.clone()),
            OpenAiError::NotACompletion(e) => e.clone(),
            _ => None,
        }
    }
}

impl fmt::Display for OpenAiError {
    /// One line: what happened and what to do, with the provider's own message when it
    /// sent one. The cause (a transport error, a JSON error) is the `source`, not repeated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let advice = self.problem().advice();
        match self {
            OpenAiError::Fetch(e) => {
                e.fmt(f)?;
                if let Some(api) = self.api_error() {
                    write!(f, "; the provider said: {}", api.message)?;
                }
                return Ok(());
            }
            OpenAiError::Decode(_) => f.write_str("the answer is not a chat completion")?,
            OpenAiError::StreamCut => f.write_str("the stream stopped before [DONE]")?,
            OpenAiError::StreamError(e) => {
                write!(f, "the stream carried an error ({})", e.message)?;
            }
            OpenAiError::Request(e) => write!(f, "the request could not be encoded ({e})")?,
            OpenAiError::Config(e) => write!(f, "misconfigured client ({e})")?,
            OpenAiError::NotACompletion(Some(e)) => {
                write!(f, "a 2xx answer carried an error instead of a completion ({})", e.message)?
            }
            OpenAiError::NotACompletion(None) => {
                f.write_str("a 2xx answer is not a chat completion (no `choices`)")?;
            }
            OpenAiError::StreamTimedOut { idle: true } => {
                f.write_str("the stream went silent past its idle timeout")?;
            }
            OpenAiError::StreamTimedOut { idle: false } => {
                f.write_str("the stream ran past its deadline")?;
            }
            OpenAiError::StreamProtocol(e) => write!(f, "the stream broke the protocol ({e})")?,
            OpenAiError::NotAStream(kind) => write!(
                f,
                "a streaming call was answered with `{kind}`, not an event stream (the server or a proxy does not stream)"
            )?,
        }
        write!(f, ": {advice}")
    }
}

impl std::error::Error for OpenAiError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Transparent: the fetch error's message is this one's, so its cause comes next.
            OpenAiError::Fetch(e) => e.source(),
            OpenAiError::Decode(e) => Some(e),
            _ => None,
        }
    }
}

impl From<FetchError> for OpenAiError {
    fn from(e: FetchError) -> OpenAiError {
        OpenAiError::Fetch(e)
    }
}

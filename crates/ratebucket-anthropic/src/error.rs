//! Why a message did not come back.

use std::fmt;

use ratebucket_http::{FetchError, Problem};
use ratebucket_rt::core::Class;

use crate::types::{ApiError, ErrorBody};

/// A failed message or stream.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnthropicError {
    /// The request ended without a usable answer: the class and attempts are in the
    /// [`FetchError`], with the last response (and its error body) if any.
    Fetch(FetchError),
    /// A 2xx answer that does not decode as a message. Ambiguous: the request was taken
    /// and probably billed, so it is not re-sent, and it stays charged.
    Decode(serde_json::Error),
    /// A 2xx answer that is an error object, not a message. Ambiguous, as above.
    NotAMessage(ApiError),
    /// The stream stopped before `message_stop`, went silent past its idle timeout, ran
    /// past its deadline or broke the protocol. Ambiguous: it stays charged as reserved.
    Stream(ratebucket_http::StreamFailure),
    /// The stream carried an `error` event after its first content (or one that is not a
    /// throttle). Ambiguous, as a cut stream.
    StreamError(ApiError),
    /// A streaming call answered with a 2xx that is not an event stream: its content type.
    /// Ambiguous: charged as reserved, not re-sent.
    NotAStream(String),
    /// The request could not be encoded.
    Request(String),
    /// The client is misconfigured (an endpoint that is not a URL, a key that cannot be a
    /// header); nothing was reserved or sent.
    Config(String),
}

impl AnthropicError {
    /// The class that ended it, when known.
    pub fn class(&self) -> Option<Class> {
        match self {
            AnthropicError::Fetch(e) => e.class(),
            AnthropicError::Request(_) | AnthropicError::Config(_) => Some(Class::Permanent),
            _ => Some(Class::Ambiguous),
        }
    }

    /// What happened, in the terms a caller acts on; [`Problem::advice`] says what to do.
    pub fn problem(&self) -> Problem {
        match self {
            AnthropicError::Fetch(e) => e.problem(),
            AnthropicError::Stream(_) | AnthropicError::StreamError(_) => Problem::Ambiguous,
            AnthropicError::Decode(_)
            | AnthropicError::NotAMessage(_)
            | AnthropicError::NotAStream(_) => Problem::Unreadable,
            AnthropicError::Request(_) | AnthropicError::Config(_) => Problem::Config,
        }
    }

    /// The provider's error, from the last response's body or the stream's error event.
    pub fn api_error(&self) -> Option<ApiError> {
        match self {
            AnthropicError::Fetch(e) => {
                serde_json::from_slice::<ErrorBody>(e.response()?.body()).ok().map(|b| b.error)
            }
            AnthropicError::StreamError(e) | AnthropicError::NotAMessage(e) => Some(e.clone()),
            _ => None,
        }
    }
}

impl fmt::Display for AnthropicError {
    /// One line: what happened and what to do, with the provider's own message when it
    /// sent one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AnthropicError::Fetch(e) => {
                e.fmt(f)?;
                if let Some(api) = self.api_error() {
                    write!(f, "; the provider said: {} ({})", api.message, api.kind)?;
                }
                return Ok(());
            }
            AnthropicError::Decode(_) => f.write_str("the answer is not a message")?,
            AnthropicError::NotAMessage(e) => write!(
                f,
                "a 2xx answer carried an error instead of a message ({}: {})",
                e.kind, e.message
            )?,
            AnthropicError::Stream(failure) => failure.fmt(f)?,
            AnthropicError::StreamError(e) => {
                write!(f, "the stream carried an error ({}: {})", e.kind, e.message)?;
            }
            AnthropicError::NotAStream(kind) => {
                write!(f, "a streaming call was answered with `{kind}`, not an event stream")?
            }
            AnthropicError::Request(e) => write!(f, "the request could not be encoded ({e})")?,
            AnthropicError::Config(e) => write!(f, "misconfigured client ({e})")?,
        }
        write!(f, ": {}", self.problem().advice())
    }
}

impl std::error::Error for AnthropicError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AnthropicError::Fetch(e) => e.source(),
            AnthropicError::Decode(e) => Some(e),
            AnthropicError::Stream(e) => Some(e),
            _ => None,
        }
    }
}

impl From<FetchError> for AnthropicError {
    fn from(e: FetchError) -> AnthropicError {
        AnthropicError::Fetch(e)
    }
}

//! A streamed chat completion: SSE chunks in, reconciled reservation at the end.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use ratebucket_http::{EventReader, StreamFailure};
use ratebucket_rt::Reservation;
use ratebucket_rt::core::SendStamp;
use serde_json::Value;

use crate::error::OpenAiError;
use crate::types::{ApiError, ChatCompletionChunk, Usage};

/// The chunks of a streamed completion, as a [`Stream`].
///
/// It holds the reservation until the stream ends: the final usage chunk commits the
/// reported total; a stream cut before `[DONE]`, one that carried an error chunk, went
/// silent past its idle timeout, ran past its deadline or ended without usage is ambiguous
/// and keeps its estimated cost charged. Dropping the stream early keeps the estimate
/// charged too (the server already took the request).
pub struct ChunkStream {
    /// The call's span, entered when the stream settles.
    span: tracing::Span,
    reader: EventReader,
    /// Items read ahead by [`Client::stream`](crate::Client::stream) before it returns.
    peeked: VecDeque<Result<ChatCompletionChunk, OpenAiError>>,
    /// Events decoded so far (comments and keep-alives are not events).
    events: u64,
    /// Whether a chunk has delivered content (anything beyond the assistant's role).
    delivered: bool,
    reservation: Option<Reservation>,
    sent: SendStamp,
    reserved: Vec<u64>,
    /// The model's price, for a reservation with a money dimension.
    price: Option<crate::Price>,
    reconcile: bool,
    usage: Option<Usage>,
    errored: bool,
    finished: bool,
    attempts: u32,
}

/// How a stream began: what [`ChunkStream::begin`] read before any content.
pub(crate) enum Beginning {
    /// Content, or the end: the stream goes to the caller as it is.
    Delivering,
    /// A rate-limit or overloaded error before any content: nothing was delivered, so the
    /// pool may pause and the request go again.
    Throttled,
    /// Cut or silent before any event: nothing was delivered, but the request was taken.
    Silent,
}

impl ChunkStream {
    pub(crate) fn new(
        span: tracing::Span,
        reader: EventReader,
        reservation: Reservation,
        sent: SendStamp,
        (reserved, price): (Vec<u64>, Option<crate::Price>),
        reconcile: bool,
        attempts: u32,
    ) -> ChunkStream {
        ChunkStream {
            span,
            reader,
            peeked: VecDeque::new(),
            events: 0,
            delivered: false,
            reservation: Some(reservation),
            sent,
            reserved,
            price,
            reconcile,
            usage: None,
            errored: false,
            finished: false,
            attempts,
        }
    }

    /// Ends the stream as ambiguous: nothing more is read, the estimate stays charged.
    fn fail(&mut self, error: OpenAiError) -> Option<Result<ChatCompletionChunk, OpenAiError>> {
        self.finished = true;
        self.errored = true;
        self.reader.stop();
        self.settle();
        Some(Err(error))
    }

    /// Reads until the stream delivers content (or ends), keeping what it read for the
    /// caller, and says how it began.
    pub(crate) async fn begin(&mut self) -> Beginning {
        loop {
            let item = std::future::poll_fn(|cx| self.poll_read(cx)).await;
            let before_content = !self.delivered;
            let beginning =
                match &item {
                    Some(Err(OpenAiError::StreamError(e))) if before_content && e.is_throttle() => {
                        Beginning::Throttled
                    }
                    Some(Err(
                        OpenAiError::StreamCut | OpenAiError::StreamTimedOut { idle: true },
                    )) if self.events == 0 => Beginning::Silent,
                    Some(Ok(_)) if before_content => {
                        self.peeked.push_back(item.expect("an item"));
                        continue;
                    }
                    _ => Beginning::Delivering,
                };
            if let Some(item) = item {
                self.peeked.push_back(item);
            }
            return beginning;
        }
    }

    /// Ends a stream [`Beginning::Throttled`] as the provider's refusal it was: the pool's
    /// gate closes once for its wave and the reservation is returned, as for a 429.
    pub(crate) fn throttle(mut self) {
        if let Some(reservation) = self.reservation.take() {
            ratebucket_http::throttle_stream(reservation, self.sent);
        }
    }

    /// Counts the attempts of earlier openings that were sent again.
    pub(crate) fn add_attempts(&mut self, attempts: u32) {
        self.attempts += attempts;
    }

    /// The usage of the final chunk, once seen.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Attempts it took to open the stream (counting openings that failed before their
    /// first content and were sent again).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Settles the reservation: the reported usage if the stream completed cleanly,
    /// otherwise the estimate stays charged.
    fn settle(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let actual = match self.usage {
            Some(usage) if self.reconcile && !self.errored => {
                let mut actual = self.reserved.clone();
                actual[crate::vendor::TOKENS] = usage.total();
                if let (Some(money), Some(price)) = (actual.get_mut(crate::MONEY), self.price) {
                    *money = price.of(&usage);
                }
                actual
            }
            _ => self.reserved.clone(),
        };
        let _entered = self.span.enter();
        self.span.record("committed", tracing::field::debug(&actual));
        if let Err(e) = reservation.commit(&actual) {
            tracing::warn!(target: "ratebucket", error = %e, "stream commit failed");
        }
    }

    /// Turns one event's data into an item, or `None` to keep going.
    fn event(&mut self, data: &str) -> Option<Result<ChatCompletionChunk, OpenAiError>> {
        self.events += 1;
        if data == "[DONE]" {
            self.finished = true;
            self.reader.stop();
            self.settle();
            return None;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return Some(Err(OpenAiError::Decode(e))),
        };
        // A null error is no error, as the SDKs read it.
        if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
            // The request ran, maybe billed. `[DONE]` may still follow (vLLM sends it),
            // but it does not make this a success.
            self.errored = true;
            let error = serde_json::from_value::<ApiError>(error.clone()).unwrap_or_default();
            return Some(Err(OpenAiError::StreamError(error)));
        }
        self.delivered |= delivers_content(&value);
        match serde_json::from_value::<ChatCompletionChunk>(value) {
            Ok(chunk) => {
                if let Some(usage) = chunk.usage {
                    self.usage = Some(usage);
                }
                Some(Ok(chunk))
            }
            Err(e) => Some(Err(OpenAiError::Decode(e))),
        }
    }
}

/// Whether a chunk delivers content: a choice whose delta carries anything beyond the
/// assistant's role (text, a refusal, a tool call).
fn delivers_content(chunk: &Value) -> bool {
    let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
        return false;
    };
    choices.iter().any(|choice| {
        choice.get("delta").and_then(Value::as_object).is_some_and(|delta| {
            delta
                .iter()
                .any(|(key, value)| key != "role" && !value.is_null() && value.as_str() != Some(""))
        })
    })
}

impl Stream for ChunkStream {
    type Item = Result<ChatCompletionChunk, OpenAiError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.peeked.pop_front() {
            Some(item) => Poll::Ready(Some(item)),
            None => self.poll_read(cx),
        }
    }
}

impl ChunkStream {
    /// The next item from the body (past what was read ahead).
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<ChatCompletionChunk, OpenAiError>>> {
        let this = self;
        loop {
            if this.finished {
                return Poll::Ready(None);
            }
            let data = match std::task::ready!(this.reader.poll_event(cx)) {
                Some(Ok(data)) => data,
                Some(Err(failure)) => {
                    let error = match failure {
                        StreamFailure::TimedOut { idle } => OpenAiError::StreamTimedOut { idle },
                        StreamFailure::Protocol(e) => OpenAiError::StreamProtocol(e),
                        // Ended before `[DONE]`: ambiguous, not re-sent, estimate charged.
                        _ => OpenAiError::StreamCut,
                    };
                    return Poll::Ready(this.fail(error));
                }
                // Stopped at `[DONE]` or after a failure.
                None => return Poll::Ready(None),
            };
            if let Some(item) = this.event(&data) {
                return Poll::Ready(Some(item));
            }
        }
    }
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        // Abandoned mid-way: the server took the request, so the estimate stays charged.
        self.errored = true;
        self.settle();
    }
}

impl std::fmt::Debug for ChunkStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStream")
            .field("usage", &self.usage)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::delivers_content;
    use serde_json::json;

    #[test]
    fn a_role_alone_delivers_nothing() {
        let role = json!({"choices": [{"delta": {"role": "assistant", "content": ""}}]});
        assert!(!delivers_content(&role));
        assert!(!delivers_content(&json!({"choices": [], "usage": {}})));
        let text = json!({"choices": [{"delta": {"content": "Hi"}}]});
        assert!(delivers_content(&text));
        let tool = json!({"choices": [{"delta": {"tool_calls": [{"index": 0}]}}]});
        assert!(delivers_content(&tool));
    }
}

//! A streamed chat completion: SSE chunks in, reconciled reservation at the end.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use http_body::Body;
use ratebucket_http::ResponseBody;
use ratebucket_rt::{BoxFuture, Limiter, Reservation};
use serde_json::Value;

use crate::error::OpenAiError;
use crate::types::{ApiError, ChatCompletionChunk, Usage};
use ratebucket_http::SseDecoder;

/// How long a stream may stay silent or run, and how large an event may be.
pub(crate) struct Timeouts {
    /// Sleeps on the limiter's runtime.
    pub(crate) limiter: Limiter,
    pub(crate) idle: Option<Duration>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) max_event_bytes: usize,
}

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
    body: ResponseBody,
    /// The first item, read by [`Client::stream`](crate::Client::stream) before it returns.
    peeked: Option<Result<ChatCompletionChunk, OpenAiError>>,
    /// Events decoded so far (comments and keep-alives are not events).
    events: u64,
    decoder: SseDecoder,
    pending: VecDeque<String>,
    reservation: Option<Reservation>,
    reserved: Vec<u64>,
    reconcile: bool,
    usage: Option<Usage>,
    errored: bool,
    finished: bool,
    attempts: u32,
    limiter: Limiter,
    idle: Option<Duration>,
    /// Armed while waiting for bytes; re-armed by each frame.
    idle_sleep: Option<BoxFuture>,
    deadline_sleep: Option<BoxFuture>,
}

impl ChunkStream {
    pub(crate) fn new(
        span: tracing::Span,
        body: ResponseBody,
        reservation: Reservation,
        reserved: Vec<u64>,
        reconcile: bool,
        attempts: u32,
        timeouts: Timeouts,
    ) -> ChunkStream {
        let deadline_sleep = timeouts.deadline.map(|d| timeouts.limiter.sleep(d));
        ChunkStream {
            span,
            body,
            peeked: None,
            events: 0,
            decoder: SseDecoder::with_limit(timeouts.max_event_bytes),
            pending: VecDeque::new(),
            reservation: Some(reservation),
            reserved,
            reconcile,
            usage: None,
            errored: false,
            finished: false,
            attempts,
            limiter: timeouts.limiter,
            idle: timeouts.idle,
            idle_sleep: None,
            deadline_sleep,
        }
    }

    /// Ends the stream as ambiguous: nothing more is read, the estimate stays charged.
    fn fail(
        &mut self,
        error: OpenAiError,
    ) -> Poll<Option<Result<ChatCompletionChunk, OpenAiError>>> {
        self.finished = true;
        self.errored = true;
        self.idle_sleep = None;
        self.deadline_sleep = None;
        self.settle();
        Poll::Ready(Some(Err(error)))
    }

    /// Whether the stream failed before its first event: the provider took the request
    /// but delivered nothing of the answer (a cut, or silence past the idle timeout).
    pub(crate) fn failed_before_content(&self) -> bool {
        self.events == 0 && self.errored
    }

    /// Puts the first item back, to be returned before anything else.
    pub(crate) fn unread(&mut self, item: Option<Result<ChatCompletionChunk, OpenAiError>>) {
        self.peeked = item;
    }

    /// Counts the attempts of earlier openings that failed before content.
    pub(crate) fn add_attempts(&mut self, attempts: u32) {
        self.attempts += attempts;
    }

    /// The usage of the final chunk, once seen.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Attempts it took to open the stream (counting openings that failed before their
    /// first event and were sent again).
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
                actual
            }
            _ => self.reserved.clone(),
        };
        let _entered = self.span.enter();
        self.span
            .record("committed", tracing::field::debug(&actual));
        if let Err(e) = reservation.commit(&actual) {
            tracing::warn!(target: "ratebucket", error = %e, "stream commit failed");
        }
    }

    /// Turns one event's data into an item, or `None` to keep going.
    fn event(&mut self, data: &str) -> Option<Result<ChatCompletionChunk, OpenAiError>> {
        self.events += 1;
        if data == "[DONE]" {
            self.finished = true;
            self.settle();
            return None;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return Some(Err(OpenAiError::Decode(e))),
        };
        // A null error is no error, as the SDKs read it.
        if let Some(error) = value.get("error").filter(|e| !e.is_null()) {
            // An error after content: the request ran, maybe billed. `[DONE]` may still
            // follow (vLLM sends it), but it does not make this a success.
            self.errored = true;
            let error = serde_json::from_value::<ApiError>(error.clone()).unwrap_or_default();
            return Some(Err(OpenAiError::StreamError(error)));
        }
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

impl Stream for ChunkStream {
    type Item = Result<ChatCompletionChunk, OpenAiError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(item) = this.peeked.take() {
            return Poll::Ready(Some(item));
        }
        loop {
            if this.finished {
                return Poll::Ready(None);
            }
            while let Some(data) = this.pending.pop_front() {
                if let Some(item) = this.event(&data) {
                    return Poll::Ready(Some(item));
                }
                if this.finished {
                    return Poll::Ready(None);
                }
            }
            if let Some(deadline) = &mut this.deadline_sleep
                && deadline.as_mut().poll(cx).is_ready()
            {
                return this.fail(OpenAiError::StreamTimedOut { idle: false });
            }
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => {
                    let idle = this.idle;
                    let limiter = &this.limiter;
                    if let Some(sleep) =
                        idle.map(|d| this.idle_sleep.get_or_insert_with(|| limiter.sleep(d)))
                        && sleep.as_mut().poll(cx).is_ready()
                    {
                        return this.fail(OpenAiError::StreamTimedOut { idle: true });
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(frame))) => {
                    // Bytes arrived: the idle clock starts again.
                    this.idle_sleep = None;
                    if let Ok(data) = frame.into_data() {
                        let mut events = Vec::new();
                        let pushed = this.decoder.push(&data, &mut events);
                        this.pending.extend(events);
                        if let Err(e) = pushed {
                            this.pending.clear();
                            return this.fail(OpenAiError::StreamProtocol(e.to_string()));
                        }
                    }
                }
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => {
                    // Ended before `[DONE]`: ambiguous, not re-sent, estimate charged.
                    return this.fail(OpenAiError::StreamCut);
                }
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

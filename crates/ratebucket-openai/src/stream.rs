//! A streamed chat completion: SSE chunks in, reconciled reservation at the end.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use http_body::Body;
use ratebucket_http::ResponseBody;
use ratebucket_rt::Reservation;
use serde_json::Value;

use crate::error::OpenAiError;
use crate::sse::SseDecoder;
use crate::types::{ApiError, ChatCompletionChunk, Usage};

/// The chunks of a streamed completion, as a [`Stream`].
///
/// It holds the reservation until the stream ends: the final usage chunk commits the
/// reported total; a stream cut before `[DONE]`, one that carried an error chunk, or one
/// that ended without usage is ambiguous and keeps its estimated cost charged. Dropping
/// the stream early keeps the estimate charged too (the server already took the request).
pub struct ChunkStream {
    body: ResponseBody,
    decoder: SseDecoder,
    pending: VecDeque<String>,
    reservation: Option<Reservation>,
    reserved: Vec<u64>,
    reconcile: bool,
    usage: Option<Usage>,
    errored: bool,
    finished: bool,
    attempts: u32,
}

impl ChunkStream {
    pub(crate) fn new(
        body: ResponseBody,
        reservation: Reservation,
        reserved: Vec<u64>,
        reconcile: bool,
        attempts: u32,
    ) -> ChunkStream {
        ChunkStream {
            body,
            decoder: SseDecoder::new(),
            pending: VecDeque::new(),
            reservation: Some(reservation),
            reserved,
            reconcile,
            usage: None,
            errored: false,
            finished: false,
            attempts,
        }
    }

    /// The usage of the final chunk, once seen.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Attempts it took to open the stream.
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
        if let Err(e) = reservation.commit(&actual) {
            tracing::warn!(target: "ratebucket", error = %e, "stream commit failed");
        }
    }

    /// Turns one event's data into an item, or `None` to keep going.
    fn event(&mut self, data: &str) -> Option<Result<ChatCompletionChunk, OpenAiError>> {
        if data == "[DONE]" {
            self.finished = true;
            self.settle();
            return None;
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(e) => return Some(Err(OpenAiError::Decode(e))),
        };
        if let Some(error) = value.get("error") {
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
            match Pin::new(&mut this.body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        let mut events = Vec::new();
                        this.decoder.push(&data, &mut events);
                        this.pending.extend(events);
                    }
                }
                Poll::Ready(Some(Err(_))) | Poll::Ready(None) => {
                    // Ended before `[DONE]`: ambiguous, not re-sent, estimate charged.
                    this.finished = true;
                    this.errored = true;
                    this.settle();
                    return Poll::Ready(Some(Err(OpenAiError::StreamCut)));
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

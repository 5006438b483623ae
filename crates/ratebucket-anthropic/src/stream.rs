//! A streamed message: Anthropic's events in, the reservation settled at `message_stop`.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use ratebucket_http::EventReader;
use ratebucket_rt::Reservation;
use ratebucket_rt::core::SendStamp;

use crate::error::AnthropicError;
use crate::types::{StreamEvent, Usage};
use crate::vendor::charge_of;

/// The events of a streamed message, as a [`Stream`].
///
/// It holds the reservation until the stream ends: at `message_stop` the usage of
/// `message_start` (input) and of the last `message_delta` (output) settles it. A stream
/// cut before `message_stop`, one that carried an `error` event, went silent past its idle
/// timeout or ran past its deadline is ambiguous and keeps its reservation charged; so does
/// a stream dropped early (the provider already took the request).
pub struct MessageStream {
    /// The call's span, entered when the stream settles.
    span: tracing::Span,
    reader: EventReader,
    /// Items read ahead by [`Client::stream`](crate::Client::stream) before it returns.
    peeked: VecDeque<Result<StreamEvent, AnthropicError>>,
    /// Events decoded so far.
    events: u64,
    /// Whether a content delta has arrived.
    delivered: bool,
    reservation: Option<Reservation>,
    sent: SendStamp,
    reserved: Vec<u64>,
    /// The model's price, for a reservation with a money dimension.
    price: Option<ratebucket_http::price::Price>,
    reconcile: bool,
    usage: Option<Usage>,
    errored: bool,
    finished: bool,
    attempts: u32,
}

/// How a stream began: what [`MessageStream::begin`] read before any content.
pub(crate) enum Beginning {
    /// Content, or the end: the stream goes to the caller as it is.
    Delivering,
    /// A `rate_limit_error` or `overloaded_error` event before any content delta.
    Throttled,
    /// Cut or silent before any event.
    Silent,
}

impl MessageStream {
    pub(crate) fn new(
        span: tracing::Span,
        reader: EventReader,
        reservation: Reservation,
        sent: SendStamp,
        (reserved, price): (Vec<u64>, Option<ratebucket_http::price::Price>),
        reconcile: bool,
        attempts: u32,
    ) -> MessageStream {
        MessageStream {
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

    /// The usage reported so far: the input from `message_start`, the output from the
    /// latest `message_delta`.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Attempts it took to open the stream (counting openings sent again).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    pub(crate) fn add_attempts(&mut self, attempts: u32) {
        self.attempts += attempts;
    }

    /// Reads until the first content delta (or the end), keeping what it read for the
    /// caller, and says how the stream began.
    pub(crate) async fn begin(&mut self) -> Beginning {
        loop {
            let item = std::future::poll_fn(|cx| self.poll_read(cx)).await;
            let beginning = match &item {
                Some(Err(AnthropicError::StreamError(e))) if !self.delivered && e.is_throttle() => {
                    Beginning::Throttled
                }
                Some(Err(AnthropicError::Stream(_))) if self.events == 0 => Beginning::Silent,
                Some(Ok(_)) if !self.delivered && !self.finished => {
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

    /// Ends a stream that began [`Beginning::Throttled`] as the refusal it was: the pool's
    /// gate closes once for its wave and the reservation is returned, as for a 429.
    pub(crate) fn throttle(mut self) {
        if let Some(reservation) = self.reservation.take() {
            ratebucket_http::throttle_stream(reservation, self.sent);
        }
    }

    /// Settles the reservation: at the reported usage if the stream ended cleanly,
    /// otherwise as reserved.
    fn settle(&mut self) {
        let Some(reservation) = self.reservation.take() else {
            return;
        };
        let actual = match self.usage {
            Some(usage) if self.reconcile && !self.errored => {
                charge_of(&self.reserved, usage, self.price)
            }
            _ => self.reserved.clone(),
        };
        let _entered = self.span.enter();
        self.span.record("committed", tracing::field::debug(&actual));
        if let Err(e) = reservation.commit(&actual) {
            tracing::warn!(target: "ratebucket", error = %e, "stream commit failed");
        }
    }

    /// Ends the stream as ambiguous: nothing more is read, the reservation stays charged.
    fn fail(&mut self, error: AnthropicError) -> Option<Result<StreamEvent, AnthropicError>> {
        self.finished = true;
        self.errored = true;
        self.reader.stop();
        self.settle();
        Some(Err(error))
    }

    /// Turns one event's data into an item.
    fn event(&mut self, data: &str) -> Option<Result<StreamEvent, AnthropicError>> {
        self.events += 1;
        let value = match serde_json::from_str(data) {
            Ok(value) => value,
            Err(e) => return self.fail(AnthropicError::Decode(e)),
        };
        let event = match StreamEvent::parse(value) {
            Ok(Ok(event)) => event,
            Ok(Err(error)) if !self.delivered && error.is_throttle() => {
                // Kept for the client to end as a throttle (or charged when dropped).
                self.finished = true;
                self.errored = true;
                self.reader.stop();
                return Some(Err(AnthropicError::StreamError(error)));
            }
            Ok(Err(error)) => return self.fail(AnthropicError::StreamError(error)),
            Err(e) => return self.fail(AnthropicError::Decode(e)),
        };
        match &event {
            StreamEvent::MessageStart(message) => self.usage = Some(message.usage),
            StreamEvent::MessageDelta { usage, .. } => {
                let mut so_far = self.usage.unwrap_or_default();
                so_far.output_tokens = usage.output_tokens;
                self.usage = Some(so_far);
            }
            StreamEvent::ContentBlockDelta { .. } => self.delivered = true,
            StreamEvent::MessageStop => {
                self.finished = true;
                self.reader.stop();
                self.settle();
            }
            _ => {}
        }
        Some(Ok(event))
    }

    /// The next item from the body (past what was read ahead).
    fn poll_read(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<StreamEvent, AnthropicError>>> {
        if self.finished {
            return Poll::Ready(None);
        }
        match std::task::ready!(self.reader.poll_event(cx)) {
            Some(Ok(data)) => Poll::Ready(self.event(&data)),
            Some(Err(failure)) => Poll::Ready(self.fail(AnthropicError::Stream(failure))),
            None => Poll::Ready(None),
        }
    }
}

impl Stream for MessageStream {
    type Item = Result<StreamEvent, AnthropicError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.peeked.pop_front() {
            Some(item) => Poll::Ready(Some(item)),
            None => self.poll_read(cx),
        }
    }
}

impl Drop for MessageStream {
    fn drop(&mut self) {
        // Abandoned mid-way: the provider took the request, so it stays charged.
        self.errored = true;
        self.settle();
    }
}

impl std::fmt::Debug for MessageStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MessageStream")
            .field("usage", &self.usage)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

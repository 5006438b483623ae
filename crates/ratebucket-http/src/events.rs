//! A streamed answer's server-sent events, read under an idle timeout, a deadline and a
//! bound on each event's size: what every chat client's stream shares.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::Body;
use ratebucket_rt::core::{Reply, SendStamp, Settle};
use ratebucket_rt::{BoxFuture, Limiter, Reservation};

use crate::sse::SseDecoder;
use crate::transport::ResponseBody;

/// How long a stream may stay silent or run, and how large an event may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamLimits {
    /// The longest the stream may go without a byte; `None` waits forever.
    pub idle: Option<Duration>,
    /// The longest the whole stream may take, from when reading starts; `None` sets none.
    pub deadline: Option<Duration>,
    /// The largest event accepted, in bytes.
    pub max_event_bytes: usize,
}

/// Why a stream stopped before its last event.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamFailure {
    /// The body ended, or broke, before the stream's last event.
    Cut,
    /// No byte for longer than the idle timeout (`idle`), or the stream ran past its
    /// deadline.
    TimedOut {
        /// Whether the idle timeout (rather than the deadline) expired.
        idle: bool,
    },
    /// The stream broke the protocol (an event larger than the bound).
    Protocol(String),
}

impl fmt::Display for StreamFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StreamFailure::Cut => f.write_str("the stream stopped before its end"),
            StreamFailure::TimedOut { idle: true } => {
                f.write_str("the stream went silent past its idle timeout")
            }
            StreamFailure::TimedOut { idle: false } => {
                f.write_str("the stream ran past its deadline")
            }
            StreamFailure::Protocol(e) => write!(f, "the stream broke the protocol ({e})"),
        }
    }
}

impl std::error::Error for StreamFailure {}

/// Reads the `data` of each server-sent event of a response body, failing with a
/// [`StreamFailure`] when the body ends or breaks, goes silent past the idle timeout, runs
/// past the deadline or sends an event over the bound. The timers sleep on the limiter's
/// runtime. Once it has failed it yields nothing more.
pub struct EventReader {
    body: ResponseBody,
    decoder: SseDecoder,
    pending: VecDeque<String>,
    limiter: Limiter,
    idle: Option<Duration>,
    /// Armed while waiting for bytes; dropped by each frame.
    idle_sleep: Option<BoxFuture>,
    deadline_sleep: Option<BoxFuture>,
    failed: bool,
}

impl EventReader {
    /// Reads `body` within `limits`, its deadline counted from now.
    pub fn new(body: ResponseBody, limiter: Limiter, limits: StreamLimits) -> EventReader {
        let deadline_sleep = limits.deadline.map(|d| limiter.sleep(d));
        EventReader {
            body,
            decoder: SseDecoder::with_limit(limits.max_event_bytes),
            pending: VecDeque::new(),
            limiter,
            idle: limits.idle,
            idle_sleep: None,
            deadline_sleep,
            failed: false,
        }
    }

    /// Stops reading: the timers are dropped and nothing more is yielded.
    pub fn stop(&mut self) {
        self.failed = true;
        self.pending.clear();
        self.idle_sleep = None;
        self.deadline_sleep = None;
    }

    fn fail(&mut self, failure: StreamFailure) -> Poll<Option<Result<String, StreamFailure>>> {
        self.stop();
        Poll::Ready(Some(Err(failure)))
    }

    /// The next event's data; `Ready(None)` only after a failure or [`EventReader::stop`].
    pub fn poll_event(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<String, StreamFailure>>> {
        loop {
            if self.failed {
                return Poll::Ready(None);
            }
            if let Some(data) = self.pending.pop_front() {
                return Poll::Ready(Some(Ok(data)));
            }
            if let Some(deadline) = &mut self.deadline_sleep
                && deadline.as_mut().poll(cx).is_ready()
            {
                return self.fail(StreamFailure::TimedOut { idle: false });
            }
            match Pin::new(&mut self.body).poll_frame(cx) {
                Poll::Pending => {
                    let limiter = &self.limiter;
                    if let Some(sleep) =
                        self.idle.map(|d| self.idle_sleep.get_or_insert_with(|| limiter.sleep(d)))
                        && sleep.as_mut().poll(cx).is_ready()
                    {
                        return self.fail(StreamFailure::TimedOut { idle: true });
                    }
                    return Poll::Pending;
                }
                Poll::Ready(Some(Ok(frame))) => {
                    // Bytes arrived: the idle clock starts again.
                    self.idle_sleep = None;
                    if let Ok(data) = frame.into_data() {
                        let mut events = Vec::new();
                        let pushed = self.decoder.push(&data, &mut events);
                        self.pending.extend(events);
                        if let Err(e) = pushed {
                            return self.fail(StreamFailure::Protocol(e.to_string()));
                        }
                    }
                }
                Poll::Ready(Some(Err(_)) | None) => return self.fail(StreamFailure::Cut),
            }
        }
    }
}

/// The content type of a 2xx answer to a streaming call that says it is something other
/// than an event stream; `None` for an event stream, or when no type is given (read as
/// one).
pub fn not_an_event_stream(headers: &http::HeaderMap) -> Option<String> {
    let kind = headers.get(http::header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = kind.split(';').next().unwrap_or_default().trim();
    (!essence.eq_ignore_ascii_case("text/event-stream")).then(|| kind.to_owned())
}

/// Ends the reservation of a stream that carried a rate-limit or overloaded error before
/// its first content as the provider's refusal it was: the pool's gate closes once for its
/// wave (the provider's default pause) and the reservation is returned, as for a 429.
pub fn throttle_stream(reservation: Reservation, sent: SendStamp) {
    let replied = reservation.reply(&Reply {
        sent,
        settle: Settle::Throttled { retry_after: None },
        reports: &[],
    });
    if let Err(e) = replied.settled {
        tracing::warn!(target: "ratebucket", error = %e, "the throttled stream did not settle");
    }
}

impl fmt::Debug for EventReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EventReader")
            .field("pending", &self.pending.len())
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

//! When a request may have left: a flag the transport sets as its bytes may reach the wire,
//! so a call cancelled before that is returned to the limiter instead of charged.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;

use super::BoxError;

/// Nothing has happened yet.
const WAITING: u8 = 0;
/// The transport began writing the request.
const LEFT: u8 = 1;
/// The call was cancelled first; the request must not be written.
const WITHDRAWN: u8 = 2;

/// Whether one attempt's request may have left for the server.
///
/// The fetcher makes one per attempt and hands it to [`Transport::send_departing`]; the
/// transport calls [`Departure::leave`] the moment the request's bytes may reach the wire
/// (after its connection is made, as it starts writing). When a call is cancelled (its
/// future dropped) the fetcher withdraws the request: one that never left is returned to
/// the limiter whole, as a refused connection is; one that may have left stays charged as
/// reserved, since the provider has probably counted it (ADR 0012).
///
/// Whichever comes first wins: once withdrawn, `leave` returns `false` and the transport
/// must not write the request.
///
/// [`Transport::send_departing`]: super::Transport::send_departing
#[derive(Clone, Debug, Default)]
pub struct Departure(Arc<AtomicU8>);

impl Departure {
    /// A request that has not left.
    pub fn new() -> Departure {
        Departure::default()
    }

    /// Marks the request as leaving. `false` if the call was withdrawn first: the request
    /// must then not be written. Calling it again changes nothing.
    pub fn leave(&self) -> bool {
        match self.0.compare_exchange(WAITING, LEFT, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(now) => now == LEFT,
        }
    }

    /// Whether the request may have left.
    pub fn has_left(&self) -> bool {
        self.0.load(Ordering::Acquire) == LEFT
    }

    /// Withdraws a request that has not left: `true` if it never will, `false` if it may
    /// already have.
    pub(crate) fn withdraw(&self) -> bool {
        match self.0.compare_exchange(WAITING, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => true,
            Err(now) => now == WITHDRAWN,
        }
    }
}

/// The body [`HyperTransport`](super::HyperTransport)'s client sends: the request's bytes,
/// telling their [`Departure`] when hyper first looks at them, which it does on a
/// connection, as it writes the request head (never while the connection is being made).
///
/// A body whose call was withdrawn first fails instead of being written, so the request
/// never completes.
#[derive(Debug)]
pub struct RequestBody {
    bytes: Full<Bytes>,
    departure: Option<Departure>,
}

impl RequestBody {
    /// `bytes`, reporting to `departure`.
    pub fn new(bytes: Bytes, departure: Departure) -> RequestBody {
        RequestBody { bytes: Full::new(bytes), departure: Some(departure) }
    }

    /// Reports the departure on the first look; whether the request may still be written.
    fn leaving(&self) -> bool {
        self.departure.as_ref().is_none_or(Departure::leave)
    }
}

impl From<Bytes> for RequestBody {
    /// `bytes` with no one to report to (the request counts as having left when sent).
    fn from(bytes: Bytes) -> RequestBody {
        RequestBody { bytes: Full::new(bytes), departure: None }
    }
}

impl Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if !this.leaving() {
            return Poll::Ready(Some(Err("the call was cancelled before its request left".into())));
        }
        Pin::new(&mut this.bytes).poll_frame(cx).map_err(|never| match never {})
    }

    fn is_end_stream(&self) -> bool {
        // A withdrawn request is not at its end: its body is polled, and fails.
        self.leaving() && self.bytes.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.leaving();
        self.bytes.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whichever_comes_first_wins() {
        let left = Departure::new();
        assert!(left.leave());
        assert!(!left.withdraw(), "a request that left stays left");
        assert!(left.leave() && left.has_left());

        let withdrawn = Departure::new();
        assert!(withdrawn.withdraw());
        assert!(!withdrawn.leave(), "a withdrawn request must not be written");
        assert!(withdrawn.withdraw() && !withdrawn.has_left());
    }

    #[test]
    fn a_withdrawn_body_fails_instead_of_being_written() {
        let departure = Departure::new();
        let mut body = RequestBody::new(Bytes::from_static(b"{}"), departure.clone());
        assert!(departure.withdraw());
        assert!(!body.is_end_stream());
        let waker = std::task::Waker::noop();
        let polled = Pin::new(&mut body).poll_frame(&mut Context::from_waker(waker));
        assert!(matches!(polled, Poll::Ready(Some(Err(_)))));
    }

    #[test]
    fn a_body_looked_at_has_left() {
        let departure = Departure::new();
        let body = RequestBody::new(Bytes::from_static(b"{}"), departure.clone());
        assert_eq!(body.size_hint().exact(), Some(2));
        assert!(departure.has_left() && !departure.withdraw());
    }
}

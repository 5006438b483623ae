//! Request and response bodies: a request copied for a retry, a response read whole
//! within the read timeout.

use bytes::{Bytes, BytesMut};
use std::borrow::Borrow;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::Request;
use ratebucket_rt::core::FailureKind;

use ratebucket_rt::Limiter;

use crate::transport::{BoxError, TransportError};

/// Where each attempt's request comes from.
pub(crate) trait Attempts {
    /// The first attempt's request, read before anything is reserved (whose it is, where
    /// it goes).
    fn first(&mut self) -> &Request<Bytes>;

    /// The request attempt `attempt` sends (0: the first), made as it leaves.
    fn make(&mut self, attempt: u32) -> Request<Bytes>;
}

/// One request copied for every attempt (its body shared): the run keeps no request of
/// its own until one leaves.
pub(crate) struct Replay<R>(pub(crate) R);

impl<R: Borrow<Request<Bytes>>> Attempts for Replay<R> {
    fn first(&mut self) -> &Request<Bytes> {
        self.0.borrow()
    }

    fn make(&mut self, _attempt: u32) -> Request<Bytes> {
        copy_request(self.0.borrow())
    }
}

/// A request built afresh for every attempt by the caller's function; the first is built
/// once, read, then sent.
pub(crate) struct Built<F> {
    build: F,
    first: Option<Request<Bytes>>,
}

impl<F: FnMut(u32) -> Request<Bytes>> Built<F> {
    /// Attempts built by `build`.
    pub(crate) fn new(build: F) -> Built<F> {
        Built { build, first: None }
    }
}

impl<F: FnMut(u32) -> Request<Bytes>> Attempts for Built<F> {
    fn first(&mut self) -> &Request<Bytes> {
        self.first.get_or_insert_with(|| (self.build)(0))
    }

    fn make(&mut self, attempt: u32) -> Request<Bytes> {
        self.first.take().unwrap_or_else(|| (self.build)(attempt))
    }
}

/// A copy of `request` to send again: method, URI, version, headers, extensions (a
/// [`Caller`](ratebucket_rt::core::Caller) among them) and body (shared, not copied).
pub fn copy_request(request: &Request<Bytes>) -> Request<Bytes> {
    let mut copy = Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    copy.headers_mut().clone_from(request.headers());
    copy.extensions_mut().clone_from(request.extensions());
    copy
}

/// Why a response body of at most `max` bytes could not be read whole: a cut body. (A
/// function of the error, not a future around [`gather`], so a response's read holds one
/// future, not two.)
pub(crate) fn body_cut(max: usize) -> impl FnOnce(Gathered) -> TransportError {
    move |e| match e {
        Gathered::TooBig => {
            let too_big = std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("response body larger than {max} bytes"),
            );
            TransportError::boxed(FailureKind::BodyCut, Box::new(too_big))
        }
        Gathered::Failed(e) => TransportError::boxed(FailureKind::BodyCut, e),
    }
}

/// Why [`gather`] stopped.
pub(crate) enum Gathered {
    /// The body is longer than allowed.
    TooBig,
    /// The body failed.
    Failed(BoxError),
}

/// Reads a whole body, at most `max` bytes. A body of one frame is kept as it came (no
/// copy).
pub(crate) async fn gather<B>(body: B, max: usize) -> Result<Bytes, Gathered>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut gathering = Gathering::new(max);
    std::future::poll_fn(|cx| gathering.poll(body.as_mut(), cx)).await
}

/// A body being read whole, frame by frame, at most `max` bytes ([`gather`], or polled by
/// hand: a body already there is read without a future).
pub(crate) struct Gathering {
    max: usize,
    /// The first frame, kept as it came while it is the only one.
    first: Option<Bytes>,
    /// The frames so far, once there is more than one.
    gathered: BytesMut,
}

impl Gathering {
    pub(crate) fn new(max: usize) -> Gathering {
        Gathering { max, first: None, gathered: BytesMut::new() }
    }

    /// Reads the frames `body` has ready; the whole body once it ends.
    pub(crate) fn poll<B>(
        &mut self,
        mut body: Pin<&mut B>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<Bytes, Gathered>>
    where
        B: http_body::Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        while let Some(frame) = std::task::ready!(body.as_mut().poll_frame(cx)) {
            let frame = frame.map_err(|e| Gathered::Failed(e.into()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let held = self.first.as_ref().map_or(0, Bytes::len) + self.gathered.len();
            if held + data.len() > self.max {
                return Poll::Ready(Err(Gathered::TooBig));
            }
            match self.first.take() {
                None if self.gathered.is_empty() => self.first = Some(data),
                None => self.gathered.extend_from_slice(&data),
                Some(earlier) => {
                    self.gathered.reserve(earlier.len() + data.len());
                    self.gathered.extend_from_slice(&earlier);
                    self.gathered.extend_from_slice(&data);
                }
            }
        }
        let gathered = std::mem::take(&mut self.gathered);
        Poll::Ready(Ok(self.first.take().unwrap_or_else(|| gathered.freeze())))
    }
}

/// `exchange`, failed with a read timeout if it takes longer than `timeout`. The timer is
/// armed only if the exchange does not finish on its first poll (an answer already there
/// costs no timer).
pub(crate) async fn within<R>(
    mut exchange: Pin<&mut impl Future<Output = Result<R, TransportError>>>,
    limiter: &Limiter,
    timeout: Duration,
) -> Result<R, TransportError> {
    let mut timer: Option<ratebucket_rt::BoxFuture> = None;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(result) = exchange.as_mut().poll(cx) {
            return Poll::Ready(result);
        }
        let timer = timer.get_or_insert_with(|| limiter.sleep(timeout));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                let timed_out = std::io::Error::new(std::io::ErrorKind::TimedOut, "read timeout");
                Poll::Ready(Err(TransportError::boxed(
                    FailureKind::ReadTimeout,
                    Box::new(timed_out),
                )))
            }
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

//! What a fetch returns: a response read whole, or one whose body is still to stream.

use bytes::Bytes;
use http::Response;
use ratebucket_rt::Reservation;
use ratebucket_rt::core::SendStamp;

use crate::headers::Signals;
use crate::transport::ResponseBody;
#[cfg(doc)]
use crate::{Fetcher, Vendor};

/// The successful result of a fetch, with what the provider's headers said.
#[derive(Debug)]
pub struct Fetched {
    /// The response, body read.
    pub response: Response<Bytes>,
    /// Attempts it took.
    pub attempts: u32,
    /// The rate-limit signals of the response.
    pub signals: Signals,
    /// What the reservation was settled at, one entry per limiter dimension, when the
    /// vendor read a charge from the response ([`Vendor::charge`]); `None`: the cost as
    /// reserved.
    pub charged: Option<Vec<u64>>,
}

/// A 2xx response whose body is still unread, with the reservation it holds: what
/// [`Fetcher::open`] returns for streaming.
#[derive(Debug)]
pub struct Opened {
    /// The response; its body streams.
    pub response: Response<ResponseBody>,
    /// The reservation, to commit once the true cost is known (or drop to release).
    pub reservation: Reservation,
    /// The send stamp of the request that produced it.
    pub sent: SendStamp,
    /// Attempts it took.
    pub attempts: u32,
    /// The rate-limit signals of the response.
    pub signals: Signals,
    /// The call's span (`ratebucket.call`): record `committed` in it, or enter it, when the
    /// stream settles.
    pub span: tracing::Span,
}

//! What a vendor adapter knows that the generic fetcher does not: the `Vendor` trait.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use ratebucket_rt::core::{QuotaPolicy, Report, Verdict};

use crate::headers::Signals;
#[cfg(doc)]
use crate::{FetchConfig, Fetcher};
#[cfg(doc)]
use ratebucket_rt::{Limiter, Reservation};

/// What a vendor adapter knows that the generic one does not: how to read its error
/// bodies and which headers describe which limiter dimension.
///
/// A vendor is pure: it reads a response and says what it means (a verdict, a wait, quota
/// reports); the fetcher hands all of it to the limiter as one reply. Every method has a
/// generic default, so `NoVendor` is an empty impl.
pub trait Vendor: Send + Sync + 'static {
    /// A verdict for an error response (e.g. OpenAI's `insufficient_quota` is fatal even
    /// though it comes as a 429), or `None` to classify by status and headers alone.
    fn verdict(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Verdict> {
        let _ = (status, headers, body);
        None
    }

    /// A wait the body asks for when the headers give none (e.g. "try again in 644ms").
    fn retry_hint(&self, body: &[u8]) -> Option<Duration> {
        let _ = body;
        None
    }

    /// The learning policy of each limiter dimension this vendor's reports describe, as
    /// `(dimension, policy)`: set on the limiter when a fetcher is made
    /// ([`Limiter::change`] with `Change::Policy`). None by default.
    fn policies(&self) -> Vec<(usize, QuotaPolicy)> {
        Vec::new()
    }

    /// The quota reports a response carries, one per limiter dimension it describes; the
    /// fetcher hands them to the limiter with the reply ([`Reservation::reply`]). The
    /// default reads the generic quota (IETF `RateLimit` / `RateLimit-Policy`, or
    /// `x-ratelimit-*`) as a report on `fold_dimension`: with a [`FetchConfig::learn`]
    /// policy the limit, the burst and how the provider counts are learned from it;
    /// without one, `remaining` only lowers the level.
    fn reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        match (response.fold_dimension, response.signals.quota) {
            (Some(dimension), Some(quota)) => vec![Report { dimension, quota: quota.into() }],
            _ => Vec::new(),
        }
    }

    /// What the provider charged for a successful `response` to a request that reserved
    /// `reserved`, one entry per limiter dimension (the usage a body reports, say): the
    /// reservation is settled at it, the over-estimate refunded and an under-estimate owed.
    /// `None` (the default): charged as reserved.
    fn charge(&self, reserved: &[u64], response: &Response<Bytes>) -> Option<Vec<u64>> {
        let _ = (reserved, response);
        None
    }
}

impl<V: Vendor> Vendor for Arc<V> {
    fn verdict(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Verdict> {
        (**self).verdict(status, headers, body)
    }

    fn retry_hint(&self, body: &[u8]) -> Option<Duration> {
        (**self).retry_hint(body)
    }

    fn policies(&self) -> Vec<(usize, QuotaPolicy)> {
        (**self).policies()
    }

    fn reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        (**self).reports(response)
    }

    fn charge(&self, reserved: &[u64], response: &Response<Bytes>) -> Option<Vec<u64>> {
        (**self).charge(reserved, response)
    }
}

/// What [`Vendor::reports`] sees of a response.
#[derive(Debug)]
pub struct ResponseHead<'a> {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: &'a HeaderMap,
    /// The generic signals parsed from them.
    pub signals: &'a Signals,
    /// The fetcher's configured fold dimension.
    pub fold_dimension: Option<usize>,
    /// The body of a refusal (any status but 2xx), read whole; `None` for a success, whose
    /// body may still be streaming and is read by [`Vendor::charge`] instead. Where a
    /// provider names the quota spent only there (Gemini's `QuotaFailure`), a vendor reads
    /// it from here.
    pub body: Option<&'a [u8]>,
}

/// No vendor knowledge: classification by status, headers and transport failure.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoVendor;

impl Vendor for NoVendor {}

//! What an attempt's answer says and how it ends its reservation: returned if the call is
//! dropped before its request left, settled by the charging rule when it failed, replied
//! to with the response's quota reports, and the error a call stops with.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, StatusCode};
use ratebucket_rt::Reservation;
use ratebucket_rt::core::{Class, Reply, Report, Retry, SendStamp, Settle, Verdict};

use super::Success;
use crate::error::{FetchError, FetchErrorKind, LimitHit};
use crate::headers::Signals;
use crate::transport::{BoxError, Departure, TransportError};
use crate::vendor::{ResponseHead, Vendor};

/// The quota reports of a response, as `vendor` reads them (folding by `fold`), each
/// with the wall clock's reading (for a provider whose windows turn with the clock).
/// `body` is the body read whole, if it was; the vendor sees it only for a refusal.
pub(super) fn quota_reports<V: Vendor>(
    (vendor, fold_dimension): (&V, Option<usize>),
    status: StatusCode,
    headers: &HeaderMap,
    signals: &Signals,
    body: Option<&[u8]>,
) -> Vec<Report> {
    let body = body.filter(|_| !status.is_success());
    let head = ResponseHead { status, headers, signals, fold_dimension, body };
    let mut reports = vendor.reports(&head);
    if !reports.is_empty() {
        let clock = SystemTime::now().duration_since(UNIX_EPOCH).ok();
        for report in &mut reports {
            report.quota.clock = report.quota.clock.or(clock);
        }
    }
    reports
}

/// What a response says, read once it has come (whole, or its head if `open`): the
/// rate-limit signals of its headers, and for an error read whole, the vendor's verdict
/// and retry hint from its body.
pub(super) fn examine<V: Vendor>(
    vendor: &V,
    success: Success,
) -> (Success, Option<Verdict>, Option<Duration>, Signals) {
    let (status, headers, body) = match &success {
        Success::Read(r) => (r.status(), r.headers(), Some(r.body())),
        Success::Open(r) => (r.status(), r.headers(), None),
    };
    let signals = Signals::read(headers, SystemTime::now);
    let (verdict, hint) = match body {
        Some(body) if !status.is_success() => {
            let verdict = match vendor.verdict(status, headers, body) {
                // Too many in flight, whatever the vendor reads of the status: fewer go
                // at once, and the pool keeps its pace.
                None | Some(Verdict::Throttled | Verdict::Retryable)
                    if crate::dialect::says_crowded(body) =>
                {
                    Some(Verdict::Crowded)
                }
                verdict => verdict,
            };
            (verdict, vendor.retry_hint(body))
        }
        _ => (None, None),
    };
    (success, verdict, hint, signals)
}

/// [`Reservation::reply`], with what went wrong logged.
pub(super) fn reply(
    reservation: Reservation,
    sent: SendStamp,
    settle: Settle<'_>,
    reports: &[Report],
) {
    let replied = reservation.reply(&Reply { sent, settle, reports });
    if let Err(e) = replied.settled {
        tracing::warn!(target: "ratebucket", error = %e, "the reservation did not settle");
    }
    if let Some(e) = replied.bad_report {
        tracing::warn!(target: "ratebucket", error = %e, "a quota report names no limiter dimension");
    }
}

/// A sent reservation while its attempt runs: dropped with the call before the request
/// left ([`Departure`]), it is returned whole, as a refused connection is; once the
/// request may have left, it stays charged as reserved (ADR 0012).
pub(super) struct Unsent {
    pub(super) reservation: Option<Reservation>,
    pub(super) sent: SendStamp,
    pub(super) departure: Departure,
}

impl Unsent {
    /// The reservation, once the attempt has its answer (or its failure).
    pub(super) fn answered(&mut self) -> Reservation {
        self.reservation.take().expect("answered once")
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        if let Some(reservation) = self.reservation.take()
            && self.departure.withdraw()
        {
            let replied =
                reservation.reply(&Reply { sent: self.sent, settle: Settle::Return, reports: &[] });
            if let Err(e) = replied.settled {
                tracing::warn!(target: "ratebucket", error = %e, "a cancelled call was not returned");
            }
        }
        // Otherwise the reservation's own drop abandons it, charged as reserved.
    }
}

/// How a failed attempt ends its reservation, by the charging rule (ADR 0012): a request
/// that may have been executed (no whole reply: reset, timeout, cut body) stays charged as
/// reserved; one the provider answered, or that never reached it, is returned.
pub(super) fn failed(class: Class) -> Settle<'static> {
    if class == Class::Ambiguous { Settle::Keep } else { Settle::Return }
}

/// The error a call stops with: `kind`, the class that ended it, the attempts so far, the
/// last response read whole (if any), the transport's error (if any) and the limit the
/// provider named (if it did).
pub(super) fn stop(
    kind: FetchErrorKind,
    class: Class,
    retry: &Retry,
    response: Option<(Success, Signals)>,
    source: Option<TransportError>,
    limit: Option<LimitHit>,
) -> FetchError {
    let response = response.and_then(|(success, _)| match success {
        Success::Read(r) => Some(Box::new(r)),
        // An open response is only returned for 2xx, which never stops the loop.
        Success::Open(_) => None,
    });
    FetchError {
        kind,
        class: Some(class),
        attempts: retry.attempts(),
        response,
        source: source.map(|e| Box::new(e) as BoxError),
        limit: limit.map(Box::new),
    }
}

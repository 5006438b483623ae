//! Limits on how requests arrive rather than how many per window: a bound on requests in
//! flight (`--max-concurrent`), held from arrival until the answer's body ends, and a bound
//! on how fast the arrival rate rises (`--max-ramp`), counted per whole second.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::replies::refuse;
use super::{Provider, lock};
use crate::body::ResponseBody;
use crate::config::Dialect;
use crate::log::Refusal;

/// What the provider counts of requests as they come: how many are in flight, and how many
/// arrived in the current second and the one before.
#[derive(Debug, Default)]
pub(super) struct Gauges {
    in_flight: Arc<AtomicUsize>,
    seconds: std::sync::Mutex<Seconds>,
}

/// Arrivals per whole second since the provider started: the current second's and the
/// one before it.
#[derive(Debug, Default)]
struct Seconds {
    second: u64,
    now: u64,
    before: u64,
}

impl Seconds {
    /// Counts an arrival in second `second` if the count rises at most `slope` above the
    /// second before's; `false` (and nothing counted) otherwise.
    fn arrive(&mut self, second: u64, slope: u64) -> bool {
        if second != self.second {
            self.before = if second == self.second + 1 { self.now } else { 0 };
            (self.second, self.now) = (second, 0);
        }
        if self.now >= self.before.saturating_add(slope) {
            return false;
        }
        self.now += 1;
        true
    }
}

/// A request's place among those in flight, given back when dropped.
#[derive(Debug)]
pub(super) struct Slot(Option<Arc<AtomicUsize>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(count) = self.0.take() {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Slot {
    /// `response`, holding this slot until its body ends (or the connection drops it).
    pub(super) fn hold(self, response: Response<ResponseBody>) -> Response<ResponseBody> {
        if self.0.is_none() {
            return response;
        }
        response.map(|body| Held { body, _slot: self }.boxed())
    }
}

/// A body that keeps its request in flight while it is being sent.
struct Held {
    body: ResponseBody,
    _slot: Slot,
}

impl Body for Held {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Lets request `id` in, or answers it with the refusal of the limit it meets: too many
/// in flight (a 429 whose message says concurrency), or a rate rising too fast (a 429 that
/// says it is a rate-of-change limit). Nothing is charged for a refusal.
pub(super) fn enter(provider: &Provider, id: u64) -> Result<Slot, Box<Response<ResponseBody>>> {
    let config = &provider.config;
    if let Some(slope) = config.max_ramp {
        let second = provider.now().as_secs();
        if !lock(&provider.gauges.seconds).arrive(second, slope) {
            let message = "Your request rate is increasing too quickly. This is a \
                           rate-of-change limit, not a quota limit: ramp up gradually.";
            return Err(Box::new(refusal(
                provider,
                id,
                Refusal::Ramp,
                message,
                Duration::from_secs(1),
            )));
        }
    }
    let Some(max) = config.max_concurrent else {
        return Ok(Slot(None));
    };
    let count = &provider.gauges.in_flight;
    let taken =
        count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1));
    if taken.is_err() {
        let message = format!(
            "Concurrency limit exceeded for user. Your current concurrency is {max}, which \
             exceeds your concurrency limit of {max}."
        );
        return Err(Box::new(refusal(
            provider,
            id,
            Refusal::Concurrency,
            &message,
            Duration::ZERO,
        )));
    }
    Ok(Slot(Some(Arc::clone(count))))
}

/// A 429 in the dialect's shape saying `message`, with a `retry-after` of `wait` when it
/// is not zero.
fn refusal(
    provider: &Provider,
    id: u64,
    which: Refusal,
    message: &str,
    wait: Duration,
) -> Response<ResponseBody> {
    let body = match provider.config.dialect {
        Dialect::Anthropic => crate::anthropic::error("rate_limit_error", message),
        _ => crate::openai::error(message, "rate_limit_error", Some("rate_limit_exceeded")),
    };
    let mut headers = HeaderMap::new();
    if !wait.is_zero() {
        headers.insert(http::header::RETRY_AFTER, wait.as_secs().max(1).into());
    }
    refuse(provider, id, which, StatusCode::TOO_MANY_REQUESTS, &body, headers)
}

#[cfg(test)]
mod tests {
    use super::Seconds;

    #[test]
    fn each_second_may_rise_at_most_the_slope_above_the_one_before() {
        let mut seconds = Seconds::default();
        let admitted =
            |s: &mut Seconds, second, tries| (0..tries).filter(|_| s.arrive(second, 10)).count();
        assert_eq!(admitted(&mut seconds, 0, 50), 10);
        assert_eq!(admitted(&mut seconds, 1, 50), 20);
        assert_eq!(admitted(&mut seconds, 2, 5), 5);
        // A fall is followed by a rise from where it fell to.
        assert_eq!(admitted(&mut seconds, 3, 50), 15);
        // A quiet second starts it again from nothing.
        assert_eq!(admitted(&mut seconds, 5, 50), 10);
    }
}

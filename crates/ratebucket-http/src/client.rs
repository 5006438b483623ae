//! The executor: reserve, wait for the gate, send, classify, reply, retry.

use std::borrow::Borrow;
use std::fmt;
use std::future::Future;
use std::ops::ControlFlow::{Break, Continue};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use ratebucket_rt::core::{Action, Class, Outcome, Retry, StopReason, classify};
use ratebucket_rt::core::{Caller, Change, SendStamp, Settle};
use ratebucket_rt::{Limiter, Reservation, ReserveOptions};
use tracing::Instrument;

use crate::body::{Attempts, Built, Replay, body_cut, gather, within};
use crate::config::FetchConfig;
use crate::error::{FetchError, FetchErrorKind, LimitHit, limiter_error};
use crate::fetched::{Fetched, Opened};
use crate::headers::Signals;
use crate::transport::{Departure, ResponseBody, Transport};
use crate::vendor::{NoVendor, Vendor};

mod ending;

use ending::{Unsent, examine, failed, quota_reports, reply, stop};

/// How far a server's processing time may exceed the truth: it counts whole milliseconds
/// (`openai-processing-ms`), and may round them up.
const PROCESSING_RESOLUTION: Duration = Duration::from_millis(1);

/// Numbers the calls, for the `request_id` of their spans.
static NEXT_REQUEST_ID: AtomicU64 = AtomicU64::new(1);

/// Sends HTTP requests through a [`Limiter`]: each attempt reserves the cost, waits for
/// the pool-wide gate, sends, classifies the result, folds the rate-limit headers, then
/// commits (success) or releases (failure) and retries per the classification table.
///
/// Cheap to clone; share one between all tasks using the same limiter.
pub struct Fetcher<T, V = NoVendor> {
    inner: Arc<Inner<T, V>>,
}

struct Inner<T, V> {
    transport: T,
    vendor: V,
    limiter: Limiter,
    config: FetchConfig,
    rng: Mutex<fastrand::Rng>,
}

impl<T, V> Clone for Fetcher<T, V> {
    fn clone(&self) -> Self {
        Fetcher { inner: Arc::clone(&self.inner) }
    }
}

impl<T, V> Fetcher<T, V> {
    /// The limiter it paces with.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// The vendor knowledge it applies.
    pub fn vendor(&self) -> &V {
        &self.inner.vendor
    }
}

impl<T: Transport> Fetcher<T, NoVendor> {
    /// A fetcher over `transport`, paced by `limiter`.
    pub fn new(transport: T, limiter: Limiter, config: FetchConfig) -> Self {
        Fetcher::with_vendor(transport, limiter, config, NoVendor)
    }
}

/// How the loop hands back a success.
enum Success {
    Read(Response<Bytes>),
    Open(Response<ResponseBody>),
}

/// A successful run of the loop.
struct Done {
    success: Success,
    reservation: Reservation,
    attempts: u32,
    signals: Signals,
    sent: SendStamp,
}

impl<T: Transport, V: Vendor> Fetcher<T, V> {
    /// A fetcher with vendor knowledge.
    ///
    /// The retry policy's `retry_after_ceiling` is lowered to the gate's `max_pause` if it
    /// is longer: a wait the gate would cut short is one the pool would not honour, so a
    /// request told to wait that long fails instead of being re-sent early.
    pub fn with_vendor(transport: T, limiter: Limiter, config: FetchConfig, vendor: V) -> Self {
        Fetcher::assemble(transport, limiter, config, vendor)
    }

    /// Sends `request` (re-built for each attempt from its method, URI, version, headers,
    /// extensions and body), at the configured cost. A
    /// [`Caller`](ratebucket_rt::core::Caller) in its extensions says whose share it counts
    /// against and in which priority class it queues.
    pub fn fetch(
        &self,
        request: Request<Bytes>,
    ) -> impl Future<Output = Result<Fetched, FetchError>> + '_ {
        // Not `async fn`s: each layer of async fn would move the whole future once more.
        self.fetch_via(&self.inner.transport, &self.inner.config.cost, Replay(request))
    }

    /// Sends the request `build(attempt)` returns, building it afresh for every attempt
    /// (for bodies that cannot be replayed), at the configured cost.
    pub fn fetch_with<'a>(
        &'a self,
        build: impl FnMut(u32) -> Request<Bytes> + 'a,
    ) -> impl Future<Output = Result<Fetched, FetchError>> + 'a {
        self.fetch_via(&self.inner.transport, &self.inner.config.cost, Built::new(build))
    }

    /// Sends at an explicit `cost` (one entry per limiter dimension, an upper bound) and
    /// settles the reservation at what the vendor says the successful response was charged
    /// ([`Vendor::charge`]; the cost as reserved when it says nothing).
    pub fn fetch_costed<'a>(
        &'a self,
        cost: &'a [u64],
        build: impl FnMut(u32) -> Request<Bytes> + 'a,
    ) -> impl Future<Output = Result<Fetched, FetchError>> + 'a {
        self.fetch_via(&self.inner.transport, cost, Built::new(build))
    }

    /// Like [`Fetcher::fetch_costed`], but returns as soon as a 2xx response head arrives,
    /// with its body unread and the reservation still held (for streams). Error responses
    /// are read and retried as usual.
    pub async fn open(
        &self,
        cost: &[u64],
        build: impl FnMut(u32) -> Request<Bytes>,
    ) -> Result<Opened, FetchError> {
        let span = self.call_span(cost);
        let done = self
            .run(&self.inner.transport, cost, &mut Built::new(build), true)
            .instrument(span.clone())
            .await?;
        let Success::Open(response) = done.success else {
            unreachable!("an open run returns an open response")
        };
        Ok(Opened {
            response,
            sent: done.sent,
            reservation: done.reservation,
            attempts: done.attempts,
            signals: done.signals,
            span,
        })
    }
}

impl<T, V: Vendor> Fetcher<T, V> {
    /// The fetcher's engine over `transport`: the retry policy's `retry_after_ceiling`
    /// capped at the gate's `max_pause`, and the learning policies set on the limiter.
    pub(crate) fn assemble(
        transport: T,
        limiter: Limiter,
        mut config: FetchConfig,
        vendor: V,
    ) -> Self {
        let max_pause = limiter.snapshot().gate.max_pause;
        config.retry.retry_after_ceiling = config.retry.retry_after_ceiling.min(max_pause);
        if let (Some(dimension), Some(policy)) = (config.fold_dimension, config.learn)
            && let Err(e) = limiter.change(dimension, Change::Policy(policy))
        {
            tracing::warn!(target: "ratebucket", error = %e, "FetchConfig::learn: the policy was not set");
        }
        for (dimension, policy) in vendor.policies() {
            if let Err(e) = limiter.change(dimension, Change::Policy(policy)) {
                tracing::warn!(target: "ratebucket", dimension, error = %e, "the vendor's learning policy was not set");
            }
        }
        let rng = Mutex::new(fastrand::Rng::with_seed(config.seed));
        Fetcher { inner: Arc::new(Inner { transport, vendor, limiter, config, rng }) }
    }

    /// The settings it runs with.
    #[cfg(feature = "tower")]
    pub(crate) fn config(&self) -> &FetchConfig {
        &self.inner.config
    }

    /// [`Fetcher::fetch_costed`] through `transport`. Not an `async fn`: the call span
    /// wraps the one future that owns `attempts` (each layer of `async fn` would hold its
    /// own copy of the arguments).
    fn fetch_via<'a, Tr: Transport>(
        &'a self,
        transport: &'a Tr,
        cost: &'a [u64],
        attempts: impl Attempts + 'a,
    ) -> impl Future<Output = Result<Fetched, FetchError>> + 'a {
        let span = self.call_span(cost);
        read_run::<T, V, Tr>(self, transport, Some(cost), attempts).instrument(span)
    }
}

/// The current span, or none without asking when no subscriber was ever set (a lookup of
/// the current span costs a thread-local read and a call into the dispatcher).
fn current_span() -> tracing::Span {
    if tracing::dispatcher::has_been_set() {
        tracing::Span::current()
    } else {
        tracing::Span::none()
    }
}

/// [`Fetcher::run`] to a whole response, then its reply: the charge and the provider's
/// count as one input. It takes the fetcher, the transport and the cost (the
/// configured one if `None`) borrowed or owned, so a caller that needs a `'static` future
/// (the tower layer) has it without a second future around this one.
#[allow(clippy::manual_async_fn)] // the block is the point: see below
pub(crate) fn read_run<T, V: Vendor, Tr: Transport>(
    fetcher: impl Borrow<Fetcher<T, V>>,
    transport: impl Borrow<Tr>,
    cost: Option<impl AsRef<[u64]>>,
    mut attempts: impl Attempts,
) -> impl Future<Output = Result<Fetched, FetchError>> {
    // Not an `async fn`: its arguments would be kept twice in the future (as arguments and
    // as the locals they are moved into); a block keeps what it captures once.
    async move {
        let this = fetcher.borrow();
        let cost = cost.as_ref().map_or(&*this.inner.config.cost, AsRef::as_ref);
        // The run's future is the one this future holds (not one more layer around it).
        let done = this.run(transport.borrow(), cost, &mut attempts, false).await?;
        let (reservation, attempts, signals) = (done.reservation, done.attempts, done.signals);
        let Success::Read(response) = done.success else {
            unreachable!("a read run returns a read response")
        };
        let charged = this.inner.vendor.charge(cost, &response);
        let used = charged.as_deref().unwrap_or(cost);
        current_span().record("committed", tracing::field::debug(used));
        // The charge and the provider's count as one reply: a refund the charge earns
        // reaches nobody before the count (which may not honour it) is heard.
        let reports = quota_reports(
            (&this.inner.vendor, this.inner.config.fold_dimension),
            response.status(),
            response.headers(),
            &signals,
            Some(response.body()),
        );
        reply(reservation, done.sent, Settle::Charge(used), &reports);
        Ok(Fetched { response, attempts, signals, charged })
    }
}

impl<T, V: Vendor> Fetcher<T, V> {
    /// The one loop: reserve, gate, send, classify, fold, then commit/release and retry.
    async fn run(
        &self,
        transport: &impl Transport,
        cost: &[u64],
        attempts: &mut impl Attempts,
        open: bool,
    ) -> Result<Done, FetchError> {
        let inner = &*self.inner;
        let limiter = &inner.limiter;
        // Checked before anything is reserved: a request that cannot be sent is a
        // configuration error, not a network failure to retry.
        // The first request is read here, but made only as it leaves: the run holds no
        // request across a wait.
        let first = attempts.first();
        // Whose share the request counts against, and its class: the first request says.
        let caller = first.extensions().get::<Caller>().copied().unwrap_or_default();
        if caller != Caller::default() {
            let span = current_span();
            span.record("tenant", caller.tenant.0);
            span.record("priority", caller.priority.name());
        }
        if let Err(e) = transport.check(first.uri()) {
            return Err(FetchError::config(e));
        }
        let mut retry = Retry::new(inner.config.retry);
        let result = loop {
            let attempt = retry.attempts();
            let span = tracing::debug_span!(
                target: "ratebucket",
                "ratebucket.attempt",
                attempt,
                wait_ms = tracing::field::Empty,
                class = tracing::field::Empty,
            );
            // Pinned where it stands: the span wraps a reference, not a second copy. Its
            // block ends before the sleep, so the retry's wait holds neither the step nor
            // its result.
            let delay = {
                let step = std::pin::pin!(async {
                    // Time queued in the limiter counts against the policy's deadline too.
                    // Sent the moment it is granted: the grant stamps the send (one lock).
                    let options = ReserveOptions::default().send_on_grant().caller(caller);
                    let options = match inner.config.retry.deadline {
                        Some(deadline) => options.deadline(
                            std::time::Instant::now()
                                + deadline.saturating_duration_since(limiter.now()),
                        ),
                        None => options,
                    };
                    // Cancelled before its request left, the call is returned, not charged.
                    let departure = Departure::new();
                    // In a block of its own: what the waits held is not kept across the
                    // exchange (the reservation lives on in `unsent` only).
                    let mut unsent = {
                        // The wait is read off the clock only for a span that records it.
                        let span = current_span();
                        let asked = (!span.is_disabled()).then(|| limiter.now());
                        let mut reservation = match limiter.reserve(cost).with(options).await {
                            Ok(r) => r,
                            Err(e) => return Break(Err(limiter_error(e, attempt, limiter))),
                        };
                        let sent = match limiter.send_when_open(&mut reservation).await {
                            Ok(sent) => sent,
                            Err(e) => return Break(Err(limiter_error(e, attempt, limiter))),
                        };
                        if let Some(asked) = asked {
                            let waited = limiter.now().saturating_duration_since(asked);
                            span.record("wait_ms", waited.as_secs_f64() * 1e3);
                        }
                        Unsent {
                            reservation: Some(reservation),
                            sent,
                            departure: departure.clone(),
                        }
                    };
                    let request = attempts.make(attempt);
                    // One send, inline (not a future of its own, moved into this one): error
                    // responses (and every response unless `open`) are read whole under the
                    // read timeout; with `open`, a 2xx response comes with its body unread. The
                    // request goes to the transport at once (its send future owns it).
                    let sending = transport.send_departing(request, departure);
                    let exchange = std::pin::pin!(async {
                        // The response in a block of its own: its parts are kept across the
                        // body's read, not the response they came from as well.
                        let (parts, body) = {
                            let response = sending.await?;
                            if open && response.status().is_success() {
                                return Ok(Success::Open(response));
                            }
                            response.into_parts()
                        };
                        let max = inner.config.max_body;
                        let bytes = gather(body, max).await.map_err(body_cut(max))?;
                        Ok(Success::Read(Response::from_parts(parts, bytes)))
                    });
                    let result = within(exchange, limiter, inner.config.read_timeout)
                        .await
                        .map(|success| examine(&self.inner.vendor, success));
                    let (reservation, sent) = (unsent.answered(), unsent.sent);
                    // A server that says how long it worked on the request counted it at
                    // least that long before now: its reports say more (SendStamp::counted_by).
                    // A time rounded up would place the count too early: a unit is taken off.
                    let sent = match result.as_ref().map(|(.., signals)| signals.processing) {
                        Ok(Some(processing)) => sent.counted_by(
                            limiter
                                .now()
                                .saturating_sub(processing.saturating_sub(PROCESSING_RESOLUTION)),
                        ),
                        _ => sent,
                    };
                    let (outcome, success, source) = match result {
                        Ok((success, verdict, hint, signals)) => {
                            let (status, headers) = match &success {
                                Success::Read(r) => (r.status(), r.headers()),
                                Success::Open(r) => (r.status(), r.headers()),
                            };
                            // Only an error's headers are searched for a family left at zero.
                            let exhausted = signals.quota.is_some_and(|q| q.remaining == Some(0))
                                || (!status.is_success()
                                    && crate::headers::any_remaining_exhausted(headers));
                            let outcome = Outcome {
                                status: Some(status.as_u16()),
                                failure: None,
                                retry_after: signals.server_delay().or(hint),
                                should_retry: signals.should_retry,
                                verdict,
                                quota_exhausted: exhausted,
                            };
                            (outcome, Some((success, signals)), None)
                        }
                        Err(e) => {
                            #[cfg(feature = "tls")]
                            if let Some(problem) = crate::tls::certificate_problem(&e) {
                                // Refused at the handshake: nothing left, and no retry fixes a
                                // certificate; the caller's configuration does.
                                reply(reservation, sent, Settle::Return, &[]);
                                let mut error = FetchError::config(problem);
                                error.attempts = retry.attempts() + 1;
                                error.source = Some(Box::new(e));
                                return Break(Err(error));
                            }
                            (Outcome::failure(e.kind()), None, Some(e))
                        }
                    };
                    let mut outcome = outcome;
                    // The wait this request's own answer asked for: it is not sent again
                    // sooner, whatever the pool's pause (set by an earlier answer of the
                    // same wave, it may end first).
                    let asked = outcome.retry_after;
                    if classify(&outcome) == Class::Throttled && outcome.retry_after.is_none() {
                        // The pause the gate will take, so the deadline is checked against it.
                        outcome.retry_after = Some(limiter.snapshot().gate.default_pause);
                    }
                    // The decision reads the time only against a deadline.
                    let now = match inner.config.retry.deadline {
                        Some(_) => limiter.now(),
                        None => ratebucket_rt::core::Instant::ZERO,
                    };
                    let action = {
                        let mut rng = inner.rng.lock().unwrap_or_else(PoisonError::into_inner);
                        retry.decide(&outcome, now, &mut rng)
                    };
                    let class = classify(&outcome);
                    current_span().record("class", tracing::field::debug(class));
                    #[cfg(feature = "metrics")]
                    metrics::counter!(
                        "ratebucket_attempts_total",
                        "limiter" => limiter.name(),
                        "class" => format!("{class:?}"),
                    )
                    .increment(1);
                    tracing::debug!(target: "ratebucket", ?action, "attempt finished");
                    // A refusal's quota reports, read once: what it tells the limiter, and
                    // which limit it names.
                    let reports = match (&action, &success) {
                        (Action::Done, _) => Vec::new(),
                        (_, Some((Success::Read(response), signals))) => quota_reports(
                            (&self.inner.vendor, self.inner.config.fold_dimension),
                            response.status(),
                            response.headers(),
                            signals,
                            Some(response.body()),
                        ),
                        _ => Vec::new(),
                    };
                    let hit = LimitHit::of(&reports, limiter);
                    if let Some(hit) = &hit
                        && matches!(class, Class::Throttled | Class::Spent | Class::Crowded)
                    {
                        tracing::info!(
                            target: "ratebucket",
                            limiter = %limiter.name(),
                            dimension = %hit.name,
                            limit = ?hit.limit,
                            remaining = ?hit.remaining,
                            reset = ?hit.reset,
                            "the provider refused on {hit}"
                        );
                    }
                    match action {
                        Action::Done => {
                            let (success, signals) = success.expect("a success has a response");
                            if let Success::Open(response) = &success {
                                // A stream settles later; its head's reports are heard now.
                                let reports = quota_reports(
                                    (&self.inner.vendor, self.inner.config.fold_dimension),
                                    response.status(),
                                    response.headers(),
                                    &signals,
                                    None,
                                );
                                if let Err(e) = reservation.observe(sent, &reports) {
                                    tracing::warn!(target: "ratebucket", error = %e, "a quota report names no limiter dimension");
                                }
                            }
                            Break(Ok(Done {
                                success,
                                reservation,
                                attempts: retry.attempts(),
                                signals,
                                sent,
                            }))
                        }
                        Action::PauseAndRetry { retry_after } => {
                            // The gate closes before the quota is returned (one reply), so the
                            // return cannot launch another request into the same wave. The
                            // provider refused this one: nothing was consumed.
                            let settle = Settle::Throttled { retry_after };
                            reply(reservation, sent, settle, &reports);
                            // Not sent again before its own answer's wait has passed.
                            Continue(asked)
                        }
                        Action::CrowdedRetry { retry_after } => {
                            // Returned as crowded: the limiter lets fewer go at once, and
                            // the retry waits for one in flight to end.
                            let settle = Settle::Crowded { retry_after };
                            reply(reservation, sent, settle, &reports);
                            Continue(asked)
                        }
                        Action::RetryAfter { delay } => {
                            reply(reservation, sent, failed(class), &reports);
                            // Slept outside this block: the answer is not kept across the wait.
                            Continue(Some(delay))
                        }
                        Action::Fail(reason) => {
                            reply(reservation, sent, failed(class), &reports);
                            let kind = FetchErrorKind::Failed(reason);
                            Break(Err(stop(kind, class, &retry, success, source, hit)))
                        }
                        Action::Spent { resets_in } => {
                            // Told to the pool first: every waiter is refused at once, and
                            // nobody is launched by this reservation's return.
                            let dimension = hit.as_ref().map(|h| h.dimension);
                            tracing::warn!(
                                target: "ratebucket",
                                limiter = %limiter.name(),
                                ?resets_in,
                                "the provider's quota is spent: every call fails until it resets"
                            );
                            let settle = Settle::Spent { resets_in, dimension };
                            reply(reservation, sent, settle, &reports);
                            let kind = FetchErrorKind::Failed(StopReason::Spent(resets_in));
                            Break(Err(stop(kind, class, &retry, success, source, hit)))
                        }
                        Action::Abort(reason) => {
                            // The abort comes first in the reply: a return before it would
                            // launch the next waiter.
                            reply(reservation, sent, Settle::Fatal, &reports);
                            let kind = FetchErrorKind::Aborted(reason);
                            Break(Err(stop(kind, class, &retry, success, source, hit)))
                        }
                    }
                });
                match step.instrument(span).await {
                    Break(result) => break result,
                    Continue(delay) => delay,
                }
            };
            if let Some(delay) = delay {
                limiter.sleep(delay).await;
            }
        };
        let call = current_span();
        match &result {
            Ok(done) => {
                call.record("attempts", done.attempts);
                call.record("class", tracing::field::debug(Class::Ok));
            }
            Err(e) => {
                call.record("attempts", e.attempts());
                if let Some(class) = e.class() {
                    call.record("class", tracing::field::debug(class));
                }
                tracing::debug!(target: "ratebucket", error = %e, "call failed");
            }
        }
        result
    }

    /// The span of one call: `ratebucket.call`, with a request id, the limiter's name, the
    /// cost reserved, and (recorded as it ends) what was committed, the attempts and the
    /// final class. Each attempt is a `ratebucket.attempt` span inside it.
    pub(crate) fn call_span(&self, cost: &[u64]) -> tracing::Span {
        tracing::info_span!(
            target: "ratebucket",
            "ratebucket.call",
            request_id = NEXT_REQUEST_ID.fetch_add(1, Ordering::Relaxed),
            limiter = %self.inner.limiter.name(),
            reserved = ?cost,
            committed = tracing::field::Empty,
            attempts = tracing::field::Empty,
            class = tracing::field::Empty,
            tenant = tracing::field::Empty,
            priority = tracing::field::Empty,
        )
    }
}

impl<T, V> fmt::Debug for Fetcher<T, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher")
            .field("limiter", &self.inner.limiter)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

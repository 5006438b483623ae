//! The executor: reserve, wait for the gate, send, classify, fold, commit or release, retry.

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::BodyExt;
use ratebucket_rt::core::{
    Action, Class, FailureKind, Outcome, Retry, RetryPolicy, StopReason, Verdict, classify,
};
use ratebucket_rt::{Limiter, ReserveError};

use crate::headers::Signals;
use crate::transport::{BoxError, ResponseBody, Transport, TransportError};

/// Reads a vendor's meaning into an error response (e.g. OpenAI's `insufficient_quota`
/// is fatal even though it comes as a 429). The generic adapter has none.
pub trait Classifier: Send + Sync + 'static {
    /// A verdict for this response, or `None` to classify by status and headers alone.
    fn verdict(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Verdict>;
}

/// No vendor knowledge: classification by status, headers and transport failure.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoVendor;

impl Classifier for NoVendor {
    fn verdict(&self, _: StatusCode, _: &HeaderMap, _: &[u8]) -> Option<Verdict> {
        None
    }
}

/// Settings of a [`Fetcher`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FetchConfig {
    /// The retry policy (backoff, ceilings, `retry_ambiguous`, deadline).
    pub retry: RetryPolicy,
    /// What one request costs, per limiter dimension. `[1]` by default: one request.
    pub cost: Vec<u64>,
    /// The limiter dimension that `x-ratelimit-remaining` / `RateLimit` quotas are folded
    /// into, if any. Dimension 0 (requests) by default.
    pub fold_dimension: Option<usize>,
    /// Time allowed from sending until the whole body is read.
    pub read_timeout: Duration,
    /// Largest response body read, in bytes.
    pub max_body: usize,
    /// Seed for backoff jitter.
    pub seed: u64,
}

impl Default for FetchConfig {
    fn default() -> FetchConfig {
        FetchConfig {
            retry: RetryPolicy::default(),
            cost: vec![1],
            fold_dimension: Some(0),
            read_timeout: Duration::from_secs(60),
            max_body: 16 << 20,
            seed: 0x5eed,
        }
    }
}

impl FetchConfig {
    /// Sets the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> FetchConfig {
        self.retry = retry;
        self
    }

    /// Sets the per-request cost.
    pub fn cost(mut self, cost: Vec<u64>) -> FetchConfig {
        self.cost = cost;
        self
    }

    /// Sets the read timeout.
    pub fn read_timeout(mut self, timeout: Duration) -> FetchConfig {
        self.read_timeout = timeout;
        self
    }

    /// Sets the jitter seed.
    pub fn seed(mut self, seed: u64) -> FetchConfig {
        self.seed = seed;
        self
    }
}

/// Why a fetch ended without a successful response.
#[derive(Debug)]
#[non_exhaustive]
pub enum FetchErrorKind {
    /// The limiter refused the reservation (cost too large, max wait, aborted run).
    Limiter(ReserveError),
    /// The retry policy stopped this request; the run goes on.
    Failed(StopReason),
    /// A fatal failure stopped the whole run; the limiter was aborted.
    Aborted(StopReason),
}

/// A fetch that did not succeed: which class ended it, after how many attempts, and the
/// last response or transport error.
#[derive(Debug)]
pub struct FetchError {
    kind: FetchErrorKind,
    class: Option<Class>,
    attempts: u32,
    response: Option<Response<Bytes>>,
    source: Option<BoxError>,
}

impl FetchError {
    /// Why it ended.
    pub fn kind(&self) -> &FetchErrorKind {
        &self.kind
    }

    /// The class of the last attempt (`None` if no attempt was made).
    pub fn class(&self) -> Option<Class> {
        self.class
    }

    /// Attempts made (requests sent or tried).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The last response, if the server answered.
    pub fn response(&self) -> Option<&Response<Bytes>> {
        self.response.as_ref()
    }

    /// The last response's status, if the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.response.as_ref().map(Response::status)
    }
}

impl fmt::Display for FetchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FetchErrorKind::Limiter(e) => write!(f, "limiter refused the request: {e}")?,
            FetchErrorKind::Failed(r) => write!(f, "request failed: {r}")?,
            FetchErrorKind::Aborted(r) => write!(f, "run aborted: {r}")?,
        }
        write!(f, " after {} attempt(s)", self.attempts)?;
        if let Some(status) = self.status() {
            write!(f, " (last status {status})")?;
        }
        if let Some(source) = &self.source {
            write!(f, " ({source})")?;
        }
        Ok(())
    }
}

impl StdError for FetchError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// Sends HTTP requests through a [`Limiter`]: each attempt reserves the cost, waits for
/// the pool-wide gate, sends, classifies the result, folds the rate-limit headers, then
/// commits (success) or releases (failure) and retries per the classification table.
///
/// Cheap to clone; share one between all tasks using the same limiter.
pub struct Fetcher<T, C = NoVendor> {
    inner: Arc<Inner<T, C>>,
}

struct Inner<T, C> {
    transport: T,
    classifier: C,
    limiter: Limiter,
    config: FetchConfig,
    rng: Mutex<fastrand::Rng>,
}

impl<T, C> Clone for Fetcher<T, C> {
    fn clone(&self) -> Self {
        Fetcher {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T: Transport> Fetcher<T, NoVendor> {
    /// A fetcher over `transport`, paced by `limiter`.
    pub fn new(transport: T, limiter: Limiter, config: FetchConfig) -> Self {
        Fetcher::with_classifier(transport, limiter, config, NoVendor)
    }
}

/// The successful result of a fetch, with what the provider's headers said.
#[derive(Debug)]
pub struct Fetched {
    /// The response, body read.
    pub response: Response<Bytes>,
    /// Attempts it took.
    pub attempts: u32,
    /// The rate-limit signals of the response.
    pub signals: Signals,
}

impl<T: Transport, C: Classifier> Fetcher<T, C> {
    /// A fetcher with a vendor classifier.
    pub fn with_classifier(
        transport: T,
        limiter: Limiter,
        config: FetchConfig,
        classifier: C,
    ) -> Self {
        let rng = Mutex::new(fastrand::Rng::with_seed(config.seed));
        Fetcher {
            inner: Arc::new(Inner {
                transport,
                classifier,
                limiter,
                config,
                rng,
            }),
        }
    }

    /// The limiter it paces with.
    pub fn limiter(&self) -> &Limiter {
        &self.inner.limiter
    }

    /// Sends `request` (re-built for each attempt from its method, URI, version, headers
    /// and body; extensions are not carried over).
    pub async fn fetch(&self, request: Request<Bytes>) -> Result<Fetched, FetchError> {
        let (parts, body) = request.into_parts();
        self.fetch_with(|_| {
            let mut builder = Request::builder()
                .method(parts.method.clone())
                .uri(parts.uri.clone())
                .version(parts.version);
            if let Some(headers) = builder.headers_mut() {
                headers.clone_from(&parts.headers);
            }
            builder
                .body(body.clone())
                .expect("parts of a valid request")
        })
        .await
    }

    /// Sends the request `build(attempt)` returns, building it afresh for every attempt
    /// (for bodies that cannot be replayed).
    pub async fn fetch_with(
        &self,
        mut build: impl FnMut(u32) -> Request<Bytes>,
    ) -> Result<Fetched, FetchError> {
        let inner = &*self.inner;
        let limiter = &inner.limiter;
        let mut retry = Retry::new(inner.config.retry);
        loop {
            let attempt = retry.attempts();
            let reservation = match limiter.reserve(&inner.config.cost).await {
                Ok(r) => r,
                Err(e) => return Err(limiter_error(e, attempt)),
            };
            limiter.gate_open().await;
            let stamp = limiter.stamp_send();
            let result = self.attempt(build(attempt)).await;
            let (outcome, response, source) = match result {
                Ok((response, verdict, signals)) => {
                    if let (Some(d), Some(quota)) = (inner.config.fold_dimension, signals.quota)
                        && let Some(remaining) = quota.remaining
                    {
                        limiter.observe_remaining(d, stamp, remaining);
                    }
                    let outcome = Outcome {
                        status: Some(response.status().as_u16()),
                        failure: None,
                        retry_after: signals.server_delay(),
                        should_retry: signals.should_retry,
                        verdict,
                    };
                    (outcome, Some((response, signals)), None)
                }
                Err(e) => (Outcome::failure(e.kind()), None, Some(e)),
            };
            let now = limiter.now();
            let action = {
                let mut rng = inner.rng.lock().unwrap_or_else(PoisonError::into_inner);
                retry.decide(&outcome, now, &mut rng)
            };
            let class = classify(&outcome);
            tracing::debug!(target: "ratebucket", attempt, ?class, ?action, "attempt finished");
            match action {
                Action::Done => {
                    let (response, signals) = response.expect("a success has a response");
                    if let Err(e) = reservation.commit(&inner.config.cost) {
                        tracing::warn!(target: "ratebucket", error = %e, "commit failed");
                    }
                    return Ok(Fetched {
                        response,
                        attempts: retry.attempts(),
                        signals,
                    });
                }
                Action::PauseAndRetry { retry_after } => {
                    // Close the gate before returning the quota, so the refund cannot
                    // launch another request into the same wave. The provider refused
                    // this one: nothing was consumed.
                    limiter.throttle(stamp, retry_after);
                    reservation.release();
                }
                Action::RetryAfter { delay } => {
                    reservation.release();
                    limiter.sleep(delay).await;
                }
                Action::Fail(reason) => {
                    reservation.release();
                    return Err(stop(
                        FetchErrorKind::Failed(reason),
                        class,
                        &retry,
                        response,
                        source,
                    ));
                }
                Action::Abort(reason) => {
                    reservation.release();
                    limiter.abort();
                    return Err(stop(
                        FetchErrorKind::Aborted(reason),
                        class,
                        &retry,
                        response,
                        source,
                    ));
                }
            }
        }
    }

    /// One send, with the body read under the read timeout.
    async fn attempt(
        &self,
        request: Request<Bytes>,
    ) -> Result<(Response<Bytes>, Option<Verdict>, Signals), TransportError> {
        let inner = &*self.inner;
        let exchange = async {
            let response = inner.transport.send(request).await?;
            let (parts, body) = response.into_parts();
            let bytes = read_body(body, inner.config.max_body).await?;
            Ok(Response::from_parts(parts, bytes))
        };
        let timeout = async {
            inner.limiter.sleep(inner.config.read_timeout).await;
            Err(TransportError::with_kind(
                FailureKind::ReadTimeout,
                "read timeout",
            ))
        };
        let response = futures_lite::future::or(exchange, timeout).await?;
        let signals = Signals::from_headers(response.headers(), SystemTime::now());
        let verdict = if response.status().is_success() {
            None
        } else {
            inner
                .classifier
                .verdict(response.status(), response.headers(), response.body())
        };
        Ok((response, verdict, signals))
    }
}

/// Reads a whole body, at most `max` bytes. A body error is a cut body.
async fn read_body(mut body: ResponseBody, max: usize) -> Result<Bytes, TransportError> {
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| TransportError::boxed(FailureKind::BodyCut, e))?;
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > max {
                let too_big = std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("response body larger than {max} bytes"),
                );
                return Err(TransportError::boxed(
                    FailureKind::BodyCut,
                    Box::new(too_big),
                ));
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes.freeze())
}

fn limiter_error(e: ReserveError, attempts: u32) -> FetchError {
    FetchError {
        kind: FetchErrorKind::Limiter(e),
        class: None,
        attempts,
        response: None,
        source: None,
    }
}

fn stop(
    kind: FetchErrorKind,
    class: Class,
    retry: &Retry,
    response: Option<(Response<Bytes>, Signals)>,
    source: Option<TransportError>,
) -> FetchError {
    FetchError {
        kind,
        class: Some(class),
        attempts: retry.attempts(),
        response: response.map(|(r, _)| r),
        source: source.map(|e| Box::new(e) as BoxError),
    }
}

impl<T, C> fmt::Debug for Fetcher<T, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fetcher")
            .field("limiter", &self.inner.limiter)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

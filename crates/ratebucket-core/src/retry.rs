//! Retry classification over neutral inputs, and the retry policy with full-jitter backoff.

use core::fmt;
use std::time::Duration;

use crate::time::Instant;

/// How a transport failed, in terms that decide whether a retry can double-bill.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FailureKind {
    /// The connection was refused: the request never reached the server.
    ConnectRefused,
    /// Connecting timed out: the request never reached the server.
    ConnectTimeout,
    /// The request was sent but no (complete) reply came in time.
    ReadTimeout,
    /// The connection was reset after the request was sent.
    ResetAfterSend,
    /// The reply's body was cut before its end (e.g. a stream before `[DONE]`).
    BodyCut,
}

/// A vendor's reading of an error body, which outranks the status code (e.g. a 429 whose
/// body says `insufficient_quota` is fatal, not throttled).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Verdict {
    /// Rate limited: pause the pool and retry.
    Throttled,
    /// This request can never succeed (e.g. "request too large").
    Permanent,
    /// Nothing will succeed (bad credentials, no permission).
    Fatal,
    /// A quota is spent: nothing succeeds until it resets (the outcome's
    /// [`retry_after`](Outcome::retry_after), when the provider says) or someone raises it
    /// (a monthly spend cap, a usage limit, an exhausted credit balance).
    Spent,
    /// Busy, not a limit of the caller's: back off with jitter and retry this request,
    /// without pausing the pool (Groq's transient 498 `capacity_exceeded`).
    Retryable,
    /// Too many requests in flight, not too fast ("Concurrency limit exceeded for user"):
    /// the pool keeps its pace, fewer go at once, and this request is sent again.
    Crowded,
}

/// One attempt's result, as neutral data: no HTTP types, no vendor names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The status code, if a response arrived.
    pub status: Option<u16>,
    /// The transport failure, if there was one.
    pub failure: Option<FailureKind>,
    /// The wait the server asked for (Retry-After and friends), already parsed.
    pub retry_after: Option<Duration>,
    /// An `x-should-retry: true|false` header, which overrides the status.
    pub should_retry: Option<bool>,
    /// A vendor's reading of the error body, which outranks status and `should_retry`.
    pub verdict: Option<Verdict>,
    /// The response's quota headers say nothing is left (`x-ratelimit-remaining: 0` or
    /// an IETF `RateLimit` remaining of zero): a 403 carrying it is a throttle, as GitHub
    /// sends its rate limits.
    pub quota_exhausted: bool,
}

impl Outcome {
    /// A response with `status`.
    pub fn status(status: u16) -> Outcome {
        Outcome { status: Some(status), ..Outcome::default() }
    }

    /// A transport failure with no response.
    pub fn failure(kind: FailureKind) -> Outcome {
        Outcome { failure: Some(kind), ..Outcome::default() }
    }

    /// With the quota headers saying nothing is left.
    pub fn with_quota_exhausted(mut self) -> Outcome {
        self.quota_exhausted = true;
        self
    }

    /// With the server's requested wait.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Outcome {
        self.retry_after = Some(retry_after);
        self
    }

    /// With an `x-should-retry` override.
    pub fn with_should_retry(mut self, should_retry: bool) -> Outcome {
        self.should_retry = Some(should_retry);
        self
    }

    /// With a vendor verdict from the body.
    pub fn with_verdict(mut self, verdict: Verdict) -> Outcome {
        self.verdict = Some(verdict);
        self
    }
}

/// The class of an attempt's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// 2xx: done.
    Ok,
    /// Rate limited (429, or 503 with Retry-After): pause the pool, retry; not a spent
    /// attempt.
    Throttled,
    /// Transient (5xx, 408, 529, or the request never reached the server): back off and
    /// retry.
    Retryable,
    /// May have been executed and billed (read timeout, reset after send, body cut): not
    /// retried unless `retry_ambiguous` is set.
    Ambiguous,
    /// This request cannot succeed (400, 404, 413, other 4xx): fail it, not the run.
    Permanent,
    /// Nothing will succeed (401, 403): abort the run.
    Fatal,
    /// A quota is spent until the provider's reset, or until someone raises it (a spend
    /// cap, a usage limit, a day's quota, a wait beyond the retry ceiling): every call
    /// fails at once until then, saying when.
    Spent,
    /// Refused for requests in flight (a concurrency limit): nothing pauses, fewer go at
    /// once, the request is retried; not a spent attempt.
    Crowded,
}

/// Classifies an attempt.
///
/// Precedence: a transport failure; then a vendor [`Verdict`] from the body; then
/// `x-should-retry` over the status class (except for 2xx); then the status code.
pub fn classify(outcome: &Outcome) -> Class {
    if let Some(kind) = outcome.failure {
        return match kind {
            FailureKind::ConnectRefused | FailureKind::ConnectTimeout => Class::Retryable,
            FailureKind::ReadTimeout | FailureKind::ResetAfterSend | FailureKind::BodyCut => {
                Class::Ambiguous
            }
        };
    }
    let Some(status) = outcome.status else {
        // Neither a response nor a failure: the caller reported nothing usable.
        return Class::Ambiguous;
    };
    if (200..300).contains(&status) {
        return Class::Ok;
    }
    if let Some(verdict) = outcome.verdict {
        return match verdict {
            Verdict::Throttled => Class::Throttled,
            Verdict::Permanent => Class::Permanent,
            Verdict::Fatal => Class::Fatal,
            Verdict::Spent => Class::Spent,
            Verdict::Retryable => Class::Retryable,
            Verdict::Crowded => Class::Crowded,
        };
    }
    let by_status = match status {
        429 => Class::Throttled,
        503 if outcome.retry_after.is_some() => Class::Throttled,
        // A rate limit sent as a 403 (GitHub's primary and secondary limits).
        403 if outcome.retry_after.is_some() || outcome.quota_exhausted => Class::Throttled,
        // 409: a conflict on the server's side (a lock timeout), which the major SDKs retry.
        408 | 409 | 500..=599 => Class::Retryable,
        401 | 403 => Class::Fatal,
        _ => Class::Permanent,
    };
    match outcome.should_retry {
        Some(true) if by_status != Class::Throttled => Class::Retryable,
        Some(false) => Class::Permanent,
        _ => by_status,
    }
}

/// Why a task or the run ended without success.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StopReason {
    /// The class itself ends the task or run (permanent, ambiguous, fatal).
    Class(Class),
    /// Retryable failures used up `max_retries`.
    RetriesExhausted,
    /// Throttles used up `max_throttles`.
    ThrottlesExhausted,
    /// The provider says a quota is spent, until it resets in the wait given (a wait
    /// beyond the policy's ceiling says so too) or, with none, until someone raises it.
    Spent(Option<Duration>),
    /// The next attempt would start after the overall deadline.
    DeadlineExhausted,
}

impl fmt::Display for StopReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopReason::Class(class) => write!(f, "{class:?} failure"),
            StopReason::RetriesExhausted => f.write_str("retries exhausted"),
            StopReason::ThrottlesExhausted => f.write_str("still throttled after every retry"),
            StopReason::Spent(Some(d)) => {
                write!(f, "quota spent; it resets in {}", crate::time::humanise(*d))
            }
            StopReason::Spent(None) => f.write_str("quota spent until its limit is raised"),
            StopReason::DeadlineExhausted => f.write_str("overall deadline exhausted"),
        }
    }
}

/// What to do after an attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Success: commit and return.
    Done,
    /// Report the throttle to the gate (which pauses the pool once per epoch), then retry.
    /// Not a spent attempt.
    PauseAndRetry {
        /// The provider's requested wait, for the gate.
        retry_after: Option<Duration>,
    },
    /// Refused for requests in flight: return the reservation as crowded (the limiter
    /// lets fewer go at once), wait the provider's wait if it named one, retry. Counted
    /// against `max_throttles`, not `max_retries`.
    CrowdedRetry {
        /// The provider's requested wait for this request, if it named one.
        retry_after: Option<Duration>,
    },
    /// Release the reservation, wait `delay`, retry.
    RetryAfter {
        /// Full-jitter backoff, or the server's requested wait.
        delay: Duration,
    },
    /// Fail this task only; release its reservation.
    Fail(StopReason),
    /// Abort the whole run; every waiter is told.
    Abort(StopReason),
    /// A quota is spent for `resets_in` (`None`: until someone raises it): tell the pool,
    /// which refuses every call at once until then, and fail this task.
    Spent {
        /// How long until the quota resets, as the provider said.
        resets_in: Option<Duration>,
    },
}

/// Retry settings. The defaults follow what the major SDKs do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RetryPolicy {
    /// Retryable failures allowed per task before it fails.
    pub max_retries: u32,
    /// Throttles allowed per task before it fails (they do not spend `max_retries`).
    pub max_throttles: u32,
    /// First backoff ceiling; doubled per retry.
    pub base_backoff: Duration,
    /// Largest backoff ceiling.
    pub max_backoff: Duration,
    /// A server-requested wait above this means the quota is spent until then
    /// ([`Action::Spent`]): every call fails at once, saying when, instead of a long
    /// sleep. The gate's [`GateConfig::max_pause`](crate::GateConfig) should be no
    /// shorter, or the pool would re-send before the wait the provider asked for has
    /// passed.
    pub retry_after_ceiling: Duration,
    /// Re-send ambiguous failures (only for idempotent requests). Off by default.
    pub retry_ambiguous: bool,
    /// No attempt starts after this instant.
    pub deadline: Option<Instant>,
}

impl Default for RetryPolicy {
    fn default() -> RetryPolicy {
        RetryPolicy {
            max_retries: 5,
            max_throttles: 20,
            base_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(8),
            retry_after_ceiling: Duration::from_secs(120),
            retry_ambiguous: false,
            deadline: None,
        }
    }
}

impl RetryPolicy {
    /// Sets `retry_ambiguous`.
    pub fn with_retry_ambiguous(mut self, on: bool) -> RetryPolicy {
        self.retry_ambiguous = on;
        self
    }

    /// Sets the overall deadline.
    pub fn with_deadline(mut self, deadline: Instant) -> RetryPolicy {
        self.deadline = Some(deadline);
        self
    }

    /// Sets `max_retries`.
    pub fn with_max_retries(mut self, max_retries: u32) -> RetryPolicy {
        self.max_retries = max_retries;
        self
    }

    /// With at most `max_throttles` throttles (and refusals for requests in flight) per task.
    pub fn with_max_throttles(mut self, max_throttles: u32) -> RetryPolicy {
        self.max_throttles = max_throttles;
        self
    }

    /// Full-jitter backoff before retry number `retry` (0-based): uniform in
    /// `[0, min(max_backoff, base_backoff * 2^retry)]`.
    pub fn backoff(&self, retry: u32, rng: &mut fastrand::Rng) -> Duration {
        let ceiling = self
            .base_backoff
            .checked_mul(1u32.checked_shl(retry.min(31)).unwrap_or(u32::MAX))
            .unwrap_or(Duration::MAX)
            .min(self.max_backoff);
        ceiling.mul_f64(rng.f64())
    }
}

/// The longest a quota is believed spent for (a year): a provider saying longer (a date
/// decades ahead, `u64::MAX` seconds) is not believed about when; the quota is spent until
/// someone raises it.
pub const MAX_SPENT: Duration = Duration::from_secs(366 * 86_400);

/// `wait` as a spent quota's reset, if it is believed ([`MAX_SPENT`]).
fn believed(wait: Duration) -> Option<Duration> {
    (wait <= MAX_SPENT).then_some(wait)
}

/// One task's retry bookkeeping: feed it every attempt's [`Outcome`], do what the
/// returned [`Action`] says.
#[derive(Clone, Debug)]
pub struct Retry {
    policy: RetryPolicy,
    retries: u32,
    throttles: u32,
    attempts: u32,
}

impl Retry {
    /// Fresh bookkeeping under `policy`.
    pub fn new(policy: RetryPolicy) -> Retry {
        Retry { policy, retries: 0, throttles: 0, attempts: 0 }
    }

    /// Attempts reported so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Decides what follows an attempt that ended with `outcome` at `now`.
    pub fn decide(&mut self, outcome: &Outcome, now: Instant, rng: &mut fastrand::Rng) -> Action {
        self.attempts += 1;
        let class = classify(outcome);
        let policy = self.policy;
        if let Some(wait) = outcome.retry_after
            && wait > policy.retry_after_ceiling
            && matches!(class, Class::Throttled | Class::Retryable | Class::Spent | Class::Crowded)
        {
            // The provider asks for longer than anyone here will wait (hours, days): the
            // quota is spent until then, not a pause of the pool, never retried blindly.
            return Action::Spent { resets_in: believed(wait) };
        }
        let past_deadline = |delay: Duration| policy.deadline.is_some_and(|d| now + delay > d);
        match class {
            Class::Ok => Action::Done,
            Class::Fatal => Action::Abort(StopReason::Class(Class::Fatal)),
            Class::Spent => Action::Spent { resets_in: outcome.retry_after.and_then(believed) },
            Class::Permanent => Action::Fail(StopReason::Class(Class::Permanent)),
            Class::Ambiguous if !policy.retry_ambiguous => {
                Action::Fail(StopReason::Class(Class::Ambiguous))
            }
            Class::Throttled | Class::Crowded => {
                self.throttles += 1;
                if self.throttles > policy.max_throttles {
                    return Action::Fail(StopReason::ThrottlesExhausted);
                }
                if past_deadline(outcome.retry_after.unwrap_or(Duration::ZERO)) {
                    return Action::Abort(StopReason::DeadlineExhausted);
                }
                let retry_after = outcome.retry_after;
                if class == Class::Crowded {
                    Action::CrowdedRetry { retry_after }
                } else {
                    Action::PauseAndRetry { retry_after }
                }
            }
            Class::Retryable | Class::Ambiguous => {
                if self.retries >= policy.max_retries {
                    return Action::Fail(StopReason::RetriesExhausted);
                }
                let delay =
                    outcome.retry_after.unwrap_or_else(|| policy.backoff(self.retries, rng));
                self.retries += 1;
                if past_deadline(delay) {
                    return Action::Abort(StopReason::DeadlineExhausted);
                }
                Action::RetryAfter { delay }
            }
        }
    }
}

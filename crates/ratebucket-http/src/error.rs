//! Why a fetch failed: [`FetchError`], and the [`Problem`] it amounts to for the caller.

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};
use ratebucket_rt::core::{Class, Report, StopReason};
use ratebucket_rt::{Limiter, ReserveError};

use crate::transport::BoxError;

/// What a failed call amounts to for its caller: one of a few outcomes, each with advice.
///
/// [`FetchError::problem`] (and `OpenAiError::problem` in `ratebucket-openai`) answer "why
/// did this call fail?" without going through the error types underneath; the cause chain
/// ([`std::error::Error::source`]) keeps the details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Problem {
    /// The limiter refused the reservation before anything was sent (a cost above a
    /// limit's capacity, a capacity lowered under a waiter).
    LimiterRefused,
    /// The deadline passed while waiting for quota or for a pause to end.
    Deadline,
    /// The provider kept answering "too many requests" until retries or the deadline ran
    /// out, or asked for a wait beyond the configured ceiling.
    Throttled,
    /// The provider refused the account (a bad key, no permission, quota or billing): the
    /// run stopped, and the limiter was aborted.
    Fatal,
    /// An earlier fatal failure had stopped the run: nothing was sent.
    Aborted,
    /// The request may have been executed and billed (a timeout, a reset or a cut reply
    /// after it was sent): it was not sent again.
    Ambiguous,
    /// The provider could not be reached, or kept failing (connection errors, 5xx), until
    /// retries ran out.
    Unavailable,
    /// The provider refused this request as it is (a 4xx other than 429 and account
    /// errors).
    Rejected,
    /// The provider answered with success but not with what was asked for (a body that
    /// does not decode): it was probably billed.
    Unreadable,
    /// The request or the client is misconfigured; nothing was reserved or sent.
    Config,
    /// The provider said a quota is spent (a spend cap, a usage limit, a day's quota, a
    /// wait of hours or days): every call fails at once until it resets, or until its
    /// limit is raised and the limiter resumed ([`FetchError::resets_in`] says when, and
    /// [`FetchError::limit`] which limit, where the provider said).
    QuotaSpent,
    /// A budget ([`Change::Budget`](ratebucket_rt::core::Change::Budget)) cannot cover the
    /// call: nothing was sent, and nothing will be before it renews
    /// ([`ReserveError::BudgetSpent`](ratebucket_rt::ReserveError::BudgetSpent) says when).
    BudgetSpent,
}

impl Problem {
    /// What happened, in a few words.
    pub fn summary(self) -> &'static str {
        match self {
            Problem::LimiterRefused => "the limiter refused the request",
            Problem::Deadline => "the deadline passed while waiting for quota",
            Problem::Throttled => "the provider kept throttling the request",
            Problem::Fatal => "the provider refused the account",
            Problem::Aborted => "the run was stopped by an earlier fatal failure",
            Problem::Ambiguous => "the request may have been executed",
            Problem::Unavailable => "the provider could not be reached or kept failing",
            Problem::Rejected => "the provider rejected the request",
            Problem::Unreadable => "the provider's answer could not be read",
            Problem::Config => "the request was not sent: misconfigured",
            Problem::QuotaSpent => "the provider's quota is spent",
            Problem::BudgetSpent => "the budget is spent",
        }
    }

    /// What to do about it.
    pub fn advice(self) -> &'static str {
        match self {
            Problem::LimiterRefused => "lower the cost, or raise the limit's capacity",
            Problem::Deadline => "allow a later deadline, or send less at once",
            Problem::Throttled => {
                "give the limiter the provider's real limits, or allow longer waits"
            }
            Problem::Fatal => "fix the key, permissions or billing, then resume the limiter",
            Problem::Aborted => "fix the fatal failure's cause, then resume the limiter",
            Problem::Ambiguous => "check whether it took effect before sending it again",
            Problem::Unavailable => "check the network and the provider's status, then retry later",
            Problem::Rejected => "fix the request: it will fail the same way again",
            Problem::Unreadable => {
                "check the endpoint and model: the answer was not the expected kind"
            }
            Problem::Config => "fix the URL or the client's settings",
            Problem::QuotaSpent => {
                "wait until the quota resets (the error says when), or have its limit raised and \
                 resume the limiter"
            }
            Problem::BudgetSpent => {
                "wait until the budget renews (the error says when), or raise it"
            }
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.summary())
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
    /// The request cannot be sent as built (no scheme, no host, a scheme the transport
    /// does not speak); found before anything was reserved or sent.
    Config(String),
}

/// Which of the provider's limits a refusal named, and what the provider said of it, as
/// read: the limiter's dimension and its name, the limit, what remained and the reset.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LimitHit {
    /// The limiter's dimension.
    pub dimension: usize,
    /// Its name (`"input_tokens"`), or its index.
    pub name: Arc<str>,
    /// The provider's limit, as read.
    pub limit: Option<u64>,
    /// What the provider said remained.
    pub remaining: Option<u64>,
    /// When the provider said the quota is whole again, from the reading.
    pub reset: Option<Duration>,
}

impl LimitHit {
    /// The limit among a refusal's `reports` that refused it: the one with nothing left
    /// (the longest reset among them), else the one with the least left for its limit;
    /// named as `limiter` names its dimensions. `None` without a report.
    pub fn of(reports: &[Report], limiter: &Limiter) -> Option<LimitHit> {
        let left = |r: &&Report| match (r.quota.remaining, r.quota.limit) {
            (Some(0), _) => (0, u64::MAX - r.quota.reset.map_or(0, |d| d.as_millis() as u64)),
            (Some(remaining), Some(limit)) if limit > 0 => {
                (1, remaining.saturating_mul(1_000_000) / limit)
            }
            (Some(_), _) => (2, 0),
            (None, _) => (3, 0),
        };
        let report = reports
            .iter()
            .filter(|r| r.quota.remaining.is_some() || r.quota.reset.is_some())
            .min_by_key(left)?;
        Some(LimitHit {
            dimension: report.dimension,
            name: limiter
                .dimension(report.dimension)
                .map_or_else(|| Arc::from(report.dimension.to_string()), |view| view.name),
            limit: report.quota.limit,
            remaining: report.quota.remaining,
            reset: report.quota.reset,
        })
    }

    /// What `limiter` last heard from the provider of `dimension` (the limit in force
    /// where it said none).
    pub(crate) fn last_said(dimension: usize, limiter: &Limiter) -> Option<LimitHit> {
        let view = limiter.dimension(dimension)?;
        let reported = view.state.reported;
        let now = limiter.now();
        Some(LimitHit {
            dimension,
            name: view.name,
            limit: reported
                .and_then(|r| r.limit)
                .or_else(|| view.state.learned.and_then(|l| l.limit)),
            remaining: reported.and_then(|r| r.remaining),
            reset: reported.and_then(|r| r.resets_at).map(|at| at.saturating_duration_since(now)),
        })
    }
}

impl fmt::Display for LimitHit {
    /// `input_tokens (limit 30000, 0 remaining, resets in 2.1s)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)?;
        let mut said = Vec::new();
        if let Some(limit) = self.limit {
            said.push(format!("limit {limit}"));
        }
        if let Some(remaining) = self.remaining {
            said.push(format!("{remaining} remaining"));
        }
        if let Some(reset) = self.reset {
            said.push(format!("resets in {:.1?}", reset));
        }
        if !said.is_empty() {
            write!(f, " ({})", said.join(", "))?;
        }
        Ok(())
    }
}

/// A fetch that did not succeed: which class ended it, after how many attempts, and the
/// last response or transport error.
#[derive(Debug)]
pub struct FetchError {
    pub(crate) kind: FetchErrorKind,
    pub(crate) class: Option<Class>,
    pub(crate) attempts: u32,
    pub(crate) response: Option<Box<Response<Bytes>>>,
    pub(crate) source: Option<BoxError>,
    /// Which limit the provider (or the limiter) refused it on, when one was named (boxed:
    /// an error stays small on the paths that return it).
    pub(crate) limit: Option<Box<LimitHit>>,
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
        self.response.as_deref()
    }

    /// Which of the provider's limits refused the call, and what the provider said of it
    /// (its limit, what remained, its reset), when its answer named one: the limit of a
    /// throttle, a spent quota or a refusal.
    pub fn limit(&self) -> Option<&LimitHit> {
        self.limit.as_deref()
    }

    /// For a spent quota ([`Problem::QuotaSpent`]), how long until it resets, as the
    /// provider said; `None` otherwise, or when it did not say (spent until its limit is
    /// raised).
    pub fn resets_in(&self) -> Option<Duration> {
        match &self.kind {
            FetchErrorKind::Limiter(e @ ReserveError::QuotaSpent { .. }) => e.retry_after(),
            FetchErrorKind::Failed(StopReason::Spent(resets_in)) => *resets_in,
            _ => None,
        }
    }

    /// A request that cannot be sent as built, found before anything was reserved.
    pub(crate) fn config(message: String) -> FetchError {
        FetchError {
            kind: FetchErrorKind::Config(message),
            class: None,
            attempts: 0,
            response: None,
            source: None,
            limit: None,
        }
    }

    /// The last response if the server answered, or the error itself if it did not.
    pub fn into_response_or_self(mut self) -> Result<Response<Bytes>, FetchError> {
        match self.response.take() {
            Some(response) => Ok(*response),
            None => Err(self),
        }
    }

    /// What happened, in the terms a caller acts on; [`Problem::advice`] says what to do.
    pub fn problem(&self) -> Problem {
        match &self.kind {
            FetchErrorKind::Config(_) => Problem::Config,
            FetchErrorKind::Limiter(e) => match e {
                ReserveError::DeadlinePassed | ReserveError::WouldWait { .. } => Problem::Deadline,
                ReserveError::Aborted => Problem::Aborted,
                ReserveError::QuotaSpent { .. } => Problem::QuotaSpent,
                ReserveError::BudgetSpent { .. } => Problem::BudgetSpent,
                _ => Problem::LimiterRefused,
            },
            FetchErrorKind::Failed(reason) | FetchErrorKind::Aborted(reason) => {
                match (reason, self.class) {
                    (StopReason::Spent(_), _) | (_, Some(Class::Spent)) => Problem::QuotaSpent,
                    (StopReason::ThrottlesExhausted, _) | (_, Some(Class::Throttled)) => {
                        Problem::Throttled
                    }
                    (_, Some(Class::Fatal)) => Problem::Fatal,
                    (_, Some(Class::Ambiguous)) => Problem::Ambiguous,
                    (_, Some(Class::Permanent)) => Problem::Rejected,
                    (StopReason::DeadlineExhausted, _) => Problem::Deadline,
                    _ => Problem::Unavailable,
                }
            }
        }
    }

    /// The last response's status, if the server answered.
    pub fn status(&self) -> Option<StatusCode> {
        self.response.as_deref().map(Response::status)
    }
}

impl fmt::Display for FetchError {
    /// One line: what happened, the attempts and last status, and what to do. The cause
    /// (a transport error, the limiter's refusal) is the error's `source`, not repeated.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let problem = self.problem();
        f.write_str(problem.summary())?;
        match &self.kind {
            FetchErrorKind::Config(e) => return write!(f, " ({e}): {}", problem.advice()),
            FetchErrorKind::Failed(reason) | FetchErrorKind::Aborted(reason) => {
                write!(f, " ({reason})")?;
            }
            // When a spent budget or quota renews is what its caller needs to know.
            FetchErrorKind::Limiter(
                e @ (ReserveError::BudgetSpent { .. } | ReserveError::QuotaSpent { .. }),
            ) => write!(f, " ({e})")?,
            FetchErrorKind::Limiter(_) => {}
        }
        if let Some(limit) = &self.limit {
            write!(f, " on {limit}")?;
        }
        write!(f, " after {} attempt(s)", self.attempts)?;
        if let Some(status) = self.status() {
            write!(f, ", last status {}", status.as_u16())?;
        }
        write!(f, ": {}", problem.advice())
    }
}

impl StdError for FetchError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            FetchErrorKind::Limiter(e) => Some(e),
            _ => self.source.as_deref().map(|e| e as &(dyn StdError + 'static)),
        }
    }
}

/// A limiter's refusal as a fetch error, after `attempts` attempts, naming the limit
/// `limiter` refused it on (with what the provider last said of it) when the refusal
/// names a dimension.
pub(crate) fn limiter_error(e: ReserveError, attempts: u32, limiter: &Limiter) -> FetchError {
    let dimension = match e {
        ReserveError::QuotaSpent { dimension, .. } => dimension,
        ReserveError::CostExceedsCapacity { dimension, .. }
        | ReserveError::CapacityLowered { dimension }
        | ReserveError::CostExceedsCap { dimension, .. }
        | ReserveError::BudgetSpent { dimension, .. } => Some(dimension),
        _ => None,
    };
    FetchError {
        kind: FetchErrorKind::Limiter(e),
        class: None,
        attempts,
        response: None,
        source: None,
        limit: dimension.and_then(|d| LimitHit::last_said(d, limiter)).map(Box::new),
    }
}

//! Why a fetch failed: [`FetchError`], and the [`Problem`] it amounts to for the caller.

use std::error::Error as StdError;
use std::fmt;

use bytes::Bytes;
use http::{Response, StatusCode};
use ratebucket_rt::ReserveError;
use ratebucket_rt::core::{Class, StopReason};

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
    /// The provider reported a quota over a longer window (a day's) spent: nothing was
    /// sent, and nothing will be before it resets
    /// ([`ReserveError::QuotaSpent`](ratebucket_rt::ReserveError::QuotaSpent) says when).
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
            Problem::QuotaSpent => "the provider's daily quota is spent",
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
                "wait until the quota resets (the error says when), or allow a deadline that reaches it"
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

/// A fetch that did not succeed: which class ended it, after how many attempts, and the
/// last response or transport error.
#[derive(Debug)]
pub struct FetchError {
    pub(crate) kind: FetchErrorKind,
    pub(crate) class: Option<Class>,
    pub(crate) attempts: u32,
    pub(crate) response: Option<Box<Response<Bytes>>>,
    pub(crate) source: Option<BoxError>,
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

    /// A request that cannot be sent as built, found before anything was reserved.
    pub(crate) fn config(message: String) -> FetchError {
        FetchError {
            kind: FetchErrorKind::Config(message),
            class: None,
            attempts: 0,
            response: None,
            source: None,
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
                    (
                        StopReason::ThrottlesExhausted | StopReason::RetryAfterBeyondCeiling(_),
                        _,
                    )
                    | (_, Some(Class::Throttled)) => Problem::Throttled,
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
            // When a spent budget renews is what its caller needs to know.
            FetchErrorKind::Limiter(e @ ReserveError::BudgetSpent { .. }) => write!(f, " ({e})")?,
            FetchErrorKind::Limiter(_) => {}
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
            _ => self
                .source
                .as_deref()
                .map(|e| e as &(dyn StdError + 'static)),
        }
    }
}

/// A limiter's refusal as a fetch error, after `attempts` attempts.
pub(crate) fn limiter_error(e: ReserveError, attempts: u32) -> FetchError {
    FetchError {
        kind: FetchErrorKind::Limiter(e),
        class: None,
        attempts,
        response: None,
        source: None,
    }
}

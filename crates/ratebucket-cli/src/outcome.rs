//! What became of one line: a record to write, or the line left for a later run, and how
//! a failed fetch is classed into one or the other.

use std::time::SystemTime;

use ratebucket_http::{FetchError, FetchErrorKind, Problem};
use ratebucket_rt::ReserveError;

use crate::api::Api;
use crate::input::Line;

/// What became of one line.
pub(crate) enum Outcome {
    /// An output record to write.
    Record {
        record: String,
        ambiguous: bool,
        kind: &'static str,
        tokens: Option<u64>,
        /// Per token dimension.
        charged: Vec<u64>,
    },
    /// Not sent (the run is stopping), refused without being taken, or failed for a
    /// reason that passes (an outage, retries exhausted): left for a later run, with the
    /// problem's code in `unfinished` for the last. `fatal` stops this one.
    Pending { sent: bool, fatal: Option<String>, unfinished: Option<&'static str> },
}

/// A failed fetch as an outcome: an output record, or left for a later run when the
/// provider refused the account or nothing was sent for a reason that will pass.
pub(crate) fn failed(
    api: Api,
    line: &Line,
    error: FetchError,
    sent: bool,
    reserved: Vec<u64>,
) -> Outcome {
    let problem = error.problem();
    match problem {
        Problem::Fatal | Problem::Aborted | Problem::Config => {
            return Outcome::Pending { sent, fatal: Some(error.to_string()), unfinished: None };
        }
        // Nothing goes before the quota resets (or its limit is raised), or the budget
        // renews: the run stops, saying which limit and when.
        Problem::QuotaSpent | Problem::BudgetSpent => {
            let (said, resets) = match error.kind() {
                FetchErrorKind::Limiter(e) => (e.to_string(), e.retry_after()),
                // The provider's refusal said so: in the limiter's words, whichever path
                // told it first.
                _ if problem == Problem::QuotaSpent => {
                    let resets_in = error.resets_in();
                    let spent = ReserveError::QuotaSpent { dimension: None, resets_in };
                    (spent.to_string(), resets_in)
                }
                _ => (problem.summary().to_owned(), error.resets_in()),
            };
            let said = match error.limit() {
                Some(limit) => format!("{said}, on {limit}"),
                None => said,
            };
            let resume = match resets.and_then(|wait| SystemTime::now().checked_add(wait)) {
                Some(at) => format!("resume after {}", humantime::format_rfc3339_seconds(at)),
                None if error.resets_in().is_none() && problem == Problem::QuotaSpent => {
                    "resume once its limit is raised".to_owned()
                }
                None => "resume once it resets".to_owned(),
            };
            return Outcome::Pending {
                sent,
                fatal: Some(format!("{said}; {resume}")),
                unfinished: None,
            };
        }
        _ => {}
    }
    let kind = problem_code(problem);
    if matches!(problem, Problem::Unavailable | Problem::Throttled | Problem::Deadline) {
        // An outage, not an answer: the provider did not take the request (it could not
        // be reached, answered 5xx or 429 until retries ran out), so the next run sends
        // it again.
        return Outcome::Pending { sent, fatal: None, unfinished: Some(kind) };
    }
    let ambiguous = problem == Problem::Ambiguous;
    let record = match error.response() {
        // The provider answered: its answer is recorded, as is.
        Some(response) if !ambiguous => api.answer_record(&line.custom_id, response),
        _ => api.error_record(&line.custom_id, kind, &error.to_string()),
    };
    let charged = if ambiguous { reserved } else { vec![0; reserved.len()] };
    Outcome::Record { record, ambiguous, kind, tokens: None, charged }
}

/// A problem's name in output records and the summary.
fn problem_code(problem: Problem) -> &'static str {
    match problem {
        Problem::LimiterRefused => "limiter_refused",
        Problem::Deadline => "deadline",
        Problem::Throttled => "throttled",
        Problem::Fatal => "fatal",
        Problem::Aborted => "aborted",
        Problem::Ambiguous => "ambiguous",
        Problem::Unavailable => "unavailable",
        Problem::Rejected => "rejected",
        Problem::Unreadable => "unreadable",
        Problem::Config => "config",
        _ => "failed",
    }
}

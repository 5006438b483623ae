//! Provider dialects as data: which headers carry which quota, what each counts, how its
//! resets are written, and where a refusal says when to come back.
//!
//! A [`Dialect`] is a table: [`Family`] rows (three header names and what they count),
//! one [`ResetFormat`], whether IETF `RateLimit` fields are read, where a refusal's body
//! carries its wait ([`BodyHint`]) and which statuses besides 429 are throttles. Reading
//! a response with a dialect gives [`Reading`]s: a quota and what it counts (requests or
//! tokens of a kind, per second, minute or day). A header a dialect has no row for is never
//! read, so Groq's per-day `x-ratelimit-limit-requests` is never taken for OpenAI's
//! per-minute one of the same name.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use ratebucket_http::dialect::{self, Per, Unit};
//!
//! let mut headers = http::HeaderMap::new();
//! headers.insert("x-ratelimit-limit-requests", "14400".parse().unwrap());
//! headers.insert("x-ratelimit-remaining-requests", "14399".parse().unwrap());
//! headers.insert("x-ratelimit-reset-requests", "6s".parse().unwrap());
//! let readings = dialect::GROQ.read(&headers, SystemTime::now());
//! assert_eq!(readings[0].counts.unit, Unit::Requests);
//! assert_eq!(readings[0].counts.per, Per::Day);
//! assert_eq!(readings[0].quota.reset, Some(Duration::from_secs(6)));
//! ```

use std::fmt;
use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::Value;

use crate::headers::{
    EPOCH_MILLIS_THRESHOLD, Quota, Written, ietf_quota, parse_go_duration, parse_instant,
    parse_non_negative_f64, parse_u64, read_reset,
};

/// What a quota counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Unit {
    /// Requests.
    Requests,
    /// Tokens, input and output together.
    Tokens,
    /// Input (prompt) tokens.
    InputTokens,
    /// Output (completion) tokens.
    OutputTokens,
    /// Input tokens not read from the provider's cache.
    UncachedTokens,
}

impl Unit {
    /// Whether it counts tokens of any kind.
    pub fn is_tokens(self) -> bool {
        self != Unit::Requests
    }
}

/// The period a quota's limit is counted over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Per {
    /// A second.
    Second,
    /// A minute (RPM, TPM).
    Minute,
    /// A day (RPD, TPD): spent, it stays spent until the provider's day turns.
    Day,
}

impl Per {
    /// The period's length.
    pub fn duration(self) -> Duration {
        match self {
            Per::Second => Duration::from_secs(1),
            Per::Minute => Duration::from_secs(60),
            Per::Day => Duration::from_secs(86_400),
        }
    }
}

/// What one quota counts: a unit per period.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Counts {
    /// What is counted.
    pub unit: Unit,
    /// Over what period.
    pub per: Per,
}

impl Counts {
    /// `unit` per `per`.
    pub const fn new(unit: Unit, per: Per) -> Counts {
        Counts { unit, per }
    }
}

impl fmt::Display for Counts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = match self.unit {
            Unit::Requests => "requests",
            Unit::Tokens => "tokens",
            Unit::InputTokens => "input tokens",
            Unit::OutputTokens => "output tokens",
            Unit::UncachedTokens => "uncached input tokens",
        };
        let per = match self.per {
            Per::Second => "second",
            Per::Minute => "minute",
            Per::Day => "day",
        };
        write!(f, "{unit} per {per}")
    }
}

/// How a dialect writes the time until a quota is whole again (or, for a continuous
/// bucket, until it is full).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResetFormat {
    /// A Go duration (`6m0s`, `1.5s`, `12ms`), as OpenAI and Groq send; a bare number is
    /// seconds.
    GoDuration,
    /// Seconds from now, whole or fractional (`55`, `11.38`).
    Seconds,
    /// An instant in Unix seconds.
    EpochSeconds,
    /// An instant in Unix milliseconds (OpenRouter).
    EpochMillis,
    /// An RFC 3339 instant in UTC (`2026-12-02T08:12:41Z`).
    Rfc3339,
    /// Told apart by shape: seconds, or epoch seconds or milliseconds when that large, an
    /// RFC 3339 instant or an HTTP-date (as gateways write it), or a Go duration (the
    /// generic `x-ratelimit-reset` reading).
    Any,
}

impl ResetFormat {
    /// Whether the format writes an instant (RFC 3339, Unix seconds or milliseconds)
    /// rather than a wait: read as a wait against the clock at the reading, it comes out
    /// short by however long the reply took to be read after it was written
    /// ([`QuotaReport::reset_as_instant`](ratebucket_rt::core::QuotaReport::reset_as_instant)).
    /// [`ResetFormat::Any`] says no: it reads mostly waits ([`ResetFormat::written`] tells
    /// by the value).
    pub fn is_instant(self) -> bool {
        matches!(self, ResetFormat::EpochSeconds | ResetFormat::EpochMillis | ResetFormat::Rfc3339)
    }

    /// Reads `value`; `None` when it is not in this format, negative or absurd. An instant
    /// in the past is a reset of zero.
    pub fn parse(self, value: &[u8], now: SystemTime) -> Option<Duration> {
        let since = |at: SystemTime| at.duration_since(now).unwrap_or(Duration::ZERO);
        let epoch = |secs: f64| {
            SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(secs).ok()?).map(since)
        };
        match self {
            ResetFormat::GoDuration => parse_go_duration(value),
            ResetFormat::Seconds => {
                Duration::try_from_secs_f64(parse_non_negative_f64(value)?).ok()
            }
            ResetFormat::EpochSeconds => epoch(parse_non_negative_f64(value)?),
            ResetFormat::EpochMillis => epoch(parse_non_negative_f64(value)? / 1000.0),
            ResetFormat::Rfc3339 => {
                let text = std::str::from_utf8(value).ok()?.trim();
                humantime::parse_rfc3339_weak(text).ok().map(since)
            }
            ResetFormat::Any => read_reset(value, now).map(|(reset, _)| reset),
        }
    }

    /// What the form of `value` says beyond its wait: whether it is an instant, and the
    /// resolution it was written at (`2026-12-06T13:40:12Z`: a second; epoch
    /// milliseconds: a millisecond). A wait says nothing: its values tell.
    pub fn written(self, value: &[u8]) -> Written {
        let text = std::str::from_utf8(value).unwrap_or_default().trim();
        let step = |unit: f64| {
            let decimals = text.split_once('.').map_or(0, |(_, frac)| frac.len()).min(9);
            Duration::from_secs_f64(unit * 10f64.powi(-(decimals as i32)))
        };
        match self {
            ResetFormat::GoDuration | ResetFormat::Seconds => Written::WAIT,
            ResetFormat::EpochSeconds => Written::instant(step(1.0)),
            ResetFormat::EpochMillis => Written::instant(step(1e-3)),
            ResetFormat::Rfc3339 => parse_instant(text)
                .map_or(Written::instant(Duration::from_secs(1)), |(_, r)| Written::instant(r)),
            ResetFormat::Any => read_reset(value, SystemTime::UNIX_EPOCH)
                .map_or(Written::WAIT, |(_, written)| written),
        }
    }
}

/// One row of a dialect: the headers of one quota and what it counts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    /// The header of the limit per period.
    pub limit: HeaderName,
    /// The header of what remains.
    pub remaining: HeaderName,
    /// The header of the reset, if the dialect sends one.
    pub reset: Option<HeaderName>,
    /// What the quota counts.
    pub counts: Counts,
    /// The step `remaining` is rounded to the nearest multiple of (Anthropic rounds its
    /// token counts to thousands); 0 or 1 when it is exact. Each [`Reading`] carries it, for
    /// the learning to take the value as the least it can stand for, half a step below
    /// ([`QuotaReport::precision`](ratebucket_rt::core::QuotaReport::precision)).
    pub remaining_step: u64,
}

impl Family {
    /// A row from lowercase header names (`HeaderName::from_static` panics, at compile
    /// time in a `static`, on an uppercase one).
    pub const fn new(
        limit: &'static str,
        remaining: &'static str,
        reset: Option<&'static str>,
        counts: Counts,
    ) -> Family {
        Family {
            limit: HeaderName::from_static(limit),
            remaining: HeaderName::from_static(remaining),
            reset: match reset {
                Some(name) => Some(HeaderName::from_static(name)),
                None => None,
            },
            counts,
            remaining_step: 0,
        }
    }

    /// The same row, its `remaining` rounded to the nearest multiple of `step`.
    pub const fn rounded(mut self, step: u64) -> Family {
        self.remaining_step = step;
        self
    }

    /// This row's quota in `headers`, if any of its headers is there. A header sent more
    /// than once (a proxy adding its own) is read conservatively: the lowest limit and
    /// remaining, the longest reset. A negative remaining (Azure has sent `-1`) is unknown.
    fn read(&self, headers: &HeaderMap, format: ResetFormat, now: SystemTime) -> Option<Quota> {
        let all = |name: &HeaderName| headers.get_all(name).into_iter().map(HeaderValue::as_bytes);
        let (reset, written) = self.reset.as_ref().map_or((None, Written::WAIT), |name| {
            all(name)
                .filter_map(|v| Some((format.parse(v, now)?, format.written(v))))
                .fold((None, Written::WAIT), |(longest, form), (reset, this)| {
                    (longest.max(Some(reset)), form.and(this))
                })
        });
        let quota = Quota {
            limit: all(&self.limit).filter_map(parse_u64).min(),
            remaining: all(&self.remaining).filter_map(parse_u64).min(),
            reset,
            window: None,
            written,
        };
        (quota != Quota::default()).then_some(quota)
    }
}

/// Where a refusal's body says how long to wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BodyHint {
    /// Nowhere.
    None,
    /// The error message: "... Please try again in 644ms." (OpenAI, Groq, Azure).
    Message,
    /// A `google.rpc.RetryInfo` detail's `retryDelay` (`"38s"`), as Gemini sends in a
    /// 429's `error.details`; the `QuotaFailure` detail beside it names the quota spent
    /// ([`Dialect::spent`]).
    RetryInfo,
}

/// A provider's dialect of rate-limit signals, as data. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dialect {
    /// Its name, as the builder and the CLI take it (`"groq"`).
    pub name: &'static str,
    /// The header families it sends.
    pub families: &'static [Family],
    /// How its resets are written.
    pub reset: ResetFormat,
    /// What IETF `RateLimit` / `RateLimit-Policy` fields count, if it sends them (the
    /// window is the policy's `w` when given).
    pub ietf: Option<Counts>,
    /// Where a refusal's body says when to try again.
    pub body_hint: BodyHint,
    /// Statuses besides 429 that mean "too much now, wait" (OpenRouter's transient 402).
    pub throttle_statuses: &'static [u16],
}

mod tables;

pub use tables::{ALL, ANTHROPIC, AZURE, CEREBRAS, GEMINI, GROQ, IETF, OPENAI, OPENROUTER};

impl Dialect {
    /// The built-in dialect called `name` (case-insensitive), or `None`.
    pub fn named(name: &str) -> Option<&'static Dialect> {
        ALL.into_iter().find(|d| d.name.eq_ignore_ascii_case(name.trim()))
    }

    /// The dialect a response's headers show unambiguously, if any: Anthropic's
    /// `anthropic-ratelimit-*`, Cerebras's period-suffixed families, IETF `RateLimit` fields, or an unsuffixed
    /// `x-ratelimit-reset` in epoch milliseconds (OpenRouter). OpenAI's
    /// `x-ratelimit-*-{requests,tokens}` names are shared by Groq (which counts requests
    /// per day under them) and Azure, so they show nothing: those are chosen by name.
    pub fn recognise(headers: &HeaderMap) -> Option<&'static Dialect> {
        let mut found = None;
        for (name, value) in headers {
            let name = name.as_str();
            if let Some(rest) = name.strip_prefix("x-ratelimit-") {
                if rest.ends_with("-minute") || rest.ends_with("-day") {
                    return Some(&CEREBRAS);
                }
                if rest == "reset"
                    && parse_non_negative_f64(value.as_bytes())
                        .is_some_and(|v| v >= EPOCH_MILLIS_THRESHOLD)
                {
                    found = Some(&OPENROUTER);
                }
            } else if name.starts_with("anthropic-ratelimit-") {
                return Some(&ANTHROPIC);
            } else if name == "ratelimit" || name == "ratelimit-policy" {
                found = Some(&IETF);
            }
        }
        found
    }

    /// Every quota `headers` report in this dialect.
    pub fn read(&self, headers: &HeaderMap, now: SystemTime) -> Vec<Reading> {
        let mut readings: Vec<Reading> = self
            .families
            .iter()
            .filter_map(|family| {
                Some(Reading {
                    counts: family.counts,
                    quota: family.read(headers, self.reset, now)?,
                    precision: family.remaining_step,
                })
            })
            .collect();
        if let Some(counts) = self.ietf
            && let Some(quota) = ietf_quota(headers)
        {
            readings.push(Reading { counts, quota, precision: 0 });
        }
        readings
    }

    /// Whether `status` is a throttle in this dialect although it is not a 429.
    pub fn throttles(&self, status: StatusCode) -> bool {
        self.throttle_statuses.contains(&status.as_u16())
    }

    /// The wait a refusal's body asks for, where this dialect puts one.
    pub fn retry_hint(&self, body: &[u8]) -> Option<Duration> {
        match self.body_hint {
            BodyHint::None => None,
            BodyHint::Message => message_wait(&body_message(body)?),
            BodyHint::RetryInfo => details(body)?.iter().find_map(|detail| {
                detail_type(detail)?.ends_with("RetryInfo").then_some(())?;
                protobuf_duration(detail.get("retryDelay")?.as_str()?)
            }),
        }
    }

    /// The quotas a refusal's body says are spent (Gemini's `QuotaFailure` violations,
    /// by their `quotaId`: `GenerateRequestsPerDayPerProjectPerModel-FreeTier` is requests
    /// per day). Empty when the body names none.
    pub fn spent(&self, body: &[u8]) -> Vec<Counts> {
        if self.body_hint != BodyHint::RetryInfo {
            return Vec::new();
        }
        let Some(details) = details(body) else {
            return Vec::new();
        };
        let mut spent: Vec<Counts> = details
            .iter()
            .filter(|d| detail_type(d).is_some_and(|t| t.ends_with("QuotaFailure")))
            .filter_map(|d| d.get("violations")?.as_array())
            .flatten()
            .filter_map(|v| quota_id_counts(v.get("quotaId")?.as_str()?))
            .collect();
        spent.dedup();
        spent
    }
}

/// One quota a response reports, and what it counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    /// What the quota counts.
    pub counts: Counts,
    /// The limit, remaining and reset reported.
    pub quota: Quota,
    /// The step its `remaining` is rounded to ([`Family::remaining_step`]; 0: exact).
    pub precision: u64,
}

impl Reading {
    /// The reading as a report to the limiter's learning, its rounding and the form of its
    /// reset ([`Quota::written`]) carried along.
    pub fn report(&self) -> ratebucket_rt::core::QuotaReport {
        let mut report: ratebucket_rt::core::QuotaReport = self.quota.into();
        report.precision = self.precision;
        report
    }
}

/// The `error` object of an error body: `{"error": {...}}`, or that inside a one-element
/// list (as Google's OpenAI-compatible endpoint has sent it).
fn error_object(body: &[u8]) -> Option<serde_json::Map<String, Value>> {
    let value: Value = serde_json::from_slice(body).ok()?;
    let outer = match value {
        Value::Array(mut items) if !items.is_empty() => items.swap_remove(0),
        other => other,
    };
    match outer {
        Value::Object(mut map) => match map.remove("error")? {
            Value::Object(error) => Some(error),
            _ => None,
        },
        _ => None,
    }
}

/// The `details` list of a Google-style error body.
fn details(body: &[u8]) -> Option<Vec<Value>> {
    match error_object(body)?.remove("details")? {
        Value::Array(details) => Some(details),
        _ => None,
    }
}

/// A detail's `@type` (`type.googleapis.com/google.rpc.RetryInfo`).
fn detail_type(detail: &Value) -> Option<&str> {
    detail.get("@type")?.as_str()
}

/// An error body's message: its `error.message` (OpenAI's shape, Azure's, Groq's), or a
/// top-level `message` (Azure API Management's `{"statusCode": 429, "message": ...}`).
fn body_message(body: &[u8]) -> Option<String> {
    if let Some(message) =
        error_object(body).and_then(|e| e.get("message")?.as_str().map(str::to_owned))
    {
        return Some(message);
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get("message")?.as_str().map(str::to_owned)
}

/// Whether an error body says too many requests are in flight rather than too many per
/// window: "Concurrency limit exceeded for user", "Your current concurrency is 5, which
/// exceeds your concurrency limit of 5", "Too many concurrent requests". Read from its
/// message (OpenAI's shape, Azure API Management's) or, for a body that is not JSON, from
/// its first 4 KiB as text.
pub fn says_crowded(body: &[u8]) -> bool {
    let text = body_message(body)
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(4096)]).into_owned())
        .to_ascii_lowercase();
    ["concurrency limit", "concurrent request", "too many concurrent", "concurrency_limit"]
        .iter()
        .any(|marker| text.contains(marker))
}

/// The wait an error message names, in any of the forms providers write it: "Please try
/// again in 644ms." (OpenAI, a Go duration), "Please retry after 33 seconds." (Azure
/// OpenAI), "Try again in 50 seconds." (Azure API Management), "Resets in 16 days."
/// (monthly quotas). `None` when it names none, or a wait of zero.
pub fn message_wait(message: &str) -> Option<Duration> {
    let lower = message.to_ascii_lowercase();
    ["try again in ", "retry after ", "resets in "]
        .into_iter()
        .find_map(|marker| {
            let (_, rest) = lower.split_once(marker)?;
            wait_in_words(rest)
        })
        .filter(|d| !d.is_zero())
}

/// The wait at the start of `text`: a Go duration (`644ms`, `7.66s`), or a number and a
/// unit in words (`33 seconds`, `5 minutes`, `2 hours`, `16 days`).
fn wait_in_words(text: &str) -> Option<Duration> {
    let mut words = text.split_whitespace();
    let first = words.next()?.trim_end_matches(['.', ',', ';']);
    let Some(number) = parse_non_negative_f64(first.as_bytes()) else {
        return parse_go_duration(first.as_bytes());
    };
    let unit = words.next().map_or("", |w| w.trim_end_matches(['.', ',', ';']));
    let seconds = match unit.trim_end_matches('s') {
        "second" | "sec" | "" => 1.0,
        "minute" | "min" => 60.0,
        "hour" | "hr" => 3_600.0,
        "day" => 86_400.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(number * seconds).ok()
}

/// A protobuf JSON duration: seconds with an `s` suffix (`"38s"`, `"1.500s"`). Zero,
/// negative or absurd values are `None`.
fn protobuf_duration(text: &str) -> Option<Duration> {
    let secs = parse_non_negative_f64(text.trim().strip_suffix('s')?.as_bytes())?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| !d.is_zero() && *d <= Duration::from_secs(86_400 * 366))
}

/// What a Gemini `quotaId` counts, from the words in it.
fn quota_id_counts(id: &str) -> Option<Counts> {
    let per = if id.contains("PerDay") {
        Per::Day
    } else if id.contains("PerMinute") {
        Per::Minute
    } else if id.contains("PerSecond") {
        Per::Second
    } else {
        return None;
    };
    let unit = if id.contains("InputTokens") {
        Unit::InputTokens
    } else if id.contains("OutputTokens") {
        Unit::OutputTokens
    } else if id.contains("Tokens") {
        Unit::Tokens
    } else if id.contains("Requests") {
        Unit::Requests
    } else {
        return None;
    };
    Some(Counts::new(unit, per))
}

#[cfg(test)]
mod tests;

//! Total parsers for the rate-limit signals servers send: Retry-After, `retry-after-ms`,
//! IETF `RateLimit` fields, `x-ratelimit-*`, `x-should-retry` and Go durations.
//!
//! Every parser takes any bytes and returns `Option`: malformed, negative, non-finite or
//! absurd values are ignored, never a panic and never an endless sleep.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use ratebucket_rt::core::QuotaReport;
use sfv::{BareItem, Dictionary, List, ListEntry, Parser};

/// Epoch seconds above this in a reset header are a timestamp, not a delay.
const EPOCH_THRESHOLD: f64 = 1_000_000_000.0;

/// Above this, a reset timestamp is in epoch milliseconds (as OpenRouter sends): in
/// seconds it would be more than three thousand years away; in milliseconds it is 1973.
pub(crate) const EPOCH_MILLIS_THRESHOLD: f64 = 100_000_000_000.0;

/// The header names read on every response, parsed once (a `&str` lookup parses the name
/// each time).
static X_SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
static RETRY_AFTER_MS: HeaderName = HeaderName::from_static("retry-after-ms");
static OPENAI_PROCESSING_MS: HeaderName = HeaderName::from_static("openai-processing-ms");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
/// `x-ratelimit-{limit,remaining,reset}`, bare and for the families providers send.
static X_RATELIMIT: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit"),
    HeaderName::from_static("x-ratelimit-remaining"),
    HeaderName::from_static("x-ratelimit-reset"),
];
static X_RATELIMIT_REQUESTS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
static X_RATELIMIT_TOKENS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// What a response's headers say about rate limiting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Signals {
    /// The wait the server asked for: `retry-after-ms` if valid, else `Retry-After`
    /// (seconds or HTTP-date). `None` when absent, invalid, zero or in the past.
    pub retry_after: Option<Duration>,
    /// `x-should-retry: true|false`.
    pub should_retry: Option<bool>,
    /// The quota the server reports, from IETF `RateLimit` fields or `x-ratelimit-*`.
    pub quota: Option<Quota>,
    /// How long the server says it spent on the request (`openai-processing-ms`): it
    /// counted the request against its limits at least this long before answering.
    pub processing: Option<Duration>,
}

impl Signals {
    /// Reads every signal from `headers`; `now` resolves HTTP-dates and epoch resets.
    pub fn from_headers(headers: &HeaderMap, now: SystemTime) -> Signals {
        Signals::read(headers, || now)
    }

    /// [`Signals::from_headers`], with the wall clock read only when a signal is there:
    /// the names are scanned once, and each signal is looked up only if present.
    pub(crate) fn read(headers: &HeaderMap, now: impl FnOnce() -> SystemTime) -> Signals {
        let present = Present::of(headers);
        if present == Present::default() {
            return Signals::default();
        }
        // The wall clock resolves dates and epoch resets only.
        let now = if present.retry_after || present.ietf || present.x_ratelimit {
            now()
        } else {
            SystemTime::UNIX_EPOCH
        };
        Signals {
            processing: present
                .processing
                .then(|| headers.get(&OPENAI_PROCESSING_MS))
                .flatten()
                .and_then(|v| parse_processing_ms(v.as_bytes())),
            retry_after: present.retry_after.then(|| retry_after(headers, now)).flatten(),
            should_retry: present
                .should_retry
                .then(|| headers.get(&X_SHOULD_RETRY))
                .flatten()
                .and_then(|v| parse_should_retry(v.as_bytes())),
            quota: present
                .ietf
                .then(|| ietf_quota(headers))
                .flatten()
                .or_else(|| present.x_ratelimit.then(|| x_ratelimit_quota(headers, now)).flatten()),
        }
    }

    /// How long to wait before the next request: Retry-After when present (it takes
    /// precedence), else the quota's reset when the quota is exhausted.
    pub fn server_delay(&self) -> Option<Duration> {
        self.retry_after.or_else(|| {
            let quota = self.quota?;
            (quota.remaining == Some(0)).then_some(quota.reset).flatten()
        })
    }
}

/// Which of the signals [`Signals`] reads a response's header names hold, found in one
/// pass (a lookup per name would hash every name, present or not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Present {
    /// `retry-after` or `retry-after-ms`.
    retry_after: bool,
    /// `x-should-retry`.
    should_retry: bool,
    /// An IETF `ratelimit*` field.
    ietf: bool,
    /// The generic `x-ratelimit-limit`, `-remaining` or `-reset`.
    x_ratelimit: bool,
    /// `openai-processing-ms`.
    processing: bool,
}

impl Present {
    fn of(headers: &HeaderMap) -> Present {
        let mut present = Present::default();
        for name in headers.keys() {
            let name = name.as_str();
            if let Some(rest) = name.strip_prefix("x-ratelimit-") {
                present.x_ratelimit |= matches!(rest, "limit" | "remaining" | "reset");
            } else if name.starts_with("ratelimit") {
                present.ietf = true;
            } else if name.starts_with("retry-after") {
                present.retry_after |= matches!(name, "retry-after" | "retry-after-ms");
            } else if name == "openai-processing-ms" {
                present.processing = true;
            } else {
                present.should_retry |= name == "x-should-retry";
            }
        }
        present
    }
}

/// A quota as a server reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quota {
    /// Units allowed per window.
    pub limit: Option<u64>,
    /// Units left now.
    pub remaining: Option<u64>,
    /// Time until more quota (or a full window) is available.
    pub reset: Option<Duration>,
    /// The window `limit` is counted over, when the server says (IETF `w`).
    pub window: Option<Duration>,
    /// How `reset` was written, where the form says more than its value: an instant, and
    /// at what resolution ([`Written`]).
    pub written: Written,
}

/// What the form of a reset says beyond the wait read from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Written as an instant (an RFC 3339 time, an HTTP-date, Unix seconds or
    /// milliseconds) and turned into a wait against the clock as it was read: it may read
    /// short by the time the reply took to be read.
    pub instant: bool,
    /// The resolution it was written at, when the form says (a second for an instant
    /// without a fraction); `None` for a wait, whose values tell it.
    pub resolution: Option<Duration>,
}

impl Written {
    /// A wait (seconds, a Go duration): its values tell its resolution.
    pub const WAIT: Written = Written { instant: false, resolution: None };

    /// An instant written at `resolution`.
    pub const fn instant(resolution: Duration) -> Written {
        Written { instant: true, resolution: Some(resolution) }
    }

    /// Both forms' evidence, for a header sent twice: an instant if either is, at the
    /// coarser resolution.
    pub(crate) fn and(self, other: Written) -> Written {
        Written {
            instant: self.instant || other.instant,
            resolution: match (self.resolution, other.resolution) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
        }
    }
}

impl From<Quota> for QuotaReport {
    /// The quota as a report to the limiter's learning
    /// ([`Reservation::reply`](ratebucket_rt::Reservation::reply)), with what the form of
    /// its reset says.
    fn from(quota: Quota) -> QuotaReport {
        let has_reset = quota.reset.is_some();
        QuotaReport {
            limit: quota.limit,
            remaining: quota.remaining,
            reset: quota.reset,
            window: quota.window,
            reset_as_instant: has_reset && quota.written.instant,
            reset_resolution: quota.written.resolution.filter(|_| has_reset).unwrap_or_default(),
            ..QuotaReport::default()
        }
    }
}

/// The server's requested wait: `retry-after-ms` wins when valid; otherwise `Retry-After`.
/// A header sent more than once (a proxy adding its own) is read conservatively: the
/// longest wait.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    headers
        .get_all(&RETRY_AFTER_MS)
        .iter()
        .filter_map(|v| parse_retry_after_ms(v.as_bytes()))
        .max()
        .or_else(|| {
            headers
                .get_all(http::header::RETRY_AFTER)
                .iter()
                .filter_map(|v| parse_retry_after(v.as_bytes(), now))
                .max()
        })
}

/// `retry-after-ms`: milliseconds, possibly fractional; must be finite and positive.
pub fn parse_retry_after_ms(value: &[u8]) -> Option<Duration> {
    let ms = parse_positive_f64(value)?;
    positive_duration(ms / 1000.0)
}

/// A positive number of seconds as a duration; `None` if it overflows or rounds to
/// nothing (a positive wait below a nanosecond is no wait the client can honour).
fn positive_duration(secs: f64) -> Option<Duration> {
    Duration::try_from_secs_f64(secs).ok().filter(|d| !d.is_zero())
}

/// `Retry-After`: delay-seconds (a float such as `1.5` is accepted, as major SDKs do) or an
/// HTTP-date in any of its three forms. Zero, negative, non-finite, overflowing values and
/// dates in the past mean "no server delay" (`None`).
pub fn parse_retry_after(value: &[u8], now: SystemTime) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() {
        return None;
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        let secs: u64 = text.parse().ok()?;
        return (secs > 0).then(|| Duration::from_secs(secs));
    }
    if let Some(secs) = parse_positive_f64(text.as_bytes()) {
        return positive_duration(secs);
    }
    let date = httpdate::parse_http_date(text).ok()?;
    date.duration_since(now).ok().filter(|d| !d.is_zero())
}

/// The longest processing time believed (a day): beyond it the header is garbage.
const MAX_PROCESSING: Duration = Duration::from_secs(86_400);

/// `openai-processing-ms`: a non-negative number of milliseconds (whole, as OpenAI sends
/// it, or decimal), at most a day; anything else is `None`.
pub fn parse_processing_ms(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    let ms: f64 = text.parse().ok()?;
    let processing = Duration::try_from_secs_f64(ms / 1e3).ok()?;
    (processing <= MAX_PROCESSING).then_some(processing)
}

/// `x-should-retry`: `true` or `false`, case-insensitive.
pub fn parse_should_retry(value: &[u8]) -> Option<bool> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.eq_ignore_ascii_case("true") {
        Some(true)
    } else if text.eq_ignore_ascii_case("false") {
        Some(false)
    } else {
        None
    }
}

/// A Go duration (`1h2m3.5s`, `2m52.8s`, `12ms`, `500us`, `500µs`, `0s`), as OpenAI's
/// `x-ratelimit-reset-*` headers carry; a bare number is seconds (Azure sends `55`).
/// Negative, empty, unit-less garbage or overflowing values are `None`.
pub fn parse_go_duration(value: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if text.is_empty() {
        return None;
    }
    if let Some(secs) = parse_non_negative_f64(text.as_bytes()) {
        return Duration::try_from_secs_f64(secs).ok();
    }
    let mut rest = text;
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let number_len =
            rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if number_len == 0 {
            return None;
        }
        let number: f64 = rest[..number_len].parse().ok()?;
        rest = &rest[number_len..];
        // Longest unit first: `ms` must not be read as `m`.
        let (unit_secs, unit_len) = [
            ("ns", 1e-9),
            ("us", 1e-6),
            ("µs", 1e-6),
            ("μs", 1e-6),
            ("ms", 1e-3),
            ("h", 3600.0),
            ("m", 60.0),
            ("s", 1.0),
        ]
        .iter()
        .find(|(unit, _)| rest.starts_with(unit))
        .map(|(unit, secs)| (*secs, unit.len()))?;
        rest = &rest[unit_len..];
        total = total.checked_add(Duration::try_from_secs_f64(number * unit_secs).ok()?)?;
    }
    Some(total)
}

/// Whether any `x-ratelimit-remaining` header, of any family (the generic one, OpenAI's
/// `-requests` and `-tokens`, or another), says nothing remains: a 403 that carries one is
/// a rate limit, not a refusal of the account.
pub fn any_remaining_exhausted(headers: &HeaderMap) -> bool {
    headers.iter().any(|(name, value)| {
        name.as_str().starts_with("x-ratelimit-remaining") && parse_u64(value.as_bytes()) == Some(0)
    })
}

/// The generic `x-ratelimit-limit` / `-remaining` / `-reset` family:
/// [`x_ratelimit`] with no suffix.
pub fn x_ratelimit_quota(headers: &HeaderMap, now: SystemTime) -> Option<Quota> {
    x_ratelimit(headers, None, now)
}

/// The one reader of `x-ratelimit-*` headers: `x-ratelimit-limit`, `-remaining` and
/// `-reset`, each with `-{family}` appended when a family is named (OpenAI's `requests`
/// and `tokens`).
///
/// Reset is delta seconds, or an epoch timestamp when it is that large (in seconds, or in
/// milliseconds when larger still), or a Go duration (`6m0s`, `1.5s`, as OpenAI sends). A
/// negative or unparsable number is "unknown" (Azure sends `-1`).
///
/// A header sent more than once with different values (a proxy adding its own count) is
/// read conservatively: the lowest limit, the lowest remaining, the longest reset.
pub fn x_ratelimit(headers: &HeaderMap, family: Option<&str>, now: SystemTime) -> Option<Quota> {
    let known = match family {
        None => Some(&X_RATELIMIT),
        Some("requests") => Some(&X_RATELIMIT_REQUESTS),
        Some("tokens") => Some(&X_RATELIMIT_TOKENS),
        Some(_) => None,
    };
    let all = |index: usize, what: &str| {
        let values = match (known, family) {
            (Some(names), _) => headers.get_all(&names[index]),
            (None, Some(family)) => headers.get_all(format!("x-ratelimit-{what}-{family}")),
            (None, None) => headers.get_all("x-ratelimit-none"),
        };
        values.into_iter().map(HeaderValue::as_bytes)
    };
    let limit = all(0, "limit").filter_map(parse_u64).min();
    let remaining = all(1, "remaining").filter_map(parse_u64).min();
    let (reset, written) = all(2, "reset")
        .filter_map(|v| read_reset(v, now))
        .fold((None, Written::WAIT), |(longest, form), (reset, this)| {
            (longest.max(Some(reset)), form.and(this))
        });
    let quota = Quota { limit, remaining, reset, window: None, written };
    (quota != Quota::default()).then_some(quota)
}

/// A generic reset, told apart by shape: delta seconds, Unix seconds or milliseconds when
/// that large, an RFC 3339 instant or an HTTP-date (as gateways write it), or a Go
/// duration; with what its form says. An instant in the past is a reset of zero.
pub(crate) fn read_reset(value: &[u8], now: SystemTime) -> Option<(Duration, Written)> {
    let text = std::str::from_utf8(value).ok()?.trim();
    if let Some(mut secs) = parse_non_negative_f64(text.as_bytes()) {
        let mut unit = 1.0;
        if secs >= EPOCH_MILLIS_THRESHOLD {
            secs /= 1000.0;
            unit = 1e-3;
        }
        if secs >= EPOCH_THRESHOLD {
            let at = SystemTime::UNIX_EPOCH.checked_add(Duration::try_from_secs_f64(secs).ok()?)?;
            let resolution = Duration::from_secs_f64(unit * fraction_step(text));
            return Some((since(at, now), Written::instant(resolution)));
        }
        return Some((Duration::try_from_secs_f64(secs).ok()?, Written::WAIT));
    }
    if let Some(at) = parse_instant(text) {
        return Some((since(at.0, now), Written::instant(at.1)));
    }
    Some((parse_go_duration(text.as_bytes())?, Written::WAIT))
}

/// How long from `now` until `at`; zero for an instant in the past.
fn since(at: SystemTime, now: SystemTime) -> Duration {
    at.duration_since(now).unwrap_or(Duration::ZERO)
}

/// The step of a decimal number's last digit: 1 for `12`, 0.01 for `11.38`.
fn fraction_step(number: &str) -> f64 {
    let decimals = number.split_once('.').map_or(0, |(_, frac)| frac.len());
    10f64.powi(-i32::try_from(decimals.min(9)).unwrap_or(9))
}

/// An RFC 3339 instant (`2026-12-06T13:40:12Z`, with or without a fraction) or an
/// HTTP-date in any of its three forms, with the resolution it was written at (a second
/// for an HTTP-date or an RFC 3339 instant without a fraction). `None` for anything else.
pub fn parse_instant(text: &str) -> Option<(SystemTime, Duration)> {
    if let Ok(at) = humantime::parse_rfc3339_weak(text) {
        // The fraction's digits, between the seconds and the zone.
        let fraction = text
            .split_once('.')
            .map_or(0, |(_, rest)| rest.bytes().take_while(u8::is_ascii_digit).count());
        let step = 10f64.powi(-i32::try_from(fraction.min(9)).unwrap_or(9));
        return Some((at, Duration::from_secs_f64(step)));
    }
    let at = httpdate::parse_http_date(text).ok()?;
    Some((at, Duration::from_secs(1)))
}

/// IETF RateLimit fields: draft-10's `RateLimit` list (`"burst";r=50;t=30`) with
/// `RateLimit-Policy` (`"burst";q=100;w=60`), draft-07's `RateLimit` dictionary
/// (`limit=10, remaining=1, reset=7`), or the older `RateLimit-Limit` / `-Remaining` /
/// `-Reset`. With several policies, the one with the least remaining wins. A malformed
/// field is ignored entirely.
pub fn ietf_quota(headers: &HeaderMap) -> Option<Quota> {
    if let Some(value) = headers.get(&RATELIMIT) {
        let bytes = value.as_bytes();
        return draft10(bytes, headers.get(&RATELIMIT_POLICY).map(|v| v.as_bytes()))
            .or_else(|| draft07(bytes));
    }
    let get = |name: &HeaderName| headers.get(name).map(|v| v.as_bytes());
    let limit = get(&RATELIMIT_LIMIT).and_then(leading_u64);
    let quota = Quota {
        limit,
        remaining: get(&RATELIMIT_REMAINING).and_then(leading_u64),
        reset: get(&RATELIMIT_RESET).and_then(leading_u64).map(Duration::from_secs),
        window: limit.and_then(|limit| listed_window(get(&RATELIMIT_LIMIT)?, limit)),
        written: Written::WAIT,
    };
    (quota != Quota::default()).then_some(quota)
}

fn draft10(value: &[u8], policy: Option<&[u8]>) -> Option<Quota> {
    let list: List = Parser::new(value).parse().ok()?;
    let policies: Option<List> = policy.and_then(|p| Parser::new(p).parse().ok());
    let mut best: Option<(Option<String>, Quota)> = None;
    for entry in &list {
        let ListEntry::Item(item) = entry else {
            return None;
        };
        let name = item_name(&item.bare_item);
        let remaining = param_u64(&item.params, "r")?;
        let reset = param_u64(&item.params, "t").map(Duration::from_secs);
        let quota = Quota {
            limit: None,
            remaining: Some(remaining),
            reset,
            window: None,
            written: Written::WAIT,
        };
        if best.as_ref().is_none_or(|(_, b)| Some(remaining) < b.remaining) {
            best = Some((name, quota));
        }
    }
    let (name, mut quota) = best?;
    if let Some(policies) = policies {
        let policy = policies.iter().find_map(|entry| match entry {
            ListEntry::Item(item) if item_name(&item.bare_item) == name => Some(&item.params),
            _ => None,
        });
        quota.limit = policy.and_then(|params| param_u64(params, "q"));
        quota.window = policy.and_then(param_window);
    }
    Some(quota)
}

fn draft07(value: &[u8]) -> Option<Quota> {
    let dict: Dictionary = Parser::new(value).parse().ok()?;
    let int = |key: &str| match dict.get(key) {
        Some(ListEntry::Item(item)) => bare_u64(&item.bare_item),
        _ => None,
    };
    let quota = Quota {
        limit: int("limit"),
        remaining: int("remaining"),
        reset: int("reset").map(Duration::from_secs),
        window: None,
        written: Written::WAIT,
    };
    (quota != Quota::default()).then_some(quota)
}

fn item_name(item: &BareItem) -> Option<String> {
    match item {
        BareItem::String(s) => Some(s.as_str().to_owned()),
        BareItem::Token(t) => Some(t.as_str().to_owned()),
        _ => None,
    }
}

fn param_u64(params: &sfv::Parameters, key: &str) -> Option<u64> {
    params.get(key).and_then(bare_u64)
}

/// A policy's window, `w` (seconds): none for zero, which would count nothing.
fn param_window(params: &sfv::Parameters) -> Option<Duration> {
    param_u64(params, "w").filter(|&w| w > 0).map(Duration::from_secs)
}

/// The window of the policy of `limit` in an older draft's `RateLimit-Limit` list
/// (`10, 10;w=1`).
fn listed_window(value: &[u8], limit: u64) -> Option<Duration> {
    let list: List = Parser::new(value).parse().ok()?;
    list.iter().find_map(|entry| match entry {
        ListEntry::Item(item) if bare_u64(&item.bare_item) == Some(limit) => {
            param_window(&item.params)
        }
        _ => None,
    })
}

fn bare_u64(item: &BareItem) -> Option<u64> {
    match item {
        BareItem::Integer(i) => u64::try_from(i64::from(*i)).ok(),
        _ => None,
    }
}

pub(crate) fn parse_u64(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.trim().parse().ok()
}

/// The integer at the start of a field like `10, 10;w=1` (older drafts list policies).
fn leading_u64(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?.trim();
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    text[..end].parse().ok()
}

fn parse_positive_f64(value: &[u8]) -> Option<f64> {
    parse_non_negative_f64(value).filter(|x| *x > 0.0)
}

pub(crate) fn parse_non_negative_f64(value: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(value).ok()?.trim();
    // Only plain decimal numbers: Rust's parser would also accept "inf", "NaN", "1e3".
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return None;
    }
    text.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0)
}

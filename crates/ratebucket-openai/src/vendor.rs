//! What OpenAI-compatible servers mean: error bodies, `x-ratelimit-*` families, and the
//! limits the provider reports.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use ratebucket_http::dialect::{self, Dialect, Per, Unit};
use ratebucket_http::{ResponseHead, Vendor};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{Limit, QuotaPolicy, QuotaReport, Report, Verdict};

use crate::types::ErrorBody;

/// The limiter dimension of requests.
pub const REQUESTS: usize = 0;
/// The limiter dimension of tokens.
pub const TOKENS: usize = 1;
/// The money dimension's index, for a client with a budget
/// ([`ClientBuilder::budget`](crate::ClientBuilder::budget)): micro-dollars.
pub const MONEY: usize = 2;

/// The window of a quota counted per day.
const DAY: Duration = Duration::from_secs(86_400);

/// Codes that mean a quota is spent (the account cannot pay, a spend or usage limit is
/// reached): retrying never helps until someone raises it.
const SPENT_CODES: [&str; 5] = [
    "insufficient_quota",
    "credit_balance_exhausted",
    "organization_spend_limit_exceeded",
    "project_spend_limit_exceeded",
    "organization_usage_limit_exceeded",
];

/// Reads an OpenAI-style error body into a verdict, telling a spent quota from a busy one
/// and a wrong request: quota and billing codes (`insufficient_quota`, the spend and usage
/// limits) are a spent quota; `rate_limit_exceeded` and `slow_down` are throttles; Groq's
/// `capacity_exceeded` (its 498) is transient, retried with jitter; "Request too large"
/// is permanent for this request; anything else is left to the status code.
pub fn verdict_for(body: &[u8]) -> Option<Verdict> {
    let error = serde_json::from_slice::<ErrorBody>(body).ok()?.error;
    let code = error.code.as_ref().and_then(|c| c.as_str());
    let kind = error.kind.as_deref();
    let named = |codes: &[&str]| [code, kind].iter().flatten().any(|c| codes.contains(c));
    if named(&SPENT_CODES) {
        return Some(Verdict::Spent);
    }
    if named(&["capacity_exceeded"]) {
        return Some(Verdict::Retryable);
    }
    if error.message.starts_with("Request too large") {
        return Some(Verdict::Permanent);
    }
    match code {
        Some("rate_limit_exceeded" | "slow_down") => Some(Verdict::Throttled),
        _ => None,
    }
}

/// The wait an error message asks for: "... Please try again in 644ms." → 644 ms.
pub fn retry_hint(body: &[u8]) -> Option<Duration> {
    dialect::OPENAI.retry_hint(body)
}

/// The limits a client is configured with, per window (a minute, as providers state
/// them); `None` means "not known: start conservatively and adopt what the provider
/// reports". The provider's `x-ratelimit-limit-*` values are read per the same window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests per window.
    pub requests_per_minute: Option<u64>,
    /// Tokens per window.
    pub tokens_per_minute: Option<u64>,
    /// The window the limits are counted over: a minute unless a test shortens it.
    pub window: Duration,
    /// How deep a burst the client allows itself.
    pub burst: Burst,
}

/// How deep a burst the client takes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Burst {
    /// A sixth of each limit, always: safe against fixed-window providers (ADR 0003).
    Conservative,
    /// A sixth of each limit until the provider's `x-ratelimit-*` headers show a bucket that
    /// refills continuously (their reset matches `(limit - remaining) / rate` observation
    /// after observation); then the provider's whole capacity, with the local level kept
    /// within the bounds each reported remaining sets given what was in flight
    /// (`Arbiter::sync_level`). Missing or inconsistent headers keep the conservative
    /// burst (ADR 0009); headers showing a fixed window or a sliding log keep it too and
    /// add a cap of the limit per trailing window (`WindowGuard`, ADR 0010), under either
    /// policy.
    #[default]
    LearnFromHeaders,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            requests_per_minute: None,
            tokens_per_minute: None,
            window: Duration::from_secs(60),
            burst: Burst::default(),
        }
    }
}

impl Limits {
    /// Known limits.
    pub fn per_minute(requests: u64, tokens: u64) -> Limits {
        Limits {
            requests_per_minute: Some(requests),
            tokens_per_minute: Some(tokens),
            ..Limits::default()
        }
    }

    /// Nothing known: the first reply's headers will tell.
    pub fn unknown() -> Limits {
        Limits::default()
    }

    /// Counts the limits over `window` instead of a minute (for providers or fakes with
    /// shorter windows).
    pub fn window(mut self, window: Duration) -> Limits {
        self.window = window;
        self
    }

    /// Sets the burst policy.
    pub fn burst(mut self, burst: Burst) -> Limits {
        self.burst = burst;
        self
    }

    /// The limit of each dimension, in order (requests, tokens): what a limiter for these
    /// limits enforces when it starts.
    ///
    /// Known limits refill at the limit with a sixth of it as burst (see ADR 0003).
    /// Unknown ones start conservatively: one request at a time, one per second, until the
    /// provider's `x-ratelimit-limit-*` headers say more; tokens are not paced until then.
    pub fn per_dimension(&self) -> [Limit; 2] {
        let requests = match self.requests_per_minute {
            Some(limit) => Limit::per(limit, self.window),
            None => Limit::per_second(1),
        };
        let tokens = match self.tokens_per_minute {
            Some(limit) => Limit::per(limit, self.window),
            None => Limit::per_second(1 << 40),
        };
        [requests.named("requests"), tokens.named("tokens")]
    }

    /// The buckets for a limiter with these limits, in dimension order (requests, tokens):
    /// [`Limits::per_dimension`], full at `now`.
    pub fn buckets(
        &self,
        now: ratebucket_rt::core::Instant,
    ) -> Result<Vec<ratebucket_rt::core::TokenBucket>, ratebucket_rt::core::InvalidLimit> {
        self.per_dimension().iter().map(|limit| limit.bucket(now)).collect()
    }
}

/// OpenAI's knowledge for the [`Fetcher`](ratebucket_http::Fetcher): classification of
/// error bodies, a learning policy for each dimension, the reading of a provider's
/// rate-limit headers in its [`Dialect`] into one quota report per dimension, and the
/// charge a completion's `usage` reports. Pure: it keeps no state and never sees the
/// limiter.
///
/// The requests dimension takes the quotas of requests per minute (or per second), the
/// tokens dimension those of tokens; a quota per day goes to the same dimension over its
/// own window, a budget that, once the provider reports it spent, refuses every call at
/// once with the time to its reset (unless the caller's deadline reaches it).
#[derive(Clone, Debug)]
pub struct OpenAiVendor {
    window: Duration,
    burst: Burst,
    configured: [Option<u64>; 2],
    reconcile: bool,
    dialect: Option<&'static Dialect>,
    /// The models' prices, for a charge in money ([`MONEY`](crate::MONEY)).
    prices: Option<std::sync::Arc<crate::Prices>>,
}

impl OpenAiVendor {
    /// Knowledge for a client configured with `limits`.
    pub fn new(limits: Limits) -> OpenAiVendor {
        OpenAiVendor {
            window: limits.window,
            burst: limits.burst,
            configured: [limits.requests_per_minute, limits.tokens_per_minute],
            reconcile: true,
            dialect: None,
            prices: None,
        }
    }

    /// Charges a reservation with a money dimension ([`MONEY`](crate::MONEY)) what the
    /// answer's usage cost at these prices (its model's, by [`Prices::price`](crate::Prices::price)).
    pub fn prices(mut self, prices: Option<std::sync::Arc<crate::Prices>>) -> OpenAiVendor {
        self.prices = prices;
        self
    }

    /// Reads the provider's signals in `dialect`; `None` (the default) recognises a
    /// dialect from each reply where its headers show one unambiguously
    /// ([`Dialect::recognise`]) and reads OpenAI's otherwise.
    pub fn dialect(mut self, dialect: Option<&'static Dialect>) -> OpenAiVendor {
        self.dialect = dialect;
        self
    }

    /// The dialect a response is read in: the chosen one, else the one its headers show,
    /// else OpenAI's.
    fn dialect_of(&self, headers: &HeaderMap) -> &'static Dialect {
        self.dialect.or_else(|| Dialect::recognise(headers)).unwrap_or(&dialect::OPENAI)
    }

    /// The dialect chosen, if any.
    pub fn chosen_dialect(&self) -> Option<&'static Dialect> {
        self.dialect
    }

    /// Whether a successful reply is charged the `usage.total_tokens` its body reports
    /// (on by default; [`usage_charge`](crate::usage_charge)). Off: every request is charged as reserved.
    pub fn reconcile(mut self, on: bool) -> OpenAiVendor {
        self.reconcile = on;
        self
    }

    /// The per-minute limits in force on `limiter`: those configured, or lowered or
    /// adopted from headers ([`Limiter::dimension`]).
    pub fn limits(&self, limiter: &Limiter) -> Limits {
        let current = |d: usize| {
            limiter
                .dimension(d)
                .and_then(|v| v.state.learned)
                .map_or(self.configured[d], |l| l.limit)
        };
        Limits {
            requests_per_minute: current(REQUESTS),
            tokens_per_minute: current(TOKENS),
            window: self.window,
            burst: self.burst,
        }
    }

    /// The policy `dimension` learns under: the configured limit per window, and whether
    /// the provider's burst may be lent.
    fn policy(&self, dimension: usize) -> QuotaPolicy {
        let policy = match self.configured[dimension] {
            Some(limit) => QuotaPolicy::known(limit, self.window),
            None => QuotaPolicy::unknown(self.window),
        };
        match self.burst {
            Burst::LearnFromHeaders => policy,
            Burst::Conservative => policy.conservative(),
        }
    }
    /// The quotas a response's rate-limit headers report, one per dimension they
    /// describe, read in its dialect.
    fn header_reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        self.dialect_of(response.headers)
            .read(response.headers, SystemTime::now())
            .into_iter()
            .filter_map(|reading| {
                let dimension = match (reading.counts.unit, reading.counts.per) {
                    (Unit::Requests, _) => REQUESTS,
                    (Unit::Tokens, _) => TOKENS,
                    // Input or output tokens alone are not what this client counts.
                    _ => return None,
                };
                let mut quota: QuotaReport = reading.report();
                match reading.counts.per {
                    Per::Second => quota.window = quota.window.or(Some(Duration::from_secs(1))),
                    // A daily quota is not a minute's: read over its day, as a budget
                    // that, spent, refuses until it resets.
                    Per::Day => quota.window = Some(DAY),
                    _ => {}
                }
                Some(Report { dimension, quota })
            })
            .collect()
    }

    /// The daily quotas a refusal's body names as spent (Gemini's `QuotaFailure`, which
    /// comes with no rate-limit header at all), each as a report of nothing left in its
    /// day until the body's retry delay has passed: every call after it is refused at once
    /// with that time, instead of being sent to meet the same 429. Quotas per minute named
    /// there are left to the pause the delay asks for.
    fn spent_days(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        let Some(body) = response.body.filter(|_| response.status.is_client_error()) else {
            return Vec::new();
        };
        // Only Gemini names quotas in a body; unchosen, its details show it.
        let dialect = self.dialect.unwrap_or(&dialect::GEMINI);
        let reset = dialect.retry_hint(body);
        let mut reports: Vec<Report> = Vec::new();
        for counts in dialect.spent(body) {
            if counts.per != Per::Day {
                continue;
            }
            let dimension = match counts.unit {
                Unit::Requests => REQUESTS,
                Unit::Tokens | Unit::InputTokens => TOKENS,
                _ => continue,
            };
            if reports.iter().any(|r| r.dimension == dimension) {
                continue;
            }
            reports.push(Report {
                dimension,
                quota: QuotaReport {
                    remaining: Some(0),
                    reset,
                    window: Some(DAY),
                    ..QuotaReport::default()
                },
            });
        }
        reports
    }
}

impl Vendor for OpenAiVendor {
    fn verdict(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Verdict> {
        if self.dialect_of(headers).throttles(status) {
            return Some(Verdict::Throttled);
        }
        verdict_for(body)
    }

    fn retry_hint(&self, body: &[u8]) -> Option<Duration> {
        match self.dialect {
            Some(dialect) => dialect.retry_hint(body),
            // The message's words and a RetryInfo detail cannot be mistaken for each other.
            None => dialect::OPENAI.retry_hint(body).or_else(|| dialect::GEMINI.retry_hint(body)),
        }
    }

    fn policies(&self) -> Vec<(usize, QuotaPolicy)> {
        vec![(REQUESTS, self.policy(REQUESTS)), (TOKENS, self.policy(TOKENS))]
    }

    fn reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        let mut reports = self.header_reports(response);
        reports.extend(self.spent_days(response));
        reports
    }

    fn charge(
        &self,
        reserved: &[u64],
        response: &http::Response<bytes::Bytes>,
    ) -> Option<Vec<u64>> {
        self.reconcile
            .then(|| {
                crate::client::priced_charge(reserved, response.body(), self.prices.as_deref())
            })
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(code: &str, kind: &str, message: &str) -> Vec<u8> {
        serde_json::json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn each_error_body_maps_to_its_verdict() {
        let throttled =
            body("rate_limit_exceeded", "tokens", "Rate limit reached. Please try again in 644ms.");
        assert_eq!(verdict_for(&throttled), Some(Verdict::Throttled));
        assert_eq!(
            verdict_for(&body("slow_down", "requests", "Slow down")),
            Some(Verdict::Throttled)
        );
        for code in SPENT_CODES {
            assert_eq!(verdict_for(&body(code, "x", "no money")), Some(Verdict::Spent), "{code}");
        }
        let quota_type = body("", "insufficient_quota", "You exceeded your current quota");
        assert_eq!(verdict_for(&quota_type), Some(Verdict::Spent));
        let busy = body("capacity_exceeded", "capacity_exceeded", "Flex tier busy");
        assert_eq!(verdict_for(&busy), Some(Verdict::Retryable));
        let too_large = body(
            "rate_limit_exceeded",
            "tokens",
            "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 36055.",
        );
        assert_eq!(verdict_for(&too_large), Some(Verdict::Permanent));
        assert_eq!(verdict_for(&body("server_is_overloaded", "server_error", "busy")), None);
        assert_eq!(verdict_for(b"not json"), None);
    }

    #[test]
    fn vllm_integer_codes_are_understood() {
        let vllm = br#"{"object":"error","error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}"#;
        assert_eq!(verdict_for(vllm), None);
        let parsed: ErrorBody = serde_json::from_slice(vllm).expect("parses");
        assert_eq!(parsed.error.code, Some(crate::types::ErrorCode::Number(400)));
    }

    #[test]
    fn the_message_says_when_to_try_again() {
        let b =
            body("rate_limit_exceeded", "tokens", "Rate limit reached. Please try again in 644ms.");
        assert_eq!(retry_hint(&b), Some(Duration::from_millis(644)));
        let b = body("rate_limit_exceeded", "tokens", "Please try again in 1.5s. Visit ...");
        assert_eq!(retry_hint(&b), Some(Duration::from_millis(1500)));
        assert_eq!(retry_hint(&body("x", "y", "no hint")), None);
    }

    #[test]
    fn a_dialects_throttle_statuses_are_throttles() {
        let openrouter = OpenAiVendor::new(Limits::unknown()).dialect(Some(&dialect::OPENROUTER));
        let empty = HeaderMap::new();
        let credit = br#"{"error":{"message":"more credits are needed","code":402}}"#;
        assert_eq!(
            openrouter.verdict(StatusCode::PAYMENT_REQUIRED, &empty, credit),
            Some(Verdict::Throttled)
        );
        let openai = OpenAiVendor::new(Limits::unknown());
        assert_eq!(openai.verdict(StatusCode::PAYMENT_REQUIRED, &empty, credit), None);
    }

    #[test]
    fn a_daily_quota_is_read_over_its_day_never_as_a_minutes() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("x-ratelimit-limit-requests", "14400"),
            ("x-ratelimit-remaining-requests", "14000"),
            ("x-ratelimit-limit-tokens", "6000"),
            ("x-ratelimit-remaining-tokens", "5000"),
        ] {
            headers.insert(name, value.parse().expect("value"));
        }
        let signals = ratebucket_http::Signals::default();
        let head = ResponseHead {
            status: StatusCode::OK,
            headers: &headers,
            signals: &signals,
            fold_dimension: None,
            body: None,
        };
        let groq = OpenAiVendor::new(Limits::unknown()).dialect(Some(&dialect::GROQ));
        let reports = groq.reports(&head);
        assert_eq!(reports.len(), 2);
        let day = reports.iter().find(|r| r.dimension == REQUESTS).expect("requests");
        assert_eq!(day.quota.window, Some(DAY));
        assert_eq!(day.quota.limit, Some(14400));
        let minute = reports.iter().find(|r| r.dimension == TOKENS).expect("tokens");
        assert_eq!(minute.quota.window, None);
        assert_eq!(minute.quota.limit, Some(6000));
        // The default reading is OpenAI's: both, per minute.
        assert_eq!(OpenAiVendor::new(Limits::unknown()).reports(&head).len(), 2);
    }
}

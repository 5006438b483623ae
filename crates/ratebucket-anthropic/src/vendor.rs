//! What Anthropic's answers mean: its limits, its error bodies, its headers and its usage.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use ratebucket_http::dialect::{self, Per, Unit};
use ratebucket_http::{ResponseHead, Vendor};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{Limit, QuotaPolicy, QuotaReport, Report, Verdict};

use crate::types::{ErrorBody, Usage};

/// The limiter dimension of requests.
pub const REQUESTS: usize = 0;
/// The limiter dimension of input tokens.
pub const INPUT_TOKENS: usize = 1;
/// The limiter dimension of output tokens.
pub const OUTPUT_TOKENS: usize = 2;
/// The limiter dimension of input and output tokens together: the combined limit that
/// servers sending only `anthropic-ratelimit-{requests,tokens}-*` enforce (some
/// Anthropic-compatible servers and gateways do). Reserved at the input estimate and
/// `max_tokens`, settled at what the answer used. Where the input and output families are
/// sent (Anthropic's own API), `tokens-*` is only the most restrictive of them, and this
/// dimension learns nothing from it.
pub const TOKENS: usize = 3;
/// The money dimension's index, for a client with a budget
/// ([`ClientBuilder::budget`](crate::ClientBuilder::budget)): micro-dollars.
pub const MONEY: usize = 4;

/// The window of a quota counted per day.
const DAY: Duration = Duration::from_secs(86_400);

/// Anthropic's limits, per window (a minute, as it states them); `None` means "not known:
/// start conservatively and adopt what the provider reports".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Requests per window (RPM).
    pub requests_per_minute: Option<u64>,
    /// Input tokens per window (ITPM): cache reads are not counted on most models.
    pub input_tokens_per_minute: Option<u64>,
    /// Output tokens per window (OTPM): charged `max_tokens` on admission, settled to what
    /// was produced.
    pub output_tokens_per_minute: Option<u64>,
    /// Input and output tokens together per window, for a server that counts them as one
    /// limit ([`TOKENS`]); `None` (the default) when none is known: learned if the server
    /// reports one.
    pub tokens_per_minute: Option<u64>,
    /// The window the limits are counted over: a minute unless a test shortens it.
    pub window: Duration,
    /// Whether the provider's whole bucket may be lent once its headers show one that
    /// refills continuously (the default), or a sixth of each limit is kept as the burst.
    pub provider_burst: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            requests_per_minute: None,
            input_tokens_per_minute: None,
            output_tokens_per_minute: None,
            tokens_per_minute: None,
            window: Duration::from_secs(60),
            provider_burst: true,
        }
    }
}

impl Limits {
    /// Known limits: requests, input tokens and output tokens per minute.
    pub fn per_minute(requests: u64, input_tokens: u64, output_tokens: u64) -> Limits {
        Limits {
            requests_per_minute: Some(requests),
            input_tokens_per_minute: Some(input_tokens),
            output_tokens_per_minute: Some(output_tokens),
            ..Limits::default()
        }
    }

    /// Known limits of a server that counts requests and tokens (input and output
    /// together) per minute, as some Anthropic-compatible servers and gateways do.
    pub fn requests_and_tokens(requests: u64, tokens: u64) -> Limits {
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

    /// With a combined limit of input and output tokens per window as well.
    pub fn tokens(mut self, tokens_per_minute: u64) -> Limits {
        self.tokens_per_minute = Some(tokens_per_minute);
        self
    }

    /// Counts the limits over `window` instead of a minute.
    pub fn window(mut self, window: Duration) -> Limits {
        self.window = window;
        self
    }

    /// Keeps a sixth of each limit as the burst even when the provider's headers show a
    /// continuously refilling bucket (`false`), or lends the provider's whole bucket then
    /// (`true`, the default).
    pub fn provider_burst(mut self, lend: bool) -> Limits {
        self.provider_burst = lend;
        self
    }

    /// The limit of each dimension, in order (requests, input tokens, output tokens, and
    /// tokens together): what a limiter for these limits enforces when it starts. Known
    /// limits refill at the limit with a sixth of it as burst; unknown ones start at one
    /// request a second, the tokens unpaced, until the provider's headers say more.
    pub fn per_dimension(&self) -> [Limit; 4] {
        let requests = match self.requests_per_minute {
            Some(limit) => Limit::per(limit, self.window),
            None => Limit::per_second(1),
        };
        let tokens = |limit: Option<u64>| match limit {
            Some(limit) => Limit::per(limit, self.window),
            None => Limit::per_second(1 << 40),
        };
        [
            requests.named("requests"),
            tokens(self.input_tokens_per_minute).named("input_tokens"),
            tokens(self.output_tokens_per_minute).named("output_tokens"),
            tokens(self.tokens_per_minute).named("tokens"),
        ]
    }

    /// The limit configured for `dimension`.
    fn configured(&self, dimension: usize) -> Option<u64> {
        match dimension {
            REQUESTS => self.requests_per_minute,
            INPUT_TOKENS => self.input_tokens_per_minute,
            OUTPUT_TOKENS => self.output_tokens_per_minute,
            TOKENS => self.tokens_per_minute,
            _ => None,
        }
    }
}

/// Reads an Anthropic error body into a verdict, telling a spent quota from a busy one
/// and a wrong request:
/// - spent (every call fails until the quota resets or someone raises it): a
///   `rate_limit_error` whose `details.error_code` is `enforced_spend_limit_reached` (the
///   monthly spend cap), and a 400 whose message says the usage limits were reached or the
///   credit balance is too low;
/// - throttles: any other `rate_limit_error`, and `overloaded_error`;
/// - fatal: `authentication_error`, `permission_error`;
/// - permanent for that request: `request_too_large`;
/// - anything else is left to the status.
pub fn verdict_for(body: &[u8]) -> Option<Verdict> {
    let error = serde_json::from_slice::<ErrorBody>(body).ok()?.error;
    let spent_message = error.message.contains("credit balance")
        || error.message.contains("reached your specified API usage limits");
    match error.kind.as_str() {
        "rate_limit_error" if error.code() == Some("enforced_spend_limit_reached") => {
            Some(Verdict::Spent)
        }
        "rate_limit_error" | "overloaded_error" => Some(Verdict::Throttled),
        "authentication_error" | "permission_error" => Some(Verdict::Fatal),
        "request_too_large" => Some(Verdict::Permanent),
        "invalid_request_error" if spent_message => Some(Verdict::Spent),
        _ => None,
    }
}

/// When an error body says the quota comes back, from `now`: "You will regain access on
/// 2027-01-01 at 00:00 UTC" (a usage limit), or a wait in its words ("Resets in 16 days").
pub fn retry_hint_at(body: &[u8], now: SystemTime) -> Option<Duration> {
    let message = serde_json::from_slice::<ErrorBody>(body).ok()?.error.message;
    regain_access(&message, now).or_else(|| dialect::message_wait(&message))
}

/// "... regain access on 2027-01-01 at 00:00 UTC." → the wait until then from `now`.
fn regain_access(message: &str, now: SystemTime) -> Option<Duration> {
    let (_, rest) = message.split_once("regain access on ")?;
    let mut words = rest.split_whitespace();
    let date = words.next()?.trim_end_matches('.');
    let time = match (words.next(), words.next()) {
        (Some("at"), Some(time)) => time.trim_end_matches('.'),
        _ => "00:00",
    };
    let seconds = if time.len() == 5 { ":00" } else { "" };
    let (at, _) = ratebucket_http::headers::parse_instant(&format!("{date}T{time}{seconds}Z"))?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// What an answer's body says it used, as a charge for a call that reserved `reserved`:
/// one request, the input tokens the limit counts (cache reads not among them) and the
/// output tokens; `None` when the body reports no usage.
pub fn usage_charge(reserved: &[u64], body: &[u8]) -> Option<Vec<u64>> {
    priced_charge(reserved, body, None)
}

/// [`usage_charge`], and for a reservation with a money dimension ([`MONEY`]), what the
/// usage cost at the price `prices` gives the answer's model (kept as reserved when the
/// table does not price it).
fn priced_charge(
    reserved: &[u64],
    body: &[u8],
    prices: Option<&ratebucket_http::price::Prices>,
) -> Option<Vec<u64>> {
    /// Only the usage and the model: the content is skipped, not decoded.
    #[derive(serde::Deserialize)]
    struct Reported {
        usage: Option<Usage>,
        #[serde(default)]
        model: String,
    }
    let reported = serde_json::from_slice::<Reported>(body).ok()?;
    let price = prices.and_then(|p| p.price(&reported.model));
    Some(charge_of(reserved, reported.usage?, price))
}

/// The charge of a call that reserved `reserved` and used `usage`, its money at `price`.
pub(crate) fn charge_of(
    reserved: &[u64],
    usage: Usage,
    price: Option<ratebucket_http::price::Price>,
) -> Vec<u64> {
    let mut actual = reserved.to_vec();
    if let (Some(money), Some(price)) = (actual.get_mut(MONEY), price) {
        *money = price.of(&usage);
    }
    if let Some(input) = actual.get_mut(INPUT_TOKENS) {
        *input = usage.counted_input();
    }
    if let Some(output) = actual.get_mut(OUTPUT_TOKENS) {
        *output = usage.output_tokens;
    }
    if let Some(tokens) = actual.get_mut(TOKENS) {
        *tokens = usage.counted_input().saturating_add(usage.output_tokens);
    }
    actual
}

/// Anthropic's knowledge for the [`Fetcher`](ratebucket_http::Fetcher): classification of
/// error bodies (529 and the overloaded error are throttles; spend and usage limits a
/// spent quota), a learning policy for each of the four dimensions, the reading of its
/// `anthropic-ratelimit-*` headers into one quota report per dimension (`tokens-*` on
/// [`TOKENS`] where it is a limit of its own, sent beside `requests-*` alone; beside the
/// input and output families it is only the most restrictive of them, and is not read),
/// and the charge an answer's `usage` reports. Pure: it keeps no state and never sees the
/// limiter.
#[derive(Clone, Debug)]
pub struct AnthropicVendor {
    limits: Limits,
    reconcile: bool,
    /// The models' prices, for a charge in money ([`MONEY`]).
    prices: Option<std::sync::Arc<ratebucket_http::price::Prices>>,
}

impl AnthropicVendor {
    /// Knowledge for a client configured with `limits`.
    pub fn new(limits: Limits) -> AnthropicVendor {
        AnthropicVendor { limits, reconcile: true, prices: None }
    }

    /// Charges a reservation with a money dimension ([`MONEY`]) what the answer's usage
    /// cost at these prices (its model's, by
    /// [`Prices::price`](ratebucket_http::price::Prices::price)).
    pub fn prices(
        mut self,
        prices: Option<std::sync::Arc<ratebucket_http::price::Prices>>,
    ) -> AnthropicVendor {
        self.prices = prices;
        self
    }

    /// Whether a successful answer is charged the usage its body reports (on by default).
    /// Off: every request is charged as reserved.
    pub fn reconcile(mut self, on: bool) -> AnthropicVendor {
        self.reconcile = on;
        self
    }

    /// The per-minute limits in force on `limiter`: those configured, or lowered or
    /// adopted from headers.
    pub fn limits(&self, limiter: &Limiter) -> Limits {
        let current = |d: usize| {
            limiter
                .dimension(d)
                .and_then(|v| v.state.learned)
                .map_or(self.limits.configured(d), |l| l.limit)
        };
        Limits {
            requests_per_minute: current(REQUESTS),
            input_tokens_per_minute: current(INPUT_TOKENS),
            output_tokens_per_minute: current(OUTPUT_TOKENS),
            tokens_per_minute: current(TOKENS),
            ..self.limits
        }
    }

    fn policy(&self, dimension: usize) -> QuotaPolicy {
        // Anthropic documents its limits as continuous buckets: its word is taken from the
        // first report that agrees, until one contradicts it.
        let policy = match self.limits.configured(dimension) {
            Some(limit) => QuotaPolicy::known(limit, self.limits.window),
            None => QuotaPolicy::unknown(self.limits.window),
        }
        .documented_bucket();
        if self.limits.provider_burst { policy } else { policy.conservative() }
    }
}

impl Vendor for AnthropicVendor {
    fn verdict(&self, status: StatusCode, _headers: &HeaderMap, body: &[u8]) -> Option<Verdict> {
        if dialect::ANTHROPIC.throttles(status) {
            return Some(Verdict::Throttled);
        }
        verdict_for(body)
    }

    fn retry_hint(&self, body: &[u8]) -> Option<Duration> {
        retry_hint_at(body, SystemTime::now())
    }

    fn policies(&self) -> Vec<(usize, QuotaPolicy)> {
        [REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS, TOKENS].map(|d| (d, self.policy(d))).to_vec()
    }

    fn reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        let readings = dialect::ANTHROPIC.read(response.headers, SystemTime::now());
        // Beside the input and output families, `tokens-*` is the most restrictive of
        // them: nothing of its own. Alone, it is the server's combined limit.
        let split = readings
            .iter()
            .any(|r| matches!(r.counts.unit, Unit::InputTokens | Unit::OutputTokens));
        readings
            .into_iter()
            .filter_map(|reading| {
                let dimension = match reading.counts.unit {
                    Unit::Requests => REQUESTS,
                    Unit::InputTokens => INPUT_TOKENS,
                    Unit::OutputTokens => OUTPUT_TOKENS,
                    Unit::Tokens if !split => TOKENS,
                    _ => return None,
                };
                let mut quota: QuotaReport = reading.report();
                if reading.counts.per == Per::Day {
                    quota.window = Some(DAY);
                }
                Some(Report { dimension, quota })
            })
            .collect()
    }

    fn charge(
        &self,
        reserved: &[u64],
        response: &http::Response<bytes::Bytes>,
    ) -> Option<Vec<u64>> {
        self.reconcile
            .then(|| priced_charge(reserved, response.body(), self.prices.as_deref()))
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: &str, message: &str) -> Vec<u8> {
        serde_json::json!({"type": "error", "error": {"type": kind, "message": message}})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn each_error_body_maps_to_its_verdict() {
        let vendor = AnthropicVendor::new(Limits::unknown());
        let empty = HeaderMap::new();
        let overloaded = StatusCode::from_u16(529).expect("status");
        assert_eq!(vendor.verdict(overloaded, &empty, b"not json"), Some(Verdict::Throttled));
        for (kind, message, verdict) in [
            ("rate_limit_error", "slow down", Some(Verdict::Throttled)),
            ("overloaded_error", "Overloaded", Some(Verdict::Throttled)),
            ("authentication_error", "invalid x-api-key", Some(Verdict::Fatal)),
            ("permission_error", "no", Some(Verdict::Fatal)),
            ("request_too_large", "too big", Some(Verdict::Permanent)),
            (
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API.",
                Some(Verdict::Spent),
            ),
            (
                "invalid_request_error",
                "You have reached your specified API usage limits. You will regain access on \
                 2027-01-01 at 00:00 UTC.",
                Some(Verdict::Spent),
            ),
            ("invalid_request_error", "messages: Field required", None),
            ("api_error", "Internal server error", None),
        ] {
            assert_eq!(
                vendor.verdict(StatusCode::BAD_REQUEST, &empty, &error(kind, message)),
                verdict,
                "{kind}"
            );
        }
    }

    #[test]
    fn a_spend_cap_is_spent_and_a_plain_rate_limit_a_throttle() {
        let capped = serde_json::json!({"type": "error", "error": {
            "type": "rate_limit_error",
            "message": "You have reached your monthly spend limit.",
            "details": {"error_code": "enforced_spend_limit_reached"},
        }})
        .to_string();
        assert_eq!(verdict_for(capped.as_bytes()), Some(Verdict::Spent));
        let busy =
            error("rate_limit_error", "Number of request tokens has exceeded your rate limit");
        assert_eq!(verdict_for(&busy), Some(Verdict::Throttled));
    }

    #[test]
    fn a_usage_limit_says_when_access_comes_back() {
        let body = error(
            "invalid_request_error",
            "You have reached your specified API usage limits. You will regain access on \
             2023-10-01 at 00:00 UTC.",
        );
        // The reference's now: 29 Sep 2023 16:26:37 UTC.
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_696_004_797);
        let until = Duration::from_secs(1_696_118_400 - 1_696_004_797);
        assert_eq!(retry_hint_at(&body, now), Some(until));
        let days = error("rate_limit_error", "Monthly usage limit reached. Resets in 16 days.");
        assert_eq!(retry_hint_at(&days, now), Some(Duration::from_secs(16 * 86_400)));
        assert_eq!(retry_hint_at(&error("api_error", "oops"), now), None);
    }

    #[test]
    fn the_usage_charges_input_without_cache_reads_and_output() {
        let body = br#"{"usage":{"input_tokens":12,"output_tokens":30,"cache_creation_input_tokens":5,"cache_read_input_tokens":400}}"#;
        assert_eq!(usage_charge(&[1, 100, 500], body), Some(vec![1, 17, 30]));
        assert_eq!(
            usage_charge(&[1, 100, 500, 600], body),
            Some(vec![1, 17, 30, 47]),
            "input and output together"
        );
        assert_eq!(usage_charge(&[1, 100, 500], b"{}"), None);
    }

    /// A server sending requests and tokens alone: `tokens` is its combined limit.
    #[test]
    fn tokens_alone_report_on_the_combined_dimension() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("anthropic-ratelimit-requests-limit", "600"),
            ("anthropic-ratelimit-requests-remaining", "599"),
            ("anthropic-ratelimit-tokens-limit", "60000"),
            ("anthropic-ratelimit-tokens-remaining", "60000"),
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
        let reports = AnthropicVendor::new(Limits::unknown()).reports(&head);
        let dimensions: Vec<usize> = reports.iter().map(|r| r.dimension).collect();
        assert_eq!(dimensions, [REQUESTS, TOKENS]);
    }

    #[test]
    fn each_family_reports_on_its_dimension_and_tokens_on_none() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-input-tokens-limit", "40000"),
            ("anthropic-ratelimit-input-tokens-remaining", "39000"),
            ("anthropic-ratelimit-output-tokens-limit", "8000"),
            ("anthropic-ratelimit-output-tokens-remaining", "8000"),
            ("anthropic-ratelimit-tokens-limit", "8000"),
            ("anthropic-ratelimit-tokens-remaining", "8000"),
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
        let reports = AnthropicVendor::new(Limits::unknown()).reports(&head);
        let dimensions: Vec<usize> = reports.iter().map(|r| r.dimension).collect();
        assert_eq!(dimensions, [REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS]);
        assert_eq!(reports[1].quota.remaining, Some(39_000));
        assert_eq!(reports[1].quota.precision, 1000);
    }
}

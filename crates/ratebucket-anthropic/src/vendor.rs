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
/// The money dimension's index, for a client with a budget
/// ([`ClientBuilder::budget`](crate::ClientBuilder::budget)): micro-dollars.
pub const MONEY: usize = 3;

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

    /// Nothing known: the first reply's headers will tell.
    pub fn unknown() -> Limits {
        Limits::default()
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

    /// The limit of each dimension, in order (requests, input tokens, output tokens): what
    /// a limiter for these limits enforces when it starts. Known limits refill at the
    /// limit with a sixth of it as burst; unknown ones start at one request a second, the
    /// tokens unpaced, until the provider's headers say more.
    pub fn per_dimension(&self) -> [Limit; 3] {
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
        ]
    }

    /// The limit configured for `dimension`.
    fn configured(&self, dimension: usize) -> Option<u64> {
        match dimension {
            REQUESTS => self.requests_per_minute,
            INPUT_TOKENS => self.input_tokens_per_minute,
            _ => self.output_tokens_per_minute,
        }
    }
}

/// Reads an Anthropic error body into a verdict: `rate_limit_error` and
/// `overloaded_error` are throttles; an account that cannot pay (a 400 whose message says
/// the credit balance is too low), `authentication_error` and `permission_error` are fatal;
/// `request_too_large` fails that request only; anything else is left to the status.
pub fn verdict_for(body: &[u8]) -> Option<Verdict> {
    let error = serde_json::from_slice::<ErrorBody>(body).ok()?.error;
    match error.kind.as_str() {
        "rate_limit_error" | "overloaded_error" => Some(Verdict::Throttled),
        "authentication_error" | "permission_error" => Some(Verdict::Fatal),
        "request_too_large" => Some(Verdict::Permanent),
        "invalid_request_error" if error.message.contains("credit balance") => Some(Verdict::Fatal),
        _ => None,
    }
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
    actual
}

/// Anthropic's knowledge for the [`Fetcher`](ratebucket_http::Fetcher): classification of
/// error bodies (529 and the overloaded error are throttles), a learning policy for each
/// of the three dimensions, the reading of its `anthropic-ratelimit-*` headers into one
/// quota report per dimension (`tokens-*`, the most restrictive of the token limits, names
/// no dimension of its own and is not read), and the charge an answer's `usage` reports.
/// Pure: it keeps no state and never sees the limiter.
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
        AnthropicVendor {
            limits,
            reconcile: true,
            prices: None,
        }
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
            ..self.limits
        }
    }

    fn policy(&self, dimension: usize) -> QuotaPolicy {
        let policy = match self.limits.configured(dimension) {
            Some(limit) => QuotaPolicy::known(limit, self.limits.window),
            None => QuotaPolicy::unknown(self.limits.window),
        };
        if self.limits.provider_burst {
            policy
        } else {
            policy.conservative()
        }
    }
}

impl Vendor for AnthropicVendor {
    fn verdict(&self, status: StatusCode, _headers: &HeaderMap, body: &[u8]) -> Option<Verdict> {
        if dialect::ANTHROPIC.throttles(status) {
            return Some(Verdict::Throttled);
        }
        verdict_for(body)
    }

    fn policies(&self) -> Vec<(usize, QuotaPolicy)> {
        [REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS]
            .map(|d| (d, self.policy(d)))
            .to_vec()
    }

    fn reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        dialect::ANTHROPIC
            .read(response.headers, SystemTime::now())
            .into_iter()
            .filter_map(|reading| {
                let dimension = match reading.counts.unit {
                    Unit::Requests => REQUESTS,
                    Unit::InputTokens => INPUT_TOKENS,
                    Unit::OutputTokens => OUTPUT_TOKENS,
                    // The most restrictive of the others: nothing of its own.
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
        assert_eq!(
            vendor.verdict(overloaded, &empty, b"not json"),
            Some(Verdict::Throttled)
        );
        for (kind, message, verdict) in [
            ("rate_limit_error", "slow down", Some(Verdict::Throttled)),
            ("overloaded_error", "Overloaded", Some(Verdict::Throttled)),
            (
                "authentication_error",
                "invalid x-api-key",
                Some(Verdict::Fatal),
            ),
            ("permission_error", "no", Some(Verdict::Fatal)),
            ("request_too_large", "too big", Some(Verdict::Permanent)),
            (
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API.",
                Some(Verdict::Fatal),
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
    fn the_usage_charges_input_without_cache_reads_and_output() {
        let body = br#"{"usage":{"input_tokens":12,"output_tokens":30,"cache_creation_input_tokens":5,"cache_read_input_tokens":400}}"#;
        assert_eq!(usage_charge(&[1, 100, 500], body), Some(vec![1, 17, 30]));
        assert_eq!(usage_charge(&[1, 100, 500], b"{}"), None);
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

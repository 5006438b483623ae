//! What the observability tests share: a server that throttles once, a named limiter, and
//! one call through the Fetcher.

use std::time::Duration;

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport, Vendor};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{ArbiterConfig, GateConfig, Limit, RetryPolicy};
use ratebucket_sim::{Scripted, Step};

/// A server that throttles its first request (no Retry-After; nothing of its 1,000
/// requests remaining) and answers the rest with a reported usage of 40 tokens, and a quota
/// of requests (`x-ratelimit-limit: 1000`, `x-ratelimit-remaining: 990`).
pub(crate) fn throttles_once() -> ratebucket_sim::ScriptedHandle {
    Scripted::start(|n, _| {
        if n == 0 {
            let headers = [("x-ratelimit-limit", "1000"), ("x-ratelimit-remaining", "0")];
            vec![Step::json(429, &headers, r#"{"error":{"message":"slow down"}}"#)]
        } else {
            let headers = [
                ("x-used-tokens", "40"),
                ("x-ratelimit-limit", "1000"),
                ("x-ratelimit-remaining", "990"),
            ];
            vec![Step::json(200, &headers, "{}")]
        }
    })
    .expect("scripted server")
}

/// Requests and tokens, roomy, with a short default pause.
pub(crate) fn paced() -> Limiter {
    let config = ArbiterConfig::default().with_gate(GateConfig {
        default_pause: Duration::from_millis(50),
        ..GateConfig::default()
    });
    let limits =
        [Limit::per_second(1_000).named("requests"), Limit::per_second(100_000).named("tokens")];
    Limiter::from_limits(limits, config, ratebucket_tokio::TokioTimer::current())
        .expect("limiter")
        .with_name("scripted/api")
}

/// The scripted server's dialect: the tokens a response used, in `x-used-tokens`.
pub(crate) struct UsedTokens;

impl Vendor for UsedTokens {
    fn charge(&self, _reserved: &[u64], response: &http::Response<Bytes>) -> Option<Vec<u64>> {
        let tokens = response.headers().get("x-used-tokens")?.to_str().ok()?;
        Some(vec![1, tokens.parse().ok()?])
    }
}

pub(crate) fn fetcher(limiter: Limiter) -> Fetcher<HyperTransport, UsedTokens> {
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    let config = FetchConfig::default().retry(retry);
    Fetcher::with_vendor(HyperTransport::default(), limiter, config, UsedTokens)
}

/// One call, 100 tokens reserved and 40 used.
pub(crate) async fn call(fetcher: &Fetcher<HyperTransport, UsedTokens>, base: &str) {
    let request = http::Request::post(format!("{base}/")).body(Bytes::new()).expect("request");
    let fetched = fetcher
        .fetch_costed(&[1, 100], |_| ratebucket_http::copy_request(&request))
        .await
        .expect("succeeds on the second attempt");
    assert_eq!(fetched.charged, Some(vec![1, 40]));
}

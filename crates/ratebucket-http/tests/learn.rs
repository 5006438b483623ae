//! Any API that reports its quota is learned: a Fetcher with `FetchConfig::learn` adopts an
//! unknown limit from IETF `RateLimit` / `RateLimit-Policy` fields or from unsuffixed
//! `x-ratelimit-*` headers, through the limiter's one learning input.

use std::time::Duration;

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{Instant, Limit, QuotaPolicy, Rate};
use ratebucket_sim::{Headers, Latency, LimitSpec, Sim, SimConfig, SimHandle};

const WINDOW: Duration = Duration::from_secs(2);
const LIMIT: u64 = 40;

fn request(sim: &SimHandle, i: usize) -> http::Request<Bytes> {
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": format!("request {i}")}],
        "max_tokens": 16,
    });
    http::Request::post(format!("{}/v1/chat/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(Bytes::from(body.to_string()))
        .expect("valid request")
}

/// Runs `n` fetches against a provider of `LIMIT` requests per `WINDOW` (a bucket that
/// starts full) sending `headers`, from a limiter that knows nothing: one request per
/// second, one at a time, learning under a policy over `window`. Returns the limiter and
/// the provider's log.
async fn learn_over(window: Duration, headers: Headers, n: usize) -> (Limiter, SimHandle) {
    let provider = LimitSpec::per_minute(LIMIT).window(WINDOW);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(provider)
            .headers(headers)
            .latency(Latency::Fixed(Duration::from_millis(2))),
    )
    .expect("sim starts");
    let cautious = Limit::per_second(1).bucket(Instant::ZERO).expect("bucket");
    let limiter = ratebucket_tokio::limiter(vec![cautious]).expect("limiter");
    let config = FetchConfig::default()
        .learn(QuotaPolicy::unknown(window))
        .read_timeout(Duration::from_secs(5));
    let fetcher =
        Fetcher::new(HyperTransport::new(Duration::from_secs(5)), limiter.clone(), config);
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let fetcher = fetcher.clone();
            let request = request(&sim, i);
            tokio::spawn(async move { fetcher.fetch(request).await.map(|f| f.attempts) })
        })
        .collect();
    for task in tasks {
        task.await.expect("task").expect("every fetch succeeds");
    }
    (limiter, sim)
}

/// [`learn_over`] the provider's own window.
async fn learn_from(headers: Headers, n: usize) -> (Limiter, SimHandle) {
    learn_over(WINDOW, headers, n).await
}

fn assert_learned(limiter: &Limiter, sim: &SimHandle, n: usize) {
    let learned =
        limiter.dimension(0).and_then(|v| v.state.learned).expect("the fetcher set a policy");
    assert_eq!(learned.limit, Some(LIMIT), "{learned:?}");
    let rate = limiter.snapshot().dimensions[0].state.rate;
    assert_eq!(rate, Rate::new(LIMIT, WINDOW).unwrap());
    let log = sim.log();
    assert_eq!(log.len(), n);
    let throttled = log.iter().filter(|e| e.refusal.is_some()).count();
    assert_eq!(throttled, 0, "no 429 at the learned limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_limit_is_learned_from_ietf_ratelimit_fields() {
    // Unlearned, 80 requests at one per second would take 80 s (past the test's patience);
    // learned, they take about three.
    let (limiter, sim) = learn_from(Headers::Ietf, 80).await;
    assert_learned(&limiter, &sim, 80);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_limit_is_learned_from_unsuffixed_x_ratelimit_headers() {
    let (limiter, sim) = learn_from(Headers::Plain, 80).await;
    assert_learned(&limiter, &sim, 80);
}

/// The policy says a minute, the provider's `RateLimit-Policy` says `w=2`: the limit is
/// learned over the provider's window. Read over the policy's, 40 a minute, the 80 requests
/// would take two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_in_ratelimit_policy_is_the_one_learned() {
    let (limiter, sim) = learn_over(Duration::from_secs(60), Headers::Ietf, 80).await;
    let learned =
        limiter.dimension(0).and_then(|v| v.state.learned).expect("the fetcher set a policy");
    assert_eq!(learned.window, WINDOW, "{learned:?}");
    assert_learned(&limiter, &sim, 80);
}

/// A gateway writing its reset as an RFC 3339 instant or an HTTP-date (in whole seconds):
/// read as the wait until then, not ignored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_written_as_a_date_is_read() {
    for headers in [Headers::PlainRfc3339, Headers::PlainHttpDate] {
        let (limiter, sim) = learn_from(headers, 20).await;
        assert_learned(&limiter, &sim, 20);
        let reported = limiter.snapshot().dimensions[0].state.reported.expect("a report");
        let resets_at = reported.resets_at.expect("its reset was read");
        // The bucket of 2 s is full again within its window (a second's resolution).
        let ahead = resets_at.saturating_duration_since(reported.at);
        assert!(ahead <= WINDOW + Duration::from_secs(1), "{headers:?}: {ahead:?}");
    }
}

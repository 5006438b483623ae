//! The Fetcher against the fake provider on a real socket: pacing, the gate, and every
//! fault kind with its class, attempt count and released reservation.

use std::time::{Duration, Instant};

use bytes::Bytes;
use ratebucket_http::{FetchConfig, FetchError, FetchErrorKind, Fetcher, HyperTransport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{
    Adapt, ArbiterConfig, Class, FailureKind, Instant as CoreInstant, MAX_LIMIT, Rate, RetryPolicy,
    StopReason, TokenBucket,
};
use ratebucket_sim::{Fault, Latency, LimitSpec, Refusal, Sim, SimConfig, SimHandle, Trigger};

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

fn limiter(rate: Rate, capacity: u64) -> Limiter {
    let bucket =
        TokenBucket::new(rate, capacity, ratebucket_rt::core::Instant::ZERO).expect("bucket");
    ratebucket_tokio::limiter(vec![bucket]).expect("limiter")
}

/// A bucket that never refills during a test: its level moves only by grants and refunds.
fn frozen(capacity: u64) -> Limiter {
    limiter(Rate::new(1, Duration::from_nanos(MAX_LIMIT)).expect("rate"), capacity)
}

/// The frozen bucket still refills a few billionths of a permit per millisecond.
fn assert_level(limiter: &Limiter, expected: f64, why: &str) {
    let level = limiter.dimension(0).map(|v| v.state.level).expect("dimension 0");
    assert!((level - expected).abs() < 1e-3, "{why}: level {level}, expected {expected}");
}

fn fast_retries() -> RetryPolicy {
    let mut policy = RetryPolicy::default();
    policy.base_backoff = Duration::from_millis(2);
    policy.max_backoff = Duration::from_millis(10);
    policy
}

/// A fetcher whose timeouts are long enough that a loaded machine, slow to accept and
/// answer a few hundred connections at once, is never taken for a stalled provider (the
/// tests of stalls and timeouts set their own, short ones).
fn fetcher(limiter: Limiter) -> Fetcher<HyperTransport> {
    let config = FetchConfig::default().retry(fast_retries()).read_timeout(Duration::from_secs(5));
    Fetcher::new(HyperTransport::new(Duration::from_secs(5)), limiter, config)
}

fn sim(config: SimConfig) -> SimHandle {
    Sim::start(config.latency(Latency::Fixed(Duration::from_millis(2)))).expect("sim starts")
}

fn gate_closures(limiter: &Limiter) -> u64 {
    limiter.snapshot().pauses
}

async fn fetch_all(
    fetcher: &Fetcher<HyperTransport>,
    sim: &SimHandle,
    n: usize,
) -> Vec<Result<u32, FetchError>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let fetcher = fetcher.clone();
            let request = request(sim, i);
            tokio::spawn(async move { fetcher.fetch(request).await.map(|f| f.attempts) })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_fetches_at_the_providers_own_limit_meet_no_429() {
    // The provider: 120 requests per 2 s, a token bucket that starts full (as OpenAI's).
    let provider = LimitSpec::per_minute(120).window(Duration::from_secs(2));
    let sim = sim(SimConfig::default().rpm(provider));
    let limiter = limiter(Rate::new(120, Duration::from_secs(2)).expect("rate"), 20);
    let fetcher = fetcher(limiter);
    let start = Instant::now();
    let results = fetch_all(&fetcher, &sim, 200).await;
    let elapsed = start.elapsed();
    assert!(results.iter().all(|r| matches!(r, Ok(1))), "every fetch succeeds at once");
    let log = sim.log();
    assert_eq!(log.len(), 200);
    assert!(log.iter().all(|e| e.refusal.is_none()), "zero 429s");
    // Paced, not burst: 20 at once, then 60 per second.
    assert!(elapsed >= Duration::from_millis(2_900), "{elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_below_the_configured_limit_closes_the_gate_once_per_wave() {
    // The provider allows 50 per second (a bucket of 50); the client was told six times
    // that, with a burst of 100: its first wave meets a wall of 429s.
    let provider = LimitSpec::per_minute(50).window(Duration::from_secs(1));
    // The provider takes 100 ms to decide, so the first wave is sent before a 429 is back.
    let sim = sim(SimConfig::default().rpm(provider).decision_delay(Duration::from_millis(100)));
    // Probing back over one provider window, so the run sees the climb meet the wall again.
    let bucket = TokenBucket::new(Rate::per_second(300).expect("rate"), 100, CoreInstant::ZERO)
        .expect("bucket");
    let adapt = Adapt::default().with_probe(Duration::from_secs(1));
    let config = ArbiterConfig::default().with_adapt(Some(adapt));
    let limiter = ratebucket_tokio::limiter_with(vec![bucket], config).expect("limiter");
    let fetcher = fetcher(limiter.clone());
    let results = fetch_all(&fetcher, &sim, 400).await;
    let errors: Vec<String> =
        results.iter().filter_map(|r| r.as_ref().err()).map(ToString::to_string).collect();
    assert!(errors.is_empty(), "every fetch still completes: {errors:?}");
    let throttled = sim.log().iter().filter(|e| e.refusal == Some(Refusal::Requests)).count();
    assert!(throttled >= 30, "the first wave alone met {throttled} 429s");
    // The first 429 to come back closed the gate. The rest of the first wave, sent before
    // it, is stale and cannot close it again: every further pause needs a 429 to a request
    // sent after the first pause began.
    let log = sim.log();
    let first_429 = log
        .iter()
        .filter(|e| e.refusal.is_some())
        .filter_map(|e| e.finished)
        .min()
        .expect("answered");
    let later_429s =
        log.iter().filter(|e| e.refusal.is_some() && e.arrived > first_429).count() as u64;
    let closures = gate_closures(&limiter);
    assert!(
        (1..=1 + later_429s).contains(&closures),
        "{closures} pauses, but only {later_429s} 429s came after the first wave"
    );
    assert_eq!(limiter.stats().late_wakeups, 0);
    // After the window that found the wall, the rate climbs back by time, not by
    // successes: the wall is touched again gently, a few 429s a window at most.
    let mut per_window = std::collections::BTreeMap::new();
    for entry in log.iter().filter(|e| e.refusal.is_some()) {
        *per_window.entry(entry.arrived.as_secs()).or_insert(0u32) += 1;
    }
    for (&window, &count) in per_window.range(1..) {
        assert!(count <= 5, "{count} 429s in window {window}: {per_window:?}");
    }
}

async fn one(
    fault: Fault,
    policy: Option<RetryPolicy>,
) -> (SimHandle, Limiter, Result<u32, FetchError>) {
    one_on(frozen(1_000), fault, policy).await
}

/// [`one`] on a limiter of the caller's.
async fn one_on(
    limiter: Limiter,
    fault: Fault,
    policy: Option<RetryPolicy>,
) -> (SimHandle, Limiter, Result<u32, FetchError>) {
    let sim = sim(SimConfig::default().fault(fault, Trigger::Requests(vec![0])));
    let mut config = FetchConfig::default()
        .retry(policy.unwrap_or_else(fast_retries))
        .read_timeout(Duration::from_millis(300));
    config.fold_dimension = None;
    let fetcher =
        Fetcher::new(HyperTransport::new(Duration::from_millis(300)), limiter.clone(), config);
    let result = fetcher.fetch(request(&sim, 0)).await.map(|f| f.attempts);
    (sim, limiter, result)
}

fn failed(result: &Result<u32, FetchError>) -> &FetchError {
    result.as_ref().expect_err("should fail")
}

#[tokio::test]
async fn a_server_error_is_retried_and_only_the_success_is_charged() {
    let (sim, limiter, result) = one(Fault::Status(500), None).await;
    assert_eq!(result.expect("recovers"), 2);
    assert_eq!(sim.log().len(), 2);
    assert_level(&limiter, 999.0, "one committed, one released");
}

#[tokio::test]
async fn persistent_server_errors_exhaust_the_retries() {
    let sim = sim(SimConfig::default().fault(Fault::Status(502), Trigger::Rate(1.0)));
    let limiter = frozen(1_000);
    let result = fetcher(limiter.clone()).fetch(request(&sim, 0)).await;
    let error = result.expect_err("never succeeds");
    assert_eq!(error.class(), Some(Class::Retryable));
    assert!(matches!(error.kind(), FetchErrorKind::Failed(StopReason::RetriesExhausted)));
    assert_eq!(error.attempts(), 6, "the first try and five retries");
    assert_eq!(sim.log().len(), 6);
    assert_eq!(error.status().map(|s| s.as_u16()), Some(502));
    assert_level(&limiter, 1_000.0, "all released");
}

#[tokio::test]
async fn a_503_with_retry_after_pauses_the_pool_and_is_not_a_spent_retry() {
    let mut policy = fast_retries();
    policy.max_retries = 0;
    let overloaded = Fault::Overloaded { retry_after: Duration::from_millis(150) };
    let started = Instant::now();
    // A pause writes off the buckets (ADR 0006): this one refills, unlike `frozen`.
    let refilling = limiter(Rate::per_second(1_000).expect("rate"), 1_000);
    let (sim, limiter, result) = one_on(refilling, overloaded, Some(policy)).await;
    assert_eq!(result.expect("recovers after the pause"), 2);
    assert_eq!(gate_closures(&limiter), 1);
    assert!(started.elapsed() >= Duration::from_millis(150), "honoured retry-after-ms");
    assert_eq!(sim.log().len(), 2);
}

async fn ambiguous(fault: Fault, kind: FailureKind) {
    let (sim, limiter, result) = one(fault, None).await;
    let error = failed(&result);
    assert_eq!(error.class(), Some(Class::Ambiguous), "{fault:?}");
    assert_eq!(error.attempts(), 1, "{fault:?}: not re-sent");
    let source = std::error::Error::source(error).expect("the transport error");
    let transport =
        source.downcast_ref::<ratebucket_http::TransportError>().expect("a transport error");
    assert_eq!(transport.kind(), kind, "{fault:?}");
    assert_eq!(sim.log().len(), 1, "{fault:?}: the provider saw it once");
    // Sent, outcome unknown: the provider may have counted it, so it stays charged.
    assert_level(&limiter, 999.0, &format!("{fault:?}: charged as reserved"));
}

#[tokio::test]
async fn a_reset_after_send_is_ambiguous_and_not_resent() {
    ambiguous(Fault::ResetBeforeResponse, FailureKind::ResetAfterSend).await;
}

#[tokio::test]
async fn a_fetch_given_up_after_the_send_stays_charged() {
    let sim = sim(SimConfig::default()
        .fault(Fault::Stall { stall: Duration::from_secs(5) }, Trigger::Requests(vec![0])));
    let limiter = frozen(1_000);
    let fetcher = fetcher(limiter.clone());
    // The caller stops waiting (a timeout, `select!`, a client that hung up) while the
    // provider holds the request.
    let given_up =
        tokio::time::timeout(Duration::from_millis(200), fetcher.fetch(request(&sim, 0))).await;
    assert!(given_up.is_err(), "still waiting when dropped");
    assert_eq!(sim.log().len(), 1, "it was sent");
    assert_level(&limiter, 999.0, "sent, then dropped: charged as reserved");
}

#[tokio::test]
async fn a_stall_past_the_read_timeout_is_ambiguous_and_not_resent() {
    ambiguous(Fault::Stall { stall: Duration::from_secs(5) }, FailureKind::ReadTimeout).await;
}

#[tokio::test]
async fn a_body_cut_half_way_is_ambiguous_and_not_resent() {
    ambiguous(Fault::CutStream, FailureKind::BodyCut).await;
}

#[tokio::test]
async fn ambiguous_failures_are_resent_when_asked() {
    let policy = fast_retries().with_retry_ambiguous(true);
    let (sim, _limiter, result) = one(Fault::ResetBeforeResponse, Some(policy)).await;
    assert_eq!(result.expect("recovers"), 2);
    assert_eq!(sim.log().len(), 2);
}

#[tokio::test]
async fn a_401_aborts_the_run() {
    let (sim, limiter, result) = one(Fault::Unauthorized, None).await;
    let error = failed(&result);
    assert_eq!(error.class(), Some(Class::Fatal));
    assert!(matches!(error.kind(), FetchErrorKind::Aborted(_)));
    assert_eq!(error.attempts(), 1);
    assert!(limiter.snapshot().aborted);
    let fetcher = fetcher(limiter.clone());
    let next = fetcher.fetch(request(&sim, 1)).await.expect_err("aborted");
    assert!(matches!(next.kind(), FetchErrorKind::Limiter(_)));
    assert_eq!(sim.log().len(), 1, "nothing sent after the abort");
}

#[tokio::test]
async fn a_bad_request_fails_only_itself() {
    let sim = sim(SimConfig::default());
    let limiter = frozen(1_000);
    let fetcher = fetcher(limiter.clone());
    let bad = http::Request::post(format!("{}/v1/chat/completions", sim.base_url()))
        .body(Bytes::from_static(b"{not json"))
        .expect("request");
    let error = fetcher.fetch(bad).await.expect_err("400");
    assert_eq!(error.class(), Some(Class::Permanent));
    assert_eq!(error.attempts(), 1);
    assert!(!limiter.snapshot().aborted);
    assert!(fetcher.fetch(request(&sim, 1)).await.is_ok(), "the run goes on");
}

#[tokio::test]
async fn a_refused_connection_is_retried_because_it_never_reached_the_server() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let limiter = frozen(1_000);
    let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
        .body(Bytes::new())
        .expect("request");
    let error = fetcher(limiter.clone()).fetch(request).await.expect_err("nobody listens");
    assert_eq!(error.class(), Some(Class::Retryable));
    assert_eq!(error.attempts(), 6);
    let transport = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<ratebucket_http::TransportError>())
        .expect("a transport error");
    assert_eq!(transport.kind(), FailureKind::ConnectRefused);
    assert_level(&limiter, 1_000.0, "released after every attempt");
}

#[test]
fn fetches_run_on_smol_too() {
    let sim = sim(SimConfig::default().rpm(LimitSpec::per_minute(600)));
    smol::block_on(async {
        let bucket = TokenBucket::new(
            Rate::per_second(100).expect("rate"),
            10,
            ratebucket_rt::core::Instant::ZERO,
        )
        .expect("bucket");
        let limiter = ratebucket_smol::limiter(vec![bucket]).expect("limiter");
        let fetcher = Fetcher::new(
            ratebucket_http::SmolTransport::default(),
            limiter,
            FetchConfig::default(),
        );
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let fetcher = fetcher.clone();
                let request = request(&sim, i);
                smol::spawn(async move { fetcher.fetch(request).await })
            })
            .collect();
        for t in tasks {
            let fetched = t.await.expect("fetched");
            assert_eq!(fetched.response.status(), 200);
        }
    });
    assert_eq!(sim.log().len(), 20);
}

fn deadline_policy(limiter: &Limiter, after: Duration) -> RetryPolicy {
    fast_retries().with_deadline(limiter.now() + after)
}

#[tokio::test]
async fn a_throttle_without_retry_after_is_not_retried_past_the_deadline() {
    let server = ratebucket_sim::Scripted::start(|n, _| {
        if n == 0 {
            vec![ratebucket_sim::Step::json(429, &[], "{}")]
        } else {
            vec![ratebucket_sim::Step::json(200, &[], "{}")]
        }
    })
    .expect("scripted server");
    let limiter = limiter(Rate::per_second(1_000).expect("rate"), 1_000);
    // The gate's default pause (1 s) ends after the deadline (500 ms).
    let config =
        FetchConfig::default().retry(deadline_policy(&limiter, Duration::from_millis(500)));
    let fetcher = Fetcher::new(HyperTransport::default(), limiter.clone(), config);
    let started = Instant::now();
    let request =
        http::Request::post(format!("{}/", server.base_url())).body(Bytes::new()).expect("request");
    let error = fetcher.fetch(request).await.expect_err("past the deadline");
    assert!(
        matches!(error.kind(), FetchErrorKind::Aborted(StopReason::DeadlineExhausted)),
        "{error}"
    );
    assert_eq!(server.requests(), 1, "no attempt starts after the deadline");
    assert!(started.elapsed() < Duration::from_millis(500), "gave up at once");
}

#[tokio::test]
async fn time_queued_in_the_limiter_counts_against_the_deadline() {
    let sim = sim(SimConfig::default());
    let limiter = limiter(Rate::per_second(1).expect("rate"), 1);
    let _held = limiter.reserve(&[1]).await.expect("the only permit");
    let config =
        FetchConfig::default().retry(deadline_policy(&limiter, Duration::from_millis(300)));
    let fetcher = Fetcher::new(HyperTransport::default(), limiter.clone(), config);
    let started = Instant::now();
    let error = fetcher.fetch(request(&sim, 0)).await.expect_err("queued past it");
    assert!(matches!(error.kind(), FetchErrorKind::Limiter(_)), "{error}");
    assert!(started.elapsed() < Duration::from_millis(900), "{:?}", started.elapsed());
    assert!(sim.log().is_empty(), "nothing sent");
}

#[tokio::test]
async fn a_url_the_transport_cannot_speak_is_a_configuration_error_before_anything_is_reserved() {
    let sim = sim(SimConfig::default());
    let port = sim.addr().port();
    let urls = [
        format!("ftp://127.0.0.1:{port}/v1/chat/completions"),
        "/v1/chat/completions".to_owned(),
        format!("127.0.0.1:{port}"),
    ];
    for url in urls {
        let limiter = frozen(3);
        let fetcher = fetcher(limiter.clone());
        let request = http::Request::post(url.as_str()).body(Bytes::new()).expect("parses");
        let error = fetcher.fetch(request).await.expect_err(&url);
        assert!(matches!(error.kind(), FetchErrorKind::Config(_)), "{url}: {error}");
        assert_eq!(error.attempts(), 0, "{url}");
        assert_level(&limiter, 3.0, &url);
    }
    assert!(sim.log().is_empty(), "nothing reached the server");
}

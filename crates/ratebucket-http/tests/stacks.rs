//! The user's own stacks behind the same loop: a `reqwest::Client` as the transport, and
//! the tower layer around hyper-util's client, against the fake provider on 127.0.0.1.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use ratebucket_http::tower::PaceLayer;
use ratebucket_http::{FetchConfig, FetchErrorKind, Fetcher, ReqwestTransport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{Class, GateConfig, Limit, MAX_LIMIT, Rate, RetryPolicy};
use ratebucket_sim::{Fault, Sim, SimConfig, SimHandle, Trigger};
use tower::{Layer, ServiceExt};

fn body(i: usize) -> Bytes {
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": format!("request {i}")}],
        "max_tokens": 16,
    });
    Bytes::from(body.to_string())
}

fn post(sim: &SimHandle, i: usize) -> http::Request<Bytes> {
    http::Request::post(format!("{}/v1/chat/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(body(i))
        .expect("request")
}

/// A limiter whose level moves only by grants and refunds, and whose gate pauses 20 ms
/// when a 429 names no wait.
fn frozen(capacity: u64) -> Limiter {
    let gate = GateConfig {
        default_pause: Duration::from_millis(20),
        max_pause: Duration::from_secs(120),
    };
    let slow = Rate::new(1, Duration::from_nanos(MAX_LIMIT)).expect("rate");
    ratebucket_tokio::Limiter::from_limits(
        [Limit::new(slow, capacity)],
        ratebucket_rt::core::ArbiterConfig::default().with_gate(gate),
        ratebucket_tokio::TokioTimer::current(),
    )
    .expect("limiter")
}

/// A limiter refilling a thousand a second, with the same gate: a pause writes off what
/// was granted before it, so a limiter that never refilled would never grant again.
fn refilling(capacity: u64) -> Limiter {
    let gate = GateConfig {
        default_pause: Duration::from_millis(20),
        max_pause: Duration::from_secs(120),
    };
    ratebucket_tokio::Limiter::from_limits(
        [Limit::per_second(1_000).with_capacity(capacity)],
        ratebucket_rt::core::ArbiterConfig::default().with_gate(gate),
        ratebucket_tokio::TokioTimer::current(),
    )
    .expect("limiter")
}

fn config() -> FetchConfig {
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    retry.max_backoff = Duration::from_millis(10);
    FetchConfig::default().retry(retry).read_timeout(Duration::from_millis(500))
}

fn level(limiter: &Limiter) -> f64 {
    limiter.dimension(0).map(|v| v.state.level).expect("dimension 0")
}

#[tokio::test]
async fn a_reqwest_client_is_paced_and_its_429s_pause_the_pool_once() {
    // The first three requests meet a 429 asking for 50 ms.
    let sim = Sim::start(SimConfig::default().fault(
        Fault::RateLimited { retry_after: Duration::from_millis(50) },
        Trigger::Requests(vec![0, 1, 2]),
    ))
    .expect("sim");
    let limiter = refilling(100);
    let fetcher =
        Fetcher::new(ReqwestTransport::new(reqwest::Client::new()), limiter.clone(), config());
    let calls: Vec<_> = (0..10)
        .map(|i| {
            let fetcher = fetcher.clone();
            let request = post(&sim, i);
            tokio::spawn(async move { fetcher.fetch(request).await })
        })
        .collect();
    for call in calls {
        let fetched = call.await.expect("task").expect("fetched");
        assert_eq!(fetched.response.status(), 200);
    }
    let log = sim.log();
    assert_eq!(log.iter().filter(|e| e.status == Some(200)).count(), 10);
    assert_eq!(log.iter().filter(|e| e.status == Some(429)).count(), 3);
    assert_eq!(log.len(), 13, "each throttled request sent once more");
    // The pool paused for them: at most once per 429 (once per wave; how many waves
    // three 429s make depends on when each request left).
    let closures = limiter.snapshot().pauses;
    assert!((1..=3).contains(&closures), "{closures} closures");
}

#[tokio::test]
async fn reqwest_failures_get_their_class() {
    let sim = Sim::start(
        SimConfig::default().fault(Fault::ResetBeforeResponse, Trigger::Requests(vec![0])),
    )
    .expect("sim");
    let limiter = frozen(100);
    let fetcher =
        Fetcher::new(ReqwestTransport::new(reqwest::Client::new()), limiter.clone(), config());
    // A reset after the request went out: ambiguous, not re-sent, charged.
    let error = fetcher.fetch(post(&sim, 0)).await.expect_err("reset");
    assert_eq!(error.class(), Some(Class::Ambiguous), "{error}");
    assert_eq!(sim.log().len(), 1);
    assert!((level(&limiter) - 99.0).abs() < 1e-3, "kept charged");

    // A refused connection never reached anyone: retried, then failed, nothing charged.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = closed.local_addr().expect("addr").port();
    drop(closed);
    let request = http::Request::get(format!("http://127.0.0.1:{port}/"))
        .body(Bytes::new())
        .expect("request");
    let error = fetcher.fetch(request).await.expect_err("refused");
    assert_eq!(error.class(), Some(Class::Retryable), "{error}");
    assert!(error.attempts() > 1, "retried");
    assert!((level(&limiter) - 99.0).abs() < 1e-3, "nothing more charged");
}

fn hyper_client() -> HyperClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    HyperClient::builder(TokioExecutor::new()).build_http()
}

#[tokio::test]
async fn the_tower_layer_paces_retries_and_passes_final_answers_on() {
    let sim = Sim::start(
        SimConfig::default()
            .fault(
                Fault::RateLimited { retry_after: Duration::from_millis(30) },
                Trigger::Requests(vec![0]),
            )
            .fault(Fault::Status(500), Trigger::Requests(vec![1])),
    )
    .expect("sim");
    let limiter = refilling(100);
    let service = PaceLayer::new(limiter.clone(), config())
        .cost(|request| vec![1 + u64::from(request.body().len() > 1_000)])
        .layer(hyper_client());
    // Throttled, then a 500, then answered: one call, three attempts.
    let request = post(&sim, 0).map(Full::new);
    let response = service.clone().oneshot(request).await.expect("answered");
    assert_eq!(response.status(), 200);
    assert_eq!(sim.log().len(), 3);

    // A final error answer is passed on as the upstream sent it, not turned into an error.
    let missing = http::Request::post(format!("{}/v1/nothing-here", sim.base_url()))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let response = service.clone().oneshot(missing).await.expect("passed on");
    assert_eq!(response.status(), 404);
    assert_eq!(sim.log().len(), 4, "a permanent answer is not re-sent");

    // The cost function decides the charge: on a limiter that never refills, a request
    // costed 2 takes two of its three permits, and the next one cannot go at once.
    let limiter = frozen(3);
    let service = PaceLayer::new(limiter.clone(), config())
        .cost(|request| vec![1 + u64::from(request.body().len() > 1_000)])
        .layer(hyper_client());
    let big = post(&sim, 1).map(|b| {
        let mut padded = b.to_vec();
        padded.extend(std::iter::repeat_n(b' ', 2_000));
        Full::new(Bytes::from(padded))
    });
    let _ = service.clone().oneshot(big).await.expect("answered");
    assert!((level(&limiter) - 1.0).abs() < 1e-3, "costed 2: {}", level(&limiter));
}

#[tokio::test]
async fn the_tower_layer_fails_only_when_there_is_no_answer() {
    let limiter = frozen(1);
    // More than the limiter could ever grant: refused before anything is sent.
    let service = PaceLayer::new(limiter, config().cost(vec![2])).layer(hyper_client());
    let request =
        http::Request::get("http://127.0.0.1:9/").body(Full::new(Bytes::new())).expect("request");
    let error = service.oneshot(request).await.expect_err("refused");
    assert!(matches!(error.kind(), FetchErrorKind::Limiter(_)), "{error}");
}

#[tokio::test]
async fn the_tower_layer_reads_a_body_that_arrives_later_whole() {
    use http_body_util::BodyExt;
    // The user's own service: answers with the length of the body it was sent.
    let upstream = tower::service_fn(|request: http::Request<axum::body::Body>| async move {
        let bytes = request.into_body().collect().await?.to_bytes();
        let answer = http::Response::new(Full::new(Bytes::from(bytes.len().to_string())));
        Ok::<_, axum::Error>(answer)
    });
    let service = PaceLayer::new(refilling(100), config()).layer(upstream);
    // Two chunks, the second a little later: not there when the call is made.
    let chunks = futures_lite::stream::unfold(0, |sent| async move {
        match sent {
            0 => Some((Ok::<_, std::io::Error>(Bytes::from_static(b"hello ")), 1)),
            1 => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                Some((Ok(Bytes::from_static(b"world")), 2))
            }
            _ => None,
        }
    });
    let request = http::Request::post("http://127.0.0.1:9/echo")
        .body(axum::body::Body::from_stream(chunks))
        .expect("request");
    let response = service.oneshot(request).await.expect("answered");
    let body = response.into_body().collect().await.expect("body").to_bytes();
    assert_eq!(&body[..], b"11", "the whole body was sent");
}

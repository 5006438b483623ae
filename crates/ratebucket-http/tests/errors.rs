//! One error for the caller: every way a fetch fails says, in one line, what happened and
//! what to do, keeps its cause as the error's source, and does not repeat it.

use std::error::Error;
use std::time::Duration;

use bytes::Bytes;
use ratebucket_http::{FetchConfig, FetchError, Fetcher, HyperTransport, Problem};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{ArbiterConfig, GateConfig, Limit, RetryPolicy};
use ratebucket_sim::{Scripted, Step};

fn limiter() -> Limiter {
    let config = ArbiterConfig::default()
        .with_gate(GateConfig { default_pause: Duration::from_millis(5), ..GateConfig::default() });
    let limits = [Limit::per_second(1_000).named("requests")];
    Limiter::from_limits(limits, config, ratebucket_tokio::TokioTimer::current()).expect("limiter")
}

fn fetcher() -> Fetcher<HyperTransport> {
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(1);
    retry.max_backoff = Duration::from_millis(2);
    retry.max_retries = 2;
    retry.max_throttles = 2;
    let config = FetchConfig::default().retry(retry).read_timeout(Duration::from_secs(2));
    Fetcher::new(HyperTransport::new(Duration::from_millis(500)), limiter(), config)
}

async fn fetch(fetcher: &Fetcher<HyperTransport>, url: &str, cost: u64) -> FetchError {
    let request = http::Request::post(url).body(Bytes::new()).expect("request");
    fetcher
        .fetch_costed(&[cost], |_| ratebucket_http::copy_request(&request))
        .await
        .expect_err("fails")
}

/// Every reply `step` gives.
fn always(step: Step) -> ratebucket_sim::ScriptedHandle {
    Scripted::start(move |_, _| vec![step.clone()]).expect("scripted server")
}

/// The contract of a caller-facing message.
fn assert_one_line_with_advice(error: &FetchError, problem: Problem) {
    assert_eq!(error.problem(), problem, "{error}");
    let message = error.to_string();
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(message.starts_with(problem.summary()), "{message}");
    assert!(message.ends_with(problem.advice()), "{message}");
    let mut cause = error.source();
    while let Some(e) = cause {
        let text = e.to_string();
        assert!(!message.contains(&text), "the cause ({text}) is not repeated in: {message}");
        cause = e.source();
    }
}

#[tokio::test]
async fn every_failure_is_one_line_of_what_happened_and_what_to_do() {
    let fetcher = fetcher();

    let ok = always(Step::json(200, &[], "{}"));
    let error = fetch(&fetcher, &format!("{}/", ok.base_url()), 5_000).await;
    assert_one_line_with_advice(&error, Problem::LimiterRefused);
    assert!(error.source().is_some(), "the limiter's refusal is the cause");

    let throttles = always(Step::json(429, &[], "{}"));
    let error = fetch(&fetcher, &format!("{}/", throttles.base_url()), 1).await;
    assert_one_line_with_advice(&error, Problem::Throttled);
    assert!(error.to_string().contains("last status 429"), "{error}");
    assert_eq!(error.limit(), None, "no limit named, none said");

    // A 429 naming its limit: the error says which, and what the provider said of it.
    let named = always(Step::json(
        429,
        &[
            ("x-ratelimit-limit", "60"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", "0.005"),
        ],
        "{}",
    ));
    let error = fetch(&fetcher, &format!("{}/", named.base_url()), 1).await;
    assert_one_line_with_advice(&error, Problem::Throttled);
    let limit = error.limit().expect("the limit is named");
    assert_eq!((&*limit.name, limit.limit, limit.remaining), ("requests", Some(60), Some(0)));
    assert!(
        error.to_string().contains("on requests (limit 60, 0 remaining, resets in 5.0ms)"),
        "{error}"
    );

    let unauthorized = always(Step::json(401, &[], r#"{"error":{"message":"bad key"}}"#));
    let error = fetch(&fetcher, &format!("{}/", unauthorized.base_url()), 1).await;
    assert_one_line_with_advice(&error, Problem::Fatal);
    fetcher.limiter().resume();

    let bad_request = always(Step::json(400, &[], "{}"));
    let error = fetch(&fetcher, &format!("{}/", bad_request.base_url()), 1).await;
    assert_one_line_with_advice(&error, Problem::Rejected);

    let resets = always(Step::Reset);
    let error = fetch(&fetcher, &format!("{}/", resets.base_url()), 1).await;
    assert_one_line_with_advice(&error, Problem::Ambiguous);
    assert!(error.source().is_some(), "the transport error is the cause");

    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}/", closed.local_addr().expect("address"));
    drop(closed);
    let error = fetch(&fetcher, &url, 1).await;
    assert_one_line_with_advice(&error, Problem::Unavailable);
    assert!(error.source().is_some(), "the connection error is the cause");

    let error = fetch(&fetcher, "ftp://127.0.0.1/", 1).await;
    assert_one_line_with_advice(&error, Problem::Config);

    // A port no socket can have is the URL's fault, found before anything is tried.
    let error = fetch(&fetcher, "http://127.0.0.1:99999/", 1).await;
    assert_one_line_with_advice(&error, Problem::Config);
    assert_eq!(error.attempts(), 0, "{error}");
    assert!(error.to_string().contains("99999"), "{error}");
    // One with a user and a password before the host is still a valid port.
    let answering = always(Step::json(200, &[], "{}"));
    let with_user = answering.base_url().replace("http://", "http://user:pass@");
    let request = http::Request::post(format!("{with_user}/")).body(Bytes::new()).expect("request");
    assert!(fetcher.fetch(request).await.is_ok());
}

#[tokio::test]
async fn a_run_stopped_by_a_fatal_failure_says_so_to_the_next_caller() {
    let fetcher = fetcher();
    let unauthorized = always(Step::json(401, &[], "{}"));
    let url = format!("{}/", unauthorized.base_url());
    assert_eq!(fetch(&fetcher, &url, 1).await.problem(), Problem::Fatal);
    let error = fetch(&fetcher, &url, 1).await;
    assert_one_line_with_advice(&error, Problem::Aborted);
}

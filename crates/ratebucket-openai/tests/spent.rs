//! Spent, busy or wrong, against the fake provider sending each: a spent quota fails every
//! call at once and sends no more, a provider that is only busy is retried with jitter,
//! and the waits written only in a refusal's words (Azure's, API Management's, a wait in
//! days) are read.

use std::time::{Duration, Instant};

use ratebucket_http::dialect::{self, Dialect};
use ratebucket_http::{FetchConfig, HyperTransport};
use ratebucket_openai::{ChatRequest, Client, Limits, Message, OpenAiError, Problem};
use ratebucket_rt::core::RetryPolicy;
use ratebucket_sim::{Fault, Latency, LimitSpec, Sim, SimConfig, SimHandle, Trigger};

/// A provider of 1,000 requests and 1,000,000 tokens a minute answering in 2 ms, with
/// `fault` on the requests `trigger` picks.
fn provider(fault: Fault, trigger: Trigger) -> SimHandle {
    Sim::start(
        SimConfig::default()
            .latency(Latency::Fixed(Duration::from_millis(2)))
            .rpm(LimitSpec::per_minute(1_000))
            .tpm(LimitSpec::per_minute(1_000_000))
            .fault(fault, trigger),
    )
    .expect("fake provider")
}

/// A client told the provider's limits (so nothing but a pause holds a call back).
fn client(sim: &SimHandle, dialect: &'static Dialect) -> Client<HyperTransport> {
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(20);
    retry.max_backoff = Duration::from_millis(40);
    Client::builder(sim.base_url())
        .api_key("sk-test")
        .limits(Limits::per_minute(1_000, 1_000_000))
        .dialect(dialect)
        .configure(|c| c.fetch(FetchConfig::default().retry(retry)))
        .build()
        .expect("client")
}

fn prompt(i: usize) -> ChatRequest {
    ChatRequest::new("sim-model", vec![Message::user(format!("Summarise {i}."))]).max_tokens(50)
}

/// OpenAI's billing and spend codes: spent until someone raises it, every later call
/// refused at once, nothing more sent.
#[tokio::test]
async fn a_spent_account_fails_every_call_at_once_and_sends_no_more() {
    for fault in [Fault::InsufficientQuota, Fault::SpendLimit, Fault::UsageLimit] {
        let sim = provider(fault, Trigger::Rate(1.0));
        let client = client(&sim, &dialect::OPENAI);
        let first = client.complete(prompt(0)).await.expect_err("spent");
        assert_eq!(first.problem(), Problem::QuotaSpent, "{fault:?}: {first}");
        let started = Instant::now();
        for i in 1..=20 {
            let error = client.complete(prompt(i)).await.expect_err("spent");
            assert_eq!(error.problem(), Problem::QuotaSpent, "{fault:?}: {error}");
            assert!(error.to_string().contains("until its limit is raised"), "{error}");
        }
        assert!(started.elapsed() < Duration::from_secs(2), "at once");
        assert_eq!(sim.log().len(), 1, "{fault:?}: one request met the refusal");
    }
}

/// A 429 whose `retry-after` is sixteen days: spent until then, said in days, not a pause
/// of the pool that long and not retried.
#[tokio::test]
async fn a_wait_of_days_is_spent_until_then() {
    let days = Duration::from_secs(16 * 86_400);
    let sim = provider(Fault::LongRetryAfter { retry_after: days }, Trigger::Rate(1.0));
    let client = client(&sim, &dialect::OPENAI);
    let first = client.complete(prompt(0)).await.expect_err("spent");
    assert_eq!(first.problem(), Problem::QuotaSpent, "{first}");
    let OpenAiError::Fetch(fetch) = &first else { panic!("{first:?}") };
    assert_eq!(fetch.resets_in(), Some(days));
    let next = client.complete(prompt(1)).await.expect_err("spent");
    assert!(next.to_string().contains("resets in 15d 23h"), "{next}");
    assert_eq!(sim.log().len(), 1, "nothing more was sent");
}

/// Groq's 498 `capacity_exceeded` is busy, not wrong: retried with jitter (no pause of the
/// pool), and the call succeeds.
#[tokio::test]
async fn groqs_capacity_exceeded_is_retried_with_jitter() {
    let sim = provider(Fault::CapacityExceeded, Trigger::FirstArrivals);
    let client = client(&sim, &dialect::GROQ);
    for i in 0..4 {
        client.complete(prompt(i)).await.expect("retried");
    }
    let log = sim.log();
    assert_eq!(log.iter().filter(|e| e.status == Some(498)).count(), 4);
    assert_eq!(log.iter().filter(|e| e.status == Some(200)).count(), 4);
    assert_eq!(client.limiter().snapshot().pauses, 0, "the pool never paused");
}

/// Azure OpenAI's "Please retry after N seconds." and API Management's "Try again in N
/// seconds.", with no header: the pool pauses that long (longer than the default pause of
/// a second), and the refused request is not sent again sooner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_written_only_in_the_message_are_honoured() {
    let wait = Duration::from_secs(2);
    tokio::join!(
        honoured(Fault::RetryAfterInMessage { retry_after: wait }, wait),
        honoured(Fault::ApimRateLimit { retry_after: wait }, wait),
    );
}

/// Checks that the one refusal `fault` gives is waited out for `wait` before the retry.
async fn honoured(fault: Fault, wait: Duration) {
    let sim = provider(fault, Trigger::Requests(vec![0]));
    let client = client(&sim, &dialect::AZURE);
    client.complete(prompt(0)).await.expect("after the wait");
    let log = sim.log();
    assert_eq!(log[0].status, Some(429), "{fault:?}");
    let waited = log[1].arrived - log[0].finished.expect("answered");
    assert!(waited >= wait, "{fault:?}: sent again after {waited:?}");
    assert_eq!(client.limiter().snapshot().pauses, 1, "{fault:?}");
}

//! Requests in flight and a rising rate, against the fake provider enforcing each: a
//! concurrency limit stated is never met, one unknown is learned from the provider's
//! refusals without pausing the pool, and a ramp keeps a cold start under a provider's
//! rate-of-change limit.

use std::time::Duration;

use ratebucket_http::FetchConfig;
use ratebucket_http::HyperTransport;
use ratebucket_openai::{ChatRequest, Client, Limits, Message, OpenAiError};
use ratebucket_rt::core::{Change, Ramp, RetryPolicy};
use ratebucket_sim::{Latency, LimitSpec, Refusal, Sim, SimConfig, SimHandle};

/// A provider of 6,000 requests and 6,000,000 tokens a minute answering in `latency_ms`,
/// with at most `max` requests in flight.
fn crowded_provider(max: usize, latency_ms: u64) -> SimHandle {
    Sim::start(
        SimConfig::default()
            .latency(Latency::Fixed(Duration::from_millis(latency_ms)))
            .rpm(LimitSpec::per_minute(6_000))
            .tpm(LimitSpec::per_minute(6_000_000))
            .max_concurrent(max),
    )
    .expect("fake provider")
}

fn prompt(i: usize) -> ChatRequest {
    ChatRequest::new("sim-model", vec![Message::user(format!("Summarise {i}."))]).max_tokens(20)
}

/// Retries enough for a learning run: every refusal for requests in flight is one.
fn patient() -> FetchConfig {
    let mut retry = RetryPolicy::default().with_max_throttles(50);
    retry.base_backoff = Duration::from_millis(5);
    retry.max_backoff = Duration::from_millis(20);
    FetchConfig::default().retry(retry)
}

/// Calls `from..to` at once, each on its own task.
async fn batch(
    client: &Client<HyperTransport>,
    from: usize,
    to: usize,
) -> Vec<Result<(), OpenAiError>> {
    let calls: Vec<_> = (from..to)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(prompt(i)).await.map(drop) })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.expect("no call panics"));
    }
    results
}

fn refused(sim: &SimHandle, why: Refusal) -> usize {
    sim.log().iter().filter(|e| e.refusal == Some(why)).count()
}

/// The most requests in flight the provider saw at once, from its log.
fn most_in_flight(sim: &SimHandle) -> usize {
    let mut edges: Vec<(Duration, i32)> = Vec::new();
    for entry in sim.log().iter().filter(|e| e.admitted) {
        edges.push((entry.arrived, 1));
        edges.push((entry.finished.unwrap_or(Duration::MAX), -1));
    }
    edges.sort();
    let mut now = 0;
    edges
        .iter()
        .map(|&(_, step)| {
            now += step;
            now
        })
        .max()
        .unwrap_or(0) as usize
}

/// Stated, the limit is kept: 60 calls fired at once against a provider that takes 4 at a
/// time meet no refusal.
#[tokio::test]
async fn a_stated_concurrency_limit_is_never_met() {
    let sim = crowded_provider(4, 20);
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(6_000, 6_000_000))
        .max_in_flight(4)
        .configure(|c| c.fetch(patient()))
        .build()
        .expect("client");
    let results = batch(&client, 0, 60).await;
    assert!(results.iter().all(Result::is_ok), "every call succeeds");
    assert_eq!(refused(&sim, Refusal::Concurrency), 0, "no refusal for requests in flight");
    assert!(most_in_flight(&sim) <= 4);
}

/// Unknown, it is learned: the provider's refusals lower it below what met them, nothing
/// pauses the pool, every call succeeds, and the refusals stop once it is learned.
#[tokio::test]
async fn a_concurrency_limit_is_learned_from_the_providers_refusals() {
    let sim = crowded_provider(5, 30);
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(6_000, 6_000_000))
        .configure(|c| c.fetch(patient()))
        .build()
        .expect("client");
    let results = batch(&client, 0, 60).await;
    let failed: Vec<_> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failed.is_empty(), "{} calls failed, the first: {:?}", failed.len(), failed.first());
    let first_wave = refused(&sim, Refusal::Concurrency);
    assert!(first_wave > 0, "the provider refused the unbounded start");
    let status = client.limiter().snapshot();
    let learned = status.max_in_flight.expect("a limit learned");
    assert!(learned <= 5, "learned {learned}, at most the provider's 5");
    // Learned: the next batch meets (almost) no refusal; each is a probe upwards at most.
    let results = batch(&client, 60, 120).await;
    assert!(results.iter().all(Result::is_ok));
    let second_wave = refused(&sim, Refusal::Concurrency) - first_wave;
    assert!(second_wave <= 3, "{second_wave} refusals once learned");
    assert!(sim.log().iter().all(|e| e.refusal != Some(Refusal::Requests)));
}

/// A provider that refuses a rate rising by more than 10 requests per second each second:
/// a client that knows its 100 per second and starts at once trips it; with a ramp of 10
/// per second per second, nothing is refused.
#[tokio::test]
async fn a_ramp_keeps_a_cold_start_under_a_rate_of_change_limit() {
    let provider = || {
        Sim::start(
            SimConfig::default()
                .latency(Latency::Fixed(Duration::from_millis(2)))
                .rpm(LimitSpec::per_minute(6_000))
                .tpm(LimitSpec::per_minute(6_000_000))
                .max_ramp(10),
        )
        .expect("fake provider")
    };
    let run = |sim: &SimHandle, ramp: bool| {
        let client = Client::builder(sim.base_url())
            .limits(Limits::per_minute(6_000, 6_000_000))
            .configure(|c| c.fetch(patient()))
            .build()
            .expect("client");
        if ramp {
            let ramp = Ramp::new(10, Duration::from_secs(1)).expect("a ramp");
            client.limiter().change(0, Change::Ramp(Some(ramp))).expect("dimension 0");
        }
        async move {
            let results = batch(&client, 0, 200).await;
            assert!(results.iter().all(Result::is_ok));
        }
    };
    let unramped = provider();
    run(&unramped, false).await;
    assert!(refused(&unramped, Refusal::Ramp) > 0, "a sudden start is refused");
    let ramped = provider();
    run(&ramped, true).await;
    assert_eq!(refused(&ramped, Refusal::Ramp), 0, "a ramped start is not");
}

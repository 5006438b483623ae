//! Each provider's dialect against the fake provider speaking it: what is learned, what is
//! never read as something else, and where a refusal's wait is found.

use std::time::Duration;

use ratebucket_http::dialect::{self, Dialect};
use ratebucket_openai::{ChatRequest, Client, Limits, Message, OpenAiError};
use ratebucket_sim::{Latency, LimitSpec, Sim, SimConfig, SimHandle};

/// A provider speaking `dialect`: 120 requests and 40,000 tokens per second, and 50,000
/// requests per "day" (a minute here).
fn provider(dialect: ratebucket_sim::Dialect) -> SimHandle {
    let second = Duration::from_secs(1);
    Sim::start(
        SimConfig::default()
            .latency(Latency::Fixed(Duration::from_millis(5)))
            .rpm(LimitSpec::per_minute(120).window(second))
            .tpm(LimitSpec::per_minute(40_000).window(second))
            .rpd(LimitSpec::per_minute(50_000))
            .dialect(dialect),
    )
    .expect("fake provider")
}

/// A client of `sim` that knows no limits (its "minute" a second), reading `dialect`.
fn client(
    sim: &SimHandle,
    dialect: Option<&'static Dialect>,
) -> Client<ratebucket_http::HyperTransport> {
    let builder = Client::builder(sim.base_url())
        .api_key("sk-test")
        .limits(Limits::unknown().window(Duration::from_secs(1)));
    match dialect {
        Some(dialect) => builder.dialect(dialect),
        None => builder,
    }
    .build()
    .expect("client")
}

fn prompt(i: usize) -> ChatRequest {
    ChatRequest::new("sim-model", vec![Message::user(format!("Summarise {i}."))]).max_tokens(100)
}

#[tokio::test]
async fn groqs_requests_per_day_are_never_taken_for_a_minutes() {
    let sim = provider(ratebucket_sim::Dialect::Groq);
    let groq = client(&sim, Some(&dialect::GROQ));
    groq.complete(prompt(0)).await.expect("completes");
    let limits = groq.limits();
    assert_eq!(limits.tokens_per_minute, Some(40_000));
    // The day's 50,000 is not a minute's: the requests limit stays unknown.
    assert_eq!(limits.requests_per_minute, None);
    // Read as OpenAI's, the same headers would say 50,000 requests a "minute" (here a
    // second): 400 times the provider's real 120.
    let misread = client(&sim, Some(&dialect::OPENAI));
    misread.complete(prompt(1)).await.expect("completes");
    assert_eq!(misread.limits().requests_per_minute, Some(50_000));
}

#[tokio::test]
async fn cerebras_is_recognised_from_its_first_reply() {
    let sim = provider(ratebucket_sim::Dialect::Cerebras);
    let client = client(&sim, None);
    client.complete(prompt(0)).await.expect("completes");
    let limits = client.limits();
    assert_eq!(limits.tokens_per_minute, Some(40_000));
    assert_eq!(limits.requests_per_minute, None, "a day's is not a minute's");
}

#[tokio::test]
async fn azures_whole_second_resets_and_overdrawn_remaining_are_read() {
    let sim = provider(ratebucket_sim::Dialect::Azure);
    let client = client(&sim, Some(&dialect::AZURE));
    client.complete(prompt(0)).await.expect("completes");
    let limits = client.limits();
    assert_eq!(limits.requests_per_minute, Some(120));
    assert_eq!(limits.tokens_per_minute, Some(40_000));
}

/// A Gemini-speaking provider allowing 1 request per 2.5 s, and a client that believes it
/// may send 20 in that time: every refusal's only hint of a wait is the body's
/// `RetryInfo.retryDelay`, longer than the pool's default pause of a second.
async fn gemini_batch(
    dialect: Option<&'static Dialect>,
) -> (SimHandle, Vec<Result<(), OpenAiError>>) {
    let window = Duration::from_millis(2_500);
    let sim = Sim::start(
        SimConfig::default()
            .latency(Latency::Fixed(Duration::from_millis(5)))
            .rpm(LimitSpec::per_minute(1).window(window))
            .dialect(ratebucket_sim::Dialect::Gemini),
    )
    .expect("fake provider");
    let builder = Client::builder(sim.base_url())
        .api_key("key")
        .limits(Limits::per_minute(20, 1_000_000).window(window));
    let client = match dialect {
        Some(dialect) => builder.dialect(dialect),
        None => builder,
    }
    .build()
    .expect("client");
    let calls: Vec<_> = (0..3)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(prompt(i)).await.map(drop) })
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.expect("task"));
    }
    (sim, results)
}

#[tokio::test]
async fn geminis_retry_delay_pauses_the_pool_until_the_quota_is_back() {
    for dialect in [Some(&dialect::GEMINI), None] {
        let (sim, results) = gemini_batch(dialect).await;
        for result in results {
            result.expect("every call completes");
        }
        let log = sim.log();
        // The burst beyond the bucket is refused with a delay of about 2.5 s; the pool
        // stays away that long (its default pause of a second would bring the retries
        // back into a bucket still empty).
        let first =
            log.iter().find(|e| e.status == Some(429)).expect("the burst meets a refusal").arrived;
        let quiet = first + Duration::from_millis(50)..first + Duration::from_millis(2_200);
        let early: Vec<_> = log.iter().filter(|e| quiet.contains(&e.arrived)).collect();
        assert!(early.is_empty(), "{dialect:?}: sent during the pause: {early:?}");
    }
}

/// Ten calls, one after another, to `sim` from a client reading `dialect`: how each ended.
async fn sequential(
    sim: &SimHandle,
    dialect: Option<&'static Dialect>,
) -> Vec<Result<(), OpenAiError>> {
    let builder =
        Client::builder(sim.base_url()).api_key("key").limits(Limits::per_minute(1_000, 1_000_000));
    let client = match dialect {
        Some(dialect) => builder.dialect(dialect),
        None => builder,
    }
    .build()
    .expect("client");
    let mut results = Vec::new();
    for i in 0..10 {
        results.push(client.complete(prompt(i)).await.map(drop));
    }
    results
}

#[tokio::test]
async fn a_gemini_daily_quota_named_in_a_refusal_fails_every_call_at_once() {
    // Three requests a "day" (ten minutes here): Gemini sends no rate-limit header, so the
    // only sign of the day's quota is the `QuotaFailure` in the 429 that meets it.
    let sim = Sim::start(
        SimConfig::default()
            .latency(Latency::Fixed(Duration::from_millis(5)))
            .rpd(LimitSpec::per_minute(3).window(Duration::from_secs(600)))
            .dialect(ratebucket_sim::Dialect::Gemini),
    )
    .expect("fake provider");
    let started = std::time::Instant::now();
    for (dialect, failures) in [(Some(&dialect::GEMINI), 7), (None, 10)] {
        let results = sequential(&sim, dialect).await;
        let failed: Vec<&OpenAiError> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        assert_eq!(failed.len(), failures, "{dialect:?}: {results:?}");
        // The call that meets the refusal learns of the day; every one after it fails
        // at once, saying when the quota resets, without being sent.
        for error in &failed[1..] {
            assert_eq!(error.problem(), ratebucket_openai::Problem::QuotaSpent, "{error:?}");
            assert!(format!("{error:?}").contains("resets_in"), "{error:?}");
        }
    }
    assert!(started.elapsed() < Duration::from_secs(20), "{:?}", started.elapsed());
    let refusals = sim.log().iter().filter(|e| e.status == Some(429)).count();
    assert_eq!(refusals, 2, "one refusal per client, then nothing sent");
}

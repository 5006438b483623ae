//! The Anthropic client against the fake provider answering as Anthropic does: resets in
//! whole seconds, a combined `tokens` limit where a server sends only that, and quotas
//! that are spent rather than busy.

use std::time::Duration;

use ratebucket_anthropic::{
    Client, INPUT_TOKENS, Limits, Message, MessagesRequest, Problem, REQUESTS, TOKENS,
};
use ratebucket_http::{FetchConfig, HyperTransport};
use ratebucket_rt::core::{ProviderModel, RetryPolicy};
use ratebucket_sim::{Dialect, Fault, Latency, LimitSpec, Sim, SimConfig, SimHandle, Trigger};

fn provider() -> SimConfig {
    SimConfig::default()
        .dialect(Dialect::Anthropic)
        .api_key("sk-ant-test")
        .latency(Latency::Fixed(Duration::from_millis(5)))
        .completion_tokens(10, 40)
}

fn client(sim: &SimHandle, limits: Limits) -> Client<HyperTransport> {
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    retry.max_backoff = Duration::from_millis(10);
    Client::builder(sim.base_url())
        .api_key("sk-ant-test")
        .limits(limits)
        .configure(|c| c.fetch(FetchConfig::default().retry(retry)))
        .build()
        .expect("builds")
}

/// A message of about `tokens` input tokens (four characters a token).
fn request(i: usize, tokens: usize, max_tokens: u64) -> MessagesRequest {
    let text = format!("Document {i}: {}", "lorem ipsum ".repeat(tokens / 3));
    MessagesRequest::new("claude-sim", max_tokens, vec![Message::user(text)])
}

/// Fires `n` messages at once; returns how many succeeded.
async fn batch(client: &Client<HyperTransport>, n: usize, tokens: usize, max_tokens: u64) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(request(i, tokens, max_tokens)).await })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        if task.await.expect("joins").is_ok() {
            ok += 1;
        }
    }
    ok
}

fn throttles(sim: &SimHandle) -> usize {
    sim.log().iter().filter(|e| e.status == Some(429)).count()
}

/// Anthropic's buckets of 1,200 requests and 30,000 input tokens a minute, their resets
/// whole-second instants: buckets refilling continuously, recognised as such (not as
/// windows) and their bursts lent, whether the limits are stated or learned. (Told by time
/// as much as by use: a second's resolution and counts rounded to thousands take about
/// eight seconds of agreeing reports; both runs go side by side.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_with_whole_second_resets_is_recognised_and_its_burst_lent() {
    tokio::join!(
        recognised(Limits::unknown()),
        recognised(Limits::per_minute(1_200, 30_000, 20_000))
    );
}

async fn recognised(limits: Limits) {
    let sim = Sim::start(
        provider()
            .rpm(LimitSpec::per_minute(1_200))
            .itpm(LimitSpec::per_minute(30_000))
            .otpm(LimitSpec::per_minute(20_000)),
    )
    .expect("sim");
    let client = client(&sim, limits);
    // 120 messages of about 200 input tokens: 24,000 of the input bucket's 30,000, 120 of
    // the 1,200 requests (whose remaining is exact: a reset a second off is its
    // resolution, not a window).
    assert_eq!(batch(&client, 120, 200, 64).await, 120);
    for (dimension, limit) in [(INPUT_TOKENS, 30_000), (REQUESTS, 1_200)] {
        let state = client.limiter().dimension(dimension).expect("dimension").state;
        let learned = state.learned.expect("learns");
        assert_eq!(
            learned.model,
            ProviderModel::Bucket { limit },
            "{limits:?}, dimension {dimension}: {learned:?}"
        );
        assert!(learned.provider_burst && !learned.guarded, "{learned:?}");
        assert!(state.capacity > limit * 5 / 6, "the burst lent: {}", state.capacity);
    }
    assert_eq!(throttles(&sim), 0, "{limits:?}");
}

/// A server that sends only `requests-*` and a combined `tokens-*` (input and output
/// together, output reserved at `max_tokens`): the combined limit paces the batch with no
/// 429, learned or stated.
#[tokio::test]
async fn a_combined_tokens_limit_alone_paces_the_batch_without_a_429() {
    let window = Duration::from_secs(6);
    let spec = |limit| LimitSpec::per_minute(limit).window(window);
    for limits in
        [Limits::unknown().window(window), Limits::requests_and_tokens(600, 6_000).window(window)]
    {
        let sim = Sim::start(provider().rpm(spec(600)).tpm(spec(6_000))).expect("sim");
        let client = client(&sim, limits);
        // 60 messages of about 25 input tokens and max_tokens 100: about 7,500 tokens,
        // 1,500 more than the bucket holds.
        assert_eq!(batch(&client, 60, 25, 100).await, 60);
        assert_eq!(throttles(&sim), 0, "{limits:?}");
        let learned =
            client.limiter().dimension(TOKENS).and_then(|d| d.state.learned).expect("learns");
        assert_eq!(learned.limit, Some(6_000), "{learned:?}");
        assert_eq!(client.limits().tokens_per_minute, Some(6_000));
        assert_eq!(client.limits().requests_per_minute, Some(600));
    }
}

/// A spent quota fails every call at once, saying so: a spend cap (until someone raises
/// it), a usage limit (until the date it names), a credit balance too low.
#[tokio::test]
async fn a_spent_quota_fails_every_call_at_once_and_sends_no_more() {
    for (fault, resets) in
        [(Fault::SpendLimit, false), (Fault::UsageLimit, true), (Fault::InsufficientQuota, false)]
    {
        let sim = Sim::start(
            provider().rpm(LimitSpec::per_minute(1_000)).fault(fault, Trigger::Rate(1.0)),
        )
        .expect("sim");
        let client = client(&sim, Limits::unknown());
        let first = client.complete(request(0, 10, 10)).await.expect_err("spent");
        assert_eq!(first.problem(), Problem::QuotaSpent, "{fault:?}: {first}");
        // Twenty more: none is sent, each fails at once.
        let started = std::time::Instant::now();
        for i in 1..=20 {
            let error = client.complete(request(i, 10, 10)).await.expect_err("spent");
            assert_eq!(error.problem(), Problem::QuotaSpent, "{fault:?}: {error}");
            let message = error.to_string();
            if resets {
                // The first of next month, in days and hours.
                assert!(message.contains("it resets in"), "{message}");
            } else {
                assert!(message.contains("until its limit is raised"), "{message}");
            }
        }
        assert!(started.elapsed() < Duration::from_secs(2), "{fault:?}: at once");
        assert_eq!(sim.log().len(), 1, "{fault:?}: one request met the refusal");
        assert!(!client.limiter().snapshot().aborted, "{fault:?}: spent, not aborted");
    }
}

/// A plain rate limit is still a throttle: the pool pauses and the call goes again.
#[tokio::test]
async fn a_rate_limit_without_a_spend_code_is_a_throttle_and_retried() {
    let sim = Sim::start(provider().rpm(LimitSpec::per_minute(1_000)).fault(
        Fault::RateLimited { retry_after: Duration::from_millis(10) },
        Trigger::Requests(vec![0]),
    ))
    .expect("sim");
    let client = client(&sim, Limits::unknown());
    client.complete(request(0, 10, 10)).await.expect("retried after the pause");
    assert_eq!(sim.log().len(), 2);
}

/// The client's books follow the provider's bucket from a full start only when the first
/// report shows one: a bucket another client has just drawn on (a third of it gone) is read
/// from its reports alone, and a batch needing more than is left is paced with no 429.
#[tokio::test]
async fn a_bucket_someone_else_drew_on_is_read_from_its_reports_alone() {
    let sim = Sim::start(
        provider()
            .rpm(LimitSpec::per_minute(6_000))
            .itpm(LimitSpec::per_minute(120_000))
            .otpm(LimitSpec::per_minute(100_000)),
    )
    .expect("sim");
    // Another client of the same key takes about 40,000 input tokens first.
    let other = client(&sim, Limits::per_minute(6_000, 120_000, 100_000));
    assert_eq!(batch(&other, 40, 1_000, 16).await, 40);
    let before = sim.log().len();
    // Then this one: 100 messages of about 900 tokens, 90,000 against the 80,000 left
    // (and 2,000 more a second).
    let client = client(&sim, Limits::unknown());
    assert_eq!(batch(&client, 100, 900, 16).await, 100);
    let refused = sim.log()[before..].iter().filter(|e| e.status == Some(429)).count();
    assert_eq!(refused, 0, "paced on what the reports say is left");
}

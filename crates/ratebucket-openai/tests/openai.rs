//! The OpenAI client against the fake provider: two limits, reconciliation, streaming,
//! a wave of 429s, fatal and permanent bodies, and limits learned from headers.

use std::time::Duration;

use futures_lite::StreamExt;
use ratebucket_http::{FetchConfig, FetchErrorKind, HyperTransport};
use ratebucket_openai::{
    Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig, OpenAiError, REQUESTS,
    TOKENS,
};
use ratebucket_rt::ReserveError;
use ratebucket_rt::core::{Class, Instant, Rate, RetryPolicy, StopReason};
use ratebucket_sim::{
    Charging, Fault, Latency, LimitSpec, Refusal, Sim, SimConfig, SimHandle, Trigger,
};

fn sim(config: SimConfig) -> SimHandle {
    Sim::start(config.latency(Latency::Fixed(Duration::from_millis(5)))).expect("sim starts")
}

fn client(
    sim: &SimHandle,
    limits: Limits,
    config: impl FnOnce(OpenAiConfig) -> OpenAiConfig,
) -> Client<HyperTransport> {
    let limiter =
        ratebucket_tokio::limiter(limits.buckets(Instant::ZERO).expect("limits")).expect("limiter");
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    retry.max_backoff = Duration::from_millis(10);
    let base = OpenAiConfig::new(Endpoint::OpenAi(sim.base_url()), Auth::Bearer("sk-test".into()))
        .fetch(FetchConfig::default().retry(retry).read_timeout(Duration::from_secs(2)));
    Client::new(HyperTransport::default(), limiter, limits, config(base))
}

fn prompt(i: usize) -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user(format!("Summarise document {i}."))])
        .max_tokens(160)
}

/// Plenty of quota, refilling so slowly (over the longest window a bucket accepts) that
/// levels move only by grants and refunds, give or take a hundredth of a token.
fn frozen() -> Limits {
    let longest = Duration::from_nanos(ratebucket_rt::core::MAX_LIMIT);
    Limits::per_minute(6_000, 600_000).window(longest)
}

const REFILL_SLACK: f64 = 0.05;

fn tokens_left(client: &Client<HyperTransport>) -> f64 {
    client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens dimension")
}

fn gate_closures(client: &Client<HyperTransport>) -> u64 {
    client.limiter().snapshot().pauses
}

/// Runs 500 prompts at once and returns the span of the provider's admissions.
async fn batch(reconcile: bool) -> (Duration, SimHandle) {
    // 300 requests and 15,000 tokens per second, charged by actual usage; completions of
    // 20 to 60 tokens against max_tokens 160: four times the typical answer.
    let window = Duration::from_secs(1);
    let sim = sim(SimConfig::default()
        .rpm(LimitSpec::per_minute(300).window(window))
        .tpm(LimitSpec::per_minute(15_000).window(window))
        .charging(Charging::ActualUsage)
        .completion_tokens(20, 60)
        .seed(11));
    // The conservative burst, so reconciliation is the only thing that differs (with the
    // provider's burst learned, syncing to its reported remaining reconciles too).
    let limits = Limits::per_minute(300, 15_000)
        .window(window)
        .burst(ratebucket_openai::Burst::Conservative);
    let client = client(&sim, limits, |c| c.reconcile(reconcile));
    let tasks: Vec<_> = (0..500)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(prompt(i)).await })
        })
        .collect();
    for t in tasks {
        let done = t.await.expect("task").expect("completes");
        assert_eq!(done.attempts, 1);
        assert!(done.completion.usage.is_some());
    }
    let log = sim.log();
    assert_eq!(log.len(), 500);
    assert!(log.iter().all(|e| e.admitted), "zero 429s");
    let first = log.iter().map(|e| e.arrived).min().expect("entries");
    let last = log.iter().map(|e| e.arrived).max().expect("entries");
    (last - first, sim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_limit_batch_completes_without_429s_and_reconciling_makes_it_faster() {
    let (reconciled, sim) = batch(true).await;
    let tokens: u64 = sim.log().iter().map(|e| e.tokens_charged).sum();
    let requests_bound = Duration::from_secs_f64((500.0 - 300.0) / 300.0);
    let tokens_bound = Duration::from_secs_f64((tokens as f64 - 15_000.0).max(0.0) / 15_000.0);
    let (unreconciled, _) = batch(false).await;
    assert!(
        reconciled * 2 < unreconciled,
        "admissions spanned {reconciled:?} with reconciliation, {unreconciled:?} without"
    );
    // Both limits matter: neither alone explains the pace.
    assert!(reconciled >= requests_bound.max(tokens_bound), "{reconciled:?}");
}

#[tokio::test]
async fn a_streams_final_usage_is_committed() {
    let sim = sim(SimConfig::default().completion_tokens(30, 30));
    let client = client(&sim, frozen(), |c| c);
    let before = tokens_left(&client);
    let mut stream = client.stream(prompt(0)).await.expect("opens");
    let mut text = String::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.expect("clean chunk");
        for choice in chunk.choices {
            text.push_str(choice.delta.content.as_deref().unwrap_or(""));
        }
    }
    let usage = stream.usage().expect("final usage chunk");
    assert_eq!(usage.completion_tokens, 30);
    assert_eq!(text.split_whitespace().count(), 30);
    let left = tokens_left(&client);
    let charged = before - left;
    assert!((charged - usage.total() as f64).abs() < REFILL_SLACK, "charged {charged}");
}

async fn broken_stream(fault: Fault) -> (SimHandle, Client<HyperTransport>, Vec<OpenAiError>, f64) {
    let sim = sim(SimConfig::default().fault(fault, Trigger::Requests(vec![0])));
    let client = client(&sim, frozen(), |c| c);
    let before = tokens_left(&client);
    let estimate = client.estimate(&prompt(0)) as f64;
    let mut stream = client.stream(prompt(0)).await.expect("opens");
    let mut errors = Vec::new();
    while let Some(item) = stream.next().await {
        if let Err(e) = item {
            errors.push(e);
        }
    }
    drop(stream);
    let charged = before - tokens_left(&client);
    assert!(
        (charged - estimate).abs() < REFILL_SLACK,
        "{fault:?}: the estimate stays charged ({charged} of {estimate})"
    );
    (sim, client, errors, charged)
}

#[tokio::test]
async fn a_cut_stream_is_ambiguous_and_not_resent() {
    let (sim, _client, errors, _) = broken_stream(Fault::CutStream).await;
    assert!(matches!(errors.as_slice(), [OpenAiError::StreamCut]), "{errors:?}");
    assert_eq!(errors[0].class(), Some(Class::Ambiguous));
    assert_eq!(sim.log().len(), 1, "sent once");
}

#[tokio::test]
async fn an_error_chunk_after_content_is_ambiguous_even_with_done() {
    let (sim, _client, errors, _) = broken_stream(Fault::ErrorChunk).await;
    assert!(matches!(errors.as_slice(), [OpenAiError::StreamError(_)]), "{errors:?}");
    assert_eq!(sim.log().len(), 1, "sent once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_429s_make_one_pause_that_honours_retry_after_ms() {
    let pause = Duration::from_millis(300);
    // Every prompt's first arrival is refused, whatever order the fifty arrive in; the
    // provider takes 200 ms to decide, so the whole wave is sent before a 429 is back.
    let sim = sim(SimConfig::default()
        .fault(Fault::RateLimited { retry_after: pause }, Trigger::FirstArrivals)
        .decision_delay(Duration::from_millis(200)));
    // Ample limits that refill the whole wave within the pause.
    let limits = Limits::per_minute(6_000, 600_000).window(Duration::from_secs(1));
    let client = client(&sim, limits, |c| c);
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(prompt(i)).await })
        })
        .collect();
    for t in tasks {
        let done = t.await.expect("task").expect("completes after the pause");
        assert_eq!(done.attempts, 2, "refused once, then served: never sent a third time");
    }
    let log = sim.log();
    let refused: Vec<_> = log.iter().filter(|e| e.status == Some(429)).collect();
    let served: Vec<_> = log.iter().filter(|e| e.status == Some(200)).collect();
    assert_eq!((refused.len(), served.len()), (50, 50));
    let first_429 = refused.iter().filter_map(|e| e.finished).min().expect("answered");
    // The gate closed when the first 429 came back. The rest of the wave was sent before
    // that and is stale: it cannot pause the pool again. Only a request first sent after
    // the pause began (a task that was slow to send) may start a pause of its own.
    let sent_after_the_pause_began = refused.iter().filter(|e| e.arrived > first_429).count();
    let closures = gate_closures(&client);
    assert!(
        (1..=1 + sent_after_the_pause_began as u64).contains(&closures),
        "{closures} pauses for one wave ({sent_after_the_pause_began} sent after it began)"
    );
    // Nothing is re-sent before the pause the first 429 asked for has passed.
    let first_retry = served.iter().map(|e| e.arrived).min().expect("retried");
    assert!(
        first_retry >= first_429 + pause - Duration::from_millis(5),
        "retried {:?} after the first 429",
        first_retry - first_429
    );
    assert_eq!(client.limiter().stats().late_wakeups, 0);
}

/// Out of credit is a spent quota: the one answer that says so fails its call, every other
/// waiter is refused at once, and nothing else is sent.
#[tokio::test]
async fn insufficient_quota_spends_the_quota_and_nothing_else_is_sent() {
    let sim = sim(SimConfig::default().fault(Fault::InsufficientQuota, Trigger::Requests(vec![0])));
    // One request at a time: the rest wait in the queue when the fatal answer arrives.
    let client = client(&sim, Limits::per_minute(6, 1_000_000), |c| c);
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(prompt(i)).await })
        })
        .collect();
    let mut spent = 0;
    let mut refused = 0;
    for t in tasks {
        match t.await.expect("task") {
            Err(OpenAiError::Fetch(e)) => match e.kind() {
                FetchErrorKind::Failed(StopReason::Spent(None)) => {
                    assert_eq!(e.class(), Some(Class::Spent));
                    spent += 1;
                }
                FetchErrorKind::Limiter(ReserveError::QuotaSpent { resets_in: None, .. }) => {
                    refused += 1;
                }
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((spent, refused), (1, 4));
    assert_eq!(sim.log().len(), 1);
}

#[tokio::test]
async fn request_too_large_fails_only_that_request() {
    let sim = sim(SimConfig::default().fault(Fault::RequestTooLarge, Trigger::Requests(vec![0])));
    let client = client(&sim, frozen(), |c| c);
    let error = client.complete(prompt(0)).await.expect_err("too large");
    assert_eq!(error.class(), Some(Class::Permanent));
    assert!(error.api_error().expect("body").message.starts_with("Request too large"));
    assert!(client.complete(prompt(1)).await.is_ok(), "the run goes on");
    assert!(!client.limiter().snapshot().aborted);
}

#[tokio::test]
async fn a_401_is_fatal() {
    let sim = sim(SimConfig::default().api_key("sk-right"));
    let client = client(&sim, frozen(), |c| c);
    let error = client.complete(prompt(0)).await.expect_err("wrong key");
    assert_eq!(error.class(), Some(Class::Fatal));
    assert!(client.limiter().snapshot().aborted);
    assert_eq!(sim.log()[0].refusal, Some(Refusal::Unauthorized));
}

#[tokio::test]
async fn a_run_stopped_by_a_spent_quota_resumes_when_told() {
    let sim = sim(SimConfig::default().fault(Fault::InsufficientQuota, Trigger::Requests(vec![0])));
    let client = client(&sim, frozen(), |c| c);
    let error = client.complete(prompt(0)).await.expect_err("out of credit");
    assert_eq!(error.class(), Some(Class::Spent));
    assert!(client.limiter().snapshot().spent);
    let refused = client.complete(prompt(1)).await.expect_err("stopped");
    assert!(
        matches!(refused, OpenAiError::Fetch(ref e) if matches!(e.kind(), FetchErrorKind::Limiter(_)))
    );
    // Credit added: the operator resumes the run.
    client.limiter().resume();
    assert!(!client.limiter().snapshot().spent);
    client.complete(prompt(2)).await.expect("runs again");
    assert_eq!(sim.log().len(), 2, "nothing was sent while stopped");
}

fn learning_sim() -> SimHandle {
    let window = Duration::from_secs(1);
    sim(SimConfig::default()
        .rpm(LimitSpec::per_minute(120).window(window))
        .tpm(LimitSpec::per_minute(40_000).window(window)))
}

#[tokio::test]
async fn a_lower_reported_limit_lowers_that_dimension() {
    let sim = learning_sim();
    let window = Duration::from_secs(1);
    let client = client(&sim, Limits::per_minute(600, 30_000).window(window), |c| c);
    client.complete(prompt(0)).await.expect("completes");
    let limits = client.limits();
    assert_eq!(limits.requests_per_minute, Some(120), "lowered to the provider's");
    assert_eq!(limits.tokens_per_minute, Some(30_000), "never raised above the configuration");
    let rate = client.limiter().dimension(REQUESTS).map(|v| v.state.rate).expect("rate");
    assert_eq!(rate, Rate::new(120, window).expect("rate"));
    let capacity = client.limiter().dimension(REQUESTS).map(|v| v.state.capacity);
    assert_eq!(capacity, Some(20));
}

#[tokio::test]
async fn an_unconfigured_client_adopts_the_first_reported_limits() {
    let sim = learning_sim();
    let client = client(&sim, Limits::unknown().window(Duration::from_secs(1)), |c| c);
    client.complete(prompt(0)).await.expect("completes");
    let limits = client.limits();
    assert_eq!(limits.requests_per_minute, Some(120));
    assert_eq!(limits.tokens_per_minute, Some(40_000));
    // And it now runs at that pace: 40 more go out well within a second.
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (1..=20)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(prompt(i)).await })
        })
        .collect();
    for t in tasks {
        t.await.expect("task").expect("completes");
    }
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
}

#[tokio::test]
async fn azure_style_endpoints_and_keys_reach_the_server() {
    let sim = sim(SimConfig::default().api_key("azure-key"));
    let limiter = ratebucket_tokio::limiter(frozen().buckets(Instant::ZERO).expect("limits"))
        .expect("limiter");
    let config = OpenAiConfig::new(
        Endpoint::Azure {
            resource: sim.base_url(),
            deployment: "gpt-4o".into(),
            api_version: "2024-10-21".into(),
        },
        Auth::ApiKey("azure-key".into()),
    );
    let client = Client::new(HyperTransport::default(), limiter, frozen(), config);
    let done = client.complete(prompt(0)).await.expect("completes");
    assert!(done.completion.text().is_some());
}

async fn burst_after_a_batch(model: ratebucket_sim::Model) -> (SimHandle, Client<HyperTransport>) {
    // A long window, so the buckets refill slowly (60 requests a second) and the batch
    // drains them by far more than the inference's evidence needs (4% of the limit) however
    // slowly a loaded machine sends it.
    let window = Duration::from_secs(10);
    let spec = |limit| LimitSpec::per_minute(limit).window(window).model(model);
    let sim = sim(SimConfig::default().rpm(spec(600)).tpm(spec(60_000)));
    let client = client(&sim, Limits::per_minute(600, 60_000).window(window), |c| c);
    // Waves of concurrent calls, so successive replies report different remaining quotas;
    // each wave is sent after the last one's replies, so its reports are fresh.
    for wave in 0..4 {
        let tasks: Vec<_> = (0..25)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.complete(prompt(wave * 25 + i)).await })
            })
            .collect();
        for t in tasks {
            t.await.expect("task").expect("completes");
        }
    }
    (sim, client)
}

fn capacity(client: &Client<HyperTransport>, dimension: usize) -> Option<u64> {
    client.limiter().dimension(dimension).map(|v| v.state.capacity)
}

#[tokio::test]
async fn a_continuously_refilling_provider_lends_its_whole_burst() {
    let (_sim, client) = burst_after_a_batch(ratebucket_sim::Model::TokenBucket).await;
    assert!(client.uses_provider_burst(REQUESTS));
    assert!(client.uses_provider_burst(TOKENS));
    // All of the provider's burst but the refill of the longest time a request took to be
    // counted (its wait to be sent and its reply), at most 100 ms (a 10 s window: 1%).
    let requests = capacity(&client, REQUESTS).expect("dimension");
    let tokens = capacity(&client, TOKENS).expect("dimension");
    assert!((594..600).contains(&requests), "{requests}");
    assert!((59_400..60_000).contains(&tokens), "{tokens}");
}

#[tokio::test]
async fn window_providers_keep_the_conservative_burst() {
    for model in [ratebucket_sim::Model::FixedWindow, ratebucket_sim::Model::SlidingLog] {
        let (_sim, client) = burst_after_a_batch(model).await;
        assert!(!client.uses_provider_burst(REQUESTS), "{model:?}");
        assert!(!client.uses_provider_burst(TOKENS), "{model:?}");
        assert_eq!(capacity(&client, TOKENS), Some(10_000), "{model:?}");
    }
}

#[tokio::test]
async fn the_conservative_policy_never_raises_the_burst() {
    let window = Duration::from_secs(2);
    let spec = |limit| LimitSpec::per_minute(limit).window(window);
    let sim = sim(SimConfig::default().rpm(spec(600)).tpm(spec(60_000)));
    let limits = Limits::per_minute(600, 60_000)
        .window(window)
        .burst(ratebucket_openai::Burst::Conservative);
    let client = client(&sim, limits, |c| c);
    for i in 0..6 {
        client.complete(prompt(i)).await.expect("completes");
    }
    assert!(!client.uses_provider_burst(TOKENS));
    assert_eq!(capacity(&client, TOKENS), Some(10_000));
}

/// A batch worth more than one window against providers that count in windows and charge
/// the requested maximum while the client reconciles to usage: the window guard keeps
/// every trailing window within the limit, so nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_providers_refuse_nothing_even_charging_the_requested_maximum() {
    for model in [ratebucket_sim::Model::FixedWindow, ratebucket_sim::Model::SlidingLog] {
        let window = Duration::from_secs(1);
        let spec = |limit| LimitSpec::per_minute(limit).window(window).model(model);
        let sim = sim(SimConfig::default()
            .rpm(spec(600))
            .tpm(spec(12_000))
            .charging(Charging::ReserveMaxTokens)
            .completion_tokens(10, 40)
            .seed(5));
        let client = client(&sim, Limits::per_minute(600, 12_000).window(window), |c| c);
        // About 100 x 170 = 17,000 tokens reserved: more than one window's 12,000.
        let tasks: Vec<_> = (0..100)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move { client.complete(prompt(i)).await })
            })
            .collect();
        for t in tasks {
            t.await.expect("task").expect("completes");
        }
        let log = sim.log();
        let refused = log.iter().filter(|e| !e.admitted).count();
        let when: Vec<_> =
            log.iter().filter(|e| !e.admitted).map(|e| (e.id, e.arrived, e.refusal)).collect();
        assert_eq!(refused, 0, "{model:?}: {refused} refused: {when:?}");
    }
}

/// A client given a share of a key (a limit below the provider's) meets a provider whose
/// window other clients have mostly spent: it keeps its own pace within what the provider
/// says is left, instead of holding the whole key's usage against its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_below_the_provider_limit_is_not_charged_everyone_elses_usage() {
    let window = Duration::from_secs(10);
    let sim = sim(SimConfig::default().rpm(
        LimitSpec::per_minute(1_000).window(window).model(ratebucket_sim::Model::FixedWindow),
    ));
    // Other clients on the same key spend 600 of the window's 1,000 requests.
    let others = ratebucket_http::HyperTransport::default();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let spent: Vec<_> = (0..600)
        .map(|i| {
            let (others, url) = (others.clone(), url.clone());
            let body = serde_json::to_vec(&prompt(10_000 + i)).expect("encodes");
            tokio::spawn(async move {
                let request = http::Request::post(url)
                    .header("content-type", "application/json")
                    .body(bytes::Bytes::from(body))
                    .expect("request");
                ratebucket_http::Transport::send(&others, request).await.is_ok()
            })
        })
        .collect();
    for s in spent {
        assert!(s.await.expect("task"), "another client's request");
    }
    // This client's share: 100 requests per window.
    let client = client(&sim, Limits::per_minute(100, 10_000_000).window(window), |c| c);
    let started = std::time::Instant::now();
    for i in 0..20 {
        client.complete(prompt(i)).await.expect("completes");
    }
    // A burst of 17 and then 10 a second: under a second, far from the window's 10 s.
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(5), "blocked for {elapsed:?}");
    assert!(sim.log().iter().all(|e| e.admitted), "nothing refused");
}

/// A completion is three events (a reservation, a send, a reply) and its reply is one
/// input: the limiter's lock is taken a fixed number of times per completion, once of them
/// for the whole reply (the charge and both quota reports).
#[tokio::test]
async fn a_completion_takes_the_lock_three_times_its_reply_once() {
    // Every reply reports both quota families; the provider's tokens limit is below the
    // client's, so hearing it lowers what the client learned (and still never binds).
    let longest = Duration::from_nanos(ratebucket_rt::core::MAX_LIMIT);
    let sim = sim(SimConfig::default()
        .rpm(LimitSpec::per_minute(1_000_000).window(longest))
        .tpm(LimitSpec::per_minute(500_000).window(longest)));
    let client = client(&sim, frozen(), |c| c);
    // The first reply installs what is learned; the count is of the ones after it.
    client.complete(prompt(0)).await.expect("completes");
    for i in 1..4 {
        let before = client.limiter().stats().locks;
        let done = client.complete(prompt(i)).await.expect("completes");
        assert_eq!(done.attempts, 1);
        let locks = client.limiter().stats().locks - before;
        // The cost (the token capacity read), the reservation with its send (stamped by
        // the grant), the reply.
        assert_eq!(locks, 3, "completion {i}");
    }
    // The replies carried quota reports, and learning heard them.
    let learned = client.limiter().dimension(TOKENS).and_then(|d| d.state.learned);
    assert_eq!(learned.and_then(|l| l.limit), Some(500_000), "{learned:?}");
}

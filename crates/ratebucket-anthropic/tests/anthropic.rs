//! The Anthropic client against the fake provider speaking Anthropic: three buckets at
//! once, settlement at the reported usage, limits learned from its headers, streams, the
//! overloaded 529, and errors inside a stream.

use std::time::Duration;

use futures_lite::StreamExt;
use ratebucket_anthropic::{
    AnthropicError, Client, INPUT_TOKENS, Limits, Message, MessagesRequest, OUTPUT_TOKENS,
    REQUESTS, StreamEvent,
};
use ratebucket_http::{FetchConfig, HyperTransport};
use ratebucket_rt::core::RetryPolicy;
use ratebucket_sim::{Dialect, Fault, Latency, LimitSpec, Sim, SimConfig, SimHandle, Trigger};

fn provider(window: Duration) -> SimConfig {
    let spec = |limit| LimitSpec::per_minute(limit).window(window);
    SimConfig::default()
        .dialect(Dialect::Anthropic)
        .api_key("sk-ant-test")
        .latency(Latency::Fixed(Duration::from_millis(2)))
        .completion_tokens(10, 40)
        .rpm(spec(50))
        .itpm(spec(40_000))
        .otpm(spec(8_000))
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

fn request(i: usize) -> MessagesRequest {
    MessagesRequest::new("claude-sim", 100, vec![Message::user(format!("Summarise document {i}."))])
        .system("Be brief.")
}

#[tokio::test]
async fn a_message_reserves_three_dimensions_and_settles_at_the_reported_usage() {
    let sim = Sim::start(provider(Duration::from_secs(60))).expect("sim");
    let client = client(&sim, Limits::per_minute(50, 40_000, 8_000));
    let level = |d: usize| client.limiter().dimension(d).expect("dimension").state.level;
    let before = [REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS].map(level);
    let answer = client.complete(request(0)).await.expect("completes");
    assert_eq!(answer.reserved[REQUESTS], 1);
    assert_eq!(answer.reserved[OUTPUT_TOKENS], 100, "max_tokens reserved");
    assert!(!answer.message.text().is_empty());
    let usage = answer.message.usage;
    let entry = &sim.log()[0];
    assert_eq!(usage.input_tokens, entry.prompt_tokens);
    assert_eq!(usage.output_tokens, entry.completion_tokens);
    // Settled at the usage: the levels went down by what was used, not reserved (the
    // buckets refill a little meanwhile, never by 60 tokens in a few milliseconds).
    let after = [REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS].map(level);
    let spent_output = before[2] - after[2];
    let reported = usage.output_tokens as f64;
    assert!(
        (reported - 5.0..=reported + 1.0).contains(&spent_output),
        "output settled at {} (reported {})",
        spent_output,
        usage.output_tokens
    );
}

#[tokio::test]
async fn unknown_limits_are_learned_from_the_headers() {
    let sim = Sim::start(provider(Duration::from_secs(60))).expect("sim");
    let client = client(&sim, Limits::unknown());
    for i in 0..3 {
        client.complete(request(i)).await.expect("completes");
    }
    let limits = client.limits();
    assert_eq!(limits.requests_per_minute, Some(50));
    assert_eq!(limits.input_tokens_per_minute, Some(40_000));
    assert_eq!(limits.output_tokens_per_minute, Some(8_000));
}

#[tokio::test]
async fn a_batch_is_paced_by_every_bucket_without_a_429() {
    // 40 requests against 20 per quarter second, max_tokens 100 against 1,200 output
    // tokens: the output bucket binds until answers settle below their maximum.
    let window = Duration::from_millis(250);
    let spec = |limit| LimitSpec::per_minute(limit).window(window);
    let sim = Sim::start(provider(window).rpm(spec(20)).otpm(spec(1_200))).expect("sim");
    let limits = Limits::per_minute(20, 40_000, 1_200).window(window);
    let client = client(&sim, limits);
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(request(i)).await })
        })
        .collect();
    for task in tasks {
        task.await.expect("joins").expect("completes");
    }
    let log = sim.log();
    assert_eq!(log.iter().filter(|e| e.status == Some(429)).count(), 0);
    assert_eq!(log.iter().filter(|e| e.admitted).count(), 40);
}

#[tokio::test]
async fn a_stream_settles_at_message_stop() {
    let sim = Sim::start(provider(Duration::from_secs(60))).expect("sim");
    let client = client(&sim, Limits::per_minute(50, 40_000, 8_000));
    let mut stream = client.stream(request(0)).await.expect("streams");
    let mut text = String::new();
    let mut last = None;
    while let Some(event) = stream.next().await {
        let event = event.expect("whole");
        text.extend(event.text().map(str::to_owned));
        last = Some(event);
    }
    assert_eq!(last, Some(StreamEvent::MessageStop));
    assert!(!text.is_empty());
    let usage = stream.usage().expect("usage");
    assert_eq!(usage.output_tokens, sim.log()[0].completion_tokens);
    assert_eq!(usage.input_tokens, sim.log()[0].prompt_tokens);
}

#[tokio::test]
async fn a_throttle_event_before_the_first_delta_pauses_once_and_goes_again() {
    for overloaded in [false, true] {
        let fault = Fault::StreamError { overloaded, after_content: false };
        let sim =
            Sim::start(provider(Duration::from_secs(60)).fault(fault, Trigger::FirstArrivals))
                .expect("sim");
        let client = client(&sim, Limits::per_minute(50, 40_000, 8_000));
        let mut stream = client.stream(request(0)).await.expect("streams");
        while let Some(event) = stream.next().await {
            event.expect("every event of the second attempt is whole");
        }
        assert_eq!(stream.attempts(), 2);
        assert_eq!(sim.log().len(), 2, "sent again once");
        assert_eq!(client.limiter().snapshot().pauses, 1, "the pool paused once");
    }
}

#[tokio::test]
async fn an_error_event_after_content_is_ambiguous_and_never_sent_again() {
    let fault = Fault::StreamError { overloaded: true, after_content: true };
    let sim = Sim::start(provider(Duration::from_secs(60)).fault(fault, Trigger::FirstArrivals))
        .expect("sim");
    let client = client(&sim, Limits::per_minute(50, 40_000, 8_000));
    let mut stream = client.stream(request(0)).await.expect("streams");
    let mut deltas = 0;
    let mut failed = None;
    while let Some(event) = stream.next().await {
        match event {
            Ok(e) if e.text().is_some() => deltas += 1,
            Ok(_) => {}
            Err(e) => failed = Some(e),
        }
    }
    assert!(deltas > 0);
    let Some(AnthropicError::StreamError(error)) = failed else {
        panic!("an error event: {failed:?}");
    };
    assert_eq!(error.kind, "overloaded_error");
    assert_eq!(sim.log().len(), 1, "not sent again");
    assert_eq!(client.limiter().snapshot().pauses, 0);
}

#[tokio::test]
async fn an_overloaded_529_pauses_the_pool_and_the_request_goes_again() {
    let fault = Fault::Overloaded { retry_after: Duration::from_millis(20) };
    let sim =
        Sim::start(provider(Duration::from_secs(60)).fault(fault, Trigger::Requests(vec![0])))
            .expect("sim");
    let client = client(&sim, Limits::per_minute(50, 40_000, 8_000));
    let answer = client.complete(request(0)).await.expect("completes");
    assert_eq!(answer.attempts, 2);
    assert_eq!(sim.log()[0].status, Some(529));
    assert_eq!(client.limiter().snapshot().pauses, 1);
}

#[tokio::test]
async fn a_bad_key_is_fatal_and_a_bad_setting_is_refused_when_building() {
    let sim = Sim::start(provider(Duration::from_secs(60))).expect("sim");
    let client = Client::builder(sim.base_url()).api_key("wrong").build().expect("builds");
    let error = client.complete(request(0)).await.expect_err("refused");
    assert_eq!(error.api_error().map(|e| e.kind).as_deref(), Some("authentication_error"));
    let bad = Client::builder("ftp://example.com").build();
    assert!(matches!(bad, Err(AnthropicError::Config(_))), "{bad:?}");
    let newline = Client::builder(sim.base_url()).api_key("a\nb").build();
    assert!(matches!(newline, Err(AnthropicError::Config(_))), "{newline:?}");
}

#[test]
fn a_client_builds_on_smol_too() {
    let sim = Sim::start(provider(Duration::from_secs(60))).expect("sim");
    smol::block_on(async {
        let client = Client::builder(sim.base_url())
            .api_key("sk-ant-test")
            .limits(Limits::per_minute(50, 40_000, 8_000))
            .build_smol()
            .expect("builds");
        let answer = client.complete(request(0)).await.expect("completes");
        assert!(!answer.message.text().is_empty());
    });
}

//! async-openai's client with the pacing layer, against the fake provider on 127.0.0.1:
//! both limits, usage committed, one loop for 429s, fatal answers, and streams.

use std::time::Duration;

use async_openai::config::OpenAIConfig;
use async_openai::error::OpenAIError;
use async_openai::middleware::ReqwestService;
use async_openai::types::chat::{
    ChatCompletionRequestUserMessageArgs, CreateChatCompletionRequest,
    CreateChatCompletionRequestArgs,
};
use futures_lite::StreamExt;
use ratebucket_async_openai::PaceLayer;
use ratebucket_http::FetchConfig;
use ratebucket_openai::{Limits, TOKENS};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{ArbiterConfig, MAX_LIMIT, RetryPolicy};
use ratebucket_sim::{Fault, Sim, SimConfig, SimHandle, Trigger};
use tower::Layer;

/// Limits whose buckets refill so slowly that levels move only by grants and refunds.
fn frozen() -> Limits {
    Limits::per_minute(6_000, 600_000).window(Duration::from_nanos(MAX_LIMIT))
}

fn client(sim: &SimHandle, limits: Limits) -> (async_openai::Client<OpenAIConfig>, Limiter) {
    let limiter = ratebucket_tokio::Limiter::from_limits(
        limits.per_dimension(),
        ArbiterConfig::default(),
        ratebucket_tokio::TokioTimer::current(),
    )
    .expect("limiter");
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    retry.max_backoff = Duration::from_millis(10);
    let layer = PaceLayer::new(limiter.clone(), limits)
        .fetch(FetchConfig::default().retry(retry))
        .default_max_tokens(100);
    let config =
        OpenAIConfig::new().with_api_base(format!("{}/v1", sim.base_url())).with_api_key("sk-test");
    let client = async_openai::Client::with_config(config)
        .with_http_service(layer.layer(ReqwestService::default()));
    (client, limiter)
}

fn request(i: usize, max_tokens: u32) -> CreateChatCompletionRequest {
    CreateChatCompletionRequestArgs::default()
        .model("gpt-4o-mini")
        .messages([ChatCompletionRequestUserMessageArgs::default()
            .content(format!("Summarise document {i}."))
            .build()
            .expect("message")
            .into()])
        .max_completion_tokens(max_tokens)
        .build()
        .expect("request")
}

fn tokens(limiter: &Limiter) -> f64 {
    limiter.dimension(TOKENS).map(|v| v.state.level).expect("tokens")
}

#[tokio::test]
async fn calls_are_charged_the_usage_the_provider_reports() {
    let sim = Sim::start(SimConfig::default()).expect("sim");
    let (client, limiter) = client(&sim, frozen());
    let before = tokens(&limiter);
    let mut used = 0;
    for i in 0..10 {
        let response = client.chat().create(request(i, 200)).await.expect("completes");
        used += u64::from(response.usage.expect("usage").total_tokens);
    }
    let charged = before - tokens(&limiter);
    assert!(
        (charged - used as f64).abs() < 0.5,
        "charged {charged}, reported {used}: the reservation was reconciled"
    );
    assert_eq!(sim.log().len(), 10);
}

#[tokio::test]
async fn a_wave_of_429s_is_retried_through_the_pools_gate() {
    let sim = Sim::start(SimConfig::default().fault(
        Fault::RateLimited { retry_after: Duration::from_millis(30) },
        Trigger::Requests(vec![0, 1, 2]),
    ))
    .expect("sim");
    let (client, limiter) = client(&sim, Limits::per_minute(6_000, 600_000));
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move { client.chat().create(request(i, 50)).await })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("completes after the pause");
    }
    let log = sim.log();
    assert_eq!(log.len(), 11, "each throttled call sent once more");
    let closures = limiter.snapshot().pauses;
    assert!((1..=3).contains(&closures), "{closures} pauses for 3 429s");
}

#[tokio::test]
async fn insufficient_quota_stops_the_run_and_reads_as_async_openais_error() {
    let sim = Sim::start(
        SimConfig::default().fault(Fault::InsufficientQuota, Trigger::Requests(vec![0])),
    )
    .expect("sim");
    let (client, limiter) = client(&sim, frozen());
    let error = client.chat().create(request(0, 50)).await.expect_err("fatal");
    match &error {
        OpenAIError::ApiError(api) => {
            assert_eq!(api.status_code.as_u16(), 429);
            assert_eq!(api.api_error.code.as_deref(), Some("insufficient_quota"));
        }
        other => panic!("expected the provider's error, got {other}"),
    }
    assert!(limiter.snapshot().spent, "the run stops: the quota is spent");
    let next = client.chat().create(request(1, 50)).await.expect_err("stopped");
    assert!(matches!(next, OpenAIError::Boxed(_)), "{next}");
    assert_eq!(sim.log().len(), 1, "nothing more was sent");
}

#[tokio::test]
async fn a_stream_goes_through_the_limiter_and_stays_charged_as_reserved() {
    let sim = Sim::start(SimConfig::default()).expect("sim");
    let (client, limiter) = client(&sim, frozen());
    let before = tokens(&limiter);
    let mut stream = client.chat().create_stream(request(0, 80)).await.expect("opens");
    let mut chunks = 0;
    while let Some(chunk) = stream.next().await {
        chunk.expect("chunk");
        chunks += 1;
    }
    assert!(chunks > 0);
    let charged = before - tokens(&limiter);
    assert!(charged >= 80.0, "the estimate (prompt + 80) stays charged: {charged}");
    assert_eq!(sim.log().len(), 1);
    assert!(sim.log()[0].stream);
}

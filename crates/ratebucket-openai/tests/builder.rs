//! `Client::builder`: limits given once, a limiter made or shared and checked, the key
//! sent the way the endpoint expects, and configuration errors at build time.

use futures_lite::StreamExt;
use ratebucket_openai::{ChatRequest, Client, Endpoint, Limits, Message, OpenAiError, TOKENS};
use ratebucket_rt::core::ArbiterConfig;
use ratebucket_sim::{LimitSpec, Sim, SimConfig};

fn prompt() -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hello.")]).max_tokens(20)
}

#[tokio::test]
async fn a_built_client_paces_with_its_own_limiter_at_the_limits_given_once() {
    let sim = Sim::start(
        SimConfig::default()
            .api_key("sk-built")
            .rpm(LimitSpec::per_minute(600))
            .tpm(LimitSpec::per_minute(60_000)),
    )
    .expect("sim");
    let client = Client::builder(sim.base_url())
        .api_key("sk-built")
        .limits(Limits::per_minute(600, 60_000))
        .build()
        .expect("builds");
    assert_eq!(client.limiter().snapshot().dimensions.len(), 2);
    assert_eq!(
        client.limiter().dimension(TOKENS).map(|v| v.state.capacity),
        Some(10_000),
        "a sixth"
    );
    let answer = client.complete(prompt()).await.expect("completes");
    assert!(answer.completion.usage.is_some());
    let mut stream = client.stream(prompt()).await.expect("streams");
    while let Some(chunk) = stream.next().await {
        chunk.expect("chunk");
    }
    assert_eq!(sim.log().len(), 2);
    assert!(sim.log().iter().all(|e| e.admitted), "the key was sent");
}

#[tokio::test]
async fn an_azure_endpoint_gets_the_key_as_api_key() {
    let sim = Sim::start(SimConfig::default().api_key("azure-key")).expect("sim");
    let client = Client::builder(Endpoint::Azure {
        resource: sim.base_url(),
        deployment: "gpt-4o-mini".into(),
        api_version: "2024-10-21".into(),
    })
    .api_key("azure-key")
    .limits(Limits::per_minute(600, 60_000))
    .build()
    .expect("builds");
    client.complete(prompt()).await.expect("authorized");
}

#[tokio::test]
async fn a_shared_limiter_must_enforce_the_limits_the_client_is_given() {
    let limits = Limits::per_minute(600, 60_000);
    let shared = ratebucket_tokio::Limiter::from_limits(
        limits.per_dimension(),
        ArbiterConfig::default(),
        ratebucket_tokio::TokioTimer::current(),
    )
    .expect("limiter");
    let a = Client::builder("http://127.0.0.1:9")
        .limits(limits)
        .limiter(shared.clone())
        .build()
        .expect("the same limits");
    let b = Client::builder("http://127.0.0.1:9")
        .limits(limits)
        .limiter(shared.clone())
        .build()
        .expect("the same limits");
    // One limiter behind both.
    let before = b.limiter().snapshot().queued;
    assert_eq!(a.limiter().snapshot().dimensions.len(), 2);
    assert_eq!(before, 0);

    let other = Client::builder("http://127.0.0.1:9")
        .limits(Limits::per_minute(500, 60_000))
        .limiter(shared)
        .build()
        .expect_err("another requests limit");
    assert!(matches!(other, OpenAiError::Config(ref m) if m.contains("requests")), "{other}");

    let one_dimension =
        ratebucket_tokio::limiter_for([ratebucket_rt::core::Limit::per_minute(600)])
            .expect("limiter");
    let error = Client::builder("http://127.0.0.1:9")
        .limits(limits)
        .limiter(one_dimension)
        .build()
        .expect_err("one dimension");
    assert!(matches!(error, OpenAiError::Config(ref m) if m.contains("dimension")), "{error}");
}

#[tokio::test]
async fn bad_settings_are_refused_when_building() {
    let cases: Vec<(&str, Result<_, OpenAiError>)> = vec![
        ("no scheme", Client::builder("api.openai.com").build().map(drop)),
        (
            "a key with a newline",
            Client::builder("https://api.openai.com").api_key("sk-\nx").build().map(drop),
        ),
        (
            "a zero limit",
            Client::builder("https://api.openai.com")
                .limits(Limits::per_minute(0, 1_000))
                .build()
                .map(drop),
        ),
    ];
    for (name, result) in cases {
        assert!(matches!(result, Err(OpenAiError::Config(_))), "{name}: {result:?}");
    }
    let no_limiter = Client::builder("https://api.openai.com")
        .build_with(ratebucket_http::HyperTransport::default())
        .map(drop);
    assert!(matches!(no_limiter, Err(OpenAiError::Config(_))), "{no_limiter:?}");
}

#[test]
fn a_client_builds_on_smol_too() {
    let sim = Sim::start(SimConfig::default()).expect("sim");
    smol::block_on(async {
        let client = Client::builder(sim.base_url())
            .limits(Limits::per_minute(600, 60_000))
            .build_smol()
            .expect("builds");
        client.complete(prompt()).await.expect("completes");
    });
}

#[tokio::test]
async fn a_request_for_n_choices_reserves_the_completion_limit_for_each() {
    let sim = Sim::start(SimConfig::default()).expect("sim");
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(600, 60_000))
        .build()
        .expect("builds");
    let one = client.estimate(&prompt());
    let mut three = prompt();
    three.n = Some(3);
    assert_eq!(
        client.estimate(&three),
        one + 2 * 20,
        "each of the three choices may use all 20 tokens"
    );
    three.n = Some(0);
    assert_eq!(client.estimate(&three), one, "n = 0 counts as one choice");
}

//! Errors inside a stream that began with 200: a rate-limit or overloaded error before the
//! first content is a throttle (the pool pauses once, the request goes again); after
//! content it is ambiguous, never sent again.

use std::time::Duration;

use futures_lite::StreamExt;
use ratebucket_http::{FetchConfig, HyperTransport};
use ratebucket_openai::{
    Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig, OpenAiError,
};
use ratebucket_rt::core::{Instant, RetryPolicy};
use ratebucket_sim::{Fault, Latency, LimitSpec, Sim, SimConfig, SimHandle, Trigger};

fn sim(fault: Fault) -> SimHandle {
    let config = SimConfig::default()
        .rpm(LimitSpec::per_minute(6_000))
        .tpm(LimitSpec::per_minute(600_000))
        .latency(Latency::Fixed(Duration::from_millis(2)))
        .fault(fault, Trigger::FirstArrivals);
    Sim::start(config).expect("sim starts")
}

fn client(sim: &SimHandle) -> Client<HyperTransport> {
    let limits = Limits::per_minute(6_000, 600_000);
    let limiter =
        ratebucket_tokio::limiter(limits.buckets(Instant::ZERO).expect("limits")).expect("limiter");
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    retry.max_backoff = Duration::from_millis(10);
    let config = OpenAiConfig::new(Endpoint::OpenAi(sim.base_url()), Auth::None)
        .fetch(FetchConfig::default().retry(retry));
    Client::new(HyperTransport::default(), limiter, limits, config)
}

fn request() -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user("Stream a summary.")]).max_tokens(60)
}

#[tokio::test]
async fn a_throttle_before_the_first_content_pauses_the_pool_once_and_goes_again() {
    for overloaded in [false, true] {
        let sim = sim(Fault::StreamError { overloaded, after_content: false });
        let client = client(&sim);
        let mut stream = client.stream(request()).await.expect("streams");
        let mut text = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.expect("every chunk of the second attempt is whole");
            text.extend(chunk.choices.iter().filter_map(|c| c.delta.content.clone()));
        }
        assert!(!text.is_empty());
        assert!(stream.usage().is_some(), "the second attempt's usage settles it");
        assert_eq!(stream.attempts(), 2);
        assert_eq!(sim.log().len(), 2, "sent again once");
        assert_eq!(client.limiter().snapshot().pauses, 1, "the pool paused once");
    }
}

#[tokio::test]
async fn an_error_after_content_is_ambiguous_and_never_sent_again() {
    let sim = sim(Fault::StreamError { overloaded: false, after_content: true });
    let client = client(&sim);
    let mut stream = client.stream(request()).await.expect("streams");
    let mut delivered = 0;
    let mut failed = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(_) => delivered += 1,
            Err(e) => failed = Some(e),
        }
    }
    assert!(delivered > 0);
    assert!(matches!(failed, Some(OpenAiError::StreamError(_))), "{failed:?}");
    assert_eq!(sim.log().len(), 1, "not sent again");
    assert_eq!(client.limiter().snapshot().pauses, 0, "no pause");
}

//! A client for a caller (`Client::for_caller`) against the fake provider speaking
//! Anthropic: an interactive call goes ahead of a queued batch.

use std::time::Duration;

use ratebucket_anthropic::{Client, Limits, Message, MessagesRequest};
use ratebucket_rt::core::{Caller, Priority, Tenant};
use ratebucket_sim::{Dialect, Headers, LimitSpec, Sim, SimConfig};

fn request(i: usize) -> MessagesRequest {
    MessagesRequest::new("claude-sim", 20, vec![Message::user(format!("Say {i}."))])
}

#[tokio::test]
async fn an_interactive_client_goes_ahead_of_a_queued_batch_client() {
    // 120 requests a minute: two a second once the burst is spent. No headers, so the
    // client keeps the limits it is given.
    let sim = Sim::start(
        SimConfig::default()
            .dialect(Dialect::Anthropic)
            .api_key("sk-ant-test")
            .headers(Headers::None)
            .rpm(LimitSpec::per_minute(120))
            .itpm(LimitSpec::per_minute(1_000_000))
            .otpm(LimitSpec::per_minute(1_000_000)),
    )
    .expect("sim");
    let client = Client::builder(sim.base_url())
        .api_key("sk-ant-test")
        .limits(Limits::per_minute(120, 1_000_000, 1_000_000))
        .build()
        .expect("builds");
    let batch = client.for_caller(Caller::tenant(1).priority(Priority::Batch));
    let tasks: Vec<_> = (0..400)
        .map(|i| {
            let batch = batch.clone();
            tokio::spawn(async move { batch.complete(request(i)).await })
        })
        .collect();
    // The burst is spent (the requests bucket, grown to the provider's whole minute as
    // Anthropic's continuous bucket allows, is empty) and the rest of the batch waits.
    let spent = || {
        client
            .limiter()
            .dimension(0)
            .is_some_and(|v| v.state.capacity >= 100 && v.state.level < 1.0)
    };
    while !spent() || client.limiter().snapshot().queued < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let interactive = client.for_caller(Caller::tenant(2).priority(Priority::Interactive));
    // Behind the queued batch it would wait minutes (hundreds of calls at two a second);
    // ahead of it, about one refill.
    let answered =
        tokio::time::timeout(Duration::from_secs(10), interactive.complete(request(1_000))).await;
    let granted = client.limiter().tenant(Tenant(2)).granted[Priority::Interactive.index()];
    // Stopped before anything is checked: a failed check then ends the test at once.
    for task in tasks {
        task.abort();
    }
    answered.expect("answered within 10 s").expect("completes");
    assert_eq!(granted, 1, "granted from the queue in its own class");
    assert!(sim.log().iter().all(|e| e.status != Some(429)));
}

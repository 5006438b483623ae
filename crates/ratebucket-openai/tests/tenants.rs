//! A client for a caller (`Client::for_caller`) against the fake provider: an interactive
//! call goes ahead of a queued batch, and every call counts against its own tenant.

use std::time::Duration;

use ratebucket_openai::{ChatRequest, Client, Limits, Message};
use ratebucket_rt::core::{Caller, Priority, Tenant};
use ratebucket_sim::{Headers, LimitSpec, Sim, SimConfig};

fn prompt() -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user("Say hello.")]).max_tokens(20)
}

#[tokio::test]
async fn an_interactive_client_goes_ahead_of_a_queued_batch_client() {
    // 120 requests a minute: two a second once the burst (a sixth, 20) is spent. The
    // provider sends no headers, so the client keeps the limits it is given.
    let sim = Sim::start(
        SimConfig::default()
            .headers(Headers::None)
            .rpm(LimitSpec::per_minute(120))
            .tpm(LimitSpec::per_minute(1_000_000)),
    )
    .expect("sim");
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(120, 1_000_000))
        .build()
        .expect("builds");
    let batch = client.for_caller(Caller::tenant(1).priority(Priority::Batch));
    let tasks: Vec<_> = (0..400)
        .map(|_| {
            let batch = batch.clone();
            tokio::spawn(async move { batch.complete(prompt()).await })
        })
        .collect();
    // The burst is spent and the rest of the batch waits on the refill.
    while sim.log().len() < 20 || client.limiter().snapshot().queued < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let interactive = client.for_caller(Caller::tenant(2).priority(Priority::Interactive));
    // Behind the queued batch it would wait minutes (hundreds of calls at two a second);
    // ahead of it, about one refill.
    let answered =
        tokio::time::timeout(Duration::from_secs(10), interactive.complete(prompt())).await;
    let interactive_granted =
        client.limiter().tenant(Tenant(2)).granted[Priority::Interactive.index()];
    // Stopped before anything is checked: a failed check then ends the test at once.
    for task in tasks {
        task.abort();
    }
    answered.expect("answered within 10 s").expect("completes");
    assert_eq!(
        interactive_granted, 1,
        "the interactive call queued and was granted in its own class"
    );
    assert!(sim.log().iter().all(|e| e.status != Some(429)));
}

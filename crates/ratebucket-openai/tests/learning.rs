//! Learning the provider from its headers, against the fake provider: limits not given are
//! adopted with the burst the provider offers, and a provider that books more than the
//! client estimates (its own estimate of each request) is met with that charge.

use std::time::Duration;

use ratebucket_openai::{ChatRequest, Client, Limits, Message, TOKENS};
use ratebucket_sim::{Charging, Latency, LimitSpec, Sim, SimConfig};

/// W1 of the learning benchmark: 300 short prompts with `max_tokens` 200 against 600
/// requests and 60,000 tokens per (ten-second) window, a provider that books its own
/// estimate; the client is told nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_limits_are_adopted_with_the_burst_and_the_charge_the_provider_books() {
    let window = Duration::from_secs(10);
    let sim = Sim::start(
        SimConfig::default()
            .charging(Charging::BooksEstimate)
            .rpm(LimitSpec::per_minute(600).window(window))
            .tpm(LimitSpec::per_minute(60_000).window(window))
            .completion_tokens(20, 60)
            .latency(Latency::Fixed(Duration::from_millis(20))),
    )
    .expect("fake provider");
    let client = Client::builder(sim.base_url())
        .limits(Limits::unknown().window(window))
        .build()
        .expect("client");
    let calls: Vec<_> = (0..300)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let prompt = format!("Summarise document {i} of the batch.");
                let request =
                    ChatRequest::new("sim-model", vec![Message::user(prompt)]).max_tokens(200);
                client.complete(request).await
            })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("every call succeeds");
    }
    let log = sim.log();
    let throttled = log.iter().filter(|e| e.status == Some(429)).count();
    // Unlearned, the client's estimate falls short of every booking and a full burst of
    // them meets dozens of 429s; the charge learned from the first reply leaves none, or
    // a stray few on a loaded machine.
    assert!(throttled <= 3, "{throttled} 429s");
    let booked: u64 = log.iter().filter(|e| e.admitted).map(|e| e.tokens_charged).sum();
    let snapshot = client.limiter().snapshot();
    let tokens = &snapshot.dimensions[TOKENS].state;
    assert!(tokens.charge_factor > 1.02, "learned {}", tokens.charge_factor);
    // The provider's burst, not a sixth of it: the whole batch's bookings exceed a sixth
    // of the limit many times over.
    assert!(tokens.capacity > 50_000, "capacity {}", tokens.capacity);
    assert!(booked > 60_000, "the batch needed the refill too: {booked}");
}

/// W1 with the limits known: a provider that books its own estimate (more than the
/// client's) meets no 429, because the first request goes alone and its reply says what
/// the provider booked before the burst leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn known_limits_meet_no_429_from_a_provider_that_books_more_than_estimated() {
    let window = Duration::from_secs(10);
    let sim = Sim::start(
        SimConfig::default()
            .charging(Charging::BooksEstimate)
            .rpm(LimitSpec::per_minute(600).window(window))
            .tpm(LimitSpec::per_minute(60_000).window(window))
            .completion_tokens(20, 60)
            .latency(Latency::Fixed(Duration::from_millis(20))),
    )
    .expect("fake provider");
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(600, 60_000).window(window))
        .build()
        .expect("client");
    let calls: Vec<_> = (0..300)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let prompt = format!("Summarise document {i} of the batch.");
                let request =
                    ChatRequest::new("sim-model", vec![Message::user(prompt)]).max_tokens(200);
                client.complete(request).await
            })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("every call succeeds");
    }
    let log = sim.log();
    let throttled = log.iter().filter(|e| e.status == Some(429)).count();
    assert_eq!(throttled, 0, "429s with the limits known");
    let factor = client.limiter().dimension(TOKENS).map(|v| v.state.charge_factor).unwrap();
    assert!(factor > 1.02, "learned {factor}");
}

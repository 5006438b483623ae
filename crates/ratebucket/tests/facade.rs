//! The facade alone: a limiter from limits, a built client against the fake provider, the
//! blocking front end and keyed limiters, all through `ratebucket::`.

use std::time::Duration;

use ratebucket::Limit;
use ratebucket::openai::{ChatRequest, Client, Limits, Message};
use ratebucket::sim::{LimitSpec, Sim, SimConfig};

#[tokio::test]
async fn the_quick_start_runs_against_the_fake_provider() {
    let sim = Sim::start(
        SimConfig::default().rpm(LimitSpec::per_minute(500)).tpm(LimitSpec::per_minute(200_000)),
    )
    .expect("sim");
    let client = Client::builder(sim.base_url())
        .limits(Limits::per_minute(500, 200_000))
        .build()
        .expect("builds");
    let calls: Vec<_> = (0..20)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let request =
                    ChatRequest::new("gpt-4o-mini", vec![Message::user(format!("Hello {i}."))]);
                client.complete(request).await
            })
        })
        .collect();
    for call in calls {
        call.await.expect("task").expect("completes");
    }
    assert_eq!(sim.log().len(), 20);
    assert!(sim.log().iter().all(|e| e.admitted));
}

#[tokio::test(start_paused = true)]
async fn a_limiter_from_limits_grants_all_dimensions_together() {
    let limiter =
        ratebucket::limiter([Limit::per_minute(600), Limit::per_minute(90_000)]).expect("limiter");
    assert_eq!(limiter.dimension(0).map(|v| v.state.capacity), Some(100));
    assert_eq!(limiter.dimension(1).map(|v| v.state.capacity), Some(15_000));
    let reservation = limiter.reserve(&[1, 15_000]).await.expect("granted");
    reservation.commit(&[1, 5_000]).expect("committed");
    // 10,000 tokens came back; the next reservation of them is granted at once.
    let started = tokio::time::Instant::now();
    limiter.acquire(&[1, 10_000]).await.expect("granted");
    assert_eq!(started.elapsed(), Duration::ZERO);
}

#[test]
fn the_blocking_front_end_needs_no_runtime() {
    let limiter = ratebucket::blocking::Limiter::new([Limit::per_second(10)]).expect("limiter");
    for _ in 0..10 {
        limiter.acquire(&[1]).expect("within the burst");
    }
    assert!(limiter.try_reserve(&[1]).is_err());
}

#[tokio::test]
async fn keyed_limiters_come_through_the_facade() {
    let models = ratebucket::KeyedLimiter::new(|model: &String| {
        let rpm = if model.ends_with("mini") { 600 } else { 60 };
        ratebucket::limiter([Limit::per_minute(rpm)])
    });
    assert_eq!(
        models.get(&"gpt-4o-mini".into()).expect("made").dimension(0).map(|v| v.state.capacity),
        Some(100)
    );
    assert_eq!(
        models.get(&"gpt-4o".into()).expect("made").dimension(0).map(|v| v.state.capacity),
        Some(10)
    );
}

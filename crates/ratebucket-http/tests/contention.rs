//! Many callers on one fetcher, on a multi-thread runtime, against the fake provider with
//! limits that never bind: no grant ever waits for another call to end (its reply, its
//! commit), under any schedule.

use std::time::Duration;

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{ArbiterConfig, Instant, Rate, TokenBucket};
use ratebucket_sim::{Sim, SimConfig};

const CALLERS: usize = 64;
const CALLS_EACH: usize = 30;

/// Requests and tokens, each far more than the test can use.
fn roomy(config: ArbiterConfig) -> Limiter {
    let bucket = |per_second: u64| {
        let rate = Rate::new(per_second, Duration::from_secs(1)).expect("rate");
        TokenBucket::new(rate, per_second, Instant::ZERO).expect("bucket")
    };
    Limiter::with_timer(
        vec![bucket(1_000_000), bucket(1_000_000_000)],
        config,
        ratebucket_tokio::TokioTimer::current(),
    )
    .expect("limiter")
}

/// Runs every call; the limiter's reservations that were pending at some poll (they
/// waited), and all of them.
async fn run(limiter: Limiter) -> (u64, u64) {
    let sim = Sim::start(SimConfig::default()).expect("fake provider");
    let config = FetchConfig::default().cost(vec![1, 100]);
    let transport = HyperTransport::new(Duration::from_secs(10));
    let fetcher = Fetcher::new(transport, limiter.clone(), config);
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let callers: Vec<_> = (0..CALLERS)
        .map(|caller| {
            let (fetcher, url) = (fetcher.clone(), url.clone());
            tokio::spawn(async move {
                for call in 0..CALLS_EACH {
                    let body = serde_json::json!({
                        "model": "m",
                        "messages": [{"role": "user", "content": format!("{caller}/{call}")}],
                        "max_tokens": 4,
                    });
                    let request = http::Request::post(&url)
                        .header("content-type", "application/json")
                        .body(Bytes::from(body.to_string()))
                        .expect("request");
                    let fetched = fetcher.fetch(request).await.expect("answered");
                    assert_eq!(fetched.response.status(), 200);
                }
            })
        })
        .collect();
    for caller in callers {
        caller.await.expect("caller");
    }
    let stats = limiter.stats();
    (stats.reserve_polls - stats.reservations, stats.reservations)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_grant_waits_for_another_calls_reply_when_no_limit_binds() {
    let (waited, reservations) = run(roomy(ArbiterConfig::default())).await;
    // Every call reserves once, but a caller's first call may take the express lane (no
    // poll counted) while no request has left yet: how many do is the schedule's.
    assert!(
        reservations + CALLERS as u64 >= (CALLERS * CALLS_EACH) as u64,
        "{reservations} reservations"
    );
    assert_eq!(waited, 0, "{waited} of {reservations} reservations waited, though no limit binds");
}

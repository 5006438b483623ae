//! Four limiters sharing one quota through Redis, against the fake provider: each stands
//! for a process (its own lease task and Redis connections). Starts its own
//! `redis-server` (it must be installed) and stops it at the end.
//!
//! `cargo run -p ratebucket-redis --example shared`

use std::time::{Duration, Instant};

use ratebucket_openai::{ChatRequest, Client, Limits, Message};
use ratebucket_redis::server::RedisServer;
use ratebucket_redis::{SharedConfig, SharedLimiter};
use ratebucket_sim::{LimitSpec, Sim, SimConfig};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redis = RedisServer::start()?;
    // 300 requests and 60,000 tokens per 10-second window: 30 requests/s.
    let window = Duration::from_secs(10);
    let sim = Sim::start(
        SimConfig::default()
            .rpm(LimitSpec::per_minute(300).window(window))
            .tpm(LimitSpec::per_minute(60_000).window(window)),
    )?;
    let limits = Limits::per_minute(300, 60_000).window(window);
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..4 {
        let config = SharedConfig::new("example-key", limits.per_dimension()).expected_processes(4);
        let shared = SharedLimiter::connect(&redis.url(), config).await?;
        let client = Client::builder(sim.base_url())
            .limits(limits)
            .limiter(shared.limiter().clone())
            .build()?;
        workers.push(tokio::spawn(async move {
            let calls: Vec<_> = (0..40)
                .map(|i| {
                    let client = client.clone();
                    tokio::spawn(async move {
                        let prompt = format!("Worker {worker}, item {i}: one line, please.");
                        let request = ChatRequest::new("sim-model", vec![Message::user(prompt)])
                            .max_tokens(100);
                        client.complete(request).await
                    })
                })
                .collect();
            let mut ok = 0;
            for call in calls {
                if matches!(call.await, Ok(Ok(_))) {
                    ok += 1;
                }
            }
            let stats = shared.stats();
            shared.shutdown().await;
            (worker, ok, stats)
        }));
    }
    for worker in workers {
        let (worker, ok, stats) = worker.await?;
        println!(
            "worker {worker}: {ok}/40 done, {} Redis round trips, {} leases",
            stats.round_trips, stats.leases
        );
    }
    let log = sim.log();
    let throttled = log.iter().filter(|e| e.status == Some(429)).count();
    println!(
        "160 requests in {:.1} s at 30/s with a burst of 50 (bound {:.1} s), {throttled} 429s",
        started.elapsed().as_secs_f64(),
        (160.0 - 50.0) / 30.0
    );
    sim.shutdown();
    Ok(())
}

//! The shared quota on Redis: round trips per 1,000 grants, the share of the rate eight
//! limiters reach together, and the latency a grant gains from sharing.
//!
//! Eight [`SharedLimiter`]s in one process stand for eight processes (each has its own
//! lease task and Redis connections) on a `redis-server` started for the run. The
//! quota is 2,000 requests/s (burst 200) and 400,000 tokens/s; every grant is `[1, 100]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratebucket_redis::server::RedisServer;
use ratebucket_redis::{Limit, SharedConfig, SharedLimiter};
use serde::Serialize;

const LIMITERS: usize = 8;
const TASKS: usize = 4;
const RATE: u64 = 2_000;
const RUN: Duration = Duration::from_secs(3);

/// What one run measured.
#[derive(Debug, Serialize)]
pub(crate) struct SharedResult {
    pub(crate) grants: u64,
    pub(crate) round_trips: u64,
    pub(crate) round_trips_per_1000_grants: f64,
    /// Grants per second against the quota's rate, all limiters busy.
    pub(crate) rate_reached: f64,
    /// Time to grant at a load below the rate: p50 and p99, shared and local (µs).
    pub(crate) grant_p50_us: (f64, f64),
    pub(crate) grant_p99_us: (f64, f64),
}

fn limits() -> [Limit; 2] {
    [
        Limit::per_second(RATE).with_capacity(RATE / 10),
        Limit::per_second(RATE * 200).with_capacity(RATE * 20),
    ]
}

/// Runs the measurement; `None` (with a note) when there is no `redis-server`.
pub(crate) fn run(runtime: &tokio::runtime::Runtime) -> Result<Option<SharedResult>, String> {
    let redis = match RedisServer::start() {
        Ok(redis) => redis,
        Err(e) => {
            eprintln!("shared quota on Redis: skipped ({e})");
            return Ok(None);
        }
    };
    runtime.block_on(measure(&redis)).map(Some)
}

async fn connect(redis: &RedisServer, name: &str) -> Result<Vec<SharedLimiter>, String> {
    let mut limiters = Vec::new();
    for _ in 0..LIMITERS {
        let config = SharedConfig::new(name, limits()).expected_processes(LIMITERS as u32);
        limiters.push(
            SharedLimiter::connect(&redis.url(), config)
                .await
                .map_err(|e| e.to_string())?,
        );
    }
    Ok(limiters)
}

/// Every task reserves and commits as fast as grants come, or with `pause` between.
async fn load(
    limiters: &[ratebucket_redis::Limiter],
    pause: Option<Duration>,
) -> (u64, Vec<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for limiter in limiters {
        for _ in 0..TASKS {
            let (limiter, stop) = (limiter.clone(), Arc::clone(&stop));
            tasks.push(tokio::spawn(async move {
                let mut waits = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    let Ok(reservation) = limiter.reserve(&[1, 100]).await else {
                        break;
                    };
                    waits.push(asked.elapsed());
                    let _ = reservation.commit(&[1, 100]);
                    if let Some(pause) = pause {
                        tokio::time::sleep(pause).await;
                    }
                }
                waits
            }));
        }
    }
    tokio::time::sleep(RUN).await;
    stop.store(true, Ordering::Relaxed);
    let mut waits = Vec::new();
    for task in tasks {
        // A task still waiting for a grant when the run ends is left behind.
        if let Ok(Ok(w)) = tokio::time::timeout(Duration::from_millis(500), task).await {
            waits.extend(w);
        }
    }
    (waits.len() as u64, waits)
}

fn percentile(waits: &mut [Duration], p: f64) -> f64 {
    if waits.is_empty() {
        return 0.0;
    }
    waits.sort();
    let index = ((waits.len() - 1) as f64 * p).round() as usize;
    waits[index].as_secs_f64() * 1e6
}

async fn measure(redis: &RedisServer) -> Result<SharedResult, String> {
    // Saturated: every limiter wants more than its share.
    let shared = connect(redis, "bench-saturated").await?;
    let handles: Vec<_> = shared.iter().map(|s| s.limiter().clone()).collect();
    let (grants, _) = load(&handles, None).await;
    let round_trips: u64 = shared.iter().map(|s| s.stats().round_trips).sum();
    for limiter in shared {
        limiter.shutdown().await;
    }
    // Below the rate: 8 x 4 tasks, one grant every 25 ms each (1,280/s of 2,000/s).
    let pause = Some(Duration::from_millis(25));
    let shared = connect(redis, "bench-light").await?;
    let handles: Vec<_> = shared.iter().map(|s| s.limiter().clone()).collect();
    let (_, mut shared_waits) = load(&handles, pause).await;
    for limiter in shared {
        limiter.shutdown().await;
    }
    let local = ratebucket_tokio::limiter_for(limits()).map_err(|e| e.to_string())?;
    let (_, mut local_waits) = load(&vec![local; LIMITERS], pause).await;
    let result = SharedResult {
        grants,
        round_trips,
        round_trips_per_1000_grants: round_trips as f64 * 1000.0 / grants.max(1) as f64,
        rate_reached: grants as f64 / RUN.as_secs_f64() / RATE as f64,
        grant_p50_us: (
            percentile(&mut shared_waits, 0.5),
            percentile(&mut local_waits, 0.5),
        ),
        grant_p99_us: (
            percentile(&mut shared_waits, 0.99),
            percentile(&mut local_waits, 0.99),
        ),
    };
    eprintln!(
        "shared quota on Redis ({LIMITERS} limiters, {RATE}/s): {} grants in {RUN:?} ({:.2} of the rate), \
         {} round trips ({:.1} per 1,000 grants); time to grant below the rate: \
         p50 {:.0} µs shared vs {:.0} µs local, p99 {:.0} µs vs {:.0} µs",
        result.grants,
        result.rate_reached,
        result.round_trips,
        result.round_trips_per_1000_grants,
        result.grant_p50_us.0,
        result.grant_p50_us.1,
        result.grant_p99_us.0,
        result.grant_p99_us.1,
    );
    Ok(result)
}

//! The shared quota on Redis: round trips per 1,000 grants, the share of the rate the
//! limiters reach together, and the latency a grant gains from sharing.
//!
//! [`SharedLimiter`]s in one process stand for processes (each has its own lease task and
//! Redis connections) on a `redis-server` started for the run: eight on 2,000 requests/s,
//! and a fleet of sixty-four on one hot quota of 10,000 requests/s. The burst is a tenth of
//! a second's rate, tokens are 200 per request per second; every grant is `[1, 100]`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratebucket_redis::server::RedisServer;
use ratebucket_redis::{Limit, SharedConfig, SharedLimiter};
use serde::Serialize;

const RUN: Duration = Duration::from_secs(3);

/// One configuration measured.
struct Setup {
    /// Limiters standing for processes.
    limiters: usize,
    /// Tasks reserving on each limiter.
    tasks: usize,
    /// Requests per second on the quota.
    rate: u64,
    /// Between two grants of a task under the light load (a load below the rate).
    pause: Duration,
}

const SETUPS: [Setup; 2] = [
    // 8 x 4 tasks, one grant every 25 ms each: 1,280/s of 2,000/s.
    Setup { limiters: 8, tasks: 4, rate: 2_000, pause: Duration::from_millis(25) },
    // 64 x 2 tasks, one grant every 20 ms each: 6,400/s of 10,000/s.
    Setup { limiters: 64, tasks: 2, rate: 10_000, pause: Duration::from_millis(20) },
];

/// What one configuration measured.
#[derive(Debug, Serialize)]
pub(crate) struct SharedResult {
    pub(crate) limiters: usize,
    pub(crate) rate: u64,
    pub(crate) grants: u64,
    pub(crate) round_trips: u64,
    pub(crate) round_trips_per_1000_grants: f64,
    /// Grants per second against the quota's rate, all limiters busy.
    pub(crate) rate_reached: f64,
    /// Time to grant at a load below the rate: p50 and p99, shared and local (µs).
    pub(crate) grant_p50_us: (f64, f64),
    pub(crate) grant_p99_us: (f64, f64),
}

fn limits(rate: u64) -> [Limit; 2] {
    [
        Limit::per_second(rate).with_capacity(rate / 10),
        Limit::per_second(rate * 200).with_capacity(rate * 20),
    ]
}

/// Runs the measurements; `None` (with a note) when there is no `redis-server`.
pub(crate) fn run(runtime: &tokio::runtime::Runtime) -> Result<Option<Vec<SharedResult>>, String> {
    let redis = match RedisServer::start() {
        Ok(redis) => redis,
        Err(e) => {
            eprintln!("shared quota on Redis: skipped ({e})");
            return Ok(None);
        }
    };
    SETUPS
        .iter()
        .map(|setup| runtime.block_on(measure(&redis, setup)))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

async fn connect(
    redis: &RedisServer,
    name: &str,
    setup: &Setup,
) -> Result<Vec<SharedLimiter>, String> {
    let mut limiters = Vec::new();
    for _ in 0..setup.limiters {
        let config =
            SharedConfig::new(name, limits(setup.rate)).expected_processes(setup.limiters as u32);
        limiters
            .push(SharedLimiter::connect(&redis.url(), config).await.map_err(|e| e.to_string())?);
    }
    Ok(limiters)
}

/// Every task reserves and commits as fast as grants come, or with `pause` between.
async fn load(
    limiters: &[ratebucket_redis::Limiter],
    tasks_each: usize,
    pause: Option<Duration>,
) -> (u64, Vec<Duration>) {
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for limiter in limiters {
        for _ in 0..tasks_each {
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

async fn measure(redis: &RedisServer, setup: &Setup) -> Result<SharedResult, String> {
    let (n, rate) = (setup.limiters, setup.rate);
    // Saturated: every limiter wants more than its share.
    let shared = connect(redis, &format!("bench-saturated-{n}"), setup).await?;
    let handles: Vec<_> = shared.iter().map(|s| s.limiter().clone()).collect();
    let (grants, _) = load(&handles, setup.tasks, None).await;
    let round_trips: u64 = shared.iter().map(|s| s.stats().round_trips).sum();
    for limiter in shared {
        limiter.shutdown().await;
    }
    // Below the rate.
    let pause = Some(setup.pause);
    let shared = connect(redis, &format!("bench-light-{n}"), setup).await?;
    let handles: Vec<_> = shared.iter().map(|s| s.limiter().clone()).collect();
    let (_, mut shared_waits) = load(&handles, setup.tasks, pause).await;
    for limiter in shared {
        limiter.shutdown().await;
    }
    let local = ratebucket_tokio::limiter_for(limits(rate)).map_err(|e| e.to_string())?;
    let (_, mut local_waits) = load(&vec![local; n], setup.tasks, pause).await;
    let result = SharedResult {
        limiters: n,
        rate,
        grants,
        round_trips,
        round_trips_per_1000_grants: round_trips as f64 * 1000.0 / grants.max(1) as f64,
        rate_reached: grants as f64 / RUN.as_secs_f64() / rate as f64,
        grant_p50_us: (percentile(&mut shared_waits, 0.5), percentile(&mut local_waits, 0.5)),
        grant_p99_us: (percentile(&mut shared_waits, 0.99), percentile(&mut local_waits, 0.99)),
    };
    eprintln!(
        "shared quota on Redis ({n} limiters, {rate}/s): {} grants in {RUN:?} ({:.2} of the rate), \
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

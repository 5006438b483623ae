//! The shared quota on Redis: round trips per 1,000 grants, the share of the rate the
//! limiters reach together, the busiest second against the bound, and the latency a
//! grant gains from sharing; and the same of simulated fleets at every start pattern.
//!
//! [`SharedLimiter`]s in one process stand for processes (each has its own lease task and
//! Redis connections) on a `redis-server` started for the run: eight on 2,000 requests/s,
//! and a fleet of sixty-four on one hot quota of 10,000 requests/s. The burst is a tenth of
//! a second's rate, tokens are 200 per request per second; every grant is `[1, 100]`.
//!
//! Simulated fleets (`ratebucket_redis::fleet`: the real drivers and scripts on a virtual
//! clock) add what one machine cannot run: 48 processes started at once expecting 8, in
//! waves, with Redis slow while they start, and a thousand processes on 10,000 requests/s.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratebucket_redis::fleet::{FleetPlan, FleetReport, ProcessPlan, RedisEvent, simulate};
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
    /// The most granted in any second of the saturated run, and the bound `C + R·(1 s + P)`.
    pub(crate) busiest_second: u64,
    pub(crate) bound_second: f64,
}

/// What `bench/shared.json` holds.
#[derive(Debug, Serialize)]
pub(crate) struct SharedResults {
    /// Limiters in one process on a real `redis-server`.
    pub(crate) real: Vec<SharedResult>,
    /// Simulated fleets.
    pub(crate) simulated: Vec<SimulatedResult>,
}

/// One simulated fleet.
#[derive(Debug, Serialize)]
pub(crate) struct SimulatedResult {
    pub(crate) pattern: &'static str,
    pub(crate) processes: usize,
    /// Requests per second on the quota.
    pub(crate) rate: f64,
    pub(crate) grants: usize,
    pub(crate) round_trips_per_1000_grants: f64,
    /// The most requests granted in any second, and the bound `C + R·(1 s + P)`.
    pub(crate) busiest_second: u64,
    pub(crate) bound_second: f64,
    /// The same over the provider's window (6 s here; 1 s for the thousand).
    pub(crate) busiest_window: u64,
    pub(crate) bound_window: f64,
    /// How long a call waited for its grant (ms).
    pub(crate) wait_p50_ms: f64,
    pub(crate) wait_p99_ms: f64,
    /// Processes that fell back to a local share (none while Redis answers).
    pub(crate) fallbacks: u64,
}

fn limits(rate: u64) -> [Limit; 2] {
    [
        Limit::per_second(rate).with_capacity(rate / 10),
        Limit::per_second(rate * 200).with_capacity(rate * 20),
    ]
}

/// Runs the measurements: the simulated fleets always, the real ones when there is a
/// `redis-server` (else with a note).
pub(crate) fn run(runtime: &tokio::runtime::Runtime) -> Result<SharedResults, String> {
    let real = match RedisServer::start() {
        Ok(redis) => SETUPS
            .iter()
            .map(|setup| runtime.block_on(measure(&redis, setup)))
            .collect::<Result<Vec<_>, _>>()?,
        Err(e) => {
            eprintln!("shared quota on Redis: skipped ({e})");
            Vec::new()
        }
    };
    Ok(SharedResults { real, simulated: simulated() })
}

/// 150 requests and 36,000 tokens per 6 s, calls reserving 664 tokens and using 90 (an
/// OpenAI client's reservation for a 150-token reply, its learned charge included).
fn small_quota() -> FleetPlan {
    let window = Duration::from_secs(6);
    let mut plan = FleetPlan::new([Limit::per(150, window), Limit::per(36_000, window)]);
    plan.expected_processes = 8;
    plan.run_for = Duration::from_secs(30);
    plan
}

fn worker(calls: u64) -> ProcessPlan {
    let mut worker = ProcessPlan::new(vec![1, 664]);
    worker.used = vec![1, 90];
    worker.callers = 8;
    worker.calls = Some(calls);
    worker.holds = Duration::from_millis(80);
    worker
}

/// The simulated start patterns, and the thousand.
fn simulated() -> Vec<SimulatedResult> {
    let mut results = Vec::new();
    let mut at_once = small_quota();
    at_once.processes = (0..48).map(|_| worker(8)).collect();
    results.push(summarise("48 at once, 8 calls each", &at_once, Duration::from_secs(6)));
    let mut spread = small_quota();
    spread.processes = (0..48u32)
        .map(|i| {
            let mut p = worker(8);
            p.joins = Duration::from_millis(30) * i;
            p
        })
        .collect();
    results.push(summarise("48 started 30 ms apart", &spread, Duration::from_secs(6)));
    let mut waves = small_quota();
    waves.processes = (0..80u64)
        .map(|i| {
            let mut p = worker(12);
            p.joins = Duration::from_secs(2 * (i / 20));
            p
        })
        .collect();
    results.push(summarise("80 in four waves 2 s apart", &waves, Duration::from_secs(6)));
    let mut slow = small_quota();
    slow.processes = (0..48).map(|_| worker(8)).collect();
    let late = Duration::from_millis(300);
    slow.events = vec![
        (Duration::ZERO, RedisEvent::Latency(late, late)),
        (Duration::from_secs(3), RedisEvent::Latency(Duration::from_millis(1), Duration::ZERO)),
    ];
    results.push(summarise("48 at once, Redis slow for 3 s", &slow, Duration::from_secs(6)));
    let mut thousand = FleetPlan::new(limits(10_000));
    thousand.run_for = Duration::from_secs(4);
    thousand.lease_period = Duration::from_secs(1);
    thousand.expected_processes = 64;
    thousand.processes = (0..1_000)
        .map(|_| {
            let mut p = ProcessPlan::new(vec![1, 100]);
            p.callers = 2;
            p.holds = Duration::from_millis(20);
            p
        })
        .collect();
    results.push(summarise("1,000 at once, 10,000 requests/s", &thousand, Duration::from_secs(1)));
    results
}

fn summarise(pattern: &'static str, plan: &FleetPlan, window: Duration) -> SimulatedResult {
    let started = Instant::now();
    let report: FleetReport = simulate(plan);
    let second = Duration::from_secs(1);
    let result = SimulatedResult {
        pattern,
        processes: plan.processes.len(),
        rate: report.limits[0].0,
        grants: report.grants.len(),
        round_trips_per_1000_grants: report.round_trips as f64 * 1000.0
            / report.grants.len().max(1) as f64,
        busiest_second: report.busiest(0, second).0,
        bound_second: report.bound(0, second),
        busiest_window: report.busiest(0, window).0,
        bound_window: report.bound(0, window),
        wait_p50_ms: report.wait_quantile(0.5).as_secs_f64() * 1e3,
        wait_p99_ms: report.wait_quantile(0.99).as_secs_f64() * 1e3,
        fallbacks: report.fallbacks,
    };
    eprintln!(
        "simulated fleet, {pattern}: {} grants, {:.0} round trips per 1,000, busiest second {} \
         (bound {:.1}), busiest {window:?} {} (bound {:.1}), wait p50 {:.0} ms p99 {:.0} ms \
         ({:.1} s to simulate)",
        result.grants,
        result.round_trips_per_1000_grants,
        result.busiest_second,
        result.bound_second,
        result.busiest_window,
        result.bound_window,
        result.wait_p50_ms,
        result.wait_p99_ms,
        started.elapsed().as_secs_f64(),
    );
    result
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

/// Every task reserves and commits as fast as grants come, or with `pause` between: the
/// grants, how long each waited, and when each was made.
async fn load(
    limiters: &[ratebucket_redis::Limiter],
    tasks_each: usize,
    pause: Option<Duration>,
) -> (u64, Vec<Duration>, Vec<Instant>) {
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
                    let granted = Instant::now();
                    waits.push((granted - asked, granted));
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
    let (mut waits, mut granted_at) = (Vec::new(), Vec::new());
    for task in tasks {
        // A task still waiting for a grant when the run ends is left behind.
        if let Ok(Ok(w)) = tokio::time::timeout(Duration::from_millis(500), task).await {
            for (waited, at) in w {
                waits.push(waited);
                granted_at.push(at);
            }
        }
    }
    (waits.len() as u64, waits, granted_at)
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
    let (grants, _, mut granted_at) = load(&handles, setup.tasks, None).await;
    granted_at.sort();
    let mut busiest_second = 0;
    let mut first = 0;
    for (last, &at) in granted_at.iter().enumerate() {
        while at - granted_at[first] >= Duration::from_secs(1) {
            first += 1;
        }
        busiest_second = busiest_second.max(last - first + 1);
    }
    let [requests, _] = limits(rate);
    // The default lease period: 1 s.
    let bound_second = requests.capacity() as f64 + rate as f64 * 2.0;
    let round_trips: u64 = shared.iter().map(|s| s.stats().round_trips).sum();
    for limiter in shared {
        limiter.shutdown().await;
    }
    // Below the rate.
    let pause = Some(setup.pause);
    let shared = connect(redis, &format!("bench-light-{n}"), setup).await?;
    let handles: Vec<_> = shared.iter().map(|s| s.limiter().clone()).collect();
    let (_, mut shared_waits, _) = load(&handles, setup.tasks, pause).await;
    for limiter in shared {
        limiter.shutdown().await;
    }
    let local = ratebucket_tokio::limiter_for(limits(rate)).map_err(|e| e.to_string())?;
    let (_, mut local_waits, _) = load(&vec![local; n], setup.tasks, pause).await;
    let result = SharedResult {
        limiters: n,
        rate,
        grants,
        round_trips,
        round_trips_per_1000_grants: round_trips as f64 * 1000.0 / grants.max(1) as f64,
        rate_reached: grants as f64 / RUN.as_secs_f64() / rate as f64,
        grant_p50_us: (percentile(&mut shared_waits, 0.5), percentile(&mut local_waits, 0.5)),
        grant_p99_us: (percentile(&mut shared_waits, 0.99), percentile(&mut local_waits, 0.99)),
        busiest_second: busiest_second as u64,
        bound_second,
    };
    eprintln!(
        "shared quota on Redis ({n} limiters, {rate}/s): {} grants in {RUN:?} ({:.2} of the rate), \
         {} round trips ({:.1} per 1,000 grants), busiest second {} (bound {:.0}); time to \
         grant below the rate: p50 {:.0} µs shared vs {:.0} µs local, p99 {:.0} µs vs {:.0} µs",
        result.grants,
        result.rate_reached,
        result.round_trips,
        result.round_trips_per_1000_grants,
        result.busiest_second,
        result.bound_second,
        result.grant_p50_us.0,
        result.grant_p50_us.1,
        result.grant_p99_us.0,
        result.grant_p99_us.1,
    );
    Ok(result)
}

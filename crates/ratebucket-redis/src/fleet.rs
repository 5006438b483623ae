//! Simulated fleets: up to thousands of processes sharing one quota, each a real
//! [`SharedLimiter`] (its driver, listener and local limiter unchanged), leasing from an
//! in-process Redis that runs the crate's own Lua scripts, all on tokio's paused clock.
//!
//! A run is a [`FleetPlan`]: the quota, when each process joins and how it ends (leaves,
//! or is killed holding what it holds), what its callers reserve, and what befalls Redis
//! (slow answers, an outage, a restart that loses the data). [`simulate`] runs it in a
//! fraction of the time it describes, the same way every time for the same plan and
//! seed, and reports every grant with the instant it was made, so the bounds in the crate
//! docs can be checked window by window ([`FleetReport::busiest`], [`FleetReport::bound`]).
//!
//! ```
//! use std::time::Duration;
//! use ratebucket_redis::Limit;
//! use ratebucket_redis::fleet::{simulate, FleetPlan, ProcessPlan};
//!
//! let mut plan = FleetPlan::new([Limit::per(150, Duration::from_secs(6))]);
//! plan.run_for = Duration::from_secs(5);
//! plan.processes = (0..48).map(|_| ProcessPlan::new(vec![1])).collect();
//! let report = simulate(&plan);
//! let (most, _) = report.busiest(0, Duration::from_secs(1));
//! assert!(most as f64 <= report.bound(0, Duration::from_secs(1)));
//! ```

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::Backend;
use crate::model::Model;
use crate::{Limit, SharedConfig, SharedLimiter};

/// How a process ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// [`SharedLimiter::shutdown`]: what it holds unspent goes back.
    Leave,
    /// Killed: its tasks stop where they are, what it holds is lost with it.
    Kill,
}

/// One simulated process.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ProcessPlan {
    /// When it joins, from the start of the run.
    pub joins: Duration,
    /// When and how it ends (`None`: it runs to the end, then leaves).
    pub exit: Option<(Duration, Exit)>,
    /// Callers reserving on it, each one call after another.
    pub callers: usize,
    /// How many calls it makes in all (`None`: as many as it can); once they are done it
    /// leaves, as a worker with a batch to send does.
    pub calls: Option<u64>,
    /// What each call reserves, per dimension.
    pub cost: Vec<u64>,
    /// What each call turns out to use (at most `cost`), committed when it ends.
    pub used: Vec<u64>,
    /// How long a call lasts once granted.
    pub holds: Duration,
    /// Between the end of one call and the next reservation of the same caller.
    pub pause: Duration,
}

impl ProcessPlan {
    /// A process from the start to the end with four callers, each call reserving `cost`,
    /// using all of it, lasting 50 ms, and followed at once by the next.
    pub fn new(cost: Vec<u64>) -> ProcessPlan {
        ProcessPlan {
            joins: Duration::ZERO,
            exit: None,
            callers: 4,
            calls: None,
            used: cost.clone(),
            cost,
            holds: Duration::from_millis(50),
            pause: Duration::ZERO,
        }
    }
}

/// What befalls Redis during a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RedisEvent {
    /// Calls from now take the first duration to reach it and the second to come back.
    Latency(Duration, Duration),
    /// It stops: calls and connections fail at once.
    Down,
    /// It starts again with what it held.
    Up,
    /// It restarts without its data.
    Restart,
}

/// A run: the quota, the processes, what befalls Redis.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FleetPlan {
    /// The quota, one limit per dimension.
    pub limits: Vec<Limit>,
    /// The lease period ([`SharedConfig::lease_period`]).
    pub lease_period: Duration,
    /// The processes' guess of their number ([`SharedConfig::expected_processes`]).
    pub expected_processes: u32,
    /// The Redis timeout ([`SharedConfig::timeout`]).
    pub timeout: Duration,
    /// The processes.
    pub processes: Vec<ProcessPlan>,
    /// What befalls Redis, and when.
    pub events: Vec<(Duration, RedisEvent)>,
    /// How long the run lasts.
    pub run_for: Duration,
    /// Seeds every random draw (the processes' ids and their jitter).
    pub seed: u64,
}

impl FleetPlan {
    /// A run of ten seconds on `limits`, no processes yet, a lease period of 500 ms,
    /// eight processes expected, Redis answering at once.
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> FleetPlan {
        FleetPlan {
            limits: limits.into_iter().collect(),
            lease_period: Duration::from_millis(500),
            expected_processes: 8,
            timeout: Duration::from_millis(250),
            processes: Vec::new(),
            events: Vec::new(),
            run_for: Duration::from_secs(10),
            seed: 1,
        }
    }
}

/// One grant a process's limiter made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// When, from the start of the run.
    pub at: Duration,
    /// Which process (its index in the plan).
    pub process: usize,
    /// What it reserved, per dimension.
    pub cost: Vec<u64>,
    /// What the call used, per dimension: what a provider counts (the rest was refunded).
    pub used: Vec<u64>,
    /// How long the call waited for it.
    pub waited: Duration,
}

/// What a run did.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FleetReport {
    /// Every grant, in the order made.
    pub grants: Vec<Grant>,
    /// Redis calls that answered, over every process.
    pub round_trips: u64,
    /// Redis calls that failed or timed out.
    pub failures: u64,
    /// Times a process fell back to its local share.
    pub fallbacks: u64,
    /// Scripts the server ran (answered or not).
    pub scripts_run: u64,
    /// The quota's rate (permits per second) and capacity per dimension.
    pub limits: Vec<(f64, u64)>,
    /// The lease period.
    pub lease_period: Duration,
}

impl FleetReport {
    /// The most of `dimension` that grants made in any window of `window` used (what a
    /// provider counts, the rest refunded), and where that window starts.
    pub fn busiest(&self, dimension: usize, window: Duration) -> (u64, Duration) {
        let mut grants: Vec<(Duration, u64)> = self
            .grants
            .iter()
            .map(|g| (g.at, g.used.get(dimension).copied().unwrap_or(0)))
            .collect();
        grants.sort();
        let (mut most, mut at, mut sum, mut start) = (0, Duration::ZERO, 0, 0);
        for end in 0..grants.len() {
            sum += grants[end].1;
            while grants[end].0 - grants[start].0 >= window {
                sum -= grants[start].1;
                start += 1;
            }
            if sum > most {
                (most, at) = (sum, grants[start].0);
            }
        }
        (most, at)
    }

    /// The documented bound on what grants made in a window of `window` use while Redis
    /// keeps the quota: `C + R·(W + P)`.
    pub fn bound(&self, dimension: usize, window: Duration) -> f64 {
        let (rate, capacity) = self.limits[dimension];
        capacity as f64 + rate * (window + self.lease_period).as_secs_f64()
    }

    /// The grant waits' quantile `q` (0 to 1).
    pub fn wait_quantile(&self, q: f64) -> Duration {
        let mut waits: Vec<Duration> = self.grants.iter().map(|g| g.waited).collect();
        if waits.is_empty() {
            return Duration::ZERO;
        }
        waits.sort();
        waits[((waits.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize]
    }
}

/// Runs `plan` on a paused clock (see the module docs). Each process is a
/// [`SharedLimiter`] on the in-process Redis; the run's instants are virtual.
///
/// # Panics
///
/// If the plan's limits are not a valid [`SharedConfig`].
pub fn simulate(plan: &FleetPlan) -> FleetReport {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime builds");
    fastrand::seed(plan.seed);
    runtime.block_on(run(plan))
}

/// What every process's callers share.
struct Log {
    origin: Instant,
    grants: Mutex<Vec<Grant>>,
}

async fn run(plan: &FleetPlan) -> FleetReport {
    let model = Model::new();
    let log = Arc::new(Log { origin: Instant::now(), grants: Mutex::new(Vec::new()) });
    let mut config = SharedConfig::new("fleet", plan.limits.clone())
        .expected_processes(plan.expected_processes)
        .lease_period(plan.lease_period)
        .timeout(plan.timeout);
    config.validate().expect("a valid plan");
    config.tick = Duration::from_millis(10);
    let end = log.origin + plan.run_for;
    let mut events = plan.events.clone();
    events.sort_by_key(|(at, _)| *at);
    let director = {
        let model = model.clone();
        let origin = log.origin;
        tokio::spawn(async move {
            for (at, event) in events {
                tokio::time::sleep_until(origin + at).await;
                match event {
                    RedisEvent::Latency(before, after) => model.set_latency(before, after),
                    RedisEvent::Down => model.set_down(true),
                    RedisEvent::Up => model.set_down(false),
                    RedisEvent::Restart => model.restart(),
                }
            }
        })
    };
    let processes: Vec<_> = plan
        .processes
        .iter()
        .enumerate()
        .map(|(index, process)| {
            let (model, config, log) = (model.clone(), config.clone(), Arc::clone(&log));
            let process = process.clone();
            tokio::spawn(async move { run_process(index, process, model, config, log, end).await })
        })
        .collect();
    let mut report = FleetReport {
        grants: Vec::new(),
        round_trips: 0,
        failures: 0,
        fallbacks: 0,
        scripts_run: 0,
        limits: plan
            .limits
            .iter()
            .map(|l| (l.amount() as f64 / l.period().as_secs_f64(), l.capacity()))
            .collect(),
        lease_period: plan.lease_period,
    };
    for process in processes {
        if let Ok(stats) = process.await {
            report.round_trips += stats.round_trips;
            report.failures += stats.failures;
            report.fallbacks += stats.fallbacks;
        }
    }
    director.abort();
    report.scripts_run = model.calls();
    report.grants = std::mem::take(&mut *log.grants.lock().unwrap_or_else(|e| e.into_inner()));
    report
}

async fn run_process(
    index: usize,
    plan: ProcessPlan,
    model: Model,
    config: SharedConfig,
    log: Arc<Log>,
    end: Instant,
) -> crate::SharedStats {
    tokio::time::sleep_until(log.origin + plan.joins).await;
    let shared = SharedLimiter::join(Backend::Model(model), config).expect("a valid plan joins");
    let left = Arc::new(std::sync::atomic::AtomicU64::new(plan.calls.unwrap_or(u64::MAX)));
    let callers: Vec<_> = (0..plan.callers)
        .map(|_| {
            let limiter = shared.limiter().clone();
            let (plan, log, left) = (plan.clone(), Arc::clone(&log), Arc::clone(&left));
            tokio::spawn(async move {
                let take = |n: u64| n.checked_sub(1);
                while left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, take).is_ok() {
                    let asked = Instant::now();
                    let Ok(reservation) = limiter.reserve(&plan.cost).await else { return };
                    let granted = Instant::now();
                    log.grants.lock().unwrap_or_else(|e| e.into_inner()).push(Grant {
                        at: granted - log.origin,
                        process: index,
                        cost: plan.cost.clone(),
                        used: plan.used.clone(),
                        waited: granted - asked,
                    });
                    tokio::time::sleep(plan.holds).await;
                    let _ = reservation.commit(&plan.used);
                    tokio::time::sleep(plan.pause).await;
                }
            })
        })
        .collect();
    let (until, exit) = match plan.exit {
        Some((at, exit)) => ((log.origin + at).min(end), exit),
        None => (end, Exit::Leave),
    };
    let deadline = tokio::time::sleep_until(until);
    tokio::pin!(deadline);
    let mut callers = callers;
    for caller in &mut callers {
        // Each caller stops when the calls are done, or at the deadline.
        tokio::select! {
            biased;
            () = &mut deadline => break,
            _ = caller => {}
        }
    }
    for caller in &callers {
        caller.abort();
    }
    let stats = shared.stats();
    match exit {
        Exit::Leave => shared.shutdown().await,
        Exit::Kill => drop(shared),
    }
    stats
}

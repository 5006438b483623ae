//! `cargo xtask waiters`: many waiters on one limiter, ratebucket beside governor and
//! leaky-bucket in the same process and run.
//!
//! For each size (2,000 waiters at 1,000/s; 20,000 at 100,000/s) every engine gets the same
//! limit with ten milliseconds of burst, all waiters start at once, and we measure the
//! makespan against the ideal `(waiters - burst) / rate` and how many times each waiting
//! future was polled per grant (a thundering herd shows as hundreds). Then the uncontended
//! cost of one reserve+commit through the async handle beside governor's `check()`.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::counted::{Counted, Polls};

use ratebucket_core::{Instant as CoreInstant, Rate, TokenBucket};

const ROUNDS: usize = 5;

pub(crate) fn run() -> Result<(), String> {
    if cfg!(debug_assertions) {
        // Timings of an unoptimised build mean nothing: re-run this task optimised.
        return crate::cargo(&["run", "--release", "--quiet", "-p", "xtask", "--", "waiters"], &[]);
    }
    println!(
        "{:<22} {:>9} {:>11} {:>9} {:>14}",
        "engine", "waiters", "makespan", "/ ideal", "polls / grant"
    );
    for (waiters, rate) in [(2_000u64, 1_000u64), (20_000, 100_000)] {
        let burst = rate / 100;
        let ideal = Duration::from_secs_f64((waiters - burst) as f64 / rate as f64);
        let engines: [(&str, Engine); 4] = [
            ("ratebucket (tokio)", Engine::RatebucketTokio),
            ("ratebucket (smol)", Engine::RatebucketSmol),
            ("governor until_ready", Engine::Governor),
            ("leaky-bucket", Engine::LeakyBucket),
        ];
        for (name, engine) in engines {
            let run = engine.run(waiters, rate, burst)?;
            println!(
                "{name:<22} {waiters:>9} {:>9.3} s {:>8.3}x {:>14.2}",
                run.makespan.as_secs_f64(),
                run.makespan.as_secs_f64() / ideal.as_secs_f64(),
                run.polls as f64 / waiters as f64
            );
        }
        println!(
            "{:<22} {waiters:>9} {:>9.3} s   (ideal at {rate}/s, burst {burst})",
            "",
            ideal.as_secs_f64()
        );
    }
    println!();
    let ours = uncontended_ratebucket()?;
    let governor = uncontended_governor();
    println!("uncontended, per operation (best of {ROUNDS})");
    println!("  ratebucket-tokio reserve().await + commit(), 1 dimension  {ours:>7.1} ns");
    println!("  governor check()                                         {governor:>7.1} ns");
    println!(
        "  ratio                                                    {:>7.2}x",
        ours / governor
    );
    Ok(())
}

struct RunResult {
    makespan: Duration,
    polls: usize,
}

#[derive(Clone, Copy)]
enum Engine {
    RatebucketTokio,
    RatebucketSmol,
    Governor,
    LeakyBucket,
}

impl Engine {
    fn run(self, waiters: u64, rate: u64, burst: u64) -> Result<RunResult, String> {
        let polls = Arc::new(Polls::default());
        let makespan = match self {
            Engine::RatebucketTokio => tokio_runtime()?.block_on(async {
                let bucket = bucket(rate, burst)?;
                let limiter = ratebucket_tokio::limiter(vec![bucket]).map_err(|e| e.to_string())?;
                let start = Instant::now();
                let tasks: Vec<_> = (0..waiters)
                    .map(|_| {
                        let limiter = limiter.clone();
                        let polls = Arc::clone(&polls);
                        tokio::spawn(async move {
                            let reserve = async { limiter.reserve(&[1]).await };
                            let granted = Counted::new(reserve, &polls).await;
                            granted.map(|r| r.commit(&[1]))
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?
                        .map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(start.elapsed())
            })?,
            Engine::RatebucketSmol => smol::block_on(async {
                let bucket = bucket(rate, burst)?;
                let limiter = ratebucket_smol::limiter(vec![bucket]).map_err(|e| e.to_string())?;
                let start = Instant::now();
                let tasks: Vec<_> = (0..waiters)
                    .map(|_| {
                        let limiter = limiter.clone();
                        let polls = Arc::clone(&polls);
                        smol::spawn(async move {
                            let reserve = async { limiter.reserve(&[1]).await };
                            let granted = Counted::new(reserve, &polls).await;
                            granted.map(|r| r.commit(&[1]))
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(start.elapsed())
            })?,
            Engine::Governor => tokio_runtime()?.block_on(async {
                let per_second = NonZeroU32::new(u32::try_from(rate).map_err(|e| e.to_string())?)
                    .ok_or("zero rate")?;
                let burst = NonZeroU32::new(u32::try_from(burst).map_err(|e| e.to_string())?)
                    .ok_or("zero burst")?;
                let quota = governor::Quota::per_second(per_second).allow_burst(burst);
                let limiter = Arc::new(governor::RateLimiter::direct(quota));
                let start = Instant::now();
                let tasks: Vec<_> = (0..waiters)
                    .map(|_| {
                        let limiter = Arc::clone(&limiter);
                        let polls = Arc::clone(&polls);
                        tokio::spawn(async move {
                            Counted::new(limiter.until_ready(), &polls).await;
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(start.elapsed())
            })?,
            Engine::LeakyBucket => tokio_runtime()?.block_on(async {
                let burst = usize::try_from(burst).map_err(|e| e.to_string())?;
                // Refilled a burst's worth every 10 ms: a 1 ms interval runs at half speed,
                // since each refill waits on a timer that fires on the next millisecond.
                let limiter = Arc::new(
                    leaky_bucket::RateLimiter::builder()
                        .max(burst)
                        .initial(burst)
                        .refill(burst)
                        .interval(Duration::from_millis(10))
                        .build(),
                );
                let start = Instant::now();
                let tasks: Vec<_> = (0..waiters)
                    .map(|_| {
                        let limiter = Arc::clone(&limiter);
                        let polls = Arc::clone(&polls);
                        tokio::spawn(async move {
                            Counted::new(limiter.acquire_one(), &polls).await;
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(start.elapsed())
            })?,
        };
        Ok(RunResult { makespan, polls: polls.get().0 as usize })
    }
}

fn bucket(rate: u64, burst: u64) -> Result<TokenBucket, String> {
    let rate = Rate::per_second(rate).map_err(|e| e.to_string())?;
    TokenBucket::new(rate, burst, CoreInstant::ZERO).map_err(|e| e.to_string())
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())
}

fn uncontended_ratebucket() -> Result<f64, String> {
    const OPS: u32 = 1_000_000;
    tokio_runtime()?.block_on(async {
        let limiter = ratebucket_tokio::limiter(vec![bucket(1 << 40, 1 << 40)?])
            .map_err(|e| e.to_string())?;
        let mut best = f64::INFINITY;
        for _ in 0..ROUNDS {
            let start = Instant::now();
            for _ in 0..OPS {
                let reservation =
                    limiter.reserve(black_box(&[1])).await.map_err(|e| e.to_string())?;
                reservation.commit(black_box(&[1])).map_err(|e| e.to_string())?;
            }
            best = best.min(start.elapsed().as_nanos() as f64 / f64::from(OPS));
        }
        Ok(best)
    })
}

fn uncontended_governor() -> f64 {
    const OPS: u32 = 1_000_000;
    let limiter = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX));
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        for _ in 0..OPS {
            let _ = black_box(limiter.check());
        }
        best = best.min(start.elapsed().as_nanos() as f64 / f64::from(OPS));
    }
    best
}

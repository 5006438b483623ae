//! The `tenants` scenario: one quota shared by a saturating batch tenant, an interactive
//! tenant at a tenth of the rate and two weighted tenants, through ratebucket's OpenAI
//! client, with tenants and classes and again as one first-come queue, in the same run.
//!
//! The provider allows 80 requests per window (a quarter second: 320 requests/s) and
//! plenty of tokens; the client is told so and starts with a sixth of it as its burst.
//! Tenant 1 sends 1,200 batch calls from 64 tasks; tenants 3 (weight 3) and 4 (weight 1)
//! send 600 and 200 default calls from 32 tasks each; tenant 2 sends one interactive call
//! every 31 ms (a tenth of the rate) until the others are done. The weighted tenants'
//! shares are counted over the span in which both are busy, against the share their
//! weights give them (3/4, 1/4); the batch class yields to theirs meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ratebucket_openai::{ChatRequest, Client, Limits, Message};
use ratebucket_rt::core::{Caller, Priority, Tenant};
use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use serde::Serialize;

use super::WINDOW;

const RPM: u64 = 80;
const TPM: u64 = 1_000_000;
/// One interactive call every this long: a tenth of the rate.
const INTERACTIVE_GAP: Duration = Duration::from_micros(31_250);

/// One busy tenant: its number, weight, calls and tasks.
struct Busy {
    tenant: u32,
    weight: u32,
    priority: Priority,
    calls: usize,
    tasks: usize,
}

const BUSY: [Busy; 3] = [
    Busy { tenant: 1, weight: 1, priority: Priority::Batch, calls: 1_200, tasks: 64 },
    Busy { tenant: 3, weight: 3, priority: Priority::Default, calls: 600, tasks: 32 },
    Busy { tenant: 4, weight: 1, priority: Priority::Default, calls: 200, tasks: 32 },
];

/// What one mode measured.
#[derive(Debug, Serialize)]
pub(crate) struct TenantsRun {
    /// `fair` (tenants, weights and classes) or `fifo` (every call the default caller).
    mode: &'static str,
    /// From the first call to the last busy tenant's last answer.
    makespan_s: f64,
    interactive_calls: usize,
    /// Time from an interactive call to its answer (the fake provider answers in about a
    /// millisecond), p50 and p99.
    interactive_p50_ms: f64,
    interactive_p99_ms: f64,
    /// Per weighted tenant (one class): (tenant, weight, share of the two tenants' grants
    /// while both were busy, the share its weight gives it).
    shares: Vec<(u32, u32, f64, f64)>,
    /// The batch tenant's grants over the weighted tenants' and its own, in that span.
    batch_share: f64,
    throttled: usize,
}

fn prompt(i: usize) -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user(format!("Summarise item {i}."))])
        .max_tokens(50)
}

fn percentile(waits: &mut [Duration], p: f64) -> f64 {
    if waits.is_empty() {
        return 0.0;
    }
    waits.sort();
    waits[((waits.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3
}

async fn one(fair: bool) -> Result<TenantsRun, String> {
    let spec = |limit| LimitSpec::per_minute(limit).window(WINDOW);
    let sim = Sim::start(SimConfig::default().rpm(spec(RPM)).tpm(spec(TPM)))
        .map_err(|e| e.to_string())?;
    let limits = Limits {
        requests_per_minute: Some(RPM),
        tokens_per_minute: Some(TPM),
        window: WINDOW,
        ..Limits::default()
    };
    let client =
        Client::builder(sim.base_url()).limits(limits).build().map_err(|e| e.to_string())?;
    let caller = |tenant: u32, priority: Priority| {
        if fair { Caller::tenant(tenant).priority(priority) } else { Caller::default() }
    };
    if fair {
        for busy in &BUSY {
            client
                .limiter()
                .set_weight(Tenant(busy.tenant), busy.weight)
                .map_err(|e| e.to_string())?;
        }
    }
    let start = Instant::now();
    let mut handles = Vec::new();
    for (b, busy) in BUSY.iter().enumerate() {
        let client = client.for_caller(caller(busy.tenant, busy.priority));
        let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..busy.tasks {
            let (client, next, calls) = (client.clone(), Arc::clone(&next), busy.calls);
            handles.push(tokio::spawn(async move {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= calls {
                        break done;
                    }
                    if client.complete(prompt(i)).await.is_ok() {
                        done.push((b, start.elapsed()));
                    }
                }
            }));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let interactive = {
        let client = client.for_caller(caller(2, Priority::Interactive));
        let stop = Arc::clone(&stop);
        tokio::spawn(async move {
            let mut calls = Vec::new();
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                let client = client.clone();
                calls.push(tokio::spawn(async move {
                    let asked = Instant::now();
                    client.complete(prompt(100_000 + i)).await.ok()?;
                    Some(asked.elapsed())
                }));
                i += 1;
                tokio::time::sleep(INTERACTIVE_GAP).await;
            }
            let mut waits = Vec::new();
            for call in calls {
                if let Ok(Some(wait)) = call.await {
                    waits.push(wait);
                }
            }
            waits
        })
    };
    let mut answers: Vec<(usize, Duration)> = Vec::new();
    for handle in handles {
        answers.extend(handle.await.map_err(|e| e.to_string())?);
    }
    let makespan = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut waits = interactive.await.map_err(|e| e.to_string())?;
    // The weighted tenants share one class: their shares are counted over the span in
    // which both still had calls to make. The batch class yields to them meanwhile.
    let weighted: Vec<usize> =
        (0..BUSY.len()).filter(|&b| BUSY[b].priority == Priority::Default).collect();
    let both_busy = weighted
        .iter()
        .map(|&b| {
            answers.iter().filter(|(t, _)| *t == b).map(|(_, at)| *at).max().unwrap_or_default()
        })
        .min()
        .unwrap_or_default();
    let in_span = |b: usize| answers.iter().filter(|(t, at)| *t == b && *at <= both_busy).count();
    let total: usize = weighted.iter().map(|&b| in_span(b)).sum();
    let batch_in_span = in_span(0);
    let weights: u32 = weighted.iter().map(|&b| BUSY[b].weight).sum();
    let shares = weighted
        .iter()
        .map(|&b| {
            (
                BUSY[b].tenant,
                BUSY[b].weight,
                in_span(b) as f64 / total.max(1) as f64,
                f64::from(BUSY[b].weight) / f64::from(weights),
            )
        })
        .collect();
    let throttled = sim.log().iter().filter(|e| e.status == Some(429)).count();
    sim.shutdown();
    Ok(TenantsRun {
        mode: if fair { "fair" } else { "fifo" },
        makespan_s: makespan.as_secs_f64(),
        interactive_calls: waits.len(),
        interactive_p50_ms: percentile(&mut waits, 0.5),
        interactive_p99_ms: percentile(&mut waits, 0.99),
        shares,
        batch_share: batch_in_span as f64 / (total + batch_in_span).max(1) as f64,
        throttled,
    })
}

/// Both modes, one after the other.
pub(crate) fn run(runtime: &tokio::runtime::Runtime) -> Result<Vec<TenantsRun>, String> {
    let mut runs = Vec::new();
    for fair in [true, false] {
        let run = runtime.block_on(one(fair))?;
        eprintln!(
            "tenants ({}): makespan {:.2} s, interactive p50 {:.1} ms p99 {:.1} ms over {} calls, \
             shares {}, batch {:.3}, {} 429s",
            run.mode,
            run.makespan_s,
            run.interactive_p50_ms,
            run.interactive_p99_ms,
            run.interactive_calls,
            run.shares
                .iter()
                .map(|(t, w, s, f)| format!("tenant {t} (weight {w}): {s:.3} of {f:.3}"))
                .collect::<Vec<_>>()
                .join(", "),
            run.batch_share,
            run.throttled
        );
        runs.push(run);
    }
    Ok(runs)
}

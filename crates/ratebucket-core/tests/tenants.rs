//! Many tenants and classes on one quota, as properties over saturated runs on the virtual
//! clock: weighted fair shares over the dominant dimension, every wait within its stated
//! bound, interactive calls ahead of a saturating batch, and the pool's window bound.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen};
use ratebucket_core::{ArbiterConfig, Caller, Event, Instant, Priority, Tenant, Ticket};
use support::{Harness, check};

/// Requests per second and tokens per second, and their capacities.
const RATES: [u64; 2] = [20, 2_000];
const CAPACITIES: [u64; 2] = [20, 2_000];

/// A flow of calls: one tenant in one class, with a fixed cost per call.
#[derive(Clone, Debug)]
struct Flow {
    caller: Caller,
    cost: [u64; 2],
    /// Closed loop: this many calls are always queued or granted. Open loop (`None`):
    /// one call every `gap`.
    concurrency: Option<usize>,
    gap: Duration,
}

/// One call's life.
#[derive(Clone, Copy, Debug)]
struct Call {
    flow: usize,
    arrived: Instant,
    granted: Option<Instant>,
}

/// What a run did.
struct Run {
    calls: Vec<Call>,
    flows: Vec<Flow>,
    /// Grants per dimension, with their instants.
    grants: Vec<(Instant, [u64; 2])>,
}

/// How long a call's cost takes to refill in its slowest dimension, in seconds.
fn demand(cost: [u64; 2]) -> f64 {
    (0..2).map(|d| cost[d] as f64 / RATES[d] as f64).fold(0.0, f64::max)
}

/// Runs `flows` against one pool for `span`, each granted call committed at its cost at
/// once (so a closed-loop flow queues its next call at the grant).
fn run(flows: &[Flow], weights: &[(u32, u32)], config: ArbiterConfig, span: Duration) -> Run {
    let mut h = Harness::two((RATES[0], CAPACITIES[0]), (RATES[1], CAPACITIES[1]), config);
    for &(tenant, weight) in weights {
        h.arbiter.set_weight(Tenant(tenant), weight).unwrap();
    }
    let mut calls: Vec<Call> = Vec::new();
    let mut of: HashMap<Ticket, usize> = HashMap::new();
    let mut grants = Vec::new();
    let end = Instant::ZERO + span;
    let mut next_open: Vec<Option<Instant>> =
        flows.iter().map(|f| f.concurrency.is_none().then_some(Instant::ZERO + f.gap)).collect();
    let reserve = |h: &mut Harness,
                   calls: &mut Vec<Call>,
                   of: &mut HashMap<Ticket, usize>,
                   flow: usize,
                   now: Instant| {
        let ticket =
            h.arbiter.reserve_for(flows[flow].caller, &flows[flow].cost, None, now).unwrap();
        of.insert(ticket, calls.len());
        calls.push(Call { flow, arrived: now, granted: None });
    };
    for (i, flow) in flows.iter().enumerate() {
        for _ in 0..flow.concurrency.unwrap_or(0) {
            reserve(&mut h, &mut calls, &mut of, i, Instant::ZERO);
        }
    }
    loop {
        // Every grant so far: committed at its cost, its flow's next call queued.
        while let Some(event) = h.arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                let call = of[&ticket];
                calls[call].granted = Some(h.now);
                let flow = &flows[calls[call].flow];
                grants.push((h.now, flow.cost));
                h.arbiter.commit(ticket, &flow.cost, h.now).unwrap();
                if flow.concurrency.is_some() && h.now < end {
                    let (which, now) = (calls[call].flow, h.now);
                    reserve(&mut h, &mut calls, &mut of, which, now);
                }
            }
        }
        let open = next_open
            .iter()
            .enumerate()
            .filter_map(|(i, at)| Some((at.filter(|&at| at < end)?, i)))
            .min();
        let timer = h.arbiter.poll_timeout().filter(|&at| at < end);
        let next = match (timer, open) {
            (None, None) => break,
            (Some(t), None) => t,
            (None, Some((o, _))) => o,
            (Some(t), Some((o, _))) => t.min(o),
        };
        h.now = h.now.max(next);
        if let Some((o, i)) = open
            && o <= h.now
        {
            let now = h.now;
            reserve(&mut h, &mut calls, &mut of, i, now);
            next_open[i] = Some(o + flows[i].gap);
        }
        h.arbiter.handle_timeout(h.now);
    }
    Run { calls, flows: flows.to_vec(), grants }
}

/// Busy tenants, each with a weight and its own cost shape.
#[derive(Clone, Debug)]
struct Tenants {
    weights: Vec<u32>,
    costs: Vec<[u64; 2]>,
}

impl Arbitrary for Tenants {
    fn arbitrary(g: &mut Gen) -> Tenants {
        let n = usize::arbitrary(g) % 3 + 2;
        Tenants {
            weights: (0..n).map(|_| u32::arbitrary(g) % 4 + 1).collect(),
            // Some request-heavy (tokens light), some token-heavy.
            costs: (0..n)
                .map(|_| [u64::arbitrary(g) % 2 + 1, u64::arbitrary(g) % 400 + 1])
                .collect(),
        }
    }
}

fn each_busy_tenant_gets_its_weight(tenants: Tenants) -> bool {
    let mut flows: Vec<Flow> = tenants
        .costs
        .iter()
        .enumerate()
        .map(|(t, &cost)| Flow {
            caller: Caller::tenant(t as u32),
            cost,
            concurrency: Some(8),
            gap: Duration::ZERO,
        })
        .collect();
    // A tenant that comes and goes (and with it the busy weight), outside the measure.
    flows.push(Flow {
        caller: Caller::tenant(99),
        cost: [1, 10],
        concurrency: None,
        gap: Duration::from_millis(700),
    });
    let weights: Vec<(u32, u32)> =
        tenants.weights.iter().enumerate().map(|(t, &w)| (t as u32, w)).collect();
    let span = Duration::from_secs(300);
    let run = run(&flows, &weights, ArbiterConfig::default(), span);
    // The share as the fair order defines it: dominant demand granted.
    let busy = tenants.weights.len();
    let mut served = vec![0.0; busy];
    for call in run.calls.iter().filter(|c| c.granted.is_some() && c.flow < busy) {
        served[call.flow] += demand(run.flows[call.flow].cost);
    }
    let total: f64 = served.iter().sum();
    let weight_sum: u32 = tenants.weights.iter().sum();
    let fair = |t: usize| f64::from(tenants.weights[t]) / f64::from(weight_sum);
    let ok = (0..busy).all(|t| (served[t] / total - fair(t)).abs() <= 0.05 * fair(t));
    if !ok {
        eprintln!(
            "weights {:?}: shares {:?}",
            tenants.weights,
            served.iter().map(|s| s / total).collect::<Vec<_>>()
        );
    }
    ok
}

#[test]
fn over_a_saturated_run_each_busy_tenant_gets_its_weights_share_within_five_percent() {
    check(40, 0x7e4a_0001, each_busy_tenant_gets_its_weight as fn(Tenants) -> bool);
}

/// Flows of every class, some saturating, a sparse one among them.
#[derive(Clone, Debug)]
struct Mix {
    flows: Vec<Flow>,
    weights: Vec<(u32, u32)>,
}

impl Arbitrary for Mix {
    fn arbitrary(g: &mut Gen) -> Mix {
        let n = usize::arbitrary(g) % 4 + 2;
        let flows = (0..n)
            .map(|i| {
                let priority = Priority::ALL[usize::arbitrary(g) % 3];
                let tenant = u32::arbitrary(g) % 3;
                let cost = [u64::arbitrary(g) % 2 + 1, u64::arbitrary(g) % 300 + 1];
                // The first flow saturates; the rest may or may not.
                let closed = i == 0 || bool::arbitrary(g);
                Flow {
                    caller: Caller::tenant(tenant).priority(priority),
                    cost,
                    concurrency: closed.then_some(usize::arbitrary(g) % 6 + 1),
                    gap: Duration::from_millis(u64::arbitrary(g) % 2_000 + 200),
                }
            })
            .collect();
        let weights = (0..3).map(|t| (t, u32::arbitrary(g) % 3 + 1)).collect();
        Mix { flows, weights }
    }
}

/// The stated bound on a call's wait, in seconds (ADR 0036's, in force while the rates
/// stay as they are and calls commit what they reserved): its class's lead and the longest
/// lead, each stretched by the summed weight over the lightest tenant's (tenants first
/// seen later), its own flow's
/// backlog at its smallest share, and one largest call per flow and its own refill.
fn bound(run: &Run, weights: &[(u32, u32)], call: &Call, config: &ArbiterConfig) -> f64 {
    let flow = &run.flows[call.flow];
    let weight = |t: u32| weights.iter().find(|w| w.0 == t).map_or(1, |w| w.1);
    // Every tenant with a flow may be busy: the smallest share it can have.
    let mut tenants: Vec<u32> = run.flows.iter().map(|f| f.caller.tenant.0).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let busy: u32 = tenants.iter().map(|&t| weight(t)).sum();
    let classes = run
        .flows
        .iter()
        .filter(|f| f.caller.tenant == flow.caller.tenant)
        .map(|f| f.caller.priority)
        .collect::<std::collections::HashSet<_>>()
        .len();
    let share = f64::from(weight(flow.caller.tenant.0)) / f64::from(busy) / classes as f64;
    let backlog = run
        .calls
        .iter()
        .filter(|c| c.flow == call.flow && c.arrived <= call.arrived)
        .filter(|c| c.granted.is_none_or(|g| g > call.arrived))
        .count() as f64
        * demand(flow.cost);
    let largest = run.flows.iter().map(|f| demand(f.cost)).fold(0.0, f64::max);
    // A lead is scaled by the busy weight when the call queues: more tenants busy later
    // stretch it by at most the summed weight over the weight of the one busy then.
    let lightest = tenants.iter().map(|&t| weight(t)).min().unwrap_or(1);
    let stretch = |_: u32| f64::from(busy) / f64::from(lightest.max(1));
    let longest_lead = config.aging.iter().max().unwrap().as_secs_f64();
    config.aging[flow.caller.priority.index()].as_secs_f64() * stretch(flow.caller.tenant.0)
        + longest_lead * stretch(lightest)
        + backlog / share
        + (run.flows.len() + 1) as f64 * largest
}

fn every_wait_is_within_its_bound(mix: Mix) -> bool {
    let config = ArbiterConfig::default().with_aging([
        Duration::ZERO,
        Duration::from_secs(3),
        Duration::from_secs(10),
    ]);
    let span = Duration::from_secs(240);
    let run = run(&mix.flows, &mix.weights, config, span);
    let end = Instant::ZERO + span;
    run.calls.iter().all(|call| {
        let waited = call.granted.unwrap_or(end).saturating_duration_since(call.arrived);
        let bound = bound(&run, &mix.weights, call, &config);
        // A call still queued at the end has not overrun unless it already waited longer.
        let ok = waited.as_secs_f64() <= bound + 1e-3;
        if !ok {
            eprintln!(
                "{:?} waited {waited:?} against a bound of {bound:.3} s",
                run.flows[call.flow]
            );
        }
        ok
    })
}

#[test]
fn no_call_waits_longer_than_its_stated_bound() {
    check(60, 0x7e4a_0002, every_wait_is_within_its_bound as fn(Mix) -> bool);
}

/// A saturating batch (several tenants' worth, or one tenant's own) and sparse
/// interactive calls, at a tenth of the pool's rate.
#[derive(Clone, Debug)]
struct UnderBatch {
    batch_cost: [u64; 2],
    batch_concurrency: usize,
    interactive_cost: [u64; 2],
    /// Whether the interactive calls are the batch tenant's own.
    same_tenant: bool,
    /// A default-class flow saturating beside the batch.
    with_default: bool,
}

impl Arbitrary for UnderBatch {
    fn arbitrary(g: &mut Gen) -> UnderBatch {
        UnderBatch {
            batch_cost: [1, u64::arbitrary(g) % 200 + 1],
            batch_concurrency: usize::arbitrary(g) % 48 + 4,
            interactive_cost: [1, u64::arbitrary(g) % 200 + 1],
            same_tenant: bool::arbitrary(g),
            with_default: bool::arbitrary(g),
        }
    }
}

fn interactive_waits_at_most_its_own_refill(case: UnderBatch) -> bool {
    let interactive_tenant = if case.same_tenant { 1 } else { 2 };
    // A tenth of the pool's rate in the interactive call's dominant dimension.
    let gap = Duration::from_secs_f64(10.0 * demand(case.interactive_cost));
    let mut flows = vec![
        Flow {
            caller: Caller::tenant(1).priority(Priority::Batch),
            cost: case.batch_cost,
            concurrency: Some(case.batch_concurrency),
            gap: Duration::ZERO,
        },
        Flow {
            caller: Caller::tenant(interactive_tenant).priority(Priority::Interactive),
            cost: case.interactive_cost,
            concurrency: None,
            gap,
        },
    ];
    if case.with_default {
        flows.push(Flow {
            caller: Caller::tenant(1),
            cost: case.batch_cost,
            concurrency: Some(4),
            gap: Duration::ZERO,
        });
    }
    let span = Duration::from_secs(120);
    let run = run(&flows, &[], ArbiterConfig::default(), span);
    let own_refill = demand(case.interactive_cost);
    run.calls.iter().filter(|c| c.flow == 1).all(|call| {
        // One still queued at the end has waited until then.
        let waited = call
            .granted
            .unwrap_or(Instant::ZERO + span)
            .saturating_duration_since(call.arrived)
            .as_secs_f64();
        let ok = waited <= own_refill + 1e-3;
        if !ok {
            eprintln!("interactive waited {waited:.3} s, its refill {own_refill:.3} s");
        }
        ok
    })
}

#[test]
fn an_interactive_call_under_a_saturating_batch_waits_at_most_its_own_refill() {
    check(60, 0x7e4a_0003, interactive_waits_at_most_its_own_refill as fn(UnderBatch) -> bool);
}

fn the_pool_keeps_its_window_bound(mix: Mix) -> bool {
    let span = Duration::from_secs(120);
    let run = run(&mix.flows, &mix.weights, ArbiterConfig::default(), span);
    // Every window of W seconds from a grant: at most C + R·W in each dimension.
    [Duration::from_millis(100), Duration::from_secs(1), Duration::from_secs(7)].into_iter().all(
        |window| {
            (0..2).all(|d| {
                let limit = CAPACITIES[d] as f64 + RATES[d] as f64 * window.as_secs_f64();
                let mut sum = 0u64;
                let mut start = 0;
                run.grants.iter().enumerate().all(|(i, &(at, cost))| {
                    sum += cost[d];
                    while at.saturating_duration_since(run.grants[start].0) > window {
                        sum -= run.grants[start].1[d];
                        start += 1;
                    }
                    let ok = sum as f64 <= limit + 1e-9;
                    if !ok {
                        eprintln!("dimension {d}: {sum} in {window:?} up to grant {i}");
                    }
                    ok
                })
            })
        },
    )
}

#[test]
fn the_pool_as_a_whole_keeps_the_window_bound() {
    check(40, 0x7e4a_0004, the_pool_keeps_its_window_bound as fn(Mix) -> bool);
}

#[test]
fn a_weight_out_of_range_is_refused() {
    let mut h = Harness::two((1, 1), (1, 1), ArbiterConfig::default());
    assert!(h.arbiter.set_weight(Tenant(3), 0).is_err());
    assert!(h.arbiter.set_weight(Tenant(3), ratebucket_core::MAX_WEIGHT + 1).is_err());
    assert!(h.arbiter.set_weight(Tenant(3), 2).is_ok());
    assert_eq!(h.arbiter.tenant(Tenant(3)).weight, 2);
}

#[test]
fn priority_names_parse_and_print() {
    for priority in Priority::ALL {
        assert_eq!(priority.name().parse::<Priority>(), Ok(priority));
        assert_eq!(priority.to_string(), priority.name());
    }
    assert!("urgent".parse::<Priority>().is_err());
}

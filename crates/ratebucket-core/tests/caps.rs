//! Per-tenant caps on the virtual clock: a capped tenant never takes more than its share
//! of any limit over any window (`share·C + share·R·W`), and never holds back another
//! tenant: the pool stays as busy as the other tenants' demand lets it.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen};
use ratebucket_core::{
    ArbiterConfig, Caller, Event, Instant, InvalidLimit, ReserveError, Tenant, Ticket, TicketState,
};
use support::{Harness, check};

/// Requests per second and tokens per second, and their capacities.
const RATES: [u64; 2] = [20, 2_000];
const CAPACITIES: [u64; 2] = [20, 2_000];

fn harness() -> Harness {
    Harness::two((RATES[0], CAPACITIES[0]), (RATES[1], CAPACITIES[1]), ArbiterConfig::default())
}

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

#[test]
fn a_capped_tenants_excess_waits_apart_and_never_holds_back_another() {
    let mut h = harness();
    // Tenant 1 may take a quarter: 5 requests at once, 5 a second.
    h.arbiter.set_cap(Tenant(1), Some(0.25), ms(0)).unwrap();
    let capped = Caller::tenant(1);
    let first: Vec<Ticket> =
        (0..8).map(|_| h.arbiter.reserve_for(capped, &[1, 10], None, ms(0)).unwrap()).collect();
    let granted = |h: &Harness, tickets: &[Ticket]| {
        tickets.iter().filter(|&&t| h.arbiter.state(t) == Some(TicketState::Granted)).count()
    };
    assert_eq!(granted(&h, &first), 5, "a quarter of the burst");
    let snapshot = h.arbiter.tenant(Tenant(1));
    assert_eq!((snapshot.cap, snapshot.parked), (Some(0.25), 3));
    // The pool has 15 more: another tenant takes them at once, ahead of the parked three.
    let other: Vec<Ticket> = (0..15)
        .map(|_| h.arbiter.reserve_for(Caller::tenant(2), &[1, 10], None, ms(0)).unwrap())
        .collect();
    assert_eq!(granted(&h, &other), 15);
    // The cap refills at 5 a second: one parked call enters the queue every 200 ms.
    let timeout = h.arbiter.poll_timeout().expect("the cap refills");
    assert_eq!(timeout, ms(200));
    h.advance_to(ms(1_000));
    assert_eq!(granted(&h, &first), 8);
    // A parked call can be cancelled; a cost above the cap never fits.
    let waiting: Vec<Ticket> = (0..10)
        .map(|_| h.arbiter.reserve_for(capped, &[1, 10], None, ms(1_000)).unwrap())
        .collect();
    let parked = h.arbiter.reserve_for(capped, &[1, 10], None, ms(1_000)).unwrap();
    assert_eq!(h.arbiter.state(parked), Some(TicketState::Queued));
    assert!(h.arbiter.cancel(parked, ms(1_000)));
    assert_eq!(h.arbiter.state(parked), None);
    assert_eq!(
        h.arbiter.reserve_for(capped, &[6, 10], None, ms(1_000)),
        Err(ReserveError::CostExceedsCap { dimension: 0, cost: 6, cap: 5 })
    );
    // Lifting the cap queues what waited under it: the pool has refilled, so it goes.
    let parked_before = h.arbiter.tenant(Tenant(1)).parked;
    h.arbiter.set_cap(Tenant(1), None, ms(1_000)).unwrap();
    assert!(parked_before > 0);
    assert_eq!(h.arbiter.tenant(Tenant(1)).parked, 0);
    assert_eq!(granted(&h, &waiting), 10);
    for share in [0.0, -0.5, 1.5, f64::NAN] {
        assert_eq!(
            h.arbiter.set_cap(Tenant(1), Some(share), ms(1_000)).map_err(|e| e.to_string()),
            Err(InvalidLimit::Share(share).to_string())
        );
    }
}

/// A run: a capped tenant and others, each a closed loop of calls, every grant committed
/// at once at what it reserved (or less).
#[derive(Clone, Debug)]
struct Scenario {
    /// The capped tenant's share, in percent.
    share: u64,
    /// Calls each tenant keeps queued or granted (tenant 0 is the capped one).
    concurrency: Vec<usize>,
    /// Each tenant's cost per call.
    costs: Vec<[u64; 2]>,
    /// Percent of its reservation each commit charges.
    used: u64,
}

impl Arbitrary for Scenario {
    fn arbitrary(g: &mut Gen) -> Scenario {
        let tenants = usize::arbitrary(g) % 3 + 1;
        Scenario {
            share: u64::arbitrary(g) % 90 + 10,
            concurrency: (0..tenants).map(|_| usize::arbitrary(g) % 30 + 1).collect(),
            costs: (0..tenants)
                .map(|_| [u64::arbitrary(g) % 2 + 1, u64::arbitrary(g) % 150 + 1])
                .collect(),
            used: u64::arbitrary(g) % 101,
        }
    }
}

/// Grants per tenant, with their instants and costs.
fn play(s: &Scenario, span: Duration) -> Vec<Vec<(Instant, [u64; 2])>> {
    let mut h = harness();
    let share = s.share as f64 / 100.0;
    h.arbiter.set_cap(Tenant(0), Some(share), ms(0)).unwrap();
    let mut owner: HashMap<Ticket, usize> = HashMap::new();
    let mut grants = vec![Vec::new(); s.concurrency.len()];
    let end = Instant::ZERO + span;
    let mut stalled = 0;
    for (tenant, &n) in s.concurrency.iter().enumerate() {
        for _ in 0..n {
            let caller = Caller::tenant(tenant as u32);
            let cost = s.costs[tenant];
            // A cost above the cap is refused: that tenant then asks for the cap's most.
            let ticket = match h.arbiter.reserve_for(caller, &cost, None, ms(0)) {
                Ok(t) => t,
                Err(ReserveError::CostExceedsCap { .. }) => return grants,
                Err(e) => panic!("{e}"),
            };
            owner.insert(ticket, tenant);
        }
    }
    loop {
        while let Some(event) = h.arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                let tenant = owner[&ticket];
                let cost = s.costs[tenant];
                grants[tenant].push((h.now, cost));
                let used = [cost[0], cost[1] * s.used / 100];
                h.arbiter.commit(ticket, &used, h.now).unwrap();
                if h.now < end {
                    let caller = Caller::tenant(tenant as u32);
                    let next = h.arbiter.reserve_for(caller, &cost, None, h.now).unwrap();
                    owner.insert(next, tenant);
                }
            }
        }
        match h.arbiter.poll_timeout().filter(|&at| at < end) {
            // A timer that fires and grants nothing, again and again at one instant, is a
            // stall: the run ends there (and the pool's work shows it).
            Some(at) if at <= h.now && stalled > 1_000 => break,
            Some(at) => {
                stalled = if at <= h.now { stalled + 1 } else { 0 };
                h.now = h.now.max(at);
                h.arbiter.handle_timeout(h.now);
            }
            None => break,
        }
    }
    grants
}

/// Over every window, the capped tenant's grants stay within `share·C + share·R·W` in each
/// dimension (commits below the reservation refund its cap, as they refund the pool).
fn a_capped_tenant_stays_within_its_share_of_every_window(s: Scenario) -> bool {
    let grants = play(&s, Duration::from_secs(10));
    let share = s.share as f64 / 100.0;
    let mine = &grants[0];
    let charged = |cost: [u64; 2], d: usize| {
        if d == 0 { cost[0] } else { cost[1] * s.used / 100 }
    };
    for window_ms in [100u64, 500, 1_000, 3_000] {
        let w = window_ms as f64 / 1_000.0;
        for (i, &(start, _)) in mine.iter().enumerate() {
            for d in 0..2 {
                let capacity = ((CAPACITIES[d] as f64 * share).floor()).max(1.0);
                // Every grant in the window took its whole reservation, refunded at once;
                // the last one's refund is not yet in.
                let mut taken = 0.0;
                let mut last = 0;
                for &(at, cost) in &mine[i..] {
                    if at.saturating_duration_since(start) > Duration::from_millis(window_ms) {
                        break;
                    }
                    taken += charged(cost, d) as f64;
                    last = cost[d] - charged(cost, d);
                }
                let bound = capacity + share * RATES[d] as f64 * w + last as f64 + 1.0;
                if taken > bound {
                    eprintln!("dimension {d}, window {w} s from {start:?}: {taken} > {bound}");
                    return false;
                }
            }
        }
    }
    true
}

#[test]
fn a_capped_tenant_stays_within_its_share_of_every_window_property() {
    check(200, 31, a_capped_tenant_stays_within_its_share_of_every_window as fn(Scenario) -> bool);
}

/// With another tenant always asking, the pool stays busy: over the run, what every tenant
/// was granted together is what the pool refills (less a call's worth), however much the
/// capped tenant asks.
fn a_capped_tenant_never_holds_back_the_others(s: Scenario) -> bool {
    if s.concurrency.len() < 2 {
        return true;
    }
    let span = Duration::from_secs(10);
    let grants = play(&s, span);
    if grants[0].is_empty() {
        return true;
    }
    let secs = span.as_secs_f64();
    // Saturated in some dimension: what was charged there against what the pool could
    // grant over the run (its burst and its refill).
    let busiest = (0..2)
        .map(|d| {
            grants
                .iter()
                .flatten()
                .map(|&(_, cost)| {
                    let used = if d == 0 { cost[0] } else { cost[1] * s.used / 100 };
                    used as f64
                })
                .sum::<f64>()
                / (RATES[d] as f64 * secs + CAPACITIES[d] as f64)
        })
        .fold(0.0, f64::max);
    if busiest < 0.9 {
        eprintln!("busiest dimension {busiest:.3} of what the pool refilled");
        return false;
    }
    true
}

#[test]
fn a_capped_tenant_never_holds_back_the_others_property() {
    check(200, 32, a_capped_tenant_never_holds_back_the_others as fn(Scenario) -> bool);
}

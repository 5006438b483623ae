//! Budgets: an allowance per day, month or period on one dimension, renewed whole, a call it
//! cannot cover refused at once with the time to its renewal; and, over any run, no period
//! spends more than its amount.

use std::time::Duration;

use quickcheck::{Arbitrary, Gen, QuickCheck};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Budget, Change, Event, Instant, Period, Refusal, ReserveError,
    TicketState, TokenBucket,
};

const HOUR: u64 = 3_600;
const DAY: u64 = 86_400;

/// 2026-12-04 at `hour` UTC, as the wall clock reads it.
fn wall(hour: u64) -> Duration {
    Duration::from_secs(20_791 * DAY + hour * HOUR)
}

/// Requests at 1,000 a second, and money (micro-dollars) with a budget of `amount` a day,
/// set at 22:00 UTC.
fn budgeted(amount: u64) -> Arbiter {
    let buckets = vec![
        TokenBucket::per_second(1_000, Instant::ZERO).unwrap(),
        TokenBucket::per_second(1 << 40, Instant::ZERO).unwrap(),
    ];
    let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
    let budget = Budget { amount, period: Period::Day, since_epoch: wall(22) };
    arbiter.change(1, Change::Budget(budget), Instant::ZERO).unwrap();
    arbiter
}

fn secs(n: u64) -> Instant {
    Instant::from_millis(n * 1_000)
}

#[test]
fn a_spent_budget_refuses_at_once_saying_when_it_renews_and_is_whole_again_at_midnight() {
    let mut arbiter = budgeted(1_000);
    let first = arbiter.reserve(&[1, 600], secs(0)).unwrap();
    arbiter.commit(first, &[1, 500], secs(1)).unwrap();
    // 500 left: a call of 600 at most cannot be covered; one of 400 can.
    match arbiter.reserve(&[1, 600], secs(10)) {
        Err(ReserveError::BudgetSpent { dimension: 1, renews_in }) => {
            assert_eq!(renews_in, Duration::from_secs(2 * HOUR - 10))
        }
        other => panic!("{other:?}"),
    }
    let error = arbiter.reserve(&[1, 600], secs(10)).unwrap_err();
    assert!(error.to_string().contains("renews in 1h 59m"), "{error}");
    let small = arbiter.reserve(&[1, 400], secs(10)).unwrap();
    assert_eq!(arbiter.state(small), Some(TicketState::Granted));
    // Nothing spends what the budget does not hold: no call of money is granted on time.
    assert_eq!(arbiter.dimension(1, secs(10)).unwrap().renews_at, Some(secs(2 * HOUR)));
    arbiter.commit(small, &[1, 400], secs(20)).unwrap();
    // At midnight it renews: 1,000 again.
    let after = secs(2 * HOUR);
    let big = arbiter.reserve(&[1, 1_000], after).unwrap();
    assert_eq!(arbiter.state(big), Some(TicketState::Granted));
    assert_eq!(arbiter.dimension(1, after).unwrap().renews_at, Some(secs(2 * HOUR + DAY)));
}

#[test]
fn a_call_the_refunds_in_flight_may_cover_waits_for_them_and_is_refused_if_they_do_not() {
    for (used, granted) in [(200, true), (1_000, false)] {
        let mut arbiter = budgeted(1_000);
        let first = arbiter.reserve(&[1, 1_000], secs(0)).unwrap();
        // Nothing is left, but the first call may refund up to 1,000: the next one waits.
        let second = arbiter.reserve(&[1, 500], secs(1)).unwrap();
        assert_eq!(arbiter.state(second), Some(TicketState::Queued));
        while arbiter.poll_event().is_some() {}
        arbiter.commit(first, &[1, used], secs(2)).unwrap();
        let events: Vec<Event> = std::iter::from_fn(|| arbiter.poll_event()).collect();
        if granted {
            assert_eq!(arbiter.state(second), Some(TicketState::Granted), "{used}");
        } else {
            assert_eq!(arbiter.state(second), None, "{used}");
            let refused = events.iter().any(|e| {
                matches!(e, Event::Refused {
                    ticket,
                    reason: Refusal::BudgetSpent { dimension: 1, renews_in },
                } if *ticket == second && *renews_in == Duration::from_secs(2 * HOUR - 2))
            });
            assert!(refused, "{events:?}");
        }
    }
}

#[test]
fn a_month_renews_on_the_first_and_an_overrun_is_carried_over() {
    let buckets = vec![TokenBucket::per_second(1 << 40, Instant::ZERO).unwrap()];
    let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
    // 2026-12-31 at 23:00 UTC: the month renews in an hour.
    let budget = Budget {
        amount: 1_000,
        period: Period::Month,
        since_epoch: Duration::from_secs(20_818 * DAY + 23 * HOUR),
    };
    arbiter.change(0, Change::Budget(budget), secs(0)).unwrap();
    let ticket = arbiter.reserve(&[900], secs(0)).unwrap();
    // It cost more than reserved: the overrun is debt.
    arbiter.commit(ticket, &[1_100], secs(1)).unwrap();
    assert!(matches!(
        arbiter.reserve(&[1], secs(2)),
        Err(ReserveError::BudgetSpent { renews_in, .. }) if renews_in == Duration::from_secs(HOUR - 2)
    ));
    // January: 1,000 less the 100 overrun.
    let level = arbiter.dimension(0, secs(HOUR)).unwrap();
    assert_eq!(level.renews_at, Some(secs(HOUR + 31 * DAY)));
    assert!(arbiter.reserve(&[901], secs(HOUR)).is_err());
    let ticket = arbiter.reserve(&[900], secs(HOUR)).unwrap();
    assert_eq!(arbiter.state(ticket), Some(TicketState::Granted));
}

#[test]
fn a_budget_of_nothing_or_of_no_period_is_refused_and_a_call_above_it_never_fits() {
    let mut arbiter = budgeted(1_000);
    for budget in [
        Budget { amount: 0, period: Period::Day, since_epoch: wall(0) },
        Budget { amount: 10, period: Period::Every(Duration::ZERO), since_epoch: wall(0) },
    ] {
        assert!(arbiter.change(1, Change::Budget(budget), secs(0)).is_err());
    }
    assert!(matches!(
        arbiter.reserve(&[1, 1_001], secs(0)),
        Err(ReserveError::CostExceedsCapacity { dimension: 1, .. })
    ));
}

/// One step of a run against a budget of 1,000 per 10 s.
#[derive(Clone, Debug)]
enum Step {
    /// Reserve at most this much.
    Reserve(u64),
    /// Commit the oldest granted call at this fraction (in percent, up to 150) of its
    /// reservation.
    Commit(u64),
    /// Let this many milliseconds pass.
    Wait(u64),
}

impl Arbitrary for Step {
    fn arbitrary(g: &mut Gen) -> Step {
        match u8::arbitrary(g) % 3 {
            0 => Step::Reserve(u64::arbitrary(g) % 1_000 + 1),
            1 => Step::Commit(u64::arbitrary(g) % 151),
            _ => Step::Wait(u64::arbitrary(g) % 4_000),
        }
    }
}

/// Within each period, what the calls granted in it were charged never exceeds the amount
/// (plus what those calls used beyond their reservations): a call is granted only if what
/// is left covers its whole reservation, and refunds of calls granted before a renewal
/// never top up the next period.
fn no_period_spends_more_than_its_amount(steps: Vec<Step>) -> bool {
    const AMOUNT: u64 = 1_000;
    const PERIOD: u64 = 10_000;
    let buckets = vec![TokenBucket::per_second(1 << 40, Instant::ZERO).unwrap()];
    let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
    let budget = Budget {
        amount: AMOUNT,
        period: Period::Every(Duration::from_millis(PERIOD)),
        since_epoch: Duration::ZERO,
    };
    arbiter.change(0, Change::Budget(budget), Instant::ZERO).unwrap();
    let mut now = 0;
    // (ticket, reserved, period granted in)
    let mut granted = Vec::new();
    let mut waiting = Vec::new();
    // Per period: charged to calls granted in it, and the debt carried into it.
    let mut charged = std::collections::BTreeMap::<u64, u64>::new();
    let mut overrun = std::collections::BTreeMap::<u64, u64>::new();
    for step in steps {
        let at = Instant::from_millis(now);
        match step {
            Step::Reserve(cost) => {
                if let Ok(ticket) = arbiter.reserve(&[cost], at) {
                    waiting.push((ticket, cost));
                }
            }
            Step::Commit(percent) => {
                if !granted.is_empty() {
                    let (ticket, reserved, period): (_, u64, u64) = granted.remove(0);
                    let used = reserved * percent / 100;
                    arbiter.commit(ticket, &[used], at).unwrap();
                    *charged.entry(period).or_default() += used;
                    *overrun.entry(period).or_default() += used.saturating_sub(reserved);
                }
            }
            Step::Wait(ms) => {
                now += ms;
                arbiter.handle_timeout(Instant::from_millis(now));
            }
        }
        // Whatever was granted by this step was granted now.
        let period = now / PERIOD;
        waiting.retain(|&(ticket, cost)| match arbiter.state(ticket) {
            Some(TicketState::Granted) => {
                granted.push((ticket, cost, period));
                false
            }
            Some(TicketState::Queued) => true,
            None => false,
        });
    }
    // Calls still granted count at what they reserved.
    for &(_, reserved, period) in &granted {
        *charged.entry(period).or_default() += reserved;
    }
    charged
        .iter()
        .all(|(period, &spent)| spent <= AMOUNT + overrun.get(period).copied().unwrap_or(0))
}

#[test]
fn no_period_spends_more_than_its_amount_property() {
    QuickCheck::new()
        .tests(500)
        .quickcheck(no_period_spends_more_than_its_amount as fn(Vec<Step>) -> bool);
}

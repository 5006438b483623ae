//! Funded buckets: a share of a quota metered out elsewhere, raised only by funds.

use super::Direct;
use quickcheck::{QuickCheck, TestResult};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Event, FoldOutcome, Instant, Rate, TicketState, TokenBucket,
};

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn funded(capacity: u64) -> TokenBucket {
    TokenBucket::funded(Rate::per_second(100).unwrap(), capacity, Instant::ZERO).unwrap()
}

#[test]
fn a_funded_bucket_starts_empty_and_never_refills_by_itself() {
    let mut bucket = funded(50);
    assert!(bucket.is_funded());
    assert_eq!(bucket.available(Instant::ZERO), 0.0);
    assert_eq!(bucket.available(Instant::from_secs(3_600)), 0.0);
    assert_eq!(bucket.time_until(1, Instant::from_secs(3_600)), Some(std::time::Duration::MAX));
    assert_eq!(bucket.fund(30, ms(0)), 30);
    assert!(bucket.fits(30, ms(10)));
    bucket.take(30, ms(10));
    assert_eq!(bucket.available(Instant::from_secs(3_600)), 0.0);
}

#[test]
fn funds_beyond_capacity_are_left_with_the_caller_and_withdraw_takes_whole_permits() {
    let mut bucket = funded(50);
    assert_eq!(bucket.fund(40, ms(0)), 40);
    assert_eq!(bucket.fund(40, ms(0)), 10, "only the room left is taken");
    bucket.take(7, ms(1));
    assert_eq!(bucket.withdraw(ms(2)), 43);
    assert_eq!(bucket.available(ms(2)), 0.0);
    // A bucket in debt has nothing to withdraw, and keeps its debt.
    bucket.take(5, ms(3));
    assert_eq!(bucket.withdraw(ms(4)), 0);
    assert_eq!(bucket.available(ms(4)), -5.0);
}

#[test]
fn a_queued_waiter_is_granted_when_funds_arrive_not_when_time_passes() {
    let buckets = vec![funded(10), funded(1_000)];
    let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
    let ticket = arbiter.reserve(&[1, 300], ms(0)).unwrap();
    assert_eq!(arbiter.state(ticket), Some(TicketState::Queued));
    assert_eq!(arbiter.poll_timeout(), Some(Instant::NEVER));
    arbiter.handle_timeout(Instant::from_secs(600));
    assert_eq!(arbiter.state(ticket), Some(TicketState::Queued));
    assert_eq!(arbiter.change(0, Change::Fund(5), Instant::from_secs(600)), Ok(5));
    assert_eq!(arbiter.state(ticket), Some(TicketState::Queued), "one dimension funded");
    assert_eq!(arbiter.change(1, Change::Fund(299), Instant::from_secs(600)), Ok(299));
    assert_eq!(arbiter.state(ticket), Some(TicketState::Queued));
    assert_eq!(arbiter.change(1, Change::Fund(1), Instant::from_secs(600)), Ok(1));
    assert_eq!(arbiter.state(ticket), Some(TicketState::Granted));
    // The refund of an over-estimate is kept apart, and withdrawn with the level.
    arbiter.commit(ticket, &[1, 100], Instant::from_secs(601)).unwrap();
    assert_eq!(arbiter.change(0, Change::Withdraw, Instant::from_secs(601)), Ok(4));
    assert_eq!(arbiter.change(1, Change::Withdraw, Instant::from_secs(601)), Ok(200));
    assert!(arbiter.change(2, Change::Fund(1), Instant::from_secs(601)).is_err());
}

/// The quota a share came from dated its permits when it funded them: what a reservation
/// did not use is not granted again here (it could be spent long after that date), but
/// kept apart for the owner to reclaim and hand back.
#[test]
fn a_funded_share_keeps_refunds_apart_until_reclaimed() {
    let buckets = vec![funded(1_000)];
    let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
    assert_eq!(arbiter.change(0, Change::Fund(300), ms(0)), Ok(300));
    let first = arbiter.reserve(&[300], ms(0)).unwrap();
    assert_eq!(arbiter.state(first), Some(TicketState::Granted));
    let second = arbiter.reserve(&[100], ms(1)).unwrap();
    arbiter.commit(first, &[100], ms(2)).unwrap();
    assert_eq!(arbiter.state(second), Some(TicketState::Queued), "the refund is not spent again");
    assert_eq!(arbiter.dimension(0, ms(2)).map(|d| d.level), Some(0.0));
    assert_eq!(arbiter.change(0, Change::Reclaim, ms(3)), Ok(200));
    assert_eq!(arbiter.change(0, Change::Reclaim, ms(3)), Ok(0), "reclaimed once");
    // Funds grant the waiter; the part whose time is over is withdrawn, the rest stays.
    assert_eq!(arbiter.change(0, Change::Fund(150), ms(4)), Ok(150));
    assert_eq!(arbiter.state(second), Some(TicketState::Granted));
    assert_eq!(arbiter.change(0, Change::WithdrawAtMost(20), ms(5)), Ok(20));
    assert_eq!(arbiter.change(0, Change::WithdrawAtMost(1_000), ms(5)), Ok(30));
    arbiter.cancel(second, ms(6));
    assert_eq!(arbiter.change(0, Change::Withdraw, ms(7)), Ok(100), "a cancelled grant's cost");
}

#[test]
fn a_providers_remaining_never_raises_a_funded_share() {
    let buckets = vec![funded(10), funded(1_000)];
    let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
    arbiter.change(0, Change::Fund(4), ms(0)).unwrap();
    arbiter.change(1, Change::Fund(400), ms(0)).unwrap();
    let ticket = arbiter.reserve(&[1, 100], ms(0)).unwrap();
    let sent = arbiter.stamp_send_if_open(ticket, ms(0)).expect("the gate is open");
    // The provider has far more left than this share: nothing rises.
    assert_eq!(arbiter.adopt_remaining(0, sent, 9, ms(1)), Ok(FoldOutcome::Unchanged));
    assert_ne!(arbiter.sync_level(1, sent, 990, ms(1)), Ok(FoldOutcome::Raised));
    assert_eq!(arbiter.dimension(0, ms(1)).map(|d| d.level), Some(3.0));
    assert_eq!(arbiter.dimension(1, ms(1)).map(|d| d.level), Some(300.0));
    // Less left than the share holds: lowered.
    assert_eq!(arbiter.sync_level(1, sent, 50, ms(1)), Ok(FoldOutcome::Lowered));
    assert!(arbiter.dimension(1, ms(1)).map(|d| d.level).unwrap() <= 50.0);
    while let Some(event) = arbiter.poll_event() {
        assert!(!matches!(event, Event::Synced { .. }), "{event:?}");
    }
}

/// Whatever the schedule of funds, reservations and commits, a funded arbiter grants no
/// more than it was funded with, net of what it withdrew and refunds it kept.
#[test]
fn grants_never_exceed_funds() {
    fn prop(ops: Vec<(u8, u16)>) -> TestResult {
        let buckets = vec![funded(64)];
        let mut arbiter = Arbiter::new(buckets, ArbiterConfig::default(), Instant::ZERO).unwrap();
        let mut funded_total = 0u64;
        let mut spent = 0u64;
        let mut withdrawn = 0u64;
        let mut live = Vec::new();
        for (step, &(op, amount)) in ops.iter().enumerate() {
            let now = ms(step as u64 * 1_000);
            match op % 4 {
                0 => {
                    funded_total +=
                        arbiter.change(0, Change::Fund(u64::from(amount % 40)), now).unwrap()
                }
                1 => {
                    if let Ok(ticket) = arbiter.reserve(&[u64::from(amount % 20) + 1], now) {
                        live.push(ticket);
                    }
                }
                2 => {
                    if let Some(ticket) = live.pop() {
                        if arbiter.state(ticket) == Some(TicketState::Granted) {
                            let used = u64::from(amount) % (arbiter.cost(ticket).unwrap()[0] + 1);
                            arbiter.commit(ticket, &[used], now).unwrap();
                            spent += used;
                        } else {
                            arbiter.cancel(ticket, now);
                        }
                    }
                }
                _ => withdrawn += arbiter.change(0, Change::Withdraw, now).unwrap(),
            }
            let granted: Vec<ratebucket_core::Ticket> = live
                .iter()
                .copied()
                .filter(|&t| arbiter.state(t) == Some(TicketState::Granted))
                .collect();
            let held: u64 = granted.iter().map(|&t| arbiter.cost(t).unwrap()[0]).sum();
            let level = arbiter.dimension(0, now).map(|d| d.level).unwrap();
            if spent + held + withdrawn + level.max(0.0) as u64 > funded_total {
                return TestResult::error(format!(
                    "funded {funded_total}, spent {spent}, held {held}, withdrawn {withdrawn}, level {level}"
                ));
            }
        }
        TestResult::passed()
    }
    QuickCheck::new().tests(500).quickcheck(prop as fn(Vec<(u8, u16)>) -> TestResult);
}

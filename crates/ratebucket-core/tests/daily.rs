//! A quota over a longer window than the bucket's (a day's), reported spent: a reservation
//! is refused at once with the time to its reset, unless its caller may wait that long.

use std::time::Duration;

use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Event, Instant, Limit, QuotaPolicy, QuotaReport, Refusal,
    Reply, Report, ReserveError, Settle, TicketState,
};

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);
const RESETS_IN: Duration = Duration::from_secs(5 * 3_600);

/// Requests at 100 per minute, learning; one request sent and answered at 1 s with a
/// report of the day's quota: `remaining` of 1,000.
fn answered(remaining: u64) -> Arbiter {
    let start = Instant::ZERO;
    let bucket = Limit::per(100, MINUTE).bucket(start).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), start).unwrap();
    arbiter.change(0, Change::Policy(QuotaPolicy::known(100, MINUTE)), start).unwrap();
    let ticket = arbiter.reserve(&[1], start).unwrap();
    let sent = arbiter.stamp_send_if_open(ticket, start).unwrap();
    let reports = [Report {
        dimension: 0,
        quota: QuotaReport {
            limit: Some(1_000),
            remaining: Some(remaining),
            reset: Some(RESETS_IN),
            window: Some(DAY),
            ..QuotaReport::default()
        },
    }];
    let reply = Reply { sent, settle: Settle::Charge(&[1]), reports: &reports };
    let replied = arbiter.reply(ticket, &reply, Instant::from_millis(1_000));
    assert_eq!(replied.settled, Ok(()));
    assert_eq!(replied.bad_report, None);
    arbiter
}

#[test]
fn a_spent_daily_quota_refuses_at_once_saying_when_it_resets() {
    let mut arbiter = answered(0);
    let now = Instant::from_millis(2_000);
    match arbiter.reserve(&[1], now) {
        Err(ReserveError::QuotaSpent { dimension: Some(0), resets_in }) => {
            assert_eq!(resets_in, Some(RESETS_IN - Duration::from_secs(1)))
        }
        other => panic!("{other:?}"),
    }
    let error = arbiter.reserve(&[1], now).unwrap_err();
    assert_eq!(error.retry_after(), Some(RESETS_IN - Duration::from_secs(1)));
    assert!(error.to_string().contains("resets in 4h 59m"), "{error}");
    // A caller whose deadline reaches the reset waits for it, then is granted.
    let ticket = arbiter.reserve_within(&[1], Some(RESETS_IN), now).expect("may wait");
    assert_eq!(arbiter.state(ticket), Some(TicketState::Queued));
    let reset = Instant::ZERO + Duration::from_secs(1) + RESETS_IN;
    assert_eq!(arbiter.poll_timeout(), Some(reset));
    arbiter.handle_timeout(
        Instant::ZERO + (Duration::from_secs(1) + RESETS_IN - Duration::from_millis(1)),
    );
    assert_eq!(arbiter.state(ticket), Some(TicketState::Queued));
    arbiter.handle_timeout(reset);
    assert_eq!(arbiter.state(ticket), Some(TicketState::Granted));
    // And once it reset, nobody is refused.
    assert!(arbiter.reserve(&[1], reset).is_ok());
}

#[test]
fn a_daily_quota_with_some_left_refuses_nothing() {
    let mut arbiter = answered(1);
    for i in 0..50 {
        assert!(arbiter.reserve(&[1], Instant::from_millis(2_000 + i)).is_ok());
    }
}

#[test]
fn waiters_queued_when_the_day_is_spent_are_refused_with_the_reset() {
    let start = Instant::ZERO;
    let bucket = Limit::per(1, MINUTE).bucket(start).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), start).unwrap();
    arbiter.change(0, Change::Policy(QuotaPolicy::known(1, MINUTE)), start).unwrap();
    let first = arbiter.reserve(&[1], start).unwrap();
    let queued = arbiter.reserve(&[1], start).unwrap();
    assert_eq!(arbiter.state(queued), Some(TicketState::Queued));
    let sent = arbiter.stamp_send_if_open(first, start).unwrap();
    let reports = [Report {
        dimension: 0,
        quota: QuotaReport {
            remaining: Some(0),
            reset: Some(RESETS_IN),
            window: Some(DAY),
            ..QuotaReport::default()
        },
    }];
    let reply = Reply { sent, settle: Settle::Charge(&[1]), reports: &reports };
    let _ = arbiter.reply(first, &reply, start);
    assert_eq!(arbiter.state(queued), None);
    let refused = std::iter::from_fn(|| arbiter.poll_event()).find_map(|e| match e {
        Event::Refused { ticket, reason } if ticket == queued => Some(reason),
        _ => None,
    });
    assert_eq!(
        refused,
        Some(Refusal::QuotaSpent { dimension: Some(0), resets_in: Some(RESETS_IN) })
    );
}

//! A refusal saying the account's quota is spent (a spend cap, a usage limit, a wait of
//! days): every waiter is refused, every reservation fails at once saying when it resets,
//! nothing waits out a pause that long, and the arbiter grants again at the reset (or,
//! spent with no reset, once resumed).

use std::time::Duration;

use ratebucket_core::{
    ArbiterConfig, Event, Instant, Refusal, Reply, ReserveError, Settle, TicketState,
};

mod support;

use support::Harness;

const HOUR: Duration = Duration::from_secs(3_600);

/// Two dimensions (10 a second, burst 2; 1,000 a second, burst 1,000), one request sent at
/// 0 and refused at 1 s as `settle` says, with a second one queued behind a third.
fn refused(settle: Settle<'_>) -> (Harness, Vec<Event>) {
    let mut h = Harness::two((10, 2), (1_000, 1_000), ArbiterConfig::default());
    let sent_one = h.arbiter.reserve(&[1, 10], h.now).expect("granted");
    h.arbiter.reserve(&[1, 10], h.now).expect("granted");
    let queued = h.arbiter.reserve(&[1, 10], h.now).expect("queued");
    assert_eq!(h.arbiter.state(queued), Some(TicketState::Queued));
    let stamp = h.arbiter.stamp_send_if_open(sent_one, h.now).expect("open");
    h.drain();
    h.now = Instant::from_millis(50);
    let replied = h.arbiter.reply(sent_one, &Reply { sent: stamp, settle, reports: &[] }, h.now);
    assert_eq!(replied.settled, Ok(()), "the refused request is returned");
    let events = std::iter::from_fn(|| h.arbiter.poll_event()).collect();
    (h, events)
}

#[test]
fn a_quota_spent_until_a_reset_refuses_everyone_at_once_until_then() {
    let settle = Settle::Spent { resets_in: Some(HOUR), dimension: Some(1) };
    let (mut h, events) = refused(settle);
    let refusal = events.iter().find_map(|e| match e {
        Event::Refused { reason, .. } => Some(*reason),
        _ => None,
    });
    assert_eq!(
        refusal,
        Some(Refusal::QuotaSpent { dimension: Some(1), resets_in: Some(HOUR) }),
        "the queued waiter is told, naming the dimension and the reset"
    );
    assert!(h.arbiter.status().spent);
    assert_eq!(h.arbiter.status().queued, 0);
    // A minute later: refused at once, saying how long is left.
    h.now = Instant::from_secs(60);
    assert_eq!(
        h.arbiter.reserve(&[1, 1], h.now),
        Err(ReserveError::QuotaSpent {
            dimension: Some(1),
            resets_in: Some(HOUR - Duration::from_secs(60) + Duration::from_millis(50)),
        })
    );
    // A caller who may wait that long waits for the reset, and no longer.
    let patient = h.arbiter.reserve_within(&[1, 1], Some(2 * HOUR), h.now).expect("queued");
    assert_eq!(h.arbiter.state(patient), Some(TicketState::Queued));
    let reset = Instant::from_millis(50) + HOUR;
    assert_eq!(h.arbiter.poll_timeout(), Some(reset));
    let just_before = Instant::from_millis(50 + 3_600_000 - 1);
    assert!(h.advance_to(just_before).is_empty());
    let granted = h.advance_to(reset);
    assert_eq!(granted, vec![(reset, patient)]);
    assert!(!h.arbiter.status().spent);
    assert!(h.arbiter.reserve(&[1, 1], h.now).is_ok(), "whole again");
}

#[test]
fn a_quota_spent_until_someone_raises_it_refuses_until_resumed() {
    let settle = Settle::Spent { resets_in: None, dimension: None };
    let (mut h, _) = refused(settle);
    h.now = Instant::from_secs(30 * 86_400);
    let error = h.arbiter.reserve(&[1, 1], h.now).unwrap_err();
    assert_eq!(error, ReserveError::QuotaSpent { dimension: None, resets_in: None });
    assert_eq!(error.retry_after(), None);
    assert!(error.to_string().contains("until its limit is raised"), "{error}");
    assert_eq!(h.arbiter.poll_timeout(), None, "nothing waits for time");
    h.arbiter.resume(h.now);
    assert!(h.arbiter.reserve(&[1, 1], h.now).is_ok());
}

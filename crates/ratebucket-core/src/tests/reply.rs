//! The provider's reports and replies: what lowers a level, and when a refund may go on.

use super::Direct;
use super::support;

use ratebucket_core::{
    ArbiterConfig, Change, FoldOutcome, Instant, InvalidLimit, QuotaReport, Rate, Reply, Report,
    Settle,
};
use support::Harness;

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

#[test]
fn observations_only_lower_and_stale_ones_are_ignored() {
    let mut h = Harness::two((1, 10), (100, 100), ArbiterConfig::default());
    let older = h.arbiter.stamp_send(h.now);
    let newer = h.arbiter.stamp_send(h.now);
    assert_eq!(h.arbiter.observe_remaining(1, newer, 40, ms(0)), Ok(FoldOutcome::Lowered));
    assert_eq!(h.arbiter.observe_remaining(1, older, 5, ms(0)), Ok(FoldOutcome::Stale));
    assert_eq!(h.arbiter.observe_remaining(1, newer, 90, ms(0)), Ok(FoldOutcome::Unchanged));
    // A dimension that does not exist is an error, not a silent no-op.
    assert_eq!(
        h.arbiter.observe_remaining(2, newer, 90, ms(0)),
        Err(InvalidLimit::NoSuchDimension(2))
    );
    assert_eq!(
        h.arbiter.change(7, Change::Rate(Rate::per_second(1).expect("rate")), ms(0)),
        Err(InvalidLimit::NoSuchDimension(7))
    );
    assert_eq!(h.arbiter.stop_sync(2), Err(InvalidLimit::NoSuchDimension(2)));
    assert_eq!(h.arbiter.dimension(1, ms(0)).map(|d| d.level), Some(40.0));
    assert_eq!(
        h.arbiter.dimension(0, ms(0)).map(|d| d.level),
        Some(10.0),
        "other dimensions untouched"
    );
}

/// A reply reconciled to usage from a provider that counted the whole reservation: the
/// refund must not reach the next waiter before the provider's count takes it back.
#[test]
fn a_reply_keeps_its_refund_from_the_next_waiter_until_its_report_is_folded() {
    let mut h = Harness::two((1, 10), (1, 100), ArbiterConfig::default());
    let first = h.arbiter.reserve(&[1, 100], ms(0)).expect("granted");
    let stamp = h.arbiter.stamp_send_if_open(first, ms(0)).expect("the gate is open");
    let next = h.arbiter.reserve(&[1, 60], ms(0)).expect("queued");
    h.drain();
    // Charged 20 of the 100 reserved, and the provider counted all 100: nothing left.
    let reports = [Report {
        dimension: 1,
        quota: QuotaReport { remaining: Some(0), ..QuotaReport::default() },
    }];
    let replied = h.arbiter.reply(
        first,
        &Reply { sent: stamp, settle: Settle::Charge(&[1, 20]), reports: &reports },
        ms(0),
    );
    assert_eq!(replied.settled, Ok(()));
    assert_eq!(replied.bad_report, None);
    assert!(h.drain().is_empty(), "the refund of 80 was taken back before any grant");
    assert_eq!(h.arbiter.state(next), Some(ratebucket_core::TicketState::Queued));
}

/// A provider that says nothing remains but its count is whole again in 1 ms: the window
/// cap holds that count for 1 ms, not for its whole window.
#[test]
fn a_window_cap_lets_the_providers_count_go_at_its_reset() {
    use ratebucket_core::{Change, WindowGuard};
    let bucket =
        ratebucket_core::TokenBucket::new(Rate::per_second(1_000).unwrap(), 1_000, Instant::ZERO)
            .unwrap();
    let mut arbiter =
        ratebucket_core::Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO)
            .unwrap();
    let guard = WindowGuard::new(10, std::time::Duration::from_secs(60)).unwrap();
    arbiter.change(0, Change::WindowGuard(Some(guard)), Instant::ZERO).unwrap();
    let sent = arbiter.stamp_send(ms(0));
    let report = QuotaReport {
        limit: Some(10),
        remaining: Some(0),
        reset: Some(std::time::Duration::from_millis(1)),
        window: None,
        ..QuotaReport::default()
    };
    arbiter.observe_quota(0, sent, report, ms(0)).unwrap();
    // Someone else spent the window: held, but only until the provider's reset.
    assert_eq!(arbiter.estimate_drain(&[1], ms(0)), Ok(std::time::Duration::from_millis(1)));
    let ticket = arbiter.reserve(&[1], ms(2)).unwrap();
    assert_eq!(
        arbiter.state(ticket),
        Some(ratebucket_core::TicketState::Granted),
        "granted at once after the reset"
    );
}

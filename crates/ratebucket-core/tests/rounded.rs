//! A `remaining` rounded to a step (Anthropic's token counts, to thousands): it lowers the
//! level only to the least it can stand for, and teaches no booked charge.

use std::time::Duration;

use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Instant, Limit, QuotaPolicy, QuotaReport, Reply, Report, Settle,
};

const WINDOW: Duration = Duration::from_secs(60);
const LIMIT: u64 = 40_000;

/// Input tokens at 40,000 per minute, learning; one request of 190 tokens sent alone and
/// answered with `remaining` as the provider rounds it (39,810 rounds to 40,000).
fn answered(remaining: u64, precision: u64) -> Arbiter {
    let start = Instant::ZERO;
    let bucket = Limit::per(LIMIT, WINDOW).bucket(start).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), start).unwrap();
    arbiter.change(0, Change::Policy(QuotaPolicy::known(LIMIT, WINDOW)), start).unwrap();
    let ticket = arbiter.reserve(&[190], start).unwrap();
    let sent = arbiter.stamp_send_if_open(ticket, start).unwrap();
    let reports = [Report {
        dimension: 0,
        quota: QuotaReport {
            limit: Some(LIMIT),
            remaining: Some(remaining),
            // A continuous bucket's: full again once what is used has refilled.
            reset: Some(WINDOW * u32::try_from(LIMIT - remaining).unwrap() / LIMIT as u32),
            precision,
            ..QuotaReport::default()
        },
    }];
    let reply = Reply { sent, settle: Settle::Charge(&[190]), reports: &reports };
    let replied = arbiter.reply(ticket, &reply, Instant::from_millis(10));
    assert_eq!(replied.settled, Ok(()));
    arbiter
}

#[test]
fn a_rounded_remaining_teaches_no_charge() {
    // Read as exact, 39,000 after a request of 190 would say the provider booked 1,000.
    let exact = answered(3_000, 0);
    let factor = exact.dimension(0, Instant::from_millis(10)).unwrap().charge_factor;
    assert!(factor > 2.0, "an exact count does teach it: {factor}");
    let rounded = answered(3_000, 1_000);
    let factor = rounded.dimension(0, Instant::from_millis(10)).unwrap().charge_factor;
    assert_eq!(factor, 1.0, "a rounded count says nothing of one request");
}

#[test]
fn a_rounded_remaining_lowers_to_the_least_it_stands_for() {
    let now = Instant::from_millis(10);
    let rounded = answered(3_000, 1_000);
    let level = rounded.dimension(0, now).unwrap().level;
    assert!(level <= 2_500.0 + 7.0, "lowered to 2,500 (and 10 ms of refill): {level}");
    let exact = answered(3_000, 0);
    let exact_level = exact.dimension(0, now).unwrap().level;
    assert!(exact_level > level + 400.0, "{exact_level} against {level}");
}

//! A provider that books what replies use (it charges after the reply, not what was
//! reserved) has reservations lowered to the high ratio of usage; one that books what was
//! reserved keeps them whole.

use super::Direct;
use crate::{Arbiter, ArbiterConfig, Instant, Rate, SendStamp, Ticket, TokenBucket};

/// One dimension of 60,000 refilling 6,000 a second, its limit told, adapting nothing,
/// reserving what replies use.
fn arbiter() -> Arbiter {
    arbiter_with(ArbiterConfig::default().with_reserve_usage(true))
}

fn arbiter_with(config: ArbiterConfig) -> Arbiter {
    let rate = Rate::per_second(6_000).expect("rate");
    let bucket = TokenBucket::new(rate, 60_000, Instant::ZERO).expect("bucket");
    let config = config.with_adapt(None);
    let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
    arbiter.observe_limit(0, 60_000).expect("dimension 0");
    arbiter
}

fn level(arbiter: &Arbiter) -> f64 {
    arbiter.dimension(0, Instant::ZERO).map(|d| d.level).expect("dimension 0")
}

/// Reserves `reserved`, returning the ticket and what the reservation took from the level.
fn reserve(arbiter: &mut Arbiter, reserved: u64) -> (Ticket, f64) {
    let before = level(arbiter);
    let ticket = arbiter.reserve(&[reserved], Instant::ZERO).expect("granted");
    (ticket, before - level(arbiter))
}

/// Reserves 200 and sends the request, returning its ticket and send stamp.
fn send(arbiter: &mut Arbiter) -> (Ticket, SendStamp) {
    let (ticket, _) = reserve(arbiter, 200);
    let sent = arbiter.stamp_send_if_open(ticket, Instant::ZERO).expect("the gate is open");
    (ticket, sent)
}

/// Reserves 200, sends the request, and commits what its reply `used`, returning its send
/// stamp.
fn answered(arbiter: &mut Arbiter, used: u64) -> SendStamp {
    let (ticket, sent) = send(arbiter);
    arbiter.commit(ticket, &[used], Instant::ZERO).expect("granted");
    sent
}

/// The first request, alone: reserved 200, its reply used 80, and the provider's report
/// says it booked `booked` of its full 60,000 (the reply's charge, then its count).
fn first(arbiter: &mut Arbiter, booked: u64) {
    let sent = answered(arbiter, 80);
    arbiter.observe_remaining(0, sent, 60_000 - booked, Instant::ZERO).expect("dimension 0");
}

#[test]
fn a_provider_booking_what_replies_use_has_reservations_lowered_to_their_high_usage() {
    let mut arbiter = arbiter();
    // The provider booked what the reply used: 80 of the 200 reserved.
    first(&mut arbiter, 80);
    // One ratio seen (0.4): a reservation of 200 takes twice it, 160.
    let (ticket, took) = reserve(&mut arbiter, 200);
    assert_eq!(took, 160.0);
    // A reply using more than was taken is charged in full: the overrun is debt.
    let before = level(&arbiter);
    arbiter.commit(ticket, &[190], Instant::ZERO).expect("granted");
    assert_eq!(before - level(&arbiter), 30.0);
    // Thirty replies using 70..=99 of 200: a reservation takes a little above their 90th
    // percentile (97 of 200, and 5%), not the 200 asked for.
    for used in 70..100 {
        answered(&mut arbiter, used);
    }
    let (_, took) = reserve(&mut arbiter, 200);
    assert_eq!(took, 102.0);
    // Small counts (whole requests) are never lowered.
    let (_, took) = reserve(&mut arbiter, 10);
    assert_eq!(took, 10.0);
}

#[test]
fn a_provider_booking_what_was_reserved_keeps_reservations_whole() {
    // It booked the whole reservation, though the reply used 80.
    let mut arbiter = arbiter();
    first(&mut arbiter, 200);
    assert_eq!(reserve(&mut arbiter, 200).1, 200.0);
    // It booked 170 of 200 (its own count of a prompt the client estimated long, and all
    // of `max_tokens`): well above what replies use, so still not lowered.
    let mut arbiter = arbiter_with_first(170);
    assert_eq!(reserve(&mut arbiter, 200).1, 200.0);
    // Booking what replies use, but not told to reserve that: whole.
    let mut arbiter = arbiter_with(ArbiterConfig::default());
    first(&mut arbiter, 80);
    assert_eq!(reserve(&mut arbiter, 200).1, 200.0);
}

fn arbiter_with_first(booked: u64) -> Arbiter {
    let mut arbiter = arbiter();
    first(&mut arbiter, booked);
    arbiter
}

/// A report read while reservations lowered to the high usage are in flight takes them at
/// what they will use together (their mean and a pooled spread), not at the sum of each
/// one's high quantile: five reservations of 99 count as about 427, not 495.
#[test]
fn a_report_reads_a_flight_of_lowered_reservations_at_what_they_use_together() {
    let mut arbiter = arbiter();
    first(&mut arbiter, 80);
    // Sixty-four replies using 60..=100 and 60..=82 of 200 (mean ratio 0.384, sd 0.056):
    // reservations of 200 are lowered to 99 (their 90th percentile, 0.47, and 5%).
    for used in (60..=100).chain(60..=82) {
        answered(&mut arbiter, used);
    }
    let before = level(&arbiter);
    let (reported, sent) = send(&mut arbiter);
    assert_eq!(before - level(&arbiter), 99.0);
    // Five more leave after it: the provider may count any of them after its report.
    for _ in 0..5 {
        send(&mut arbiter);
    }
    arbiter.commit(reported, &[80], Instant::ZERO).expect("granted");
    arbiter.sync_level(0, sent, 50_000, Instant::ZERO).expect("dimension 0");
    let held = 50_000.0 - level(&arbiter);
    // 0.384 × 1,003 estimated, and 1.645 × 0.056 × sqrt(200 × 1,003) more.
    assert!((420.0..=435.0).contains(&held), "held {held} for 495 reserved");
}

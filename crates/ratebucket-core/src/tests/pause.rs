//! The pool-wide pause: one per wave of throttles, the drained buckets, the rates that
//! fall and climb back.

use super::Direct;
use super::support;

use std::time::Duration;

use ratebucket_core::{
    Adapt, ArbiterConfig, Event, GateConfig, Instant, Rate, TicketError, TicketState,
};
use support::Harness;

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}
#[test]
fn fifty_throttles_of_one_wave_pause_the_pool_once() {
    let mut h = Harness::two((100, 100), (10_000, 10_000), ArbiterConfig::default());
    let stamps: Vec<_> = (0..50).map(|_| h.arbiter.stamp_send(h.now)).collect();
    for (i, stamp) in stamps.iter().enumerate() {
        h.arbiter.throttle(*stamp, Some(Duration::from_secs(2)), ms(i as u64));
    }
    let waiter = h.arbiter.reserve(&[1, 1], ms(100)).unwrap();
    h.drain();
    let pauses = h.log.iter().filter(|(_, e)| matches!(e, Event::Throttled { .. })).count();
    assert_eq!(pauses, 1);
    assert_eq!(h.arbiter.state(waiter), Some(TicketState::Queued), "no grant while paused");
    assert_eq!(h.arbiter.poll_timeout(), Some(ms(2000)));
    assert_eq!(h.advance_to(ms(2000)), vec![(ms(2000), waiter)]);
    // A request sent after the pause belongs to a new wave and can close it again.
    let next = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(next, None, ms(2000));
    assert!(!h.arbiter.status().gate.is_open(ms(2000)));
}

#[test]
fn an_absurd_retry_after_is_capped() {
    let mut h = Harness::two((1, 1), (1, 1), ArbiterConfig::default());
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, Some(Duration::MAX), ms(0));
    assert_eq!(h.arbiter.status().gate.reopens_at(ms(0)), Some(Instant::from_secs(120)));
}

#[test]
fn the_gate_honours_every_wait_the_retry_policy_accepts() {
    let ceiling = ratebucket_core::RetryPolicy::default().retry_after_ceiling;
    assert!(GateConfig::default().max_pause >= ceiling);
}

#[test]
fn a_throttle_drains_every_bucket_and_halves_the_rates_once_per_wave() {
    let mut h = Harness::two((100, 100), (1_000, 1_000), ArbiterConfig::default());
    let wave: Vec<_> = (0..10).map(|_| h.arbiter.stamp_send(h.now)).collect();
    for stamp in &wave {
        h.arbiter.throttle(*stamp, Some(Duration::from_secs(1)), ms(0));
    }
    assert_eq!(
        h.arbiter.dimension(0, ms(0)).map(|d| d.level),
        Some(0.0),
        "the provider has nothing left"
    );
    assert_eq!(h.arbiter.dimension(1, ms(0)).map(|d| d.level), Some(0.0));
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(50).unwrap())
    );
    assert_eq!(
        h.arbiter.dimension(1, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(500).unwrap())
    );
    // After the one-second pause, each bucket holds what refilled at the lowered rate.
    assert_eq!(h.arbiter.dimension(0, ms(1000)).map(|d| d.level), Some(50.0));
}

#[test]
fn the_rest_of_a_throttled_wave_gives_nothing_back_when_it_ends() {
    let config = ArbiterConfig::default().with_adapt(None);
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    // A wave of ten, all sent; the first 429 closes the gate for a second.
    let wave: Vec<_> = (0..10)
        .map(|_| {
            let ticket = h.arbiter.reserve(&[1, 10], ms(0)).unwrap();
            (ticket, h.arbiter.stamp_send_if_open(ticket, ms(0)).expect("the gate is open"))
        })
        .collect();
    h.arbiter.throttle(wave[0].1, Some(Duration::from_secs(1)), ms(5));
    // The other nine come back 429 too (stale) and are released; one got through.
    for &(ticket, stamp) in &wave[1..9] {
        h.arbiter.throttle(stamp, Some(Duration::from_secs(1)), ms(6));
        h.arbiter.release(ticket, ms(6)).unwrap();
    }
    h.arbiter.release(wave[0].0, ms(6)).unwrap();
    h.arbiter.commit(wave[9].0, &[1, 2], ms(6)).unwrap();
    // The provider had nothing left: the releases and the refund do not refill the
    // buckets, or the wave would leave again, into the same wall, when the pause ends.
    let level = |h: &mut Harness, d, at| h.arbiter.dimension(d, at).map(|d| d.level).unwrap();
    let after_the_wave = level(&mut h, 0, ms(6));
    assert!(
        (after_the_wave - 0.1).abs() < 1e-6,
        "{after_the_wave} left a millisecond after the wave, not one millisecond of refill"
    );
    // After the pause, what refilled during it, and no more.
    assert!((level(&mut h, 1, ms(500)) - 495.0).abs() < 1e-6);
    assert!((level(&mut h, 0, ms(1_005)) - 100.0).abs() < 1e-6);
}

#[test]
fn an_unsent_grant_is_queued_again_ahead_of_later_waiters_and_takes_its_cost_anew() {
    let config = ArbiterConfig::default().with_adapt(None);
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let sent = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    let stamp = h.arbiter.stamp_send_if_open(sent, ms(0)).expect("the gate is open");
    let unsent = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    h.arbiter.throttle(stamp, Some(Duration::from_secs(1)), ms(0));
    let later = h.arbiter.reserve(&[1, 1], ms(10)).unwrap();
    assert_eq!(h.arbiter.requeue_unsent(sent, ms(10)), Err(TicketError::AlreadySent));
    h.arbiter.requeue_unsent(unsent, ms(10)).unwrap();
    assert_eq!(h.arbiter.state(unsent), Some(TicketState::Queued));
    assert_eq!(h.arbiter.status().queued, 2);
    // Nothing is granted during the pause; after it, the requeued grant goes first and
    // pays again from what refilled.
    h.advance_to(ms(999));
    assert_eq!(h.arbiter.state(unsent), Some(TicketState::Queued));
    h.advance_to(ms(1_000));
    assert_eq!(h.arbiter.state(unsent), Some(TicketState::Granted));
    assert_eq!(h.arbiter.state(later), Some(TicketState::Granted));
    assert_eq!(h.arbiter.dimension(0, ms(1_000)).map(|d| d.level), Some(100.0 - 2.0));
    h.drain();
    let order: Vec<_> = h
        .log
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Granted { ticket, .. } => Some(*ticket),
            _ => None,
        })
        .collect();
    assert_eq!(order[order.len() - 2..], [unsent, later]);
}

#[test]
fn the_rate_comes_back_but_never_above_the_configured_one() {
    let mut h = Harness::two((100, 100), (1_000, 1_000), ArbiterConfig::default());
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, None, ms(0));
    h.advance_to(ms(60_000));
    for _ in 0..500 {
        let t = h.arbiter.reserve(&[1, 1], h.now).unwrap();
        h.arbiter.commit(t, &[1, 1], h.now).unwrap();
        h.advance(Duration::from_millis(20));
    }
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(100).unwrap())
    );
    assert_eq!(
        h.arbiter.dimension(1, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(1_000).unwrap())
    );
    h.drain();
    let changes = h.log.iter().filter(|(_, e)| matches!(e, Event::RateChanged { .. })).count();
    assert!(changes > 2, "down once, then up step by step");
    assert!(changes < 1_000, "in steps, not an event per call: {changes}");
}

/// After a throttle the rate climbs back by time, from the end of the pause: successes do
/// not speed it up, and it nears the rate that met the throttle over one probe.
#[test]
fn the_rate_climbs_back_over_a_probe_not_per_success() {
    let adapt = Adapt::default().with_probe(Duration::from_secs(10));
    let config = ArbiterConfig::default().with_adapt(Some(adapt));
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let rate = |h: &Harness| {
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate).unwrap().per_second_f64()
    };
    let stamp = h.arbiter.stamp_send(h.now);
    // A one-second pause; the rate halves at once.
    h.arbiter.throttle(stamp, Some(Duration::from_secs(1)), ms(0));
    assert_eq!(rate(&h), 50.0);
    // Many successes within the pause's end and the probe's start raise nothing.
    h.advance_to(ms(1_000));
    for _ in 0..40 {
        let t = h.arbiter.reserve(&[1, 1], h.now).unwrap();
        h.arbiter.commit(t, &[1, 1], h.now).unwrap();
    }
    assert_eq!(rate(&h), 50.0, "successes alone do not raise the rate");
    // Half a probe on: halfway from 50 to 90 (nine tenths of the 100 that met the 429).
    h.advance_to(ms(6_000));
    assert!((rate(&h) - 70.0).abs() < 0.5, "{}", rate(&h));
    h.advance_to(ms(11_000));
    assert!((rate(&h) - 90.0).abs() < 0.5, "{}", rate(&h));
    // Then a tenth of it per probe, up to the configured rate and no further.
    h.advance_to(ms(16_000));
    assert!((rate(&h) - 95.0).abs() < 0.5, "{}", rate(&h));
    h.advance_to(ms(60_000));
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(100).unwrap())
    );

    // A second throttle while climbing remembers the lower rate that met it.
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, Some(Duration::from_secs(1)), ms(0));
    h.advance_to(ms(11_000));
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, Some(Duration::from_secs(1)), ms(11_000));
    assert!((rate(&h) - 45.0).abs() < 0.5, "{}", rate(&h));
    h.advance_to(ms(22_000));
    assert!((rate(&h) - 81.0).abs() < 0.5, "nine tenths of 90: {}", rate(&h));
}

#[test]
fn without_adapting_a_throttle_leaves_the_rates_alone() {
    let config = ArbiterConfig::default().with_adapt(None);
    let mut h = Harness::two((100, 100), (1_000, 1_000), config);
    let stamp = h.arbiter.stamp_send(h.now);
    h.arbiter.throttle(stamp, None, ms(0));
    assert_eq!(
        h.arbiter.dimension(0, Instant::ZERO).map(|d| d.rate),
        Some(Rate::per_second(100).unwrap())
    );
    assert_eq!(h.arbiter.dimension(0, ms(0)).map(|d| d.level), Some(0.0), "still drained");
}

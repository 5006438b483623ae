//! Bad input and hopeless waits: refused at once with a clear error, nothing lost.

use super::Direct;
use super::support;

use std::time::Duration;

use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Event, Instant, InvalidLimit, Rate, Refusal, ReserveError,
    Ticket, TicketError, TicketState, TokenBucket,
};
use support::Harness;

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

#[test]
fn a_cost_above_capacity_is_refused_at_once() {
    let mut h = Harness::two((3, 4), (50, 100), ArbiterConfig::default());
    assert_eq!(
        h.arbiter.reserve(&[1, 101], ms(0)),
        Err(ReserveError::CostExceedsCapacity { dimension: 1, cost: 101, capacity: 100 })
    );
    assert_eq!(
        h.arbiter.reserve(&[1], ms(0)),
        Err(ReserveError::WrongDimensions { expected: 2, got: 1 })
    );
    assert_eq!(h.arbiter.status().queued, 0);
    assert_eq!(h.arbiter.poll_timeout(), None, "nothing is left waiting");
}

#[test]
fn invalid_limits_are_constructor_errors() {
    let now = Instant::ZERO;
    assert_eq!(Rate::per_minute(0).unwrap_err(), InvalidLimit::ZeroRate);
    for bad in [0.0, -3.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert!(Rate::from_per_second_f64(bad).is_err(), "{bad} accepted");
    }
    let rate = Rate::per_second(1).unwrap();
    assert_eq!(TokenBucket::new(rate, 0, now).unwrap_err(), InvalidLimit::ZeroCapacity);
    assert!(Arbiter::new(Vec::new(), ArbiterConfig::default(), now).is_err());
    let mut bucket = TokenBucket::new(rate, 5, now).unwrap();
    assert_eq!(bucket.set_capacity(0, now), Err(InvalidLimit::ZeroCapacity));
    assert_eq!(bucket.capacity(), 5);
}

#[test]
fn time_going_backwards_neither_panics_nor_grants_extra() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    h.arbiter.reserve(&[1, 1], Instant::from_secs(100)).unwrap();
    let waiting = h.arbiter.reserve(&[1, 1], Instant::from_secs(100)).unwrap();
    for back in [99, 50, 0] {
        h.arbiter.handle_timeout(Instant::from_secs(back));
        h.arbiter.reserve(&[1, 1], Instant::from_secs(back)).unwrap();
    }
    h.drain();
    assert_eq!(h.granted().len(), 1);
    assert_eq!(h.arbiter.state(waiting), Some(TicketState::Queued));
    assert_eq!(h.arbiter.poll_timeout(), Some(Instant::from_secs(101)));
}

#[test]
fn ticket_misuse_is_an_error_not_a_double_refund() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    let granted = h.arbiter.reserve(&[1, 50], ms(0)).unwrap();
    let queued = h.arbiter.reserve(&[1, 50], ms(0)).unwrap();
    assert_eq!(h.arbiter.commit(queued, &[1, 5], ms(0)), Err(TicketError::NotGranted));
    assert_eq!(
        h.arbiter.commit(granted, &[1], ms(0)),
        Err(TicketError::WrongDimensions { expected: 2, got: 1 })
    );
    h.arbiter.commit(granted, &[1, 10], ms(0)).unwrap();
    assert_eq!(h.arbiter.commit(granted, &[1, 10], ms(0)), Err(TicketError::Unknown));
    assert_eq!(h.arbiter.release(granted, ms(0)), Err(TicketError::Unknown));
    assert!(!h.arbiter.cancel(granted, ms(0)));
    assert_eq!(h.arbiter.dimension(1, ms(0)).map(|d| d.level), Some(90.0));
    // A slot reused by a new reservation does not answer to the old ticket.
    h.arbiter.cancel(queued, ms(0));
    let reused = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    assert!(!h.arbiter.cancel(queued, ms(0)));
    assert_eq!(h.arbiter.state(reused), Some(TicketState::Queued));
}

#[test]
fn max_wait_refuses_up_front_with_the_wait_it_refused() {
    let mut h = Harness::two((2, 2), (100, 100), ArbiterConfig::default());
    for _ in 0..4 {
        h.arbiter.reserve(&[1, 10], ms(0)).unwrap();
    }
    // Two granted, two queued: the next waits for three more request permits = 1.5 s.
    let refused = h.arbiter.reserve_within(&[1, 10], Some(Duration::from_secs(1)), ms(0));
    assert_eq!(refused, Err(ReserveError::WouldWait { retry_after: Duration::from_millis(1500) }));
    h.drain();
    assert!(h.log.iter().any(|(_, e)| matches!(e, Event::Rejected { .. })));
    assert_eq!(h.arbiter.status().queued, 2, "a refused reservation is not queued");
    let accepted =
        h.arbiter.reserve_within(&[1, 10], Some(Duration::from_millis(1500)), ms(0)).unwrap();
    let grants = h.run_until_idle();
    assert_eq!(grants.last(), Some(&(ms(1500), accepted)));
}

#[test]
fn a_capacity_for_a_dimension_that_does_not_exist_is_refused() {
    let mut h = Harness::two((1, 1), (1, 1), ArbiterConfig::default());
    assert_eq!(
        h.arbiter.change(2, Change::Capacity(10), ms(0)),
        Err(InvalidLimit::NoSuchDimension(2))
    );
}

#[test]
fn abort_refuses_every_queued_waiter_and_later_reservations() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    let granted = h.arbiter.reserve(&[1, 1], ms(0)).unwrap();
    let queued: Vec<Ticket> = (0..3).map(|_| h.arbiter.reserve(&[1, 1], ms(0)).unwrap()).collect();
    h.arbiter.abort(ms(0));
    h.drain();
    let refused: Vec<Ticket> = h
        .log
        .iter()
        .filter_map(|(_, e)| match e {
            Event::Refused { ticket, reason: Refusal::Aborted } => Some(*ticket),
            _ => None,
        })
        .collect();
    assert_eq!(refused, queued);
    assert_eq!(h.arbiter.reserve(&[1, 1], ms(0)), Err(ReserveError::Aborted));
    assert_eq!(h.arbiter.release(granted, ms(0)), Ok(()));
}

#[test]
fn lowering_capacity_below_a_queued_cost_refuses_it_instead_of_hanging() {
    let mut h = Harness::two((1, 1), (100, 100), ArbiterConfig::default());
    h.arbiter.reserve(&[1, 100], ms(0)).unwrap();
    let big = h.arbiter.reserve(&[1, 80], ms(0)).unwrap();
    h.arbiter.change(1, Change::Capacity(50), ms(0)).unwrap();
    h.drain();
    assert!(h.log.iter().any(|(_, e)| *e
        == Event::Refused { ticket: big, reason: Refusal::CostExceedsCapacity { dimension: 1 } }));
    assert_eq!(h.arbiter.status().queued, 0);
}

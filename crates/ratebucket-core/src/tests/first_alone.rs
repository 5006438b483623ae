//! The first reservation alone: nothing else leaves before the provider's first report
//! says what it booked, or that reservation ends.

use super::Direct;
use ratebucket_core::{Arbiter, ArbiterConfig, Instant, Rate, TicketState, TokenBucket};

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

/// 100 requests and 10,000 tokens per second, full.
fn arbiter(first_alone: bool) -> Arbiter {
    let buckets = vec![
        TokenBucket::new(Rate::per_second(100).unwrap(), 100, Instant::ZERO).unwrap(),
        TokenBucket::new(Rate::per_second(10_000).unwrap(), 10_000, Instant::ZERO).unwrap(),
    ];
    let config = ArbiterConfig::default().with_first_alone(first_alone);
    Arbiter::new(buckets, config, Instant::ZERO).unwrap()
}

#[test]
fn the_burst_waits_for_every_dimensions_first_report_and_leaves_at_the_booked_charge() {
    let mut arbiter = arbiter(true);
    let first = arbiter.reserve(&[1, 100], ms(0)).unwrap();
    let rest: Vec<_> = (0..5).map(|_| arbiter.reserve(&[1, 100], ms(0)).unwrap()).collect();
    assert_eq!(arbiter.state(first), Some(TicketState::Granted));
    let queued = |arbiter: &Arbiter| {
        rest.iter().filter(|&&t| arbiter.state(t) == Some(TicketState::Queued)).count()
    };
    assert_eq!(queued(&arbiter), 5, "the first goes alone");
    arbiter.handle_timeout(ms(500));
    assert_eq!(queued(&arbiter), 5, "time alone releases nothing");
    // The provider (starting full) booked 150 tokens for the first request.
    arbiter.observe_limit(0, 100).unwrap();
    arbiter.observe_limit(1, 10_000).unwrap();
    let sent = arbiter.stamp_send_if_open(first, ms(500)).expect("the gate is open");
    arbiter.observe_remaining(0, sent, 99, ms(520)).unwrap();
    assert_eq!(queued(&arbiter), 5, "the tokens have not reported yet");
    arbiter.observe_remaining(1, sent, 9_850, ms(520)).unwrap();
    assert_eq!(queued(&arbiter), 0, "both reported: the rest go");
    // ... each at what the provider books, not at the estimate.
    for &ticket in &rest {
        let cost = arbiter.cost(ticket).unwrap();
        assert_eq!(cost[0], 1);
        assert!(cost[1] >= 150, "reserved {cost:?}");
    }
}

#[test]
fn a_first_reservation_that_ends_without_a_report_lets_the_rest_go() {
    for end in ["commit", "release", "cancel"] {
        let mut arbiter = arbiter(true);
        let first = arbiter.reserve(&[1, 100], ms(0)).unwrap();
        let second = arbiter.reserve(&[1, 100], ms(0)).unwrap();
        assert_eq!(arbiter.state(second), Some(TicketState::Queued));
        match end {
            "commit" => arbiter.commit(first, &[1, 80], ms(10)).unwrap(),
            "release" => arbiter.release(first, ms(10)).unwrap(),
            _ => assert!(arbiter.cancel(first, ms(10))),
        }
        assert_eq!(arbiter.state(second), Some(TicketState::Granted), "{end}");
        // From then on, grants are immediate.
        let third = arbiter.reserve(&[1, 100], ms(10)).unwrap();
        let fourth = arbiter.reserve(&[1, 100], ms(10)).unwrap();
        assert_eq!(arbiter.state(third), Some(TicketState::Granted), "{end}");
        assert_eq!(arbiter.state(fourth), Some(TicketState::Granted), "{end}");
    }
}

#[test]
fn by_default_a_burst_leaves_at_once() {
    let mut arbiter = arbiter(false);
    let tickets: Vec<_> = (0..6).map(|_| arbiter.reserve(&[1, 100], ms(0)).unwrap()).collect();
    assert!(tickets.iter().all(|&t| arbiter.state(t) == Some(TicketState::Granted)));
}

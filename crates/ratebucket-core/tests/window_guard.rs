//! The window guard against fixed-window and sliding-log providers, on a virtual clock:
//! whatever the bucket's burst, the client never sends what the provider must refuse, even
//! when it reconciles to usage while the provider counts the reservation.

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Event, Instant, Rate, SendStamp, Ticket, TicketState, TokenBucket,
    WindowGuard,
};
use support::check;

#[derive(Clone, Copy, Debug)]
enum Model {
    FixedWindow,
    SlidingLog,
}

#[derive(Clone, Debug)]
struct Call {
    gap: u64,
    reserved: u64,
    actual: u64,
    send_delay: u64,
    transit: u64,
    latency: u64,
}

#[derive(Clone, Debug)]
struct Schedule {
    model: Model,
    limit: u64,
    window_ms: u64,
    /// The client's burst, as a fraction of the limit in 1/8s (8 = the whole limit).
    burst_eighths: u64,
    /// Whether the provider counts the reservation (the client reconciles to usage).
    charges_reservation: bool,
    calls: Vec<Call>,
}

impl Arbitrary for Schedule {
    fn arbitrary(g: &mut Gen) -> Schedule {
        let limit = u64::arbitrary(g) % 2_000 + 300;
        let n = usize::arbitrary(g) % 200 + 10;
        let calls = (0..n)
            .map(|_| {
                let reserved = u64::arbitrary(g) % 200 + 1;
                Call {
                    gap: u64::arbitrary(g) % 30,
                    reserved,
                    actual: u64::arbitrary(g) % (reserved + 1),
                    send_delay: u64::arbitrary(g) % 20,
                    transit: u64::arbitrary(g) % 15,
                    latency: u64::arbitrary(g) % 300,
                }
            })
            .collect();
        Schedule {
            model: if bool::arbitrary(g) {
                Model::FixedWindow
            } else {
                Model::SlidingLog
            },
            limit,
            window_ms: u64::arbitrary(g) % 2_000 + 200,
            burst_eighths: u64::arbitrary(g) % 8 + 1,
            charges_reservation: bool::arbitrary(g),
            calls,
        }
    }
}

/// The provider's count: a fixed window restarting every `window` ms, or a log of charges
/// each forgotten `window` ms after it was made.
struct Provider {
    model: Model,
    limit: u64,
    window: u64,
    log: VecDeque<(u64, u64)>,
}

impl Provider {
    fn used(&mut self, now: u64) -> u64 {
        match self.model {
            Model::FixedWindow => {
                let start = now / self.window * self.window;
                self.log.retain(|&(at, _)| at >= start);
            }
            Model::SlidingLog => {
                while self
                    .log
                    .front()
                    .is_some_and(|&(at, _)| at + self.window <= now)
                {
                    self.log.pop_front();
                }
            }
        }
        self.log.iter().map(|&(_, amount)| amount).sum()
    }
}

type Agenda<T> = BTreeMap<(u64, u64), T>;

/// Plays `schedule`; returns when the last reservation was granted, in ms, or how the
/// provider had to refuse one.
fn play(schedule: &Schedule) -> Result<u64, String> {
    let window = Duration::from_millis(schedule.window_ms);
    let rate = Rate::new(schedule.limit, window).expect("rate");
    let capacity = (schedule.limit * schedule.burst_eighths / 8).max(200);
    let bucket = TokenBucket::new(rate, capacity, Instant::ZERO).expect("bucket");
    let mut arbiter = Arbiter::new(
        vec![bucket],
        ArbiterConfig::default().with_adapt(None),
        Instant::ZERO,
    )
    .expect("arbiter");
    let guard = WindowGuard::new(schedule.limit, window).expect("guard");
    arbiter
        .set_window_guard(0, Some(guard), Instant::ZERO)
        .expect("dimension 0");
    let mut provider = Provider {
        model: schedule.model,
        limit: schedule.limit,
        window: schedule.window_ms,
        log: VecDeque::new(),
    };
    let mut calls: BTreeMap<Ticket, &Call> = BTreeMap::new();
    let mut arrivals = schedule.calls.iter().scan(0u64, |t, c| {
        *t += c.gap;
        Some((*t, c))
    });
    let mut next_arrival = arrivals.next();
    let mut departures: Agenda<Ticket> = BTreeMap::new();
    let mut in_transit: Agenda<(SendStamp, Ticket)> = BTreeMap::new();
    let mut replies: Agenda<(SendStamp, Ticket, u64)> = BTreeMap::new();
    let (mut now, mut serial, mut granted, mut last_grant) = (0u64, 0u64, 0usize, 0u64);
    loop {
        let at = Instant::from_millis(now);
        arbiter.handle_timeout(at);
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                serial += 1;
                granted += 1;
                last_grant = now;
                departures.insert((now + calls[&ticket].send_delay, serial), ticket);
            }
        }
        if let Some(entry) = departures.first_entry().filter(|e| e.key().0 <= now) {
            let ticket = entry.remove();
            let stamp = arbiter.stamp_send_for(ticket, at);
            serial += 1;
            in_transit.insert((now + calls[&ticket].transit, serial), (stamp, ticket));
            continue;
        }
        if let Some(entry) = in_transit.first_entry().filter(|e| e.key().0 <= now) {
            let (stamp, ticket) = entry.remove();
            let call = calls[&ticket];
            let charge = if schedule.charges_reservation {
                call.reserved
            } else {
                call.actual
            };
            let used = provider.used(now);
            if used + charge > provider.limit {
                return Err(format!(
                    "at {now} ms the provider had used {used} of {} and was sent {charge}",
                    provider.limit
                ));
            }
            provider.log.push_back((now, charge));
            serial += 1;
            replies.insert((now + call.latency, serial), (stamp, ticket, used + charge));
            continue;
        }
        if let Some(entry) = replies.first_entry().filter(|e| e.key().0 <= now) {
            let (stamp, ticket, used) = entry.remove();
            // Reconciled to usage, then the provider's count folded, as one step.
            arbiter.hold();
            arbiter
                .commit(ticket, &[calls[&ticket].actual], at)
                .expect("granted");
            arbiter
                .observe_used(0, stamp, used, at)
                .expect("dimension 0");
            arbiter.unhold(at);
            continue;
        }
        if next_arrival.is_some_and(|a| a.0 <= now) {
            let (_, call) = next_arrival.take().expect("checked");
            let ticket = arbiter.reserve(&[call.reserved], at).expect("fits");
            calls.insert(ticket, call);
            next_arrival = arrivals.next();
            continue;
        }
        let next = [
            next_arrival.map(|a| a.0),
            departures.keys().next().map(|k| k.0),
            in_transit.keys().next().map(|k| k.0),
            replies.keys().next().map(|k| k.0),
            arbiter
                .poll_timeout()
                .filter(|t| !t.is_never())
                .map(|t| t.as_nanos().div_ceil(1_000_000)),
        ];
        match next.iter().flatten().min() {
            Some(&t) if t > now => now = t,
            Some(_) => return Err(format!("stuck at {now} ms")),
            None if granted == schedule.calls.len() => return Ok(last_grant),
            None => return Err(format!("{granted} granted, then nothing")),
        }
    }
}

fn guarded_grants_are_never_refused(schedule: Schedule) -> TestResult {
    match play(&schedule) {
        Ok(_) => TestResult::passed(),
        Err(e) => TestResult::error(e),
    }
}

#[test]
fn a_guarded_bucket_is_never_refused_by_a_window_or_a_log() {
    check(
        2_000,
        0x5eed_0010,
        guarded_grants_are_never_refused as fn(Schedule) -> TestResult,
    );
}

/// A sliding log that counts usage, a quarter of each reservation (20 windows' worth of
/// reservations, 5 of usage): the provider's reports let the guard go of what it held
/// beyond them. Only partly: a report cannot vouch for requests that ended after its own
/// left, so the guard lets go of earlier rounds only. Holding reservations takes 19.6 s
/// here; trimming 14.8 s.
#[test]
fn a_provider_counting_usage_is_not_held_to_reservations() {
    let calls = (0..200)
        .map(|i| Call {
            gap: 0,
            reserved: 100,
            actual: 25,
            send_delay: i % 3,
            transit: i % 5,
            latency: 20 + i % 7,
        })
        .collect();
    let schedule = Schedule {
        model: Model::SlidingLog,
        limit: 1_000,
        window_ms: 1_000,
        burst_eighths: 8,
        charges_reservation: false,
        calls,
    };
    let last_grant = play(&schedule).expect("never refused");
    assert!(last_grant < 17_000, "last grant at {last_grant} ms");
}

#[test]
fn a_guard_installed_mid_run_counts_what_is_in_flight() {
    let bucket =
        TokenBucket::new(Rate::per_second(10_000).unwrap(), 10_000, Instant::ZERO).expect("bucket");
    let mut arbiter =
        Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).expect("arbiter");
    let at = Instant::from_millis(1);
    // Six reservations of 100 are in flight when the headers reveal a window of 1,000.
    for _ in 0..6 {
        let ticket = arbiter.reserve(&[100], at).expect("fits");
        arbiter.stamp_send_for(ticket, at);
    }
    let guard = WindowGuard::new(1_000, Duration::from_secs(1)).expect("guard");
    arbiter
        .set_window_guard(0, Some(guard), at)
        .expect("dimension 0");
    // They may still land in the window the guard caps: only 400 more fit.
    let tickets: Vec<Ticket> = (0..10)
        .map(|_| arbiter.reserve(&[100], at).expect("queued or granted"))
        .collect();
    let granted = tickets
        .iter()
        .filter(|t| arbiter.state(**t) == Some(TicketState::Granted))
        .count();
    assert_eq!(granted, 4, "600 in flight + 400 = the window's 1,000");
}

//! In-flight accounting: syncing a bucket to a provider's reported remaining never lets
//! the client's grants exceed what the provider has, on a virtual clock.

mod support;

use std::collections::BTreeMap;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Event, Instant, Rate, SendStamp, Ticket, TokenBucket,
};
use support::check;

const MAX_SEND_DELAY_MS: u64 = 30;

#[derive(Clone, Debug)]
struct Call {
    /// Milliseconds after the previous call arrives.
    gap: u64,
    /// The upper bound reserved.
    reserved: u64,
    /// What the provider charges (at most the reservation).
    actual: u64,
    /// Milliseconds from the grant until the request leaves (the task must be scheduled).
    send_delay: u64,
    /// Milliseconds until the reply comes back.
    latency: u64,
}

#[derive(Clone, Debug)]
struct Schedule {
    capacity: u64,
    per_second: u64,
    /// Whether the provider charges the reservation (as OpenAI counts `max_tokens`) rather
    /// than the actual usage.
    charges_reservation: bool,
    calls: Vec<Call>,
}

impl Arbitrary for Schedule {
    fn arbitrary(g: &mut Gen) -> Schedule {
        let capacity = u64::arbitrary(g) % 2_000 + 300;
        let per_second = u64::arbitrary(g) % 1_000 + 50;
        let n = usize::arbitrary(g) % 150 + 10;
        let calls = (0..n)
            .map(|_| {
                let reserved = u64::arbitrary(g) % 200 + 1;
                Call {
                    gap: u64::arbitrary(g) % 40,
                    reserved,
                    actual: u64::arbitrary(g) % (reserved + 1),
                    send_delay: u64::arbitrary(g) % MAX_SEND_DELAY_MS,
                    latency: u64::arbitrary(g) % 400,
                }
            })
            .collect();
        Schedule {
            capacity,
            per_second,
            charges_reservation: bool::arbitrary(g),
            calls,
        }
    }
}

/// The provider: a bucket that starts full and charges each request on arrival.
struct Provider {
    level: f64,
    capacity: f64,
    per_ms: f64,
    at: u64,
}

impl Provider {
    fn refill(&mut self, now: u64) {
        self.level = (self.level + self.per_ms * (now - self.at) as f64).min(self.capacity);
        self.at = now;
    }
}

/// Replies in flight, by arrival time: (stamp, ticket, remaining reported, actual).
type Replies = BTreeMap<(u64, u64), (SendStamp, Ticket, u64, u64)>;

fn synced_grants_stay_within_the_provider(schedule: Schedule) -> TestResult {
    let rate = Rate::per_second(schedule.per_second).expect("rate");
    // The client's capacity leaves room for what refills while a granted request is on its
    // way (at most 30 ms here): when the provider's bucket is full it cannot absorb that.
    let margin = (schedule.per_second * MAX_SEND_DELAY_MS).div_ceil(1000);
    let bucket = TokenBucket::new(rate, schedule.capacity - margin, Instant::ZERO).expect("bucket");
    let mut arbiter = Arbiter::new(
        vec![bucket],
        ArbiterConfig::default().with_adapt(None),
        Instant::ZERO,
    )
    .expect("arbiter");
    let mut provider = Provider {
        level: schedule.capacity as f64,
        capacity: schedule.capacity as f64,
        per_ms: schedule.per_second as f64 / 1000.0,
        at: 0,
    };
    let mut calls: BTreeMap<Ticket, &Call> = BTreeMap::new();
    let mut replies: Replies = BTreeMap::new();
    let mut arrivals = schedule.calls.iter().scan(0u64, |t, c| {
        *t += c.gap;
        Some((*t, c))
    });
    let mut next_arrival = arrivals.next();
    let mut now = 0u64;
    let mut serial = 0u64;
    // Granted requests waiting to leave, by departure time.
    let mut departures: BTreeMap<(u64, u64), Ticket> = BTreeMap::new();
    loop {
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                serial += 1;
                departures.insert((now + calls[&ticket].send_delay, serial), ticket);
            }
        }
        // Requests leaving now: stamped, and charged by the provider on arrival.
        while let Some((&(at, key), &ticket)) = departures.iter().next() {
            if at > now {
                break;
            }
            departures.remove(&(at, key));
            let call = calls[&ticket];
            let stamp = arbiter.stamp_send_for(ticket);
            provider.refill(now);
            let charge = if schedule.charges_reservation {
                call.reserved
            } else {
                call.actual
            };
            if provider.level + 1e-9 < charge as f64 {
                return TestResult::error(format!(
                    "at {now} ms the provider had {:.3} but was sent {charge}",
                    provider.level
                ));
            }
            provider.level -= charge as f64;
            let remaining = provider.level.max(0.0).floor() as u64;
            serial += 1;
            replies.insert(
                (now + call.latency, serial),
                (stamp, ticket, remaining, call.actual),
            );
        }
        let next_reply = replies.keys().next().map(|k| k.0);
        let next_grant = arbiter
            .poll_timeout()
            .map(|t| t.as_nanos().div_ceil(1_000_000));
        let next_departure = departures.keys().next().map(|k| k.0);
        let candidates = [
            next_arrival.map(|a| a.0),
            next_reply,
            next_departure,
            next_grant,
        ];
        let Some(t) = candidates.iter().flatten().min().copied() else {
            return TestResult::passed();
        };
        now = now.max(t);
        let at = Instant::from_millis(now);
        if next_arrival.is_some_and(|a| a.0 <= now) {
            let (_, call) = next_arrival.take().expect("checked");
            let ticket = arbiter.reserve(&[call.reserved], at).expect("fits");
            calls.insert(ticket, call);
            next_arrival = arrivals.next();
        } else if next_reply.is_some_and(|r| r <= now) {
            let key = *replies.keys().next().expect("checked");
            let (stamp, ticket, remaining, actual) = replies.remove(&key).expect("present");
            arbiter.sync_level(0, stamp, remaining, at);
            arbiter.commit(ticket, &[actual], at).expect("granted");
        } else if next_departure.is_some_and(|d| d <= now) {
            // Handled at the top of the loop.
        } else {
            arbiter.handle_timeout(at);
        }
    }
}

#[test]
fn a_synced_bucket_never_grants_more_than_the_provider_has() {
    check(
        300,
        0x5eed_0008,
        synced_grants_stay_within_the_provider as fn(Schedule) -> TestResult,
    );
}

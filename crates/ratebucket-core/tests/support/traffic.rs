//! Traffic on the virtual clock: calls that arrive, are granted, leave after a scheduling
//! delay, reach a provider in any order and are answered after a latency. The provider's
//! model and what the client does with each reply are the test's; the event loop is here,
//! once.

use std::collections::BTreeMap;

use quickcheck::{Arbitrary, Gen};
use ratebucket_core::{Arbiter, Event, Instant, SendStamp, Ticket};

/// One call of a schedule.
#[derive(Clone, Debug)]
pub struct Call {
    /// Milliseconds after the previous call arrives.
    pub gap: u64,
    /// The upper bound reserved.
    pub reserved: u64,
    /// What it really uses (at most the reservation).
    pub actual: u64,
    /// Milliseconds from the grant until the request leaves (the task must be scheduled).
    pub send_delay: u64,
    /// Milliseconds from leaving until the provider charges it: requests sent close
    /// together reach it in any order (a pool of connections, some still connecting).
    pub transit: u64,
    /// Milliseconds from the charge until the reply is read.
    pub latency: u64,
    /// Whether the reply's headers are read before the reservation is committed (a
    /// stream) or after (a whole body).
    pub fold_first: bool,
}

/// Upper bounds (exclusive) of a generated call's numbers, in ms.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub gap: u64,
    pub send_delay: u64,
    pub transit: u64,
    pub latency: u64,
}

impl Call {
    /// A call with each number drawn below its bound, costing 1 to 200.
    pub fn arbitrary(g: &mut Gen, bounds: Bounds) -> Call {
        let reserved = u64::arbitrary(g) % 200 + 1;
        Call {
            gap: u64::arbitrary(g) % bounds.gap,
            reserved,
            actual: u64::arbitrary(g) % (reserved + 1),
            send_delay: u64::arbitrary(g) % bounds.send_delay,
            transit: u64::arbitrary(g) % bounds.transit,
            latency: u64::arbitrary(g) % bounds.latency,
            fold_first: bool::arbitrary(g),
        }
    }
}

/// A provider on the virtual clock.
pub trait Provider {
    /// Takes `charge` arriving at `now` ms. Returns the number its reply reports (what is
    /// left, or what is used: the model's choice), or why the provider must refuse it.
    fn charge(&mut self, now: u64, charge: u64) -> Result<u64, String>;
}

/// Queued work by (instant in ms, serial): the serial keeps insertion order among equals.
type Agenda<T> = BTreeMap<(u64, u64), T>;

/// Plays `calls` through a one-dimension `arbiter` against `provider`, which is charged
/// the reservation (`charges_reservation`) or the actual use. `reply` ends each call with
/// what its reply reported (commit, fold); with `tells_counted`, the stamp it is given
/// says when the provider counted the request ([`SendStamp::counted_by`], as a reply's
/// processing time tells). Returns when the last call was granted, in ms; fails if the
/// provider refused one, the loop stalls, or a call is never granted.
pub fn play(
    arbiter: &mut Arbiter,
    calls: &[Call],
    charges_reservation: bool,
    tells_counted: bool,
    provider: &mut impl Provider,
    mut reply: impl FnMut(&mut Arbiter, &Call, Ticket, SendStamp, u64, Instant),
) -> Result<u64, String> {
    let mut by_ticket: BTreeMap<Ticket, &Call> = BTreeMap::new();
    let mut arrivals = calls.iter().scan(0u64, |t, c| {
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
                departures.insert((now + by_ticket[&ticket].send_delay, serial), ticket);
            }
        }
        if let Some(entry) = departures.first_entry().filter(|e| e.key().0 <= now) {
            let ticket = entry.remove();
            let stamp = arbiter.stamp_send_if_open(ticket, at).expect("the gate is open");
            serial += 1;
            in_transit.insert((now + by_ticket[&ticket].transit, serial), (stamp, ticket));
            continue;
        }
        if let Some(entry) = in_transit.first_entry().filter(|e| e.key().0 <= now) {
            let (stamp, ticket) = entry.remove();
            let call = by_ticket[&ticket];
            let charge = if charges_reservation { call.reserved } else { call.actual };
            let reported = provider.charge(now, charge).map_err(|e| format!("at {now} ms: {e}"))?;
            serial += 1;
            let stamp =
                if tells_counted { stamp.counted_by(Instant::from_millis(now)) } else { stamp };
            replies.insert((now + call.latency, serial), (stamp, ticket, reported));
            continue;
        }
        if let Some(entry) = replies.first_entry().filter(|e| e.key().0 <= now) {
            let (stamp, ticket, reported) = entry.remove();
            reply(arbiter, by_ticket[&ticket], ticket, stamp, reported, at);
            continue;
        }
        if next_arrival.is_some_and(|a| a.0 <= now) {
            let (_, call) = next_arrival.take().expect("checked");
            let ticket = arbiter.reserve(&[call.reserved], at).expect("fits");
            by_ticket.insert(ticket, call);
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
            None if granted == calls.len() => return Ok(last_grant),
            None => {
                return Err(format!("{granted} of {} granted, then nothing", calls.len()));
            }
        }
    }
}

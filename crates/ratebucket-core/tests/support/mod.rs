//! A virtual-time harness that drives an `Arbiter` the way a runtime adapter would.

#![allow(dead_code, unreachable_pub)]

pub mod traffic;

use std::time::Duration;

use quickcheck::{Gen, QuickCheck, Testable};
use ratebucket_core::{Arbiter, ArbiterConfig, Event, Instant, Rate, Ticket, TokenBucket};

/// Runs a property over `tests` schedules from a fixed seed, so failures reproduce.
pub fn check<A: Testable>(tests: u64, seed: u64, property: A) {
    QuickCheck::new()
        .rng(Gen::from_size_and_seed(64, seed))
        .tests(tests)
        .max_tests(tests * 10)
        .quickcheck(property);
}

/// An arbiter on a virtual clock, with every event it emitted and when.
pub struct Harness {
    pub arbiter: Arbiter,
    pub now: Instant,
    pub log: Vec<(Instant, Event)>,
}

impl Harness {
    pub fn new(buckets: Vec<TokenBucket>, config: ArbiterConfig) -> Harness {
        Harness {
            arbiter: Arbiter::new(buckets, config, Instant::ZERO).expect("valid buckets"),
            now: Instant::ZERO,
            log: Vec::new(),
        }
    }

    /// Two dimensions: (rate per second, capacity) each.
    pub fn two(req: (u64, u64), tok: (u64, u64), config: ArbiterConfig) -> Harness {
        let b = |(rate, cap): (u64, u64)| {
            TokenBucket::new(Rate::per_second(rate).unwrap(), cap, Instant::ZERO).unwrap()
        };
        Harness::new(vec![b(req), b(tok)], config)
    }

    /// Drains events into the log; returns the tickets granted by this drain, with when.
    pub fn drain(&mut self) -> Vec<(Instant, Ticket)> {
        let mut granted = Vec::new();
        while let Some(event) = self.arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                granted.push((self.now, ticket));
            }
            self.log.push((self.now, event));
        }
        granted
    }

    /// Moves the clock to `target`, firing every timeout on the way at its exact instant.
    pub fn advance_to(&mut self, target: Instant) -> Vec<(Instant, Ticket)> {
        let mut granted = self.drain();
        while let Some(at) = self.arbiter.poll_timeout() {
            if at > target || at <= self.now {
                break;
            }
            self.now = at;
            self.arbiter.handle_timeout(at);
            granted.extend(self.drain());
        }
        if target > self.now {
            self.now = target;
        }
        self.arbiter.handle_timeout(self.now);
        granted.extend(self.drain());
        granted
    }

    pub fn advance(&mut self, by: Duration) -> Vec<(Instant, Ticket)> {
        self.advance_to(self.now + by)
    }

    /// Runs the clock until nothing is waiting, committing nothing; returns grants in order
    /// with their instants.
    pub fn run_until_idle(&mut self) -> Vec<(Instant, Ticket)> {
        let mut out = self.drain();
        while let Some(at) = self.arbiter.poll_timeout() {
            self.now = self.now.max(at);
            self.arbiter.handle_timeout(self.now);
            out.extend(self.drain());
            if self.arbiter.status().queued == 0 {
                break;
            }
        }
        out
    }

    pub fn granted(&self) -> Vec<Ticket> {
        self.log
            .iter()
            .filter_map(|(_, e)| match e {
                Event::Granted { ticket, .. } => Some(*ticket),
                _ => None,
            })
            .collect()
    }
}

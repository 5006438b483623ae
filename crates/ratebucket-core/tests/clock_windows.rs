//! Fixed windows without a reset, supposed aligned to the wall clock: confirmed when they
//! are, refuted at the cost of one probe when they are not, on the virtual clock.

use std::time::Duration;

use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Instant, Limit, QuotaPolicy, QuotaReport, Reply, Report,
    SendStamp, Settle, Ticket, TicketState,
};

const WINDOW: Duration = Duration::from_secs(1);
const LATENCY: Duration = Duration::from_millis(20);
const LIMIT: u64 = 100;
/// Where the wall clock stands at `Instant::ZERO`: 7 s and 250 ms past a whole second.
const CLOCK_AT_ZERO: Duration = Duration::from_millis(1_700_000_007_250);

/// A provider counting `LIMIT` per fixed window of its own, its windows turning `phase`
/// after the wall clock's (zero: aligned to the clock). It answers with its limit and
/// remaining but no reset, and a 429 hints a whole window.
struct Provider {
    phase: Duration,
    index: u64,
    used: u64,
    throttled: Vec<Instant>,
}

impl Provider {
    /// Takes one request at `at`: its remaining after it, or `None` (a 429).
    fn take(&mut self, at: Instant) -> Option<u64> {
        let clock = wall(at).as_nanos() - self.phase.as_nanos();
        let index = (clock / WINDOW.as_nanos()) as u64;
        if index != self.index {
            self.index = index;
            self.used = 0;
        }
        if self.used == LIMIT {
            self.throttled.push(at);
            return None;
        }
        self.used += 1;
        Some(LIMIT - self.used)
    }
}

/// What the wall clock reads at `at`.
fn wall(at: Instant) -> Duration {
    CLOCK_AT_ZERO + Duration::from_nanos(at.as_nanos())
}

struct Run {
    /// When the last reply came.
    last: Instant,
    /// When the provider refused, at its own clock.
    throttled: Vec<Instant>,
    /// When the gate was closed by a throttle, if ever.
    paused: bool,
}

/// `requests` of one unit queued at `start` against a provider whose windows turn `phase`
/// after the clock's, with replies that say what the clock read (`clock`) or not.
fn run(start: Instant, requests: usize, phase: Duration, clock: bool) -> Run {
    let bucket = Limit::per(LIMIT, WINDOW).bucket(start).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), start).unwrap();
    arbiter.change(0, Change::Policy(QuotaPolicy::known(LIMIT, WINDOW)), start).unwrap();
    let mut provider = Provider { phase, index: u64::MAX, used: 0, throttled: Vec::new() };
    let mut waiting: Vec<Ticket> =
        (0..requests).map(|_| arbiter.reserve(&[1], start).unwrap()).collect();
    let mut replies: Vec<(Instant, Ticket, SendStamp, Option<u64>)> = Vec::new();
    let (mut now, mut last, mut paused) = (start, start, false);
    for step in 0.. {
        assert!(step < 100_000, "stuck at {now:?}: {} waiting", waiting.len());
        while arbiter.poll_event().is_some() {}
        // Whatever was granted (on arrival or since) is sent.
        for &ticket in &waiting {
            let in_flight = replies.iter().any(|r| r.1 == ticket);
            if !in_flight && arbiter.state(ticket) == Some(TicketState::Granted) {
                let sent = arbiter.stamp_send_if_open(ticket, now).expect("gate open");
                let remaining = provider.take(now + LATENCY / 2);
                replies.push((now + LATENCY, ticket, sent, remaining));
            }
        }
        if waiting.is_empty() && replies.is_empty() {
            break;
        }
        replies.sort_by_key(|r| std::cmp::Reverse(r.0));
        let next = [replies.last().map(|r| r.0), arbiter.poll_timeout()]
            .into_iter()
            .flatten()
            .min()
            .expect("something is pending");
        now = next.max(now);
        arbiter.handle_timeout(now);
        while replies.last().is_some_and(|r| r.0 <= now) {
            let (at, ticket, sent, remaining) = replies.pop().unwrap();
            let reports = [Report {
                dimension: 0,
                quota: QuotaReport {
                    limit: Some(LIMIT),
                    remaining: Some(remaining.unwrap_or(0)),
                    clock: clock.then(|| wall(at)),
                    ..QuotaReport::default()
                },
            }];
            let settle = match remaining {
                Some(_) => Settle::Charge(&[1]),
                None => Settle::Throttled { retry_after: Some(WINDOW) },
            };
            let replied = arbiter.reply(ticket, &Reply { sent, settle, reports: &reports }, at);
            paused |= replied.throttle.is_some();
            if remaining.is_some() {
                waiting.retain(|&t| t != ticket);
            } else {
                // Refused: asked for again.
                waiting.retain(|&t| t != ticket);
                waiting.push(arbiter.reserve(&[1], at).unwrap());
            }
            last = at;
        }
    }
    Run { last, throttled: provider.throttled, paused }
}

/// A batch of four windows' worth started 400 ms into a window of the clock's.
const START: Instant = Instant::from_millis(10_150);

/// What a client that knows where the provider's windows turn needs: the rest of the
/// first window, then three windows from the next edge on, and the last answer.
fn bound(phase: Duration) -> Duration {
    let into = (wall(START).as_nanos() - phase.as_nanos()) % WINDOW.as_nanos();
    let to_edge = WINDOW - Duration::from_nanos(into as u64);
    to_edge + WINDOW * 2 + LATENCY
}

#[test]
fn windows_aligned_to_the_clock_are_spent_from_each_opening() {
    let run = run(START, 400, Duration::ZERO, true);
    assert!(run.throttled.is_empty(), "refused at {:?}", run.throttled);
    let makespan = run.last.saturating_duration_since(START);
    let ratio = makespan.as_secs_f64() / bound(Duration::ZERO).as_secs_f64();
    assert!(ratio <= 1.05, "{makespan:?}: {ratio:.3}x the bound");
}

#[test]
fn without_the_clock_the_same_windows_wait_a_trailing_window() {
    // What the supposition buys: counted blind, each window's spend waits until the
    // previous one is a window old.
    let run = run(START, 400, Duration::ZERO, false);
    assert!(run.throttled.is_empty(), "refused at {:?}", run.throttled);
    let makespan = run.last.saturating_duration_since(START);
    assert!(makespan >= WINDOW * 3, "{makespan:?}");
}

#[test]
fn windows_not_aligned_to_the_clock_cost_one_probe_and_no_pause() {
    // The provider's windows turn 300 ms after the clock's: the supposed edge comes first,
    // and its probe is refused.
    for phase in [300u64, 550, 900] {
        let phase = Duration::from_millis(phase);
        let run = run(START, 400, phase, true);
        assert!(run.throttled.len() <= 1, "phase {phase:?}: refused at {:?}", run.throttled);
        assert!(!run.paused, "phase {phase:?}: a probe's refusal paused the pool");
        // No slower than counting blind, but for the probe's round trip.
        let makespan = run.last.saturating_duration_since(START);
        let blind = self::run(START, 400, phase, false).last.saturating_duration_since(START);
        assert!(
            makespan <= blind + LATENCY * 2,
            "phase {phase:?}: {makespan:?}, counted blind {blind:?}"
        );
    }
}

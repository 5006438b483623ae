//! The window guard against fixed-window and sliding-log providers, on a virtual clock:
//! whatever the bucket's burst, the client never sends what the provider must refuse, even
//! when it reconciles to usage while the provider counts the reservation.

mod support;

use std::collections::VecDeque;
use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Instant, QuotaReport, Rate, Reply, Report, Settle, Ticket,
    TicketState, TokenBucket, WindowGuard,
};
use support::check;
use support::traffic::{self, Bounds, Call, Provider};

#[derive(Clone, Copy, Debug)]
enum Model {
    FixedWindow,
    SlidingLog,
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
        let bounds = Bounds { gap: 30, send_delay: 20, transit: 15, latency: 300 };
        let calls = (0..n).map(|_| Call::arbitrary(g, bounds)).collect();
        Schedule {
            model: if bool::arbitrary(g) { Model::FixedWindow } else { Model::SlidingLog },
            limit,
            window_ms: u64::arbitrary(g) % 2_000 + 200,
            burst_eighths: u64::arbitrary(g) % 8 + 1,
            charges_reservation: bool::arbitrary(g),
            calls,
        }
    }
}

/// The provider's count: a fixed window restarting every `window` ms, or a log of charges
/// each forgotten `window` ms after it was made. Its replies report what is used.
struct Window {
    model: Model,
    limit: u64,
    window: u64,
    log: VecDeque<(u64, u64)>,
}

impl Window {
    fn used(&mut self, now: u64) -> u64 {
        match self.model {
            Model::FixedWindow => {
                let start = now / self.window * self.window;
                self.log.retain(|&(at, _)| at >= start);
            }
            Model::SlidingLog => {
                while self.log.front().is_some_and(|&(at, _)| at + self.window <= now) {
                    self.log.pop_front();
                }
            }
        }
        self.log.iter().map(|&(_, amount)| amount).sum()
    }
}

impl Provider for Window {
    fn charge(&mut self, now: u64, charge: u64) -> Result<u64, String> {
        let used = self.used(now);
        if used + charge > self.limit {
            return Err(format!(
                "the provider had used {used} of {} and was sent {charge}",
                self.limit
            ));
        }
        self.log.push_back((now, charge));
        Ok(used + charge)
    }
}

/// Plays `schedule`; returns when the last reservation was granted, in ms, or how the
/// provider had to refuse one.
fn play(schedule: &Schedule) -> Result<u64, String> {
    let window = Duration::from_millis(schedule.window_ms);
    let rate = Rate::new(schedule.limit, window).expect("rate");
    let capacity = (schedule.limit * schedule.burst_eighths / 8).max(200);
    let bucket = TokenBucket::new(rate, capacity, Instant::ZERO).expect("bucket");
    let mut arbiter =
        Arbiter::new(vec![bucket], ArbiterConfig::default().with_adapt(None), Instant::ZERO)
            .expect("arbiter");
    let guard = WindowGuard::new(schedule.limit, window).expect("guard");
    arbiter.change(0, Change::WindowGuard(Some(guard)), Instant::ZERO).expect("dimension 0");
    let mut provider = Window {
        model: schedule.model,
        limit: schedule.limit,
        window: schedule.window_ms,
        log: VecDeque::new(),
    };
    traffic::play(
        &mut arbiter,
        &schedule.calls,
        schedule.charges_reservation,
        false,
        &mut provider,
        |arbiter, call, ticket, stamp, used, at| {
            // Reconciled to usage and the provider's count folded: one reply.
            let reports = [Report {
                dimension: 0,
                quota: QuotaReport {
                    limit: Some(schedule.limit),
                    remaining: Some(schedule.limit.saturating_sub(used)),
                    ..QuotaReport::default()
                },
            }];
            let reply =
                Reply { sent: stamp, settle: Settle::Charge(&[call.actual]), reports: &reports };
            let replied = arbiter.reply(ticket, &reply, at);
            replied.settled.expect("granted");
            assert_eq!(replied.bad_report, None);
        },
    )
}

fn guarded_grants_are_never_refused(schedule: Schedule) -> TestResult {
    match play(&schedule) {
        Ok(_) => TestResult::passed(),
        Err(e) => TestResult::error(e),
    }
}

#[test]
fn a_guarded_bucket_is_never_refused_by_a_window_or_a_log() {
    check(2_000, 0x5eed_0010, guarded_grants_are_never_refused as fn(Schedule) -> TestResult);
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
            fold_first: false,
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
        arbiter.stamp_send_if_open(ticket, at).expect("the gate is open");
    }
    let guard = WindowGuard::new(1_000, Duration::from_secs(1)).expect("guard");
    arbiter.change(0, Change::WindowGuard(Some(guard)), at).expect("dimension 0");
    // They may still land in the window the guard caps: only 400 more fit.
    let tickets: Vec<Ticket> =
        (0..10).map(|_| arbiter.reserve(&[100], at).expect("queued or granted")).collect();
    let granted =
        tickets.iter().filter(|t| arbiter.state(**t) == Some(TicketState::Granted)).count();
    assert_eq!(granted, 4, "600 in flight + 400 = the window's 1,000");
}

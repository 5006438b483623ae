//! Learning the provider from its reports (`Arbiter::observe_quota`), on the virtual clock.

mod support;

use std::time::Duration;

use quickcheck::{Arbitrary, Gen};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Instant, Limit, ProviderModel, QuotaPolicy, QuotaReport, Rate,
    ReserveError, TicketState, TokenBucket,
};

const WINDOW: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

/// One dimension built from `limit` per minute (or the cautious start of an unknown one:
/// one per second, one at a time), learning under the matching policy.
fn learning(limit: Option<u64>) -> Arbiter {
    let (bucket, policy) = match limit {
        Some(limit) => (
            Limit::per(limit, WINDOW).bucket(Instant::ZERO).unwrap(),
            QuotaPolicy::known(limit, WINDOW),
        ),
        None => (Limit::per_second(1).bucket(Instant::ZERO).unwrap(), QuotaPolicy::unknown(WINDOW)),
    };
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).unwrap();
    arbiter.change(0, Change::Policy(policy), Instant::ZERO).unwrap();
    arbiter
}

/// Reserves one unit and stamps its send at `at`; returns the stamp.
fn send_one(arbiter: &mut Arbiter, at: Instant) -> ratebucket_core::SendStamp {
    let ticket = arbiter.reserve(&[1], at).unwrap();
    assert_eq!(arbiter.state(ticket), Some(TicketState::Granted));
    let sent = arbiter.stamp_send_if_open(ticket, at).expect("the gate is open");
    arbiter.commit(ticket, &[1], at).unwrap();
    sent
}

fn report(limit: u64, remaining: u64, reset: Duration) -> QuotaReport {
    QuotaReport {
        limit: Some(limit),
        remaining: Some(remaining),
        reset: Some(reset),
        window: None,
        ..QuotaReport::default()
    }
}

/// How many one-unit reservations are granted on arrival at `at`.
fn granted_at_once(arbiter: &mut Arbiter, at: Instant, most: usize) -> usize {
    let tickets: Vec<_> = (0..most).map(|_| arbiter.reserve(&[1], at).unwrap()).collect();
    tickets.iter().filter(|&&t| arbiter.state(t) == Some(TicketState::Granted)).count()
}

#[test]
fn an_unknown_limit_is_adopted_with_the_burst_the_provider_offers() {
    let mut arbiter = learning(None);
    let sent = send_one(&mut arbiter, ms(0));
    let learned = arbiter
        .observe_quota(0, sent, report(600, 599, Duration::from_millis(100)), ms(50))
        .unwrap()
        .expect("a policy was given");
    assert_eq!(learned.limit, Some(600));
    assert_eq!(arbiter.dimension(0, Instant::ZERO).unwrap().rate, Rate::per_minute(600).unwrap());
    // The provider had 599 left: the conservative burst (a sixth, 100) is there at once,
    // not after the cautious start's empty bucket refills.
    let burst = granted_at_once(&mut arbiter, ms(50), 200);
    assert_eq!(burst, 100, "the adopted limit's burst is taken at once");
}

#[test]
fn a_configured_limit_is_lowered_by_a_smaller_report_and_never_raised() {
    let mut arbiter = learning(Some(600));
    let sent = send_one(&mut arbiter, ms(0));
    let learned = arbiter
        .observe_quota(0, sent, report(1_200, 1_199, Duration::ZERO), ms(10))
        .unwrap()
        .unwrap();
    assert_eq!(learned.limit, Some(600), "never above the configuration");
    assert_eq!(arbiter.dimension(0, Instant::ZERO).unwrap().rate, Rate::per_minute(600).unwrap());
    let sent = send_one(&mut arbiter, ms(20));
    let learned = arbiter
        .observe_quota(0, sent, report(300, 290, Duration::from_secs(2)), ms(30))
        .unwrap()
        .unwrap();
    assert_eq!(learned.limit, Some(300));
    let bucket = arbiter.dimension(0, Instant::ZERO).unwrap();
    assert_eq!(bucket.rate, Rate::per_minute(300).unwrap());
    assert_eq!(bucket.capacity, 50, "a sixth of the lowered limit");
}

/// Against a continuous bucket of 100 per second whose replies take 20 ms, and a request
/// sent 5 ms after its grant, the burst lent is all of it but 25 ms of refill (97), not
/// 100 ms of it (90): the provider counts a request before it answers, so a request
/// cannot take longer than that to reach it.
#[test]
fn the_burst_lent_leaves_out_only_a_replys_time_of_refill() {
    let second = Duration::from_secs(1);
    let bucket = Limit::per(100, second).bucket(Instant::ZERO).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).unwrap();
    arbiter.change(0, Change::Policy(QuotaPolicy::known(100, second)), Instant::ZERO).unwrap();
    // One reservation granted at once and sent 5 ms later.
    let ticket = arbiter.reserve(&[1], ms(0)).unwrap();
    arbiter.stamp_send_if_open(ticket, ms(5)).expect("the gate is open");
    arbiter.commit(ticket, &[1], ms(6)).unwrap();
    // The provider refills one unit every 10 ms; three requests leave every 10 ms.
    let mut level = 100.0f64;
    let mut replies = std::collections::VecDeque::new();
    for step in 1..30u64 {
        let at = ms(step * 10);
        while let Some(&(due, sent, remaining, reset)) = replies.front()
            && due <= at
        {
            arbiter.observe_quota(0, sent, report(100, remaining, reset), due).unwrap();
            replies.pop_front();
        }
        level = (level + 1.0).min(100.0) - if step == 1 { 1.0 } else { 0.0 };
        for _ in 0..3 {
            let sent = arbiter.stamp_send(at);
            level -= 1.0;
            let reset = Duration::from_secs_f64((100.0 - level) / 100.0);
            replies.push_back((at + Duration::from_millis(20), sent, level as u64, reset));
        }
    }
    for (due, sent, remaining, reset) in replies {
        arbiter.observe_quota(0, sent, report(100, remaining, reset), due).unwrap();
    }
    let learned = arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).unwrap();
    assert!(learned.provider_burst, "{learned:?}");
    assert_eq!(arbiter.dimension(0, Instant::ZERO).unwrap().capacity, 97);
}

/// A report of `limit` per `window` (IETF `RateLimit-Policy`'s `w`) from a bucket.
fn over(window: Duration, limit: u64, remaining: u64) -> QuotaReport {
    let reset = window * u32::try_from(limit - remaining).unwrap() / u32::try_from(limit).unwrap();
    QuotaReport { window: Some(window), ..report(limit, remaining, reset) }
}

/// Without a configured limit, the provider's own window replaces the policy's: 40 per
/// 2 s is that, not 40 per minute (30 times too slow).
#[test]
fn the_window_a_provider_reports_replaces_the_policy_window() {
    let mut arbiter = learning(None);
    let sent = send_one(&mut arbiter, ms(0));
    let two = Duration::from_secs(2);
    let learned = arbiter.observe_quota(0, sent, over(two, 40, 39), ms(10)).unwrap().unwrap();
    assert_eq!((learned.limit, learned.window), (Some(40), two));
    let bucket = arbiter.dimension(0, Instant::ZERO).unwrap();
    assert_eq!(bucket.rate, Rate::new(40, two).unwrap());
    assert_eq!(bucket.capacity, 7, "a sixth of 40");
    // Reports over that window from then on learn as usual: idempotent here.
    let sent = send_one(&mut arbiter, ms(20));
    let learned = arbiter.observe_quota(0, sent, over(two, 40, 38), ms(30)).unwrap().unwrap();
    assert_eq!((learned.limit, learned.window), (Some(40), two));
}

/// Under a configured 100 per minute, a provider allowing 10 per second (600 a minute)
/// is looser: the configured limit and window stay (the reported 10 is not taken for 10 a
/// minute), but no burst exceeds the provider's 10 in its one-second window. A provider
/// allowing 1 per second (60 a minute) is stricter: its limit and window are adopted.
#[test]
fn a_configured_limit_is_compared_with_a_reported_one_as_a_rate() {
    let mut arbiter = learning(Some(100));
    let second = Duration::from_secs(1);
    let sent = send_one(&mut arbiter, ms(0));
    let learned = arbiter.observe_quota(0, sent, over(second, 10, 9), ms(10)).unwrap().unwrap();
    assert_eq!((learned.limit, learned.window), (Some(100), WINDOW));
    let bucket = arbiter.dimension(0, Instant::ZERO).unwrap();
    assert_eq!(bucket.rate, Rate::per_minute(100).unwrap());
    assert_eq!(bucket.capacity, 10, "a sixth of 100 (17), cut to the provider's 10");

    let sent = send_one(&mut arbiter, ms(20));
    let learned = arbiter.observe_quota(0, sent, over(second, 1, 0), ms(30)).unwrap().unwrap();
    assert_eq!((learned.limit, learned.window), (Some(1), second));
    assert_eq!(arbiter.dimension(0, Instant::ZERO).unwrap().rate, Rate::per_second(1).unwrap());
    // Its own ceiling from then on: a larger limit over that window is not adopted.
    let sent = send_one(&mut arbiter, ms(1_100));
    let learned = arbiter.observe_quota(0, sent, over(second, 5, 4), ms(1_110)).unwrap().unwrap();
    assert_eq!((learned.limit, learned.window), (Some(1), second));
}

/// A provider with two policies reports whichever has less left: a minute's 100 and an
/// hour's 1,000, in turn. The minute's is the pace; the hour's, a longer window, is a
/// budget whose `remaining` only bounds the level. Neither starts the learning over.
#[test]
fn of_two_policies_reported_in_turn_the_shorter_window_paces_and_the_longer_bounds() {
    let mut arbiter = learning(None);
    let (minute, hour) = (WINDOW, Duration::from_secs(3_600));
    for i in 0..6u64 {
        let sent = send_one(&mut arbiter, ms(i * 100));
        let report = if i % 2 == 0 { over(minute, 100, 90) } else { over(hour, 1_000, 950) };
        arbiter.observe_quota(0, sent, report, ms(i * 100 + 10)).unwrap();
    }
    let learned = arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).unwrap();
    assert_eq!((learned.limit, learned.window), (Some(100), minute));
    let bucket = arbiter.dimension(0, Instant::ZERO).unwrap();
    assert_eq!(bucket.rate, Rate::per_minute(100).unwrap());
    assert_eq!(bucket.capacity, 17, "a sixth of 100");
    // The hour's budget says 3 are left: the level is read down to it.
    let sent = send_one(&mut arbiter, ms(700));
    arbiter.observe_quota(0, sent, over(hour, 1_000, 3), ms(710)).unwrap();
    assert!(arbiter.dimension(0, ms(710)).map(|d| d.level).unwrap() <= 3.0);
    // A window beyond a day is never learned.
    let mut arbiter = learning(None);
    let sent = send_one(&mut arbiter, ms(0));
    let learned = arbiter
        .observe_quota(0, sent, over(Duration::from_secs(864_000), 10, 9), ms(10))
        .unwrap()
        .unwrap();
    assert_eq!(learned.window, WINDOW);
}

/// A provider bucket of `limit` per minute that refills continuously, drained by one
/// request every `gap`: its reports, in order.
fn continuous_reports(limit: u64, gap: Duration, n: u64) -> Vec<(Instant, QuotaReport)> {
    let rate = limit as f64 / WINDOW.as_secs_f64();
    let mut level = limit as f64;
    (0..n)
        .map(|i| {
            if i > 0 {
                level = (level + rate * gap.as_secs_f64()).min(limit as f64);
            }
            level -= 1.0;
            let remaining = level.floor() as u64;
            let reset = Duration::from_secs_f64((limit as f64 - level) / rate);
            (Instant::ZERO + gap * u32::try_from(i).unwrap(), report(limit, remaining, reset))
        })
        .collect()
}

#[test]
fn a_continuous_provider_lends_its_whole_burst_and_a_windowed_one_gets_a_guard() {
    let mut arbiter = learning(Some(600));
    let mut last = None;
    for (at, report) in continuous_reports(600, Duration::from_millis(20), 40) {
        let sent = send_one(&mut arbiter, at);
        last = arbiter.observe_quota(0, sent, report, at).unwrap();
    }
    let learned = last.unwrap();
    assert_eq!(learned.model, ProviderModel::Bucket { limit: 600 });
    assert!(learned.provider_burst, "{learned:?}");
    assert!(!learned.guarded);
    let capacity = arbiter.dimension(0, Instant::ZERO).unwrap().capacity;
    assert!(capacity > 500, "the provider's burst is lent: {capacity}");

    // Then the provider counts in a fixed window: its reset falls with time while its
    // remaining falls too, which no bucket does.
    let start = 800u64;
    let mut learned = learned;
    for i in 0..10u64 {
        let at = ms(start + 100 * i);
        let sent = send_one(&mut arbiter, at);
        let reset = Duration::from_millis(30_000 - 100 * i);
        let remaining = 400 - 10 * i;
        learned =
            arbiter.observe_quota(0, sent, report(600, remaining, reset), at).unwrap().unwrap();
    }
    assert_eq!(learned.model, ProviderModel::Window);
    assert!(!learned.provider_burst, "{learned:?}");
    assert!(learned.guarded, "each trailing window is capped");
    assert_eq!(arbiter.dimension(0, Instant::ZERO).unwrap().capacity, 100, "back to a sixth");
    assert_eq!(
        arbiter.dimension(0, Instant::ZERO).and_then(|d| d.window_limit),
        Some((600, WINDOW))
    );
}

#[test]
fn without_a_policy_a_report_only_lowers_the_level() {
    let bucket = Limit::per(600, WINDOW).bucket(Instant::ZERO).unwrap();
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), Instant::ZERO).unwrap();
    let sent = send_one(&mut arbiter, ms(0));
    let learned = arbiter.observe_quota(0, sent, report(60, 10, Duration::ZERO), ms(10)).unwrap();
    assert_eq!(learned, None);
    assert_eq!(arbiter.dimension(0, Instant::ZERO).unwrap().rate, Rate::per_minute(600).unwrap());
    assert!(arbiter.dimension(0, ms(10)).map(|d| d.level).unwrap() <= 10.0);
    assert!(arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).is_none());
}

#[test]
fn a_policy_given_again_keeps_what_was_learned_and_bad_ones_are_refused() {
    let mut arbiter = learning(None);
    let sent = send_one(&mut arbiter, ms(0));
    arbiter.observe_quota(0, sent, report(600, 599, Duration::ZERO), ms(10)).unwrap();
    arbiter.change(0, Change::Policy(QuotaPolicy::unknown(WINDOW)), ms(20)).unwrap();
    assert_eq!(
        arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).unwrap().limit,
        Some(600)
    );
    assert!(
        arbiter.change(0, Change::Policy(QuotaPolicy::unknown(Duration::ZERO)), ms(20)).is_err()
    );
    assert!(arbiter.change(0, Change::Policy(QuotaPolicy::known(0, WINDOW)), ms(20)).is_err());
    assert!(arbiter.change(1, Change::Policy(QuotaPolicy::unknown(WINDOW)), ms(20)).is_err());
    assert!(arbiter.observe_quota(1, sent, QuotaReport::default(), ms(20)).is_err());
}

/// Any report a provider (or a proxy's garbage) might send.
#[derive(Clone, Debug)]
struct AnyReport {
    limit: Option<u64>,
    remaining: Option<u64>,
    reset: Option<Duration>,
    window: Option<Duration>,
    after: Duration,
}

fn extreme(g: &mut Gen) -> u64 {
    *g.choose(&[0, 1, 2, 59, 600, 601, 1 << 40, 1 << 53, (1 << 53) + 1, u64::MAX]).unwrap()
}

impl Arbitrary for AnyReport {
    fn arbitrary(g: &mut Gen) -> AnyReport {
        let number = |g: &mut Gen| {
            if bool::arbitrary(g) { extreme(g) } else { u64::arbitrary(g) % 2_000 }
        };
        AnyReport {
            limit: Option::<()>::arbitrary(g).map(|()| number(g)),
            remaining: Option::<()>::arbitrary(g).map(|()| number(g)),
            reset: Option::<()>::arbitrary(g)
                .map(|()| Duration::from_millis(number(g) % (1 << 40))),
            window: Option::<()>::arbitrary(g).map(|()| {
                Duration::from_millis(
                    *g.choose(&[0, 1, 1_000, 2_000, 60_000, 3_600_000, 86_400_000, 1 << 40])
                        .unwrap(),
                )
            }),
            after: Duration::from_millis(u64::arbitrary(g) % 5_000),
        }
    }
}

#[test]
fn no_report_raises_a_configured_limit_or_wedges_the_dimension() {
    fn property(reports: Vec<AnyReport>, configured: bool) -> bool {
        let mut arbiter = learning(configured.then_some(600));
        let mut now = Instant::ZERO;
        for r in &reports {
            now = now + r.after;
            let ticket = match arbiter.reserve(&[1], now) {
                Ok(ticket) => ticket,
                // A longer quota reported spent refuses until it resets: a day at most.
                Err(ReserveError::QuotaSpent { resets_in: Some(resets_in), .. }) => {
                    assert!(resets_in <= DAY, "spent for {resets_in:?}");
                    continue;
                }
                Err(e) => panic!("{e}"),
            };
            let sent = arbiter.stamp_send_if_open(ticket, now).expect("the gate is open");
            let report = QuotaReport {
                limit: r.limit,
                remaining: r.remaining,
                reset: r.reset,
                window: r.window,
                ..QuotaReport::default()
            };
            arbiter.observe_quota(0, sent, report, now).unwrap();
            arbiter.cancel(ticket, now);
            if configured {
                // 600 a minute, over whatever window the limit is learned.
                let learned = arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).unwrap();
                let limit = learned.limit.unwrap() as f64 / learned.window.as_secs_f64();
                assert!(limit <= 10.0, "raised to {learned:?}");
                let rate = arbiter.dimension(0, Instant::ZERO).unwrap().rate.per_second_f64();
                assert!(rate <= 10.0, "rate raised to {rate}/s");
            }
        }
        let window =
            arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).unwrap().window.max(WINDOW);
        // Whatever was said, one more unit is granted within a few windows (after a
        // longer quota's reset, a day at most, if one was reported spent).
        let (ticket, window) = match arbiter.reserve(&[1], now) {
            Ok(ticket) => (ticket, window),
            Err(ReserveError::QuotaSpent { resets_in: Some(resets_in), .. }) => {
                (arbiter.reserve_within(&[1], Some(DAY), now).unwrap(), window * 3 + resets_in)
            }
            Err(e) => panic!("{e}"),
        };
        let mut at = now;
        while arbiter.state(ticket) == Some(TicketState::Queued) {
            let Some(next) = arbiter.poll_timeout() else {
                break;
            };
            at = next.max(at);
            arbiter.handle_timeout(at);
        }
        let waited = at.saturating_duration_since(now);
        arbiter.state(ticket) == Some(TicketState::Granted) && waited <= window * 3
    }
    support::check(300, 19, property as fn(Vec<AnyReport>, bool) -> bool);
}

#[test]
fn the_learned_model_shows_in_the_snapshot() {
    let mut arbiter = learning(None);
    let sent = send_one(&mut arbiter, ms(0));
    arbiter.observe_quota(0, sent, report(120, 100, Duration::ZERO), ms(10)).unwrap();
    let snapshot = arbiter.snapshot(ms(10));
    let learned = snapshot.dimensions[0].learned.expect("learning");
    assert_eq!(learned.limit, Some(120));
    let unlearning = Arbiter::new(
        vec![TokenBucket::per_second(10, Instant::ZERO).unwrap()],
        ArbiterConfig::default(),
        Instant::ZERO,
    )
    .unwrap();
    assert_eq!(unlearning.snapshot(ms(0)).dimensions[0].learned, None);
}

/// How the test provider counts its 100 per `WINDOW_FIXED`.
#[derive(Clone, Copy, Debug)]
enum Counting {
    /// Fixed windows beginning at this phase (and whole windows from it).
    Fixed(Duration),
    /// Any trailing window.
    Sliding,
    /// A bucket of 100 that starts full and refills continuously.
    Bucket,
}

/// A provider counting 100 per window of `WINDOW_FIXED` as `counting` says, answering
/// `LATENCY` after each send with its limit and remaining but no reset.
struct FixedProvider {
    counting: Counting,
    index: i64,
    used: u64,
    log: std::collections::VecDeque<Instant>,
    /// The bucket's level and when it was last brought up to date.
    level: (f64, Instant),
    throttled: usize,
}

const WINDOW_FIXED: Duration = Duration::from_secs(1);
const LATENCY: Duration = Duration::from_millis(20);
const FIXED_LIMIT: u64 = 100;

impl FixedProvider {
    fn new(counting: Counting) -> FixedProvider {
        FixedProvider {
            counting,
            index: i64::MIN,
            used: 0,
            log: std::collections::VecDeque::new(),
            level: (FIXED_LIMIT as f64, Instant::ZERO),
            throttled: 0,
        }
    }

    /// Takes one request at `at`: its remaining after it, or `None` (a 429).
    fn take(&mut self, at: Instant) -> Option<u64> {
        match self.counting {
            Counting::Fixed(phase) => {
                let since = at.as_nanos() as i64 - phase.as_nanos() as i64;
                let index = since.div_euclid(WINDOW_FIXED.as_nanos() as i64);
                if index != self.index {
                    self.index = index;
                    self.used = 0;
                }
            }
            Counting::Sliding => {
                while self.log.front().is_some_and(|&t| t + WINDOW_FIXED <= at) {
                    self.log.pop_front();
                }
                self.used = self.log.len() as u64;
            }
            Counting::Bucket => {
                let (level, then) = self.level;
                let refill = at.saturating_duration_since(then).as_secs_f64() * FIXED_LIMIT as f64;
                let level = (level + refill).min(FIXED_LIMIT as f64);
                self.level = (level, at);
                if level < 1.0 {
                    self.throttled += 1;
                    return None;
                }
                self.level.0 -= 1.0;
                return Some(self.level.0.floor() as u64);
            }
        }
        if self.used == FIXED_LIMIT {
            self.throttled += 1;
            return None;
        }
        self.used += 1;
        self.log.push_back(at);
        Some(FIXED_LIMIT - self.used)
    }
}

/// What a run against the fixed-window provider did.
struct BlindRun {
    arbiter: Arbiter,
    /// When each request was granted, in arrival order.
    granted: Vec<Instant>,
    /// When the last reply came.
    last: Instant,
    throttled: usize,
    /// Whether a window's edge was ever taken as found.
    edge_ever: bool,
}

/// Queues one request of cost 1 at each of `arrivals` (sorted) against the provider of
/// `phase`, and runs until every one is answered.
fn run_blind(arrivals: &[Instant], counting: Counting, limit: Option<u64>) -> BlindRun {
    type Reply = (Instant, usize, ratebucket_core::SendStamp, Option<u64>);
    let window = WINDOW_FIXED;
    let start = arrivals[0];
    let (bucket, policy) = match limit {
        Some(l) => (Limit::per(l, window).bucket(start).unwrap(), QuotaPolicy::known(l, window)),
        None => (Limit::per_second(1).bucket(start).unwrap(), QuotaPolicy::unknown(window)),
    };
    let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), start).unwrap();
    arbiter.change(0, Change::Policy(policy), start).unwrap();
    let mut provider = FixedProvider::new(counting);
    let mut tickets = Vec::new();
    let mut granted = vec![None; arrivals.len()];
    let mut replies: Vec<Reply> = Vec::new();
    let mut now = start;
    let mut done = 0;
    let mut last = start;
    let mut edge_ever = false;
    loop {
        while tickets.len() < arrivals.len() && arrivals[tickets.len()] <= now {
            tickets.push(arbiter.reserve(&[1], now).unwrap());
        }
        while let Some(event) = arbiter.poll_event() {
            if let ratebucket_core::Event::Granted { ticket, .. } = event {
                let i = tickets.iter().position(|&t| t == ticket).unwrap();
                granted[i] = Some(now);
                let sent = arbiter.stamp_send_if_open(ticket, now).expect("the gate is open");
                let remaining = provider.take(now + LATENCY / 2);
                replies.push((now + LATENCY, i, sent, remaining));
            }
        }
        if done == arrivals.len() {
            break;
        }
        // Replies due at the same instant come back newest first: the order in which a
        // guard seeded on the first of them counts the rest twice.
        replies.sort_by_key(|r| std::cmp::Reverse((r.0, std::cmp::Reverse(r.1))));
        let candidates = [
            replies.last().map(|r| r.0),
            arbiter.poll_timeout(),
            arrivals.get(tickets.len()).copied(),
        ];
        let next = candidates.into_iter().flatten().min().expect("something is pending");
        now = next.max(now);
        arbiter.handle_timeout(now);
        while replies.last().is_some_and(|r| r.0 <= now) {
            let (at, i, sent, remaining) = replies.pop().unwrap();
            let report = QuotaReport {
                limit: Some(FIXED_LIMIT),
                remaining: Some(remaining.unwrap_or(0)),
                reset: None,
                window: None,
                ..QuotaReport::default()
            };
            let learned = arbiter.observe_quota(0, sent, report, at).unwrap();
            edge_ever |= learned.is_some_and(|l| l.window_edge.is_some());
            // A 429 is counted and released (the tests want none).
            match remaining {
                Some(_) => arbiter.commit(tickets[i], &[1], at).unwrap(),
                None => arbiter.release(tickets[i], at).unwrap(),
            }
            done += 1;
            last = at;
        }
    }
    BlindRun {
        arbiter,
        granted: granted.into_iter().map(|g| g.expect("granted")).collect(),
        last,
        throttled: provider.throttled,
        edge_ever,
    }
}

#[test]
fn a_fixed_window_without_reset_is_spent_whole_and_never_exceeded() {
    // Four windows' worth queued at once, at several points of a window: the bound is three
    // windows (plus the last answer's latency) whatever the point.
    for offset_ms in [0u64, 100, 400, 700, 950] {
        for limit in [Some(FIXED_LIMIT), None] {
            let start = ms(10_000 + offset_ms);
            let run = run_blind(&[start; 400], Counting::Fixed(Duration::ZERO), limit);
            assert_eq!(
                run.throttled, 0,
                "offset {offset_ms} ms, limit {limit:?}: a window exceeded"
            );
            let makespan = run.last.saturating_duration_since(start);
            let bound = WINDOW_FIXED * 3 + LATENCY;
            let ratio = makespan.as_secs_f64() / bound.as_secs_f64();
            assert!(
                ratio <= 1.15,
                "offset {offset_ms} ms, limit {limit:?}: {makespan:?} is {ratio:.2}x the bound"
            );
        }
    }
}

#[test]
fn a_fixed_windows_edge_is_found_and_each_window_is_spent_from_its_opening() {
    // The provider's windows begin 370 ms into each second. A steady stream below the
    // limit shows where; then a burst of three windows' worth arrives.
    let phase = Duration::from_millis(370);
    let steady = (0..150u64).map(|i| ms(15 * i));
    let burst = std::iter::repeat_n(ms(2_500), 300);
    let arrivals: Vec<Instant> = steady.chain(burst).collect();
    let run = run_blind(&arrivals, Counting::Fixed(phase), Some(FIXED_LIMIT));
    assert_eq!(run.throttled, 0, "a window exceeded");
    let learned = run.arbiter.dimension(0, Instant::ZERO).and_then(|d| d.learned).unwrap();
    let edge = learned.window_edge.expect("the edge was found");
    let into_window = (edge.as_nanos() % WINDOW_FIXED.as_nanos() as u64) as f64 / 1e6;
    assert!((370.0..=430.0).contains(&into_window), "edge placed {into_window} ms into the second");
    // The burst: what the current window has left at once, then each window's limit from
    // its opening (at most a slot and the edge's uncertainty late).
    for opening in [3_370u64, 4_370] {
        let early = run.granted[150..]
            .iter()
            .filter(|&&g| g >= ms(opening) && g <= ms(opening + 100))
            .count();
        assert!(
            early >= 90,
            "only {early} granted within 100 ms of the window opening at {opening} ms"
        );
    }
    assert!(run.last <= ms(4_450), "the burst ended at {:?}", run.last);
}

#[test]
fn a_sliding_log_or_a_bucket_without_reset_is_never_taken_for_a_fixed_window() {
    // Against a provider counting 100 in any trailing second, a burst ageing out makes
    // `remaining` leap between two requests sent 15 ms apart; against a bucket, it climbs
    // as the bucket refills. Neither may read as a window's edge.
    let burst = std::iter::repeat_n(ms(0), 60);
    let steady = (0..200u64).map(|i| ms(15 * i));
    let arrivals: Vec<Instant> = burst.chain(steady).collect();
    for counting in [Counting::Sliding, Counting::Bucket] {
        for limit in [Some(FIXED_LIMIT), None] {
            let run = run_blind(&arrivals, counting, limit);
            assert_eq!(run.throttled, 0, "{counting:?}, limit {limit:?}: 429s");
            assert!(!run.edge_ever, "{counting:?}, limit {limit:?}: an edge was taken");
        }
    }
}

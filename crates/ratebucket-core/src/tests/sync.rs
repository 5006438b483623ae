//! In-flight accounting: syncing a bucket to a provider's reported remaining never lets
//! the client's grants exceed what the provider has, and still takes the provider's burst,
//! on a virtual clock with requests reordered on their way.

use super::Direct;
use super::support;

use std::time::Duration;

use quickcheck::{Arbitrary, Gen, TestResult};
use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, FoldOutcome, Instant, Rate, TicketState, TokenBucket,
};
use support::check;
use support::traffic::{self, Bounds, Call, Provider};

const MAX_SEND_DELAY_MS: u64 = 30;
const MAX_TRANSIT_MS: u64 = 15;

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
        let bounds = Bounds {
            gap: 40,
            send_delay: MAX_SEND_DELAY_MS,
            transit: MAX_TRANSIT_MS,
            latency: 400,
        };
        Schedule {
            capacity,
            per_second,
            charges_reservation: bool::arbitrary(g),
            calls: (0..n).map(|_| Call::arbitrary(g, bounds)).collect(),
        }
    }
}

/// The provider: a bucket that starts full and charges each request as it arrives; its
/// replies report what is left.
struct Bucket {
    level: f64,
    capacity: f64,
    per_ms: f64,
    at: u64,
}

impl Provider for Bucket {
    fn charge(&mut self, now: u64, charge: u64) -> Result<u64, String> {
        self.level = (self.level + self.per_ms * (now - self.at) as f64).min(self.capacity);
        self.at = now;
        if self.level + 1e-9 < charge as f64 {
            return Err(format!("the provider had {:.3} but was sent {charge}", self.level));
        }
        self.level -= charge as f64;
        Ok(self.level.max(0.0).floor() as u64)
    }
}

/// How a run went.
struct Run {
    /// When the last reservation was granted, in ms.
    last_grant: u64,
}

/// Plays `schedule` against the provider, syncing every reply into a client bucket of
/// `client_capacity`; fails if the provider is ever sent more than it has.
fn play(schedule: &Schedule, client_capacity: u64) -> Result<Run, String> {
    play_told(schedule, client_capacity, false)
}

/// [`play`], each reply saying when the provider counted its request (`tells_counted`).
fn play_told(
    schedule: &Schedule,
    client_capacity: u64,
    tells_counted: bool,
) -> Result<Run, String> {
    let rate = Rate::per_second(schedule.per_second).expect("rate");
    let bucket = TokenBucket::new(rate, client_capacity, Instant::ZERO).expect("bucket");
    let mut arbiter =
        Arbiter::new(vec![bucket], ArbiterConfig::default().with_adapt(None), Instant::ZERO)
            .expect("arbiter");
    let mut provider = Bucket {
        level: schedule.capacity as f64,
        capacity: schedule.capacity as f64,
        per_ms: schedule.per_second as f64 / 1000.0,
        at: 0,
    };
    let charges_reservation = schedule.charges_reservation;
    let last_grant = traffic::play(
        &mut arbiter,
        &schedule.calls,
        charges_reservation,
        tells_counted,
        &mut provider,
        |arbiter, call, ticket, stamp, remaining, at| {
            if call.fold_first {
                arbiter.sync_level(0, stamp, remaining, at).expect("dimension 0");
            }
            // Reconciled against what the provider charged: before the first sync the
            // client's own books count, and they must match the provider's charging.
            let charged = if charges_reservation { call.reserved } else { call.actual };
            arbiter.commit(ticket, &[charged], at).expect("granted");
            if !call.fold_first {
                arbiter.sync_level(0, stamp, remaining, at).expect("dimension 0");
            }
        },
    )?;
    Ok(Run { last_grant })
}

fn synced_grants_stay_within_the_provider(schedule: Schedule) -> TestResult {
    // The client's capacity leaves room for what refills while a granted request is on its
    // way: when the provider's bucket is full it cannot absorb that.
    let margin = (schedule.per_second * (MAX_SEND_DELAY_MS + MAX_TRANSIT_MS)).div_ceil(1000);
    match play(&schedule, schedule.capacity - margin) {
        Ok(_) => TestResult::passed(),
        Err(e) => TestResult::error(e),
    }
}

#[test]
fn a_synced_bucket_never_grants_more_than_the_provider_has() {
    check(3_000, 0x5eed_0008, synced_grants_stay_within_the_provider as fn(Schedule) -> TestResult);
}

fn told_grants_stay_within_the_provider(schedule: Schedule) -> TestResult {
    let margin = (schedule.per_second * (MAX_SEND_DELAY_MS + MAX_TRANSIT_MS)).div_ceil(1000);
    match play_told(&schedule, schedule.capacity - margin, true) {
        Ok(_) => TestResult::passed(),
        Err(e) => TestResult::error(e),
    }
}

/// Replies that say when the provider counted each request (a processing time): the
/// floor takes as counted every reservation whose reply says it was counted before the
/// request reported on was sent, and the refill since that request was counted, and the
/// provider is still never sent more than it has, requests reordered on their way or not.
#[test]
fn replies_that_say_when_they_were_counted_never_overdraw_the_provider() {
    check(3_000, 0x5eed_000a, told_grants_stay_within_the_provider as fn(Schedule) -> TestResult);
}

/// A short batch against a provider that charges usage: 150 calls reserved at 82 and
/// using 41 to 81, a bucket of 4,000 refilling 16 a ms, replies 20 ms after the charge.
/// With every live reservation read as uncounted and nothing as refilled since the
/// report, the provider keeps about a round trip's worth unspent to the end; replies
/// that say when they were counted spend it.
#[test]
fn replies_that_say_when_they_were_counted_spend_what_a_round_trip_kept() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_000b);
    let calls: Vec<Call> = (0..150)
        .map(|_| Call {
            gap: 0,
            reserved: 82,
            actual: 41 + rng.u64(0..41),
            send_delay: rng.u64(0..2),
            transit: rng.u64(0..2),
            latency: 20,
            fold_first: false,
        })
        .collect();
    let schedule =
        Schedule { capacity: 4_000, per_second: 16_000, charges_reservation: false, calls };
    let used: u64 = schedule.calls.iter().map(|c| c.actual).sum();
    // The provider's own bound: its burst, then the rest at its refill.
    let ideal = (used - schedule.capacity) / 16;
    let capacity = schedule.capacity - 64;
    let untold = play(&schedule, capacity).expect("no request is sent beyond the provider's level");
    let told = play_told(&schedule, capacity, true)
        .expect("no request is sent beyond the provider's level");
    assert!(
        told.last_grant * 100 <= ideal * 105,
        "last grant at {} ms told when each was counted, ideal {ideal} ms",
        told.last_grant
    );
    assert!(
        untold.last_grant * 100 > ideal * 110,
        "last grant at {} ms untold, ideal {ideal} ms: telling shows nothing",
        untold.last_grant
    );
}

/// The level one report leaves: a request of 100 sent at 10 ms, its reply folded at 30 ms
/// saying 50,000 left, and by when it was counted (`None`: not said).
fn level_after_one_report(counted_by: Option<u64>) -> f64 {
    let rate = Rate::per_second(6_000).expect("rate");
    let bucket = TokenBucket::new(rate, 60_000, Instant::ZERO).expect("bucket");
    let config = ArbiterConfig::default().with_adapt(None);
    let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
    let at = Instant::from_millis;
    let a = arbiter.reserve(&[100], at(10)).expect("granted");
    let sent = arbiter.stamp_send_if_open(a, at(10)).expect("the gate is open");
    let sent = counted_by.map_or(sent, |ms| sent.counted_by(at(ms)));
    arbiter.commit(a, &[100], at(30)).expect("granted");
    arbiter.sync_level(0, sent, 50_000, at(30)).expect("dimension 0");
    arbiter.dimension(0, at(30)).map(|d| d.level).expect("dimension 0")
}

/// What refilled since the provider counted a request is the provider's; a reply that
/// says it was counted before it was sent is not believed.
#[test]
fn the_refill_since_a_request_was_counted_is_the_providers() {
    assert_eq!(level_after_one_report(None), 50_000.0);
    // Counted at 12 ms: 18 ms of refill at 6 a ms.
    assert_eq!(level_after_one_report(Some(12)), 50_000.0 + 108.0);
    assert_eq!(level_after_one_report(Some(5)), 50_000.0, "before its send");
}

/// A short batch against a provider whose bucket starts full, with requests reaching it
/// up to 40 ms out of order (a burst opening new connections): reading every report within
/// its bounds takes the whole burst and then the refill, close to the ideal. A ceiling that
/// took requests sent later as not yet counted would stall the tail (2.5 s here).
#[test]
fn a_burst_against_a_full_provider_bucket_finishes_near_the_ideal() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_0009);
    let calls = (0..300)
        .map(|_| Call {
            gap: 0,
            reserved: 224,
            actual: 224,
            send_delay: rng.u64(0..5),
            transit: rng.u64(0..40),
            latency: 20 + rng.u64(0..20),
            fold_first: false,
        })
        .collect();
    let schedule =
        Schedule { capacity: 60_000, per_second: 6_000, charges_reservation: true, calls };
    // 100 ms of refill below the provider's capacity: the most learning leaves out.
    let run = play(&schedule, 59_400).expect("no request is sent beyond the provider's level");
    // The burst covers 60,000 of the 67,200 tokens; the rest refill in 1.2 s.
    let ideal = 1_200;
    assert!(
        run.last_grant <= ideal * 11 / 10,
        "last grant at {} ms, ideal {ideal} ms",
        run.last_grant
    );
}

/// Another client spends from the same quota: the provider reports less than even the
/// kindest reading of the client's books allows, and the level comes down to that reading.
#[test]
fn a_report_below_every_reading_of_the_books_lowers_the_level() {
    let rate = Rate::per_second(6_000).expect("rate");
    let bucket = TokenBucket::new(rate, 60_000, Instant::ZERO).expect("bucket");
    let mut arbiter =
        Arbiter::new(vec![bucket], ArbiterConfig::default().with_adapt(None), Instant::ZERO)
            .expect("arbiter");
    let at = Instant::from_millis;
    let a = arbiter.reserve(&[100], at(0)).expect("granted");
    let b = arbiter.reserve(&[200], at(0)).expect("granted");
    let sent_a = arbiter.stamp_send_if_open(a, at(0)).expect("the gate is open");
    arbiter.commit(a, &[100], at(10)).expect("granted");
    // The first report: 59,900 left, `b` (granted, not sent) still to come.
    arbiter.sync_level(0, sent_a, 59_900, at(10)).expect("dimension 0");
    assert_eq!(arbiter.dimension(0, at(10)).map(|d| d.level), Some(59_700.0));
    let sent_b = arbiter.stamp_send_if_open(b, at(10)).expect("the gate is open");
    arbiter.commit(b, &[200], at(20)).expect("granted");
    // Someone else spent 29,700 meanwhile.
    arbiter.sync_level(0, sent_b, 30_000, at(20)).expect("dimension 0");
    // The report plus what refilled since `b` left (10 ms at 6,000/s).
    assert_eq!(arbiter.dimension(0, at(20)).map(|d| d.level), Some(30_060.0));
}

/// A provider that books more than the client reserves (its own estimate of a request)
/// shows it in its first report, when its limit is known and nothing else was in flight;
/// reservations granted from then on take what it books.
#[test]
fn the_charge_a_provider_books_is_learned_and_reserved() {
    let rate = Rate::per_second(6_000).expect("rate");
    let bucket = TokenBucket::new(rate, 60_000, Instant::ZERO).expect("bucket");
    let config = ArbiterConfig::default().with_adapt(None);
    let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
    arbiter.observe_limit(0, 60_000).expect("dimension 0");
    assert_eq!(
        arbiter.dimension(0, Instant::ZERO).map(|d| d.charge_factor),
        Some(1.0),
        "nothing learned yet"
    );
    let first = arbiter.reserve(&[200], Instant::ZERO).expect("granted");
    let stamp = arbiter.stamp_send_if_open(first, Instant::ZERO).expect("the gate is open");
    // The provider booked 240 for it.
    arbiter.observe_remaining(0, stamp, 60_000 - 240, Instant::ZERO).expect("dimension 0");
    arbiter.commit(first, &[200], Instant::ZERO).expect("granted");
    let factor = arbiter.dimension(0, Instant::ZERO).map(|d| d.charge_factor).expect("dimension 0");
    assert!((factor - 1.2).abs() < 1e-9, "{factor}");
    assert_eq!(arbiter.snapshot(Instant::ZERO).dimensions[0].charge_factor, factor);

    // The next reservation of 200 takes what the provider will book, 2% to spare.
    let before = arbiter.dimension(0, Instant::ZERO).map(|d| d.level).expect("dimension 0");
    let next = arbiter.reserve(&[200], Instant::ZERO).expect("granted");
    let after = arbiter.dimension(0, Instant::ZERO).map(|d| d.level).expect("dimension 0");
    assert_eq!(before - after, 245.0);
    // A count of whole requests is not raised by a fraction.
    arbiter.commit(next, &[200], Instant::ZERO).expect("granted");
    let before = arbiter.dimension(0, Instant::ZERO).map(|d| d.level).expect("dimension 0");
    arbiter.reserve(&[1], Instant::ZERO).expect("granted");
    let after = arbiter.dimension(0, Instant::ZERO).map(|d| d.level).expect("dimension 0");
    assert_eq!(before - after, 1.0);
    // Queued behind a bucket drained, a reservation of 200 needs what it will take, 245:
    // the head's cost a snapshot shows is that (what must be there for the queue to move).
    let level = arbiter.dimension(0, Instant::ZERO).map(|d| d.level).expect("dimension 0");
    // Raised the same way (1.2 and 2% to spare), a reservation of this takes nearly all.
    let drain = arbiter.reserve(&[(level / 1.224) as u64 - 1], Instant::ZERO).expect("granted");
    assert_eq!(arbiter.state(drain), Some(TicketState::Granted));
    let queued = arbiter.reserve(&[200], Instant::ZERO).expect("queued");
    assert_eq!(arbiter.state(queued), Some(TicketState::Queued));
    let dimension = arbiter.dimension(0, Instant::ZERO).expect("dimension 0");
    assert_eq!((dimension.queued_cost, dimension.head_cost), (200, 245));
}

/// A grant taken back unsent and queued again is raised by the learned charge once, when it
/// is granted anew: not the raised cost raised a second time.
#[test]
fn a_requeued_grant_takes_the_learned_charge_once() {
    let rate = Rate::per_second(6_000).expect("rate");
    let bucket = TokenBucket::new(rate, 60_000, Instant::ZERO).expect("bucket");
    let config = ArbiterConfig::default().with_adapt(None);
    let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
    arbiter.observe_limit(0, 60_000).expect("dimension 0");
    let first = arbiter.reserve(&[200], Instant::ZERO).expect("granted");
    let stamp = arbiter.stamp_send_if_open(first, Instant::ZERO).expect("the gate is open");
    // The provider booked 240 for it: a factor of 1.2, reserved 2% above.
    arbiter.observe_remaining(0, stamp, 60_000 - 240, Instant::ZERO).expect("dimension 0");
    arbiter.commit(first, &[200], Instant::ZERO).expect("granted");
    let next = arbiter.reserve(&[200], Instant::ZERO).expect("granted");
    assert_eq!(arbiter.cost(next), Some(vec![245]));
    arbiter.requeue_unsent(next, Instant::ZERO).expect("granted, not sent");
    // Granted again at once (there is room), at the same raised cost.
    assert_eq!(arbiter.state(next), Some(TicketState::Granted));
    assert_eq!(arbiter.cost(next), Some(vec![245]));
}

/// Replies out of order in a burst say nothing certain about what was booked: a report on a
/// request that left while others were unsettled teaches nothing.
#[test]
fn reports_on_a_burst_in_flight_teach_no_charge() {
    let rate = Rate::per_second(6_000).expect("rate");
    let bucket = TokenBucket::new(rate, 60_000, Instant::ZERO).expect("bucket");
    let config = ArbiterConfig::default().with_adapt(None);
    let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
    arbiter.observe_limit(0, 60_000).expect("dimension 0");
    let tickets: Vec<_> =
        (0..10).map(|_| arbiter.reserve(&[200], Instant::ZERO).expect("granted")).collect();
    let stamps: Vec<_> = tickets
        .iter()
        .map(|&t| arbiter.stamp_send_if_open(t, Instant::ZERO).expect("the gate is open"))
        .collect();
    // The last request's report arrives first, with everything before it charged twice
    // over (as a provider that processed them first would report).
    for (i, &stamp) in stamps.iter().enumerate().rev() {
        arbiter
            .observe_remaining(0, stamp, 60_000 - 400 * (i as u64 + 1), Instant::ZERO)
            .expect("dimension 0");
    }
    assert_eq!(arbiter.dimension(0, Instant::ZERO).map(|d| d.charge_factor), Some(1.0));
}

/// A limit adopted from a provider starts from what it says remains, not from the empty
/// bucket the client's own reckoning reached; other reservations live are subtracted, and
/// the level is never raised above the capacity, nor lowered.
#[test]
fn an_adopted_limit_starts_from_what_the_provider_says_remains() {
    let rate = Rate::per_second(1).expect("rate");
    let bucket = TokenBucket::new(rate, 1, Instant::ZERO).expect("bucket");
    let config = ArbiterConfig::default().with_adapt(None);
    let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
    let first = arbiter.reserve(&[1], Instant::ZERO).expect("granted");
    let stamp = arbiter.stamp_send_if_open(first, Instant::ZERO).expect("the gate is open");
    // The provider says 600 per ten seconds, with 599 left after this request.
    let per_window = Rate::new(600, Duration::from_secs(10)).expect("rate");
    arbiter.change(0, Change::Rate(per_window), Instant::ZERO).expect("dimension 0");
    arbiter.change(0, Change::Capacity(100), Instant::ZERO).expect("dimension 0");
    assert_eq!(arbiter.dimension(0, Instant::ZERO).map(|d| d.level), Some(0.0));
    let raised = arbiter.adopt_remaining(0, stamp, 599, Instant::ZERO);
    assert_eq!(raised, Ok(FoldOutcome::Raised));
    assert_eq!(
        arbiter.dimension(0, Instant::ZERO).map(|d| d.level),
        Some(100.0),
        "capped at capacity"
    );
    assert_eq!(
        arbiter.adopt_remaining(0, stamp, 3, Instant::ZERO),
        Ok(FoldOutcome::Unchanged),
        "never lowers"
    );

    // With a capacity to spare, what else is live comes off.
    arbiter.change(0, Change::Capacity(1_000), Instant::ZERO).expect("dimension 0");
    let other = arbiter.reserve(&[30], Instant::ZERO).expect("granted");
    arbiter.adopt_remaining(0, stamp, 599, Instant::ZERO).expect("dimension 0");
    assert_eq!(arbiter.dimension(0, Instant::ZERO).map(|d| d.level), Some(599.0 - 30.0));
    assert!(arbiter.state(other).is_some());
}

/// A count rounded to the nearest thousand (Anthropic's): a `remaining` of 1,000 stands for
/// anything from 500 to 1,499. A level at 800 (1,500 the provider had, less 700 granted
/// since) is within that: the report lowers it no further. Read at its least for the
/// ceiling too, every such report would drag the level back to 500, a step below what
/// the provider has.
#[test]
fn a_rounded_count_is_a_ceiling_at_the_most_it_stands_for() {
    let level_after = |slack: u64| {
        let rate = Rate::per_second(1).expect("rate");
        let bucket = TokenBucket::new(rate, 1_500, Instant::ZERO).expect("bucket");
        let config = ArbiterConfig::default().with_adapt(None);
        let mut arbiter = Arbiter::new(vec![bucket], config, Instant::ZERO).expect("arbiter");
        let at = Instant::from_millis;
        let granted = arbiter.reserve(&[700], at(0)).expect("granted");
        let sent = arbiter.stamp_send_if_open(granted, at(0)).expect("open");
        arbiter.commit(granted, &[700], at(1)).expect("granted");
        // Reported as 1,000: at least 500 (read so for the floor), at most 1,499.
        arbiter.sync_level_within(0, sent, 500, slack, at(1)).expect("dimension 0");
        arbiter.dimension(0, at(1)).map(|d| d.level).expect("dimension 0")
    };
    let kept = level_after(999);
    assert!((kept - 800.0).abs() < 1.0, "the level the report allows: {kept}");
    let dragged = level_after(0);
    assert!((dragged - 500.0).abs() < 1.0, "read at its least: {dragged}");
}

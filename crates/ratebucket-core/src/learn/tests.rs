//! The learning policy alone: reports in, adjustments out, no arbiter in between.

use ratebucket_core::Change;
use std::time::Duration;

use quickcheck::{QuickCheck, TestResult};

use super::{Adjust, Learner, QuotaPolicy, QuotaReport, View};
use crate::bucket::{Limit, MAX_LIMIT, TokenBucket};
use crate::gate::Epoch;
use crate::ids::SendStamp;
use crate::time::Instant;
use crate::{Arbiter, ArbiterConfig};

const MINUTE: Duration = Duration::from_secs(60);

fn stamp(seq: u64) -> SendStamp {
    SendStamp { epoch: Epoch::default(), seq, counted_by: crate::Instant::NEVER }
}

fn view(capacity: u64, guarded: bool) -> View {
    View {
        now: Instant::from_millis(1_000),
        capacity,
        guarded,
        send: Some((Instant::from_millis(900), 1)),
        send_delay: Duration::ZERO,
        throttled: false,
    }
}

fn fold(learner: &mut Learner, view: View, seq: u64, report: QuotaReport) -> Vec<Adjust> {
    let mut out = Vec::new();
    learner.fold(view, stamp(seq), report, &mut out);
    out
}

fn report(limit: u64, remaining: u64, reset: Option<Duration>) -> QuotaReport {
    QuotaReport {
        limit: Some(limit),
        remaining: Some(remaining),
        reset,
        window: None,
        ..QuotaReport::default()
    }
}

fn rates(adjustments: &[Adjust]) -> Vec<crate::Rate> {
    adjustments
        .iter()
        .filter_map(|a| match a {
            Adjust::Rate(rate) => Some(*rate),
            _ => None,
        })
        .collect()
}

fn capacities(adjustments: &[Adjust]) -> Vec<u64> {
    adjustments
        .iter()
        .filter_map(|a| match a {
            Adjust::Capacity(capacity) => Some(*capacity),
            _ => None,
        })
        .collect()
}

#[test]
fn a_lower_reported_limit_is_put_in_force_a_higher_one_never() {
    let mut learner = Learner::new(QuotaPolicy::known(600, MINUTE));
    let lower = fold(&mut learner, view(100, false), 0, report(300, 290, None));
    assert_eq!(rates(&lower), vec![Limit::per(300, MINUTE).rate().unwrap()]);
    assert!(capacities(&lower).contains(&50));
    assert_eq!(learner.learned(false).limit, Some(300));

    let higher = fold(&mut learner, view(50, false), 1, report(900, 890, None));
    assert!(rates(&higher).is_empty(), "{higher:?}");
    assert_eq!(learner.learned(false).limit, Some(300));
}

#[test]
fn an_unknown_limit_is_adopted_with_the_burst_its_remaining_offers() {
    let mut learner = Learner::new(QuotaPolicy::unknown(MINUTE));
    let adjustments =
        fold(&mut learner, view(1, false), 0, report(600, 500, Some(Duration::from_secs(10))));
    assert!(matches!(adjustments[0], Adjust::ProviderLimit(600)));
    assert_eq!(rates(&adjustments), vec![Limit::per(600, MINUTE).rate().unwrap()]);
    assert!(adjustments.iter().any(|a| matches!(a, Adjust::Adopt(500))));
}

#[test]
fn a_provider_without_a_reset_is_counted_blind_under_a_guard() {
    let mut learner = Learner::new(QuotaPolicy::unknown(MINUTE));
    let first = fold(&mut learner, view(1, false), 0, report(600, 590, None));
    let guard = first
        .iter()
        .find_map(|a| match a {
            Adjust::Guard { guard, used } => Some((guard.limit(), *used)),
            _ => None,
        })
        .expect("a guard");
    assert_eq!(guard, (600, 10));
    // The whole limit is the burst, and the bucket level is not lowered by `remaining`:
    // the guard follows the provider's count instead.
    assert_eq!(capacities(&first).last(), Some(&600));
    assert!(!first.iter().any(|a| matches!(a, Adjust::Lower(_))));
    assert!(first.iter().any(|a| matches!(a, Adjust::Used(10))));

    // Guarded already: no second guard.
    let second = fold(&mut learner, view(600, true), 1, report(600, 580, None));
    assert!(!second.iter().any(|a| matches!(a, Adjust::Guard { .. })));
    assert!(second.iter().any(|a| matches!(a, Adjust::Used(20))));
}

#[test]
fn a_continuous_bucket_lends_its_burst_once_then_follows_the_books() {
    let mut learner = Learner::new(QuotaPolicy::known(600, MINUTE));
    // Ten units a second: each report's reset is exactly what the used part refills in.
    let mut lent = Vec::new();
    let mut synced = Vec::new();
    for (seq, remaining) in [590u64, 560, 530, 500, 470, 440].into_iter().enumerate() {
        let reset = Duration::from_secs((600 - remaining) / 10);
        let out =
            fold(&mut learner, view(100, false), seq as u64, report(600, remaining, Some(reset)));
        lent.extend(capacities(&out));
        synced.extend(out.iter().filter_map(|a| match a {
            Adjust::Sync { remaining, .. } => Some(*remaining),
            _ => None,
        }));
    }
    assert!(learner.learned(false).provider_burst);
    assert_eq!(lent.len(), 1, "the burst is lent once: {lent:?}");
    assert!(lent[0] > 100 && lent[0] <= 600, "{lent:?}");
    assert!(!synced.is_empty());
}

#[test]
fn a_shorter_window_with_a_stricter_rate_is_learned_afresh() {
    let mut learner = Learner::new(QuotaPolicy::known(600, MINUTE));
    let per_second = QuotaReport { window: Some(Duration::from_secs(1)), ..report(5, 4, None) };
    let out = fold(&mut learner, view(100, false), 0, per_second);
    assert_eq!(rates(&out), vec![Limit::per(5, Duration::from_secs(1)).rate().unwrap()]);
    assert_eq!(learner.window(), Duration::from_secs(1));
}

/// One report, as a property test draws it: any limit (zero, past [`MAX_LIMIT`]), any
/// remaining, any reset and any window, zero included.
type Drawn = (u64, Option<u64>, Option<u32>, Option<u32>, bool);

fn drawn_report((limit, remaining, reset, window, huge): Drawn) -> QuotaReport {
    QuotaReport {
        limit: Some(if huge { u64::MAX - limit % 7 } else { limit % 2_000 }),
        remaining: remaining.map(|r| if huge { r } else { r % 2_100 }),
        reset: reset.map(|ms| Duration::from_millis(u64::from(ms % 120_000))),
        window: window.map(|ms| Duration::from_millis(u64::from(ms % 200_000))),
        clock: reset.map(|ms| {
            if huge { Duration::MAX } else { Duration::from_millis(u64::from(ms) * 1_000_003) }
        }),
        // Exact, rounded to thousands, or absurdly coarse.
        precision: match (huge, limit % 3) {
            (true, _) => u64::MAX,
            (false, 0) => 0,
            (false, _) => 1_000,
        },
        reset_as_instant: limit % 2 == 0,
        // Told by the form, or from the values.
        reset_resolution: if limit % 5 == 0 { Duration::from_secs(1) } else { Duration::ZERO },
    }
}

/// Whatever a provider reports, the policy asks nothing a dimension refuses: every report
/// folds without an error, under every kind of policy.
#[test]
fn every_adjustment_the_policy_makes_is_one_a_dimension_accepts() {
    fn property(policy: u8, reports: Vec<Drawn>) -> TestResult {
        let t0 = Instant::ZERO;
        let bucket = TokenBucket::new(Limit::per_minute(600).rate().unwrap(), 100, t0).unwrap();
        let mut arbiter = Arbiter::new(vec![bucket], ArbiterConfig::default(), t0).unwrap();
        let policy = match policy % 3 {
            0 => QuotaPolicy::known(600, MINUTE),
            1 => QuotaPolicy::unknown(MINUTE),
            _ => QuotaPolicy::unknown(MINUTE).conservative(),
        };
        arbiter.change(0, Change::Policy(policy), t0).unwrap();
        for (i, drawn) in reports.into_iter().enumerate() {
            let now = Instant::from_millis(100 * i as u64);
            let sent = arbiter.stamp_send(now);
            let report = drawn_report(drawn);
            if let Err(e) = arbiter.observe_quota(0, sent, report, now) {
                return TestResult::error(format!("{report:?} refused: {e}"));
            }
            let capacity = arbiter.dimension(0, now).unwrap().capacity;
            if capacity == 0 || capacity > MAX_LIMIT {
                return TestResult::error(format!("capacity {capacity} after {report:?}"));
            }
        }
        TestResult::passed()
    }
    QuickCheck::new().tests(300).quickcheck(property as fn(u8, Vec<Drawn>) -> TestResult);
}

/// A provider documented to count in buckets that start full, its counts rounded to
/// thousands: taken at its word from its first agreeing report, and its burst lent from
/// the client's own books (the share less what was taken, shifted by what the lent
/// capacity adds). When its first report shows a bucket someone else has drawn on, the
/// books are not trusted: the level comes from the reports alone.
#[test]
fn a_documented_bucket_is_reckoned_from_a_full_start_only_when_its_first_report_shows_one() {
    let rounded = |remaining: u64, reset_ms: u64| QuotaReport {
        precision: 1_000,
        reset_as_instant: true,
        reset_resolution: Duration::from_secs(1),
        ..report(30_000, remaining, Some(Duration::from_millis(reset_ms)))
    };
    // A bucket of 30,000 a minute (500 a second) holding `first` at the first reply, then
    // 5,000 less at the first burst's.
    let run = |first: u64| {
        let mut learner = Learner::new(QuotaPolicy::unknown(MINUTE).documented_bucket());
        let to_full = |left: u64| (30_000 - left) * 2;
        let mut all = fold(&mut learner, view(MAX_LIMIT, false), 0, rounded(first, to_full(first)));
        let after = first - 5_000;
        all.extend(fold(&mut learner, view(5_000, false), 1, rounded(after, to_full(after))));
        (all, learner.learned(false))
    };
    let (full, learned) = run(30_000);
    assert!(learned.provider_burst, "taken at its word: {learned:?}");
    assert!(matches!(full.as_slice(), [.., Adjust::Sync { .. }]), "{full:?}");
    assert!(full.iter().any(|a| matches!(a, Adjust::FullLessTaken)), "{full:?}");
    assert!(full.iter().any(|a| matches!(a, Adjust::Shift(more) if *more > 20_000)), "{full:?}");
    let (drawn_on, learned) = run(18_000);
    assert!(learned.provider_burst, "{learned:?}");
    assert!(
        !drawn_on.iter().any(|a| matches!(a, Adjust::FullLessTaken | Adjust::Shift(_))),
        "read from its reports alone: {drawn_on:?}"
    );
}

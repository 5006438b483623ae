//! The bucket inference's unit tests: buckets, windows, coarse and rounded reports, replies
//! out of order and resets read late.

use super::*;
use crate::gate::Epoch;

fn stamp(seq: u64) -> SendStamp {
    SendStamp { epoch: Epoch::default(), seq, counted_by: crate::Instant::NEVER }
}

fn obs(limit: u64, remaining: u64, reset_ms: u64) -> QuotaObservation {
    QuotaObservation {
        limit,
        remaining,
        reset: Duration::from_millis(reset_ms),
        read_short_by: Duration::ZERO,
        resolution: Duration::ZERO,
    }
}

const MINUTE: Duration = Duration::from_secs(60);

/// A continuous bucket of 600 per minute: 10 per second, so each used unit is 100 ms.
#[test]
fn a_continuously_refilling_bucket_is_recognised() {
    let mut inference = BucketInference::new(MINUTE);
    assert_eq!(inference.observe(stamp(0), obs(600, 599, 100), None), Some(ProviderModel::Unknown));
    // Agreeing, but only 0.9 s of predicted reset apart: not yet conclusive.
    assert_eq!(
        inference.observe(stamp(1), obs(600, 590, 1_000), None),
        Some(ProviderModel::Unknown)
    );
    assert_eq!(
        inference.observe(stamp(2), obs(600, 550, 5_000), None),
        Some(ProviderModel::Bucket { limit: 600 })
    );
}

/// The same bucket, its reset rounded up to whole seconds (as IETF `RateLimit` fields
/// send it): a second off is the header's resolution, not a window.
#[test]
fn a_bucket_reported_in_whole_seconds_is_recognised() {
    let mut inference = BucketInference::new(MINUTE);
    for (seq, (remaining, reset)) in
        [(599, 1_000), (590, 1_000), (550, 5_000), (500, 10_000)].into_iter().enumerate()
    {
        inference.observe(stamp(seq as u64), obs(600, remaining, reset), None);
    }
    assert_eq!(inference.model(), ProviderModel::Bucket { limit: 600 });
    assert!(inference.can_tell());
    assert!(!BucketInference::new(Duration::from_secs(2)).can_tell());
    // One reset with a fraction: the finer resolution holds from then on.
    inference.observe(stamp(4), obs(600, 500, 10_500), None);
    assert_eq!(inference.model(), ProviderModel::Window);
}

/// A bucket of 4,000 per 250 ms whose resets come as float seconds with two decimals
/// (as Cerebras writes them): 10 ms off is their resolution, four times the window's
/// hundredth, not a window.
#[test]
fn a_bucket_reported_in_hundredths_of_a_second_is_recognised() {
    let window = Duration::from_millis(250);
    let mut inference = BucketInference::new(window);
    for (seq, level) in (0..9).map(|i| 3_900.0 - 170.0 * f64::from(i)).enumerate() {
        let exact = (4_000.0 - level) / 4_000.0 * 0.25;
        let written = format!("{exact:.2}");
        let reset = Duration::from_secs_f64(written.parse().expect("seconds"));
        inference.observe(
            stamp(seq as u64),
            QuotaObservation {
                limit: 4_000,
                remaining: level as u64,
                reset,
                read_short_by: Duration::ZERO,
                resolution: Duration::ZERO,
            },
            None,
        );
    }
    assert_eq!(inference.model(), ProviderModel::Bucket { limit: 4_000 });
}

/// A fixed window of 60,000 per 10 s, and a client spending 6,000 a second after a
/// first 10,000: the window's reset (10 s - t) and a bucket's (used / 6,000 a second)
/// cross at t = 4.17 s, and replies near there agree with the bucket formula.
#[test]
fn a_window_crossing_the_bucket_formula_is_not_mistaken_for_a_bucket() {
    let mut inference = BucketInference::new(Duration::from_secs(10));
    for (seq, ms) in (3_500..5_000u64).step_by(5).enumerate() {
        let used = 10_000 + 6 * ms;
        let verdict =
            inference.observe(stamp(seq as u64), obs(60_000, 60_000 - used, 10_000 - ms), None);
        assert_ne!(verdict, Some(ProviderModel::Bucket { limit: 60_000 }), "at {ms} ms");
    }
    assert_eq!(inference.model(), ProviderModel::Window);
}

/// A bucket of 40 per 250 ms, whose level is continuous: its reset is computed from the
/// level, its remaining is the level rounded down, so the reset is up to one unit's
/// refill (6.25 ms, more than the 2.5 ms tolerance) short of the formula.
#[test]
fn a_bucket_reporting_whole_units_of_a_continuous_level_is_recognised() {
    let window = Duration::from_millis(250);
    let mut inference = BucketInference::new(window);
    let unit_ms = 250.0 / 40.0;
    // Levels with a fraction, as a provider refilling between requests has them.
    for (seq, level) in
        [39.9, 37.2, 35.05, 33.6, 31.3, 29.8, 27.1, 25.5, 23.95].into_iter().enumerate()
    {
        let reset = Duration::from_secs_f64((40.0 - level) * unit_ms / 1e3);
        let observation = QuotaObservation {
            limit: 40,
            remaining: level as u64,
            reset,
            read_short_by: Duration::ZERO,
            resolution: Duration::ZERO,
        };
        assert_ne!(
            inference.observe(stamp(seq as u64), observation, None),
            Some(ProviderModel::Window),
            "level {level}"
        );
    }
    assert_eq!(inference.model(), ProviderModel::Bucket { limit: 40 });
}

/// A fixed window resetting on the minute: the reset is the time to the boundary,
/// whatever remains.
#[test]
fn a_fixed_window_is_not_mistaken_for_a_bucket() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(0), obs(600, 599, 42_000), None);
    assert_eq!(
        inference.observe(stamp(1), obs(600, 590, 41_900), None),
        Some(ProviderModel::Window)
    );
}

/// A sliding log reports the time until its newest entry ages out: about a window.
#[test]
fn a_sliding_log_is_not_mistaken_for_a_bucket() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(0), obs(600, 599, 59_990), None);
    assert_eq!(
        inference.observe(stamp(1), obs(600, 598, 59_995), None),
        Some(ProviderModel::Window)
    );
}

#[test]
fn full_buckets_and_repeated_remaining_are_not_evidence() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(0), obs(600, 600, 0), None);
    inference.observe(stamp(1), obs(600, 599, 100), None);
    assert_eq!(inference.observe(stamp(2), obs(600, 599, 100), None), Some(ProviderModel::Unknown));
}

#[test]
fn replies_that_overtake_one_another_still_count() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(6), obs(600, 550, 5_000), None);
    // Sent earlier, read later: still evidence, agreeing here...
    assert_eq!(
        inference.observe(stamp(5), obs(600, 599, 100), None),
        Some(ProviderModel::Bucket { limit: 600 })
    );
    // ...and disagreeing here.
    assert_eq!(
        inference.observe(stamp(4), obs(600, 500, 57_000), None),
        Some(ProviderModel::Window)
    );
}

#[test]
fn an_older_reply_under_a_previous_limit_changes_nothing() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(5), obs(1_000, 999, 60), None);
    inference.observe(stamp(6), obs(600, 599, 100), None);
    inference.observe(stamp(7), obs(600, 550, 5_000), None);
    assert_eq!(inference.observe(stamp(4), obs(1_000, 900, 6_000), None), None);
    assert_eq!(inference.model(), ProviderModel::Bucket { limit: 600 });
}

#[test]
fn one_inconsistent_observation_falls_back_to_the_safe_model() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(0), obs(600, 599, 100), None);
    inference.observe(stamp(1), obs(600, 550, 5_000), None);
    assert_eq!(inference.model(), ProviderModel::Bucket { limit: 600 });
    assert_eq!(
        inference.observe(stamp(2), obs(600, 540, 30_000), None),
        Some(ProviderModel::Window)
    );
}

/// Groq: `-requests` counts per day, so its reset does not fit a per-minute bucket.
#[test]
fn a_per_day_requests_family_does_not_pass_for_a_per_minute_bucket() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(0), obs(14_400, 14_399, 6_000), None);
    assert_eq!(
        inference.observe(stamp(1), obs(14_400, 14_398, 12_000), None),
        Some(ProviderModel::Window)
    );
}

#[test]
fn a_new_limit_starts_the_evidence_afresh() {
    let mut inference = BucketInference::new(MINUTE);
    inference.observe(stamp(0), obs(600, 599, 100), None);
    inference.observe(stamp(1), obs(600, 550, 5_000), None);
    assert_eq!(
        inference.observe(stamp(2), obs(1200, 1190, 500), None),
        Some(ProviderModel::Unknown)
    );
}

/// 1,000 a window of 5 s (200 a second), resets rounded up to whole seconds, a
/// reading every 50 ms of a request sent 20 ms before it.
const SLOW: Duration = Duration::from_secs(5);

fn taken(ms: u64) -> Option<(Instant, Instant)> {
    Some((Instant::from_millis(ms - 20), Instant::from_millis(ms)))
}

fn whole_seconds(seconds: f64) -> u64 {
    seconds.ceil() as u64 * 1_000
}

/// A bucket spent at its refill rate keeps `remaining` where it is, so over a window
/// of 5 s reported in whole seconds the reset never moves far enough to tell it from a
/// window; time does: its full instant moves on with the clock, a window's stays put.
#[test]
fn a_bucket_spent_at_its_refill_rate_is_told_by_time_passing() {
    let verdict = |timed: bool| {
        let mut inference = BucketInference::new(SLOW);
        let mut model = ProviderModel::Unknown;
        for i in 0..120u64 {
            let at = 1_000 + i * 50;
            // 100 used (0.5 s of refill): the reset reads 1 s.
            let observation = obs(1_000, 900, whole_seconds(0.5));
            let when = timed.then(|| taken(at)).flatten();
            model = inference.observe(stamp(i), observation, when).expect("fresh");
        }
        model
    };
    assert_eq!(verdict(false), ProviderModel::Unknown, "by use alone");
    assert_eq!(verdict(true), ProviderModel::Bucket { limit: 1_000 });
}

/// A fixed window of 5 s, spent evenly at its limit, agrees with a bucket's formula for
/// a second of each window: however long it runs, it is never taken for a bucket.
#[test]
fn a_window_agreeing_for_a_while_is_never_a_bucket_however_long_it_runs() {
    let mut inference = BucketInference::new(SLOW);
    for i in 0..2_000u64 {
        let at = 1_000 + i * 10;
        // Used since the window opened, at 200 a second; the reset is to its end.
        let into = (at % 5_000) as f64 / 1e3;
        let used = (into * 200.0) as u64;
        let observation = obs(1_000, 1_000 - used.min(999), whole_seconds(5.0 - into));
        let model = inference.observe(stamp(i), observation, taken(at));
        assert_ne!(model, Some(ProviderModel::Bucket { limit: 1_000 }), "at {at} ms");
    }
}

/// A bucket of 4,000 per 250 ms whose resets come as instants, each read 6 ms after the
/// provider wrote it (a reply waiting its turn on a busy client): read against the
/// clock at the reading, every reset is 6 ms short, beyond the band of 2.6 ms. With the
/// span between send and reading (20 ms) allowed below, it is a bucket; without, a
/// window. A reset read long is never excused.
#[test]
fn resets_sent_as_instants_and_read_late_still_tell_a_bucket() {
    let window = Duration::from_millis(250);
    let verdict = |late_ms: i64, read_short_by: Duration| {
        let mut inference = BucketInference::new(window);
        let mut verdict = None;
        for (seq, level) in (0..9u64).map(|i| 3_900 - 170 * i).enumerate() {
            let exact = (4_000 - level) as f64 / 4_000.0 * 250.0;
            let reset = Duration::from_secs_f64((exact - late_ms as f64).max(0.0) / 1e3);
            verdict = inference.observe(
                stamp(seq as u64),
                QuotaObservation {
                    limit: 4_000,
                    remaining: level,
                    reset,
                    read_short_by,
                    resolution: Duration::ZERO,
                },
                None,
            );
        }
        verdict
    };
    let span = Duration::from_millis(20);
    assert_eq!(verdict(6, span), Some(ProviderModel::Bucket { limit: 4_000 }));
    assert_eq!(verdict(6, Duration::ZERO), Some(ProviderModel::Window));
    assert_eq!(verdict(-6, span), Some(ProviderModel::Window), "read long");
}

/// A bucket of 30,000 per minute (500 a second) whose resets come as instants in whole
/// seconds, the fraction dropped (as Anthropic writes them), each read up to 40 ms after
/// it was written: turned into a wait, a reset falls anywhere up to a second short of the
/// formula, at the phase of the second the provider wrote it in. Told the resolution by
/// the form, the inference takes a second for its tolerance and sees the bucket; reading
/// the resolution from the values (a wait with a fraction looks exact to the
/// millisecond), it sees a window.
#[test]
fn a_bucket_whose_resets_are_whole_second_instants_is_recognised() {
    let verdict = |resolution: Duration| {
        let mut inference = BucketInference::new(MINUTE);
        let mut rng = fastrand::Rng::with_seed(7);
        let mut verdict = None;
        // Every 70 ms a reply, the client spending 1,000 a second from a full bucket.
        for i in 0..60u64 {
            let at = 1.0 + i as f64 * 0.07;
            let level: f64 = 30_000.0 - 1_000.0 * (at - 1.0) - 200.0;
            let full_at = at + (30_000.0 - level) / 500.0;
            let read = at + rng.f64() * 0.04;
            let observation = QuotaObservation {
                limit: 30_000,
                remaining: level as u64,
                // An instant in the past reads as no wait.
                reset: Duration::from_secs_f64((full_at.floor() - read).max(0.0)),
                read_short_by: Duration::from_millis(50),
                resolution,
            };
            verdict = inference.observe(stamp(i), observation, None);
            if verdict == Some(ProviderModel::Window) {
                break;
            }
        }
        verdict
    };
    assert_eq!(verdict(Duration::from_secs(1)), Some(ProviderModel::Bucket { limit: 30_000 }));
    assert_eq!(verdict(Duration::ZERO), Some(ProviderModel::Window));
}

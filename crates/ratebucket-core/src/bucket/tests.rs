//! Unit tests of the token bucket and its rates.

use super::*;

fn secs(s: u64) -> Instant {
    Instant::from_secs(s)
}

#[test]
fn starts_full_and_refills_continuously_between_calls() {
    let mut b = TokenBucket::new(Rate::per_second(10).unwrap(), 10, secs(0)).unwrap();
    assert_eq!(b.available(secs(0)), 10.0);
    b.take(10, secs(0));
    assert_eq!(b.available(Instant::from_millis(250)), 2.5);
    assert_eq!(b.available(secs(1)), 10.0);
    assert_eq!(b.available(secs(100)), 10.0, "refill stops at capacity");
}

#[test]
fn level_may_go_negative_and_debt_is_paid_by_refill() {
    let mut b = TokenBucket::new(Rate::per_second(10).unwrap(), 10, secs(0)).unwrap();
    b.take(25, secs(0));
    assert_eq!(b.available(secs(0)), -15.0);
    assert_eq!(b.time_until(5, secs(0)), Some(Duration::from_secs(2)));
    assert!(!b.fits(1, Instant::from_millis(1500)));
    assert!(b.fits(1, Instant::from_millis(1600)));
}

#[test]
fn per_minute_caps_burst_at_a_sixth_but_refills_at_the_real_limit() {
    let mut b = TokenBucket::per_minute(600, secs(0)).unwrap();
    assert_eq!(b.capacity(), 100);
    assert_eq!(b.rate().per_second_f64(), 10.0);
    b.take(100, secs(0));
    assert_eq!(b.available(secs(5)), 50.0);
    assert_eq!(TokenBucket::per_minute(5, secs(0)).unwrap().capacity(), 1);
}

#[test]
fn refunds_never_raise_the_level_above_capacity() {
    let mut b = TokenBucket::new(Rate::per_second(1).unwrap(), 5, secs(0)).unwrap();
    b.take(2, secs(0));
    b.give_back(10, secs(0));
    assert_eq!(b.available(secs(0)), 5.0);
}

#[test]
fn a_clock_stepping_back_mints_nothing() {
    let mut b = TokenBucket::new(Rate::per_second(1).unwrap(), 5, secs(10)).unwrap();
    b.take(5, secs(10));
    assert_eq!(b.available(secs(3)), 0.0);
    assert_eq!(b.available(secs(11)), 1.0);
}

#[test]
fn lower_to_only_lowers() {
    let mut b = TokenBucket::new(Rate::per_second(1).unwrap(), 5, secs(0)).unwrap();
    assert!(b.lower_to(3, secs(0)));
    assert!(!b.lower_to(4, secs(0)));
    assert_eq!(b.available(secs(0)), 3.0);
    assert!(b.lower_to(-2, secs(0)));
    assert_eq!(b.available(secs(0)), -2.0);
}

#[test]
fn rate_and_capacity_change_at_run_time_keeping_the_level() {
    let mut b = TokenBucket::new(Rate::per_second(10).unwrap(), 10, secs(0)).unwrap();
    b.take(7, secs(0));
    b.set_rate(Rate::per_minute(60).unwrap(), secs(0));
    assert_eq!(b.available(secs(0)), 3.0);
    assert_eq!(b.available(secs(2)), 5.0);
    b.set_capacity(4, secs(2)).unwrap();
    assert_eq!(b.available(secs(2)), 4.0);
    b.set_capacity(100, secs(2)).unwrap();
    assert_eq!(b.available(secs(3)), 5.0);
}

#[test]
fn invalid_limits_are_refused_with_a_reason() {
    assert_eq!(Rate::per_second(0), Err(InvalidLimit::ZeroRate));
    assert_eq!(Rate::new(1, Duration::ZERO), Err(InvalidLimit::ZeroRate));
    assert!(matches!(Rate::from_per_second_f64(f64::NAN), Err(InvalidLimit::NotFinitePositive(_))));
    for bad in [f64::INFINITY, f64::NEG_INFINITY, -1.0] {
        assert_eq!(Rate::from_per_second_f64(bad), Err(InvalidLimit::NotFinitePositive(bad)));
    }
    assert_eq!(Rate::from_per_second_f64(0.0), Err(InvalidLimit::ZeroRate));
    assert_eq!(Rate::from_per_second_f64(1e-9), Err(InvalidLimit::ZeroRate));
    assert_eq!(Rate::from_per_second_f64(1e300), Err(InvalidLimit::TooLarge));
    assert_eq!(Rate::per_second(u64::MAX), Err(InvalidLimit::TooLarge));
    let rate = Rate::per_second(1).unwrap();
    assert_eq!(TokenBucket::new(rate, 0, secs(0)).unwrap_err(), InvalidLimit::ZeroCapacity);
    assert_eq!(TokenBucket::new(rate, u64::MAX, secs(0)).unwrap_err(), InvalidLimit::TooLarge);
    assert_eq!(TokenBucket::per_minute(0, secs(0)).unwrap_err(), InvalidLimit::ZeroRate);
    assert_eq!(Rate::from_per_second_f64(0.5).unwrap().per_second_f64(), 0.5);
}

#[test]
fn absurd_quantities_saturate_instead_of_overflowing() {
    let mut b = TokenBucket::new(Rate::per_second(MAX_LIMIT).unwrap(), MAX_LIMIT, secs(0)).unwrap();
    b.take(u64::MAX, secs(0));
    b.take(u64::MAX, secs(0));
    assert!(b.available(Instant::NEVER) <= MAX_LIMIT as f64);
    assert_eq!(b.time_until(MAX_LIMIT + 1, secs(0)), None);
}

#[test]
fn absurd_debts_give_a_long_wait_never_an_overflow_or_a_zero() {
    let slowest = Rate::new(1, Duration::from_nanos(MAX_LIMIT)).unwrap();
    let mut b = TokenBucket::new(slowest, MAX_LIMIT, secs(0)).unwrap();
    // Enough absurd debts to drive the level to the bottom of its range.
    for _ in 0..2_000 {
        b.take(u64::MAX, secs(0));
    }
    let wait = b.time_until(1, secs(0)).expect("within capacity");
    assert_eq!(wait, Duration::from_nanos(u64::MAX), "as long as a wait can be");
    assert!(!b.fits(1, secs(1)));
}

#[test]
fn a_float_rate_is_never_faster_than_asked() {
    let day = 1.0 / 86_400.0;
    let week = day / 7.0;
    for per_second in [day, week, 2e-7, 0.3, 0.999_999_9, 1.0, 1.5, 123.456_789, 9e8] {
        let rate = Rate::from_per_second_f64(per_second).unwrap();
        let got = rate.per_second_f64();
        assert!(got <= per_second, "{per_second}/s came out {got}/s");
        assert!((per_second - got) / per_second < 1e-6, "{per_second}/s came out {got}/s");
    }
    assert_eq!(
        Rate::from_per_second_f64(day).unwrap(),
        Rate::new(1, Duration::from_secs(86_400)).unwrap()
    );
    assert_eq!(
        Rate::from_per_second_f64(1e-9),
        Err(InvalidLimit::ZeroRate),
        "slower than one per 104 days"
    );
}

#[test]
fn no_float_rate_comes_out_faster() {
    fn property(mantissa: u32, exponent: i8) -> bool {
        let per_second = f64::from(mantissa.max(1)) * 10f64.powi(i32::from(exponent % 12));
        match Rate::from_per_second_f64(per_second) {
            Ok(rate) => rate.per_second_f64() <= per_second,
            Err(_) => true,
        }
    }
    quickcheck::QuickCheck::new().tests(5_000).quickcheck(property as fn(u32, i8) -> bool);
}

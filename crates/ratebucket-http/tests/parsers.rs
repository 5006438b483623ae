//! Every vector of the rate-limit signals reference, and arbitrary bytes never panic.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, HeaderName, HeaderValue};
use quickcheck::{Gen, QuickCheck};
use ratebucket_http::Written;
use ratebucket_http::headers::{
    ietf_quota, parse_go_duration, parse_processing_ms, parse_retry_after, parse_retry_after_ms,
    parse_should_retry, retry_after, x_ratelimit_quota,
};
use ratebucket_http::{Quota, Signals};

/// Fri, 29 Sep 2023 16:26:37 GMT.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_696_004_797)
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in pairs {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).expect("name"),
            HeaderValue::from_str(v).expect("value"),
        );
    }
    map
}

fn secs(s: f64) -> Option<Duration> {
    Some(Duration::from_secs_f64(s))
}

#[test]
fn go_durations() {
    let cases = [
        ("1s", secs(1.0)),
        ("6m0s", secs(360.0)),
        ("12ms", secs(0.012)),
        ("0s", secs(0.0)),
        ("2m52.8s", secs(172.8)),
        ("1h23m31s", secs(5011.0)),
        ("1h2m3.5s", secs(3723.5)),
        ("500us", secs(0.0005)),
        ("500µs", secs(0.0005)),
        ("9ms", secs(0.009)),
        ("547ms", secs(0.547)),
        ("7.66s", secs(7.66)),
        ("2m59.56s", secs(179.56)),
        ("55", secs(55.0)),
        ("", None),
        ("soon", None),
        ("-1s", None),
        ("1x", None),
        ("ms", None),
    ];
    for (text, want) in cases {
        let got = parse_go_duration(text.as_bytes());
        match (got, want) {
            (Some(g), Some(w)) => {
                assert!((g.as_secs_f64() - w.as_secs_f64()).abs() < 1e-9, "{text}: {g:?} != {w:?}")
            }
            _ => assert_eq!(got, want, "{text}"),
        }
    }
}

#[test]
fn retry_after_in_seconds() {
    assert_eq!(parse_retry_after(b"20", now()), secs(20.0));
    assert_eq!(parse_retry_after(b"0", now()), None, "zero: use backoff");
    assert_eq!(parse_retry_after(b"-10", now()), None, "negative: use backoff");
    assert_eq!(parse_retry_after(b"1.5", now()), secs(1.5));
    assert_eq!(parse_retry_after(b"0.00000002", now()), secs(0.00000002), "twenty nanoseconds");
    assert_eq!(
        parse_retry_after(b"0.0000000002", now()),
        None,
        "below a nanosecond: no wait, not a zero-length one"
    );
}

#[test]
fn retry_after_ms_wins_when_valid() {
    let both = headers(&[("retry-after-ms", "1500"), ("retry-after", "2")]);
    assert_eq!(retry_after(&both, now()), secs(1.5));
    let bad_ms = headers(&[("retry-after-ms", "abc"), ("retry-after", "3")]);
    assert_eq!(retry_after(&bad_ms, now()), secs(3.0));
    assert_eq!(parse_retry_after_ms(b"12.5"), secs(0.0125));
    assert_eq!(parse_retry_after_ms(b"0.0000001"), None, "below a nanosecond");
}

#[test]
fn retry_after_as_an_http_date_in_all_three_forms() {
    for date in [
        "Fri, 29 Sep 2023 16:26:57 GMT",
        "Friday, 29-Sep-23 16:26:57 GMT",
        "Fri Sep 29 16:26:57 2023",
    ] {
        assert_eq!(parse_retry_after(date.as_bytes(), now()), secs(20.0), "{date}");
    }
    assert_eq!(
        parse_retry_after(b"Fri, 29 Sep 2023 16:26:27 GMT", now()),
        None,
        "a date in the past means no wait"
    );
}

#[test]
fn absurd_retry_after_values_are_ignored() {
    for value in [
        "inf",
        "nan",
        "99999999999999999999999999999999999",
        "Fri, 29 Sep 100000 16:26:57 GMT",
        "",
        "1e9",
    ] {
        assert_eq!(parse_retry_after(value.as_bytes(), now()), None, "{value}");
    }
    for value in ["inf", "nan", "-5", "0", "abc", ""] {
        assert_eq!(parse_retry_after_ms(value.as_bytes()), None, "{value}");
    }
}

#[test]
fn x_should_retry() {
    assert_eq!(parse_should_retry(b"true"), Some(true));
    assert_eq!(parse_should_retry(b"false"), Some(false));
    assert_eq!(parse_should_retry(b"FALSE "), Some(false));
    assert_eq!(parse_should_retry(b"maybe"), None);
}

#[test]
fn openai_processing_ms() {
    let ms = |n| Some(Duration::from_millis(n));
    assert_eq!(parse_processing_ms(b"417"), ms(417));
    assert_eq!(parse_processing_ms(b" 0 "), ms(0));
    assert_eq!(parse_processing_ms(b"12.5"), Some(Duration::from_micros(12_500)));
    for garbage in [&b""[..], b"-3", b"1e3", b"NaN", b"inf", b"3ms", b"1.2.3", b"86400001"] {
        assert_eq!(parse_processing_ms(garbage), None, "{garbage:?}");
    }
    let signals = Signals::from_headers(&headers(&[("openai-processing-ms", "20")]), now());
    assert_eq!(signals.processing, ms(20));
    assert_eq!(Signals::from_headers(&headers(&[]), now()).processing, None);
}

#[test]
fn generic_x_ratelimit_with_delta_or_epoch_reset() {
    let delta = headers(&[
        ("x-ratelimit-limit", "60"),
        ("x-ratelimit-remaining", "59"),
        ("x-ratelimit-reset", "30"),
    ]);
    assert_eq!(
        x_ratelimit_quota(&delta, now()),
        Some(Quota {
            limit: Some(60),
            remaining: Some(59),
            reset: secs(30.0),
            window: None,
            written: Written::WAIT,
        })
    );
    let epoch = headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1696004827")]);
    let quota = x_ratelimit_quota(&epoch, now()).expect("quota");
    assert_eq!(quota.reset, secs(30.0));
    // The same instant in epoch milliseconds (OpenRouter), not 57,000 years away.
    let epoch_ms =
        headers(&[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "1696004827000")]);
    let quota = x_ratelimit_quota(&epoch_ms, now()).expect("quota");
    assert_eq!(quota.reset, secs(30.0));
    let negative = headers(&[("x-ratelimit-remaining", "-1")]);
    assert_eq!(x_ratelimit_quota(&negative, now()), None, "negative is unknown");
}

#[test]
fn ietf_draft_10_with_policy() {
    let h = headers(&[
        ("ratelimit-policy", r#""burst";q=100;w=60,"daily";q=1000;w=86400"#),
        ("ratelimit", r#""burst";r=50;t=30, "daily";r=900;t=3600"#),
    ]);
    assert_eq!(
        ietf_quota(&h),
        Some(Quota {
            limit: Some(100),
            remaining: Some(50),
            reset: secs(30.0),
            window: secs(60.0),
            written: Written::WAIT,
        })
    );
}

#[test]
fn ietf_retry_after_takes_precedence_and_malformed_fields_are_ignored() {
    let h = headers(&[("ratelimit", r#""default";r=0;t=10"#), ("retry-after", "20")]);
    assert_eq!(Signals::from_headers(&h, now()).server_delay(), secs(20.0));
    let only_quota = headers(&[("ratelimit", r#""default";r=0;t=10"#)]);
    assert_eq!(Signals::from_headers(&only_quota, now()).server_delay(), secs(10.0));
    let malformed = headers(&[("ratelimit", "default;r=abc")]);
    assert_eq!(ietf_quota(&malformed), None);
}

#[test]
fn ietf_older_drafts() {
    let dict = headers(&[("ratelimit", "limit=10, remaining=1, reset=7")]);
    assert_eq!(
        ietf_quota(&dict),
        Some(Quota {
            limit: Some(10),
            remaining: Some(1),
            reset: secs(7.0),
            window: None,
            written: Written::WAIT,
        })
    );
    let split = headers(&[
        ("ratelimit-limit", "10, 10;w=1"),
        ("ratelimit-remaining", "4"),
        ("ratelimit-reset", "2"),
    ]);
    assert_eq!(
        ietf_quota(&split),
        Some(Quota {
            limit: Some(10),
            remaining: Some(4),
            reset: secs(2.0),
            window: secs(1.0),
            written: Written::WAIT,
        })
    );
}

fn never_panics(name: u8, bytes: Vec<u8>) -> bool {
    let names = [
        "retry-after",
        "retry-after-ms",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-should-retry",
        "openai-processing-ms",
    ];
    let _ = parse_go_duration(&bytes);
    let _ = parse_processing_ms(&bytes);
    let _ = parse_retry_after(&bytes, now());
    let _ = parse_retry_after(&bytes, SystemTime::UNIX_EPOCH);
    let _ = parse_retry_after_ms(&bytes);
    let _ = parse_should_retry(&bytes);
    if let Ok(value) = HeaderValue::from_bytes(&bytes) {
        let mut map = HeaderMap::new();
        map.insert(names[name as usize % names.len()], value.clone());
        map.insert("ratelimit-policy", value);
        let signals = Signals::from_headers(&map, now());
        let _ = signals.server_delay();
    }
    true
}

#[test]
fn arbitrary_bytes_never_panic() {
    QuickCheck::new()
        .rng(Gen::from_size_and_seed(200, 0xbad_b17e5))
        .tests(5_000)
        .quickcheck(never_panics as fn(u8, Vec<u8>) -> bool);
}

#[test]
fn near_miss_inputs_never_panic() {
    // Shapes close to valid values, where overflow and unit bugs hide.
    for text in [
        "99999999999999999999h",
        "1.7976931348623157e308s",
        "184467440737095516160ns",
        "1.5.5s",
        "..s",
        "5m5",
        "1h-1m",
        "µs",
        "9999999999999999999999999.5",
    ] {
        let _ = parse_go_duration(text.as_bytes());
        let _ = parse_retry_after(text.as_bytes(), now());
        let _ = parse_retry_after_ms(text.as_bytes());
    }
}

/// A header sent twice with different values (a proxy adding its own): the conservative
/// reading wins, whichever came first.
#[test]
fn duplicated_headers_are_read_conservatively() {
    for (first, second) in [("10", "0"), ("0", "10")] {
        let quota = x_ratelimit_quota(
            &headers(&[
                ("x-ratelimit-limit", "100"),
                ("x-ratelimit-limit", "60"),
                ("x-ratelimit-remaining", first),
                ("x-ratelimit-remaining", second),
                ("x-ratelimit-reset", "1"),
                ("x-ratelimit-reset", "30"),
            ]),
            now(),
        )
        .expect("a quota");
        assert_eq!(quota.limit, Some(60));
        assert_eq!(quota.remaining, Some(0));
        assert_eq!(quota.reset, secs(30.0));
    }
    let waits = headers(&[("retry-after", "1"), ("retry-after", "5")]);
    assert_eq!(retry_after(&waits, now()), secs(5.0));
    let waits = headers(&[("retry-after-ms", "900"), ("retry-after-ms", "100")]);
    assert_eq!(retry_after(&waits, now()), secs(0.9));
}

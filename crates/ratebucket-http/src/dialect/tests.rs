//! The dialects' tables against each provider's header formats and error bodies.

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use quickcheck::quickcheck;

use super::*;

/// 29 Sep 2023 16:26:37 UTC, the reference's `now`.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_696_004_797)
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).expect("name"),
            value.parse().expect("value"),
        );
    }
    map
}

fn quota(limit: Option<u64>, remaining: Option<u64>, reset: Option<Duration>) -> Quota {
    Quota { limit, remaining, reset, window: None, written: Written::WAIT }
}

/// OpenAI's two families, as its headers are documented (test vector 7).
fn openai_headers() -> HeaderMap {
    headers(&[
        ("x-ratelimit-limit-requests", "60"),
        ("x-ratelimit-remaining-requests", "59"),
        ("x-ratelimit-reset-requests", "1s"),
        ("x-ratelimit-limit-tokens", "150000"),
        ("x-ratelimit-remaining-tokens", "149984"),
        ("x-ratelimit-reset-tokens", "6m0s"),
    ])
}

#[test]
fn openai_reads_requests_and_tokens_per_minute() {
    let readings = OPENAI.read(&openai_headers(), now());
    assert_eq!(
        readings,
        vec![
            Reading {
                counts: Counts::new(Unit::Requests, Per::Minute),
                quota: quota(Some(60), Some(59), Some(Duration::from_secs(1))),
                precision: 0,
            },
            Reading {
                counts: Counts::new(Unit::Tokens, Per::Minute),
                quota: quota(Some(150_000), Some(149_984), Some(Duration::from_secs(360))),
                precision: 0,
            },
        ]
    );
}

#[test]
fn groq_reads_the_same_names_as_requests_per_day() {
    let readings = GROQ.read(&openai_headers(), now());
    assert_eq!(readings[0].counts, Counts::new(Unit::Requests, Per::Day));
    assert_eq!(readings[1].counts, Counts::new(Unit::Tokens, Per::Minute));
    assert_eq!(readings[0].quota.limit, Some(60));
}

#[test]
fn azure_resets_are_seconds_and_a_negative_remaining_is_unknown() {
    let h = headers(&[
        ("x-ratelimit-limit-requests", "600"),
        ("x-ratelimit-remaining-requests", "-1"),
        ("x-ratelimit-reset-requests", "55"),
        ("x-ratelimit-remaining-tokens", "-3"),
    ]);
    let readings = AZURE.read(&h, now());
    assert_eq!(readings[0].quota, quota(Some(600), None, Some(Duration::from_secs(55))));
    // Nothing known of tokens but a negative remaining: no reading at all.
    assert_eq!(readings.len(), 1);
    // A Go duration is not Azure's format: not read as something else.
    let go = headers(&[("x-ratelimit-reset-requests", "1m0s")]);
    assert_eq!(AZURE.read(&go, now()), vec![]);
}

#[test]
fn cerebras_reads_each_period_from_its_suffix_with_float_second_resets() {
    let h = headers(&[
        ("x-ratelimit-limit-requests-day", "14400"),
        ("x-ratelimit-remaining-requests-day", "14399"),
        ("x-ratelimit-reset-requests-day", "33011.38"),
        ("x-ratelimit-limit-tokens-minute", "60000"),
        ("x-ratelimit-remaining-tokens-minute", "59000"),
        ("x-ratelimit-reset-tokens-minute", "11.38"),
    ]);
    let readings = CEREBRAS.read(&h, now());
    assert_eq!(readings.len(), 2);
    assert_eq!(readings[0].counts, Counts::new(Unit::Tokens, Per::Minute));
    assert_eq!(readings[0].quota.reset, Some(Duration::from_secs_f64(11.38)));
    assert_eq!(readings[1].counts, Counts::new(Unit::Requests, Per::Day));
    assert_eq!(readings[1].quota.limit, Some(14_400));
    // OpenAI's unsuffixed-period names are not Cerebras's: never read as its minute.
    assert_eq!(CEREBRAS.read(&openai_headers(), now()), vec![]);
}

#[test]
fn openrouter_resets_are_epoch_milliseconds() {
    let at = 1_696_004_797_000u64 + 2_500;
    let h = headers(&[
        ("X-RateLimit-Limit", "20"),
        ("X-RateLimit-Remaining", "0"),
        ("X-RateLimit-Reset", &at.to_string()),
    ]);
    let readings = OPENROUTER.read(&h, now());
    assert_eq!(
        readings[0].quota,
        Quota {
            written: Written::instant(Duration::from_millis(1)),
            ..quota(Some(20), Some(0), Some(Duration::from_millis(2_500)))
        }
    );
    assert!(OPENROUTER.throttles(StatusCode::PAYMENT_REQUIRED));
    assert!(!OPENAI.throttles(StatusCode::PAYMENT_REQUIRED));
}

#[test]
fn ietf_reads_the_policy_window() {
    let h = headers(&[
        ("RateLimit", "\"default\";r=7;t=3"),
        ("RateLimit-Policy", "\"default\";q=10;w=60"),
    ]);
    let readings = IETF.read(&h, now());
    assert_eq!(
        readings[0].quota,
        Quota {
            limit: Some(10),
            remaining: Some(7),
            reset: Some(Duration::from_secs(3)),
            window: Some(Duration::from_secs(60)),
            written: Written::WAIT,
        }
    );
    // The OpenAI dialect does not read IETF fields.
    assert_eq!(OPENAI.read(&h, now()), vec![]);
}

#[test]
fn each_reset_format_reads_its_own_shape() {
    let n = now();
    let secs = |s: f64| Some(Duration::from_secs_f64(s));
    assert_eq!(ResetFormat::GoDuration.parse(b"2m52.8s", n), secs(172.8));
    assert_eq!(ResetFormat::Seconds.parse(b"11.38", n), secs(11.38));
    assert_eq!(ResetFormat::Seconds.parse(b"6m0s", n), None);
    assert_eq!(ResetFormat::EpochSeconds.parse(b"1696004817", n), secs(20.0));
    assert_eq!(ResetFormat::EpochMillis.parse(b"1696004797500", n), secs(0.5));
    assert_eq!(ResetFormat::Rfc3339.parse(b"2023-09-29T16:26:57Z", n), secs(20.0));
    assert_eq!(ResetFormat::Rfc3339.parse(b"2023-09-29T16:26:38.25Z", n), secs(1.25));
    // In the past: whole now.
    assert_eq!(ResetFormat::Rfc3339.parse(b"2023-09-29T16:26:00Z", n), Some(Duration::ZERO));
    assert_eq!(ResetFormat::Rfc3339.parse(b"tomorrow", n), None);
    assert_eq!(ResetFormat::Any.parse(b"1696004817", n), secs(20.0));
    assert_eq!(ResetFormat::Any.parse(b"1m", n), secs(60.0));
}

/// Gemini's 429, as its OpenAI-compatible endpoint sends it.
fn gemini_429(quota_id: &str, delay: &str) -> Vec<u8> {
    serde_json::json!([{
        "error": {
            "code": 429,
            "message": "You exceeded your current quota.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{
                        "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                        "quotaId": quota_id,
                        "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                        "quotaValue": "200"
                    }]
                },
                {"@type": "type.googleapis.com/google.rpc.Help", "links": []},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
            ]
        }
    }])
    .to_string()
    .into_bytes()
}

#[test]
fn gemini_retry_delay_and_spent_quota_come_from_the_body() {
    let body = gemini_429("GenerateRequestsPerDayPerProjectPerModel-FreeTier", "38s");
    assert_eq!(GEMINI.retry_hint(&body), Some(Duration::from_secs(38)));
    assert_eq!(GEMINI.spent(&body), vec![Counts::new(Unit::Requests, Per::Day)]);
    let body = gemini_429("GenerateContentInputTokensPerModelPerMinute-FreeTier", "1.500s");
    assert_eq!(GEMINI.retry_hint(&body), Some(Duration::from_millis(1_500)));
    assert_eq!(GEMINI.spent(&body), vec![Counts::new(Unit::InputTokens, Per::Minute)]);
    // The same body as a plain object (Google's native API).
    let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let object = serde_json::to_vec(&value[0]).expect("json");
    assert_eq!(GEMINI.retry_hint(&object), Some(Duration::from_millis(1_500)));
    // Other dialects do not look there.
    assert_eq!(OPENAI.retry_hint(&body), None);
    assert_eq!(OPENAI.spent(&body), vec![]);
    for bad in ["", "-3s", "38", "nans", "1e9s", "99999999999999999999s"] {
        assert_eq!(GEMINI.retry_hint(&gemini_429("x", bad)), None, "{bad:?} is not a wait");
    }
}

#[test]
fn the_message_hint_is_read_where_the_dialect_puts_it() {
    let body = br#"{"error":{"message":"Rate limit reached for model `llama` on requests per minute (RPM): Limit 30, Used 30, Requested 1. Please try again in 7.66s.","type":"requests","code":"rate_limit_exceeded"}}"#;
    assert_eq!(GROQ.retry_hint(body), Some(Duration::from_millis(7_660)));
    assert_eq!(IETF.retry_hint(body), None);
    assert_eq!(GEMINI.retry_hint(body), None);
}

/// Azure OpenAI's and API Management's forms, and a wait in days, beside OpenAI's.
#[test]
fn every_form_of_a_wait_in_words_is_read() {
    let secs = Duration::from_secs;
    let azure = br#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 33 seconds. Please go here: https://aka.ms/oai/quotaincrease"}}"#;
    assert_eq!(AZURE.retry_hint(azure), Some(secs(33)));
    let apim =
        br#"{"statusCode": 429, "message": "Rate limit is exceeded. Try again in 50 seconds."}"#;
    assert_eq!(AZURE.retry_hint(apim), Some(secs(50)));
    let daily = br#"{"error":{"code":"429","message":"Please retry after 86400 seconds."}}"#;
    assert_eq!(AZURE.retry_hint(daily), Some(secs(86_400)));
    for (message, wait) in [
        ("Monthly usage limit reached. Resets in 16 days.", Some(secs(16 * 86_400))),
        ("Try again in 2 hours", Some(secs(7_200))),
        ("try again in 1 minute.", Some(secs(60))),
        ("Please try again in 644ms.", Some(Duration::from_millis(644))),
        ("Please try again in 0s.", None),
        ("Please retry after a while.", None),
        ("Try again in 5 fortnights.", None),
        ("Resets in 99999999999999999999999999 days.", None),
    ] {
        assert_eq!(message_wait(message), wait, "{message}");
    }
}

#[test]
fn recognised_only_where_unambiguous() {
    let cerebras = headers(&[("x-ratelimit-limit-tokens-minute", "60000")]);
    assert_eq!(Dialect::recognise(&cerebras), Some(&CEREBRAS));
    let ietf = headers(&[("RateLimit", "\"default\";r=7;t=3")]);
    assert_eq!(Dialect::recognise(&ietf), Some(&IETF));
    let openrouter = headers(&[("x-ratelimit-reset", "1696004797500")]);
    assert_eq!(Dialect::recognise(&openrouter), Some(&OPENROUTER));
    // Delta seconds in the unsuffixed family: a generic API, nobody in particular.
    assert_eq!(Dialect::recognise(&headers(&[("x-ratelimit-reset", "30")])), None);
    // OpenAI's names are Groq's and Azure's too.
    assert_eq!(Dialect::recognise(&openai_headers()), None);
    let anthropic = headers(&[("anthropic-ratelimit-requests-limit", "50")]);
    assert_eq!(Dialect::recognise(&anthropic), Some(&ANTHROPIC));
}

#[test]
fn anthropic_reads_three_buckets_rfc3339_resets_and_rounded_tokens() {
    // now = 2023-09-29T16:26:37Z.
    let map = headers(&[
        ("anthropic-ratelimit-requests-limit", "50"),
        ("anthropic-ratelimit-requests-remaining", "49"),
        ("anthropic-ratelimit-requests-reset", "2023-09-29T16:26:38Z"),
        ("anthropic-ratelimit-input-tokens-limit", "40000"),
        ("anthropic-ratelimit-input-tokens-remaining", "39000"),
        ("anthropic-ratelimit-input-tokens-reset", "2023-09-29T16:26:39.5Z"),
        ("anthropic-ratelimit-output-tokens-limit", "8000"),
        ("anthropic-ratelimit-output-tokens-remaining", "0"),
        ("anthropic-ratelimit-output-tokens-reset", "2023-09-29T16:27:37Z"),
        ("anthropic-ratelimit-tokens-limit", "48000"),
        ("anthropic-ratelimit-tokens-remaining", "39000"),
        ("anthropic-ratelimit-tokens-reset", "2023-09-29T16:26:39Z"),
        // Not Anthropic's: never read in its dialect.
        ("x-ratelimit-limit-requests", "10"),
    ]);
    let readings = ANTHROPIC.read(&map, now());
    let of =
        |unit| readings.iter().find(|r| r.counts.unit == unit).map(|r| r.quota).expect("a reading");
    assert_eq!(readings.len(), 4);
    let requests = of(Unit::Requests);
    assert_eq!((requests.limit, requests.remaining), (Some(50), Some(49)));
    assert_eq!(requests.reset, Some(Duration::from_secs(1)));
    let input = of(Unit::InputTokens);
    // 39,000 as sent, rounded to the nearest thousand: the reading says so.
    assert_eq!((input.limit, input.remaining), (Some(40_000), Some(39_000)));
    let rounded = readings.iter().find(|r| r.counts.unit == Unit::InputTokens).expect("input");
    assert_eq!(rounded.precision, 1000);
    assert_eq!(rounded.report().precision, 1000);
    // Its reset is an RFC 3339 instant (in tenths of a second here), read against the
    // clock at the reading: the form says both.
    assert!(rounded.report().reset_as_instant);
    assert_eq!(rounded.report().reset_resolution, Duration::from_millis(100));
    assert_eq!(input.reset, Some(Duration::from_millis(2_500)));
    let output = of(Unit::OutputTokens);
    assert_eq!(output.remaining, Some(0));
    assert_eq!(output.reset, Some(Duration::from_secs(60)));
    assert!(ANTHROPIC.throttles(StatusCode::from_u16(529).expect("status")));
    assert!(!OPENAI.throttles(StatusCode::from_u16(529).expect("status")));
}

/// What the form of a reset says: an instant's resolution is its last digit's, whatever
/// fraction of it the wait reads at; a wait says nothing, its values tell.
#[test]
fn a_resets_form_says_whether_it_is_an_instant_and_its_resolution() {
    let second = Duration::from_secs(1);
    for (format, value, written) in [
        (ResetFormat::Rfc3339, "2023-09-29T16:26:39Z", Written::instant(second)),
        (
            ResetFormat::Rfc3339,
            "2023-09-29T16:26:39.250Z",
            Written::instant(Duration::from_millis(1)),
        ),
        (ResetFormat::EpochMillis, "1696004799250", Written::instant(Duration::from_millis(1))),
        (ResetFormat::EpochSeconds, "1696004799", Written::instant(second)),
        (ResetFormat::GoDuration, "2m59.56s", Written::WAIT),
        (ResetFormat::Seconds, "55", Written::WAIT),
        (ResetFormat::Any, "Fri, 29 Sep 2023 16:26:57 GMT", Written::instant(second)),
        (ResetFormat::Any, "2023-09-29T16:26:57Z", Written::instant(second)),
        (ResetFormat::Any, "1696004817", Written::instant(second)),
        (ResetFormat::Any, "20", Written::WAIT),
    ] {
        assert_eq!(format.written(value.as_bytes()), written, "{format:?} {value}");
    }
}

/// A gateway's generic reset written as an RFC 3339 instant or an HTTP-date is read as
/// the wait until then (it was ignored before).
#[test]
fn a_generic_reset_written_as_a_date_is_read() {
    for reset in ["2023-09-29T16:26:57Z", "Fri, 29 Sep 2023 16:26:57 GMT"] {
        let map = headers(&[
            ("x-ratelimit-limit", "100"),
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", reset),
        ]);
        let quota = crate::headers::x_ratelimit_quota(&map, now()).expect("a quota");
        assert_eq!(quota.reset, Some(Duration::from_secs(20)), "{reset}");
        assert!(quota.written.instant, "{reset}");
        let report: ratebucket_rt::core::QuotaReport = quota.into();
        assert_eq!(report.reset_resolution, Duration::from_secs(1));
    }
}

#[test]
fn every_dialect_is_found_by_its_name() {
    for dialect in ALL {
        assert_eq!(Dialect::named(dialect.name), Some(dialect));
        assert_eq!(Dialect::named(&dialect.name.to_uppercase()), Some(dialect));
    }
    assert_eq!(Dialect::named("anthropicx"), None);
}

quickcheck! {
    /// Any bytes in any header a dialect reads, and any body: no panic, and no reset or
    /// hint beyond what the bytes could mean.
    fn no_header_or_body_makes_a_dialect_panic(values: Vec<Vec<u8>>, body: Vec<u8>) -> bool {
        let names = [
            "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests", "x-ratelimit-reset-tokens-minute",
            "x-ratelimit-reset", "ratelimit", "ratelimit-policy",
            "anthropic-ratelimit-input-tokens-remaining", "anthropic-ratelimit-requests-reset",
        ];
        let mut map = HeaderMap::new();
        for (name, value) in names.iter().cycle().zip(values) {
            if let Ok(value) = http::HeaderValue::from_bytes(&value) {
                map.append(*name, value);
            }
        }
        for dialect in ALL {
            let _ = dialect.read(&map, now());
            let _ = dialect.retry_hint(&body);
            let _ = dialect.spent(&body);
        }
        let _ = Dialect::recognise(&map);
        true
    }
}

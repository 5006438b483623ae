//! Each dialect's headers hold the shape its provider documents, resolution included: one
//! real header set per dialect (from the provider's documentation or traffic it quotes),
//! and the fake provider's own, checked against the same shape.

use std::time::Duration;

use http::StatusCode;
use ratebucket_sim::{Dialect, Headers, LimitSpec, Resets, Sim, SimConfig, SimHandle};
use serde_json::{Value, json};

mod support;

use support::{Reply, post};

/// What one header's value must look like.
#[derive(Clone, Copy, Debug)]
enum Shape {
    /// A whole number (`14400`).
    Count,
    /// A whole number that is a multiple of a thousand (Anthropic's token counts).
    Thousands,
    /// OpenAI's Go duration: whole milliseconds below a second (`547ms`), at most two
    /// decimals of seconds above (`7.66s`, `2m59.56s`, `6m0s`).
    OpenAiDuration,
    /// Whole seconds (`55`).
    WholeSeconds,
    /// Seconds with exactly two decimals (`11.38`).
    TwoDecimals,
    /// An RFC 3339 instant in UTC, in whole seconds (`2026-12-02T08:12:41Z`).
    Rfc3339Seconds,
    /// Unix time in milliseconds (13 digits).
    EpochMillis,
}

fn digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

impl Shape {
    fn holds(self, v: &str) -> bool {
        match self {
            Shape::Count | Shape::WholeSeconds => digits(v),
            Shape::Thousands => digits(v) && v.parse::<u64>().is_ok_and(|n| n % 1000 == 0),
            Shape::TwoDecimals => v
                .split_once('.')
                .is_some_and(|(whole, frac)| digits(whole) && frac.len() == 2 && digits(frac)),
            Shape::EpochMillis => digits(v) && v.len() == 13,
            Shape::Rfc3339Seconds => {
                let b = v.as_bytes();
                v.len() == 20
                    && b[4] == b'-'
                    && b[7] == b'-'
                    && b[10] == b'T'
                    && b[13] == b':'
                    && b[16] == b':'
                    && b[19] == b'Z'
                    && [0..4, 5..7, 8..10, 11..13, 14..16, 17..19]
                        .into_iter()
                        .all(|r| digits(&v[r]))
            }
            Shape::OpenAiDuration => {
                if let Some(ms) = v.strip_suffix("ms") {
                    return digits(ms) && ms.parse::<u64>().is_ok_and(|n| n < 1000);
                }
                let Some(rest) = v.strip_suffix('s') else {
                    return false;
                };
                let rest =
                    rest.split_once('h').map_or(rest, |(h, r)| if digits(h) { r } else { "x" });
                let secs =
                    rest.split_once('m').map_or(rest, |(m, r)| if digits(m) { r } else { "x" });
                match secs.split_once('.') {
                    Some((whole, frac)) => {
                        digits(whole) && (1..=2).contains(&frac.len()) && digits(frac)
                    }
                    None => digits(secs),
                }
            }
        }
    }
}

/// One dialect: the headers its provider documents on an answer (name, a real value) and
/// on a 429, and the shape each must hold.
struct Documented {
    dialect: Dialect,
    answer: &'static [(&'static str, &'static str, Shape)],
    refusal: &'static [(&'static str, &'static str, Shape)],
}

use Shape::*;

const DOCUMENTED: [Documented; 7] = [
    Documented {
        dialect: Dialect::Openai,
        answer: &[
            ("x-ratelimit-limit-requests", "60", Count),
            ("x-ratelimit-remaining-requests", "59", Count),
            ("x-ratelimit-reset-requests", "1s", OpenAiDuration),
            ("x-ratelimit-limit-tokens", "150000", Count),
            ("x-ratelimit-remaining-tokens", "149984", Count),
            ("x-ratelimit-reset-tokens", "6m0s", OpenAiDuration),
            ("openai-processing-ms", "547", Count),
        ],
        refusal: &[
            ("retry-after", "1", WholeSeconds),
            ("retry-after-ms", "644", Count),
            ("x-ratelimit-reset-requests", "547ms", OpenAiDuration),
            ("x-ratelimit-reset-tokens", "2m59.56s", OpenAiDuration),
        ],
    },
    Documented {
        dialect: Dialect::Azure,
        answer: &[
            ("x-ratelimit-limit-requests", "100", Count),
            ("x-ratelimit-remaining-requests", "99", Count),
            ("x-ratelimit-reset-requests", "55", WholeSeconds),
            ("x-ratelimit-limit-tokens", "10000", Count),
            ("x-ratelimit-remaining-tokens", "9990", Count),
            ("x-ratelimit-reset-tokens", "6", WholeSeconds),
        ],
        refusal: &[("retry-after", "33", WholeSeconds), ("retry-after-ms", "33000", Count)],
    },
    Documented {
        dialect: Dialect::Groq,
        answer: &[
            ("x-ratelimit-limit-requests", "14400", Count),
            ("x-ratelimit-remaining-requests", "14370", Count),
            ("x-ratelimit-reset-requests", "2m59.56s", OpenAiDuration),
            ("x-ratelimit-limit-tokens", "18000", Count),
            ("x-ratelimit-remaining-tokens", "17997", Count),
            ("x-ratelimit-reset-tokens", "7.66s", OpenAiDuration),
        ],
        refusal: &[("retry-after", "2", WholeSeconds)],
    },
    Documented {
        dialect: Dialect::Cerebras,
        answer: &[
            ("x-ratelimit-limit-requests-day", "14400", Count),
            ("x-ratelimit-remaining-requests-day", "14399", Count),
            ("x-ratelimit-reset-requests-day", "33011.38", TwoDecimals),
            ("x-ratelimit-limit-tokens-minute", "60000", Count),
            ("x-ratelimit-remaining-tokens-minute", "59980", Count),
            ("x-ratelimit-reset-tokens-minute", "11.38", TwoDecimals),
        ],
        refusal: &[("retry-after", "11", WholeSeconds)],
    },
    Documented {
        dialect: Dialect::Openrouter,
        answer: &[],
        refusal: &[
            ("x-ratelimit-limit", "20", Count),
            ("x-ratelimit-remaining", "0", Count),
            ("x-ratelimit-reset", "1741305600000", EpochMillis),
            ("retry-after", "12", WholeSeconds),
        ],
    },
    Documented { dialect: Dialect::Gemini, answer: &[], refusal: &[] },
    Documented {
        dialect: Dialect::Anthropic,
        answer: &[
            ("anthropic-ratelimit-requests-limit", "50", Count),
            ("anthropic-ratelimit-requests-remaining", "49", Count),
            ("anthropic-ratelimit-requests-reset", "2026-12-02T08:12:41Z", Rfc3339Seconds),
            ("anthropic-ratelimit-input-tokens-limit", "40000", Count),
            ("anthropic-ratelimit-input-tokens-remaining", "39000", Thousands),
            ("anthropic-ratelimit-input-tokens-reset", "2026-12-02T08:12:42Z", Rfc3339Seconds),
            ("anthropic-ratelimit-output-tokens-limit", "8000", Count),
            ("anthropic-ratelimit-output-tokens-remaining", "8000", Thousands),
            ("anthropic-ratelimit-output-tokens-reset", "2026-12-02T08:12:41Z", Rfc3339Seconds),
            ("anthropic-ratelimit-tokens-limit", "8000", Count),
            ("anthropic-ratelimit-tokens-remaining", "8000", Thousands),
            ("anthropic-ratelimit-tokens-reset", "2026-12-02T08:12:41Z", Rfc3339Seconds),
        ],
        refusal: &[("retry-after", "20", WholeSeconds)],
    },
];

/// Whether a header is one of the rate-limit signals a dialect sends.
fn signal(name: &str) -> bool {
    name.contains("ratelimit") || name.starts_with("retry-after") || name.ends_with("processing-ms")
}

/// The rate-limit headers of `reply`, as names.
fn signals(reply: &Reply) -> Vec<String> {
    let mut names: Vec<String> =
        reply.headers.keys().map(|k| k.as_str().to_owned()).filter(|k| signal(k)).collect();
    names.sort();
    names
}

/// A provider speaking `dialect` over minute windows, with room for two answers before
/// a 429: 2 requests a minute, 60,000 tokens (input 40,000 and output 8,000 for
/// Anthropic), and 14,400 requests a day; its resets as it writes them by default, or as
/// `finer` asks.
fn provider(dialect: Dialect, finer: Option<Resets>) -> SimHandle {
    let mut config = SimConfig::default().dialect(dialect);
    if let Some(resets) = finer {
        config = config.resets(resets);
    }
    config = config
        .completion_tokens(10, 30)
        .latency(ratebucket_sim::Latency::Fixed(Duration::from_millis(5)))
        .rpm(LimitSpec::per_minute(2));
    config = if dialect == Dialect::Anthropic {
        config.itpm(LimitSpec::per_minute(40_000)).otpm(LimitSpec::per_minute(8_000))
    } else {
        config
            .tpm(LimitSpec::per_minute(60_000))
            .rpd(LimitSpec::per_minute(14_400).window(Duration::from_secs(86_400)))
    };
    Sim::start(config).expect("sim")
}

fn request(dialect: Dialect, text: &str) -> (&'static str, Value) {
    if dialect == Dialect::Anthropic {
        let body = json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": text}]});
        ("/v1/messages", body)
    } else {
        let body = json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": text}]});
        ("/v1/chat/completions", body)
    }
}

const SIGNED: [(&str, &str); 1] = [("anthropic-version", "2023-06-01")];

/// An answer and a 429 from a provider speaking `dialect`.
async fn answer_and_refusal(dialect: Dialect, finer: Option<Resets>) -> (Reply, Reply) {
    let sim = provider(dialect, finer);
    let (path, one) = request(dialect, "one");
    let answer = post(&sim, path, &one, &SIGNED).await;
    assert_eq!(answer.status, StatusCode::OK, "{dialect:?}: {}", answer.text());
    let (_, two) = request(dialect, "two");
    post(&sim, path, &two, &SIGNED).await;
    let (_, three) = request(dialect, "three");
    let refusal = post(&sim, path, &three, &SIGNED).await;
    assert_eq!(refusal.status, StatusCode::TOO_MANY_REQUESTS, "{dialect:?}");
    (answer, refusal)
}

/// Checks that `reply` sends every documented header of `documented` in its shape (and the
/// documented value holds it too); `exact`: and no other rate-limit header.
fn holds(dialect: Dialect, reply: &Reply, documented: &[(&str, &str, Shape)], exact: bool) {
    for (name, real, shape) in documented {
        assert!(shape.holds(real), "{dialect:?}: the documented {name}: {real} is not {shape:?}");
        let ours = reply.header(name);
        assert!(shape.holds(ours), "{dialect:?}: the sim's {name}: {ours} is not {shape:?}");
    }
    if exact {
        let mut want: Vec<String> = documented.iter().map(|(n, ..)| (*n).to_owned()).collect();
        want.sort();
        assert_eq!(signals(reply), want, "{dialect:?}: the headers sent");
    }
}

#[tokio::test]
async fn every_dialect_writes_its_providers_shapes_by_default() {
    for documented in &DOCUMENTED {
        let dialect = documented.dialect;
        let (answer, refusal) = answer_and_refusal(dialect, None).await;
        holds(dialect, &answer, documented.answer, true);
        holds(dialect, &refusal, documented.refusal, false);
    }
}

#[tokio::test]
async fn finer_resets_are_an_option_that_breaks_the_shape() {
    // Proof that the shapes above can fail: the kinder resolutions do not hold them.
    let (answer, _) = answer_and_refusal(Dialect::Anthropic, Some(Resets::Fine)).await;
    let reset = answer.header("anthropic-ratelimit-requests-reset");
    assert!(!Rfc3339Seconds.holds(reset), "{reset}");
    assert_eq!(reset.len(), 24, "to the millisecond: {reset}");
    let (answer, _) = answer_and_refusal(Dialect::Azure, Some(Resets::Fine)).await;
    let reset = answer.header("x-ratelimit-reset-tokens");
    assert!(!WholeSeconds.holds(reset), "{reset}");
}

#[test]
fn openai_durations_keep_milliseconds_below_a_second_and_hundredths_above() {
    for good in ["0s", "1s", "12ms", "547ms", "7.66s", "2m52.8s", "2m59.56s", "6m0s", "1h23m31s"] {
        assert!(OpenAiDuration.holds(good), "{good}");
    }
    for bad in ["1.234s", "12.5ms", "1000ms", "6m", "soon", "1.5", "2m52.812s"] {
        assert!(!OpenAiDuration.holds(bad), "{bad}");
    }
}

#[tokio::test]
async fn gateways_write_resets_as_instants_when_told() {
    for (style, shape) in [(Headers::PlainRfc3339, "T"), (Headers::PlainHttpDate, " GMT")] {
        let sim = Sim::start(SimConfig::default().headers(style).rpm(LimitSpec::per_minute(10)))
            .expect("sim");
        let (path, body) = request(Dialect::Openai, "one");
        let answer = post(&sim, path, &body, &[]).await;
        let reset = answer.header("x-ratelimit-reset");
        assert!(reset.contains(shape), "{style:?}: {reset}");
        if style == Headers::PlainRfc3339 {
            assert!(Rfc3339Seconds.holds(reset), "{reset}");
        }
    }
}

#[tokio::test]
async fn anthropics_combined_tokens_are_sent_beside_the_requests_alone() {
    let sim = Sim::start(
        SimConfig::default()
            .dialect(Dialect::Anthropic)
            .completion_tokens(10, 30)
            .rpm(LimitSpec::per_minute(600))
            .tpm(LimitSpec::per_minute(60_000)),
    )
    .expect("sim");
    let (path, body) = request(Dialect::Anthropic, "one");
    let answer = post(&sim, path, &body, &SIGNED).await;
    assert_eq!(answer.status, StatusCode::OK);
    let names = signals(&answer);
    assert_eq!(
        names,
        [
            "anthropic-ratelimit-requests-limit",
            "anthropic-ratelimit-requests-remaining",
            "anthropic-ratelimit-requests-reset",
            "anthropic-ratelimit-tokens-limit",
            "anthropic-ratelimit-tokens-remaining",
            "anthropic-ratelimit-tokens-reset",
        ]
    );
    assert_eq!(answer.header("anthropic-ratelimit-tokens-limit"), "60000");
    // Input and output are counted together, the output settled to what was produced.
    let entry = &sim.log()[0];
    assert_eq!(entry.tokens_charged, entry.prompt_tokens + entry.completion_tokens);
}

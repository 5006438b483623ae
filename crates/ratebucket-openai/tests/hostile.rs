//! Hostile providers: a scripted raw server on 127.0.0.1 answers with malformed or absurd
//! headers, bodies that are not what they claim, streams that stall, flood or lie,
//! silence and resets; and clients are misconfigured. Every case runs under a time bound:
//! a panic or a hang fails it. Each case also checks what the library promises for it.

use std::future::Future;
use std::time::Duration;

use futures_lite::StreamExt;
use ratebucket_http::{FetchConfig, FetchErrorKind, HyperTransport};
use ratebucket_openai::{
    Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig, OpenAiError, TOKENS,
};
use ratebucket_rt::core::{ArbiterConfig, Class, GateConfig, Instant, RetryPolicy, StopReason};
use ratebucket_sim::{Scripted, ScriptedHandle, Step};

/// Every case must end within this.
const BOUND: Duration = Duration::from_secs(10);

const COMPLETION: &str = r#"{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;
const CHUNK: &str = r#"{"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}"#;
const USAGE_CHUNK: &str = r#"{"id":"c","object":"chat.completion.chunk","created":0,"model":"m","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;

fn ok() -> Step {
    Step::json(200, &[], COMPLETION)
}

/// Fast refill: retries and pauses cost milliseconds.
fn limits() -> Limits {
    Limits::per_minute(6_000, 600_000).window(Duration::from_secs(1))
}

/// A small token bucket refilling 10,000 a second: an absurd charge of its whole capacity
/// is repaid in a tenth of a second.
fn small_limits() -> Limits {
    Limits::per_minute(6_000, 10_000).window(Duration::from_secs(1))
}

/// So slow a refill (a tenth of a token a second) that what a failed call kept charged
/// is still visible when it returns.
fn slow_limits() -> Limits {
    Limits::per_minute(6_000, 600).window(Duration::from_secs(3_600))
}

fn config(base: String, auth: Auth) -> OpenAiConfig {
    let mut retry = RetryPolicy::default();
    retry.base_backoff = Duration::from_millis(2);
    retry.max_backoff = Duration::from_millis(10);
    retry.retry_after_ceiling = Duration::from_secs(5);
    OpenAiConfig::new(Endpoint::OpenAi(base), auth)
        .fetch(FetchConfig::default().retry(retry).read_timeout(Duration::from_millis(300)))
        .stream_idle_timeout(Some(Duration::from_millis(300)))
}

fn client_on(limits: Limits, config: OpenAiConfig) -> Client<HyperTransport> {
    // A short default pause, so a 429 without a usable Retry-After costs 50 ms, not 1 s.
    let gate = GateConfig {
        default_pause: Duration::from_millis(50),
        max_pause: Duration::from_secs(120),
    };
    let limiter = ratebucket_tokio::limiter_with(
        limits.buckets(Instant::ZERO).expect("limits"),
        ArbiterConfig::default().with_gate(gate),
    )
    .expect("limiter");
    Client::new(HyperTransport::new(Duration::from_millis(300)), limiter, limits, config)
}

fn client_with(config: OpenAiConfig) -> Client<HyperTransport> {
    client_on(limits(), config)
}

fn client(server: &ScriptedHandle) -> Client<HyperTransport> {
    client_with(config(server.base_url(), Auth::Bearer("sk-test".into())))
}

/// A client whose charges stay visible (see [`slow_limits`]).
fn slow_client(server: &ScriptedHandle) -> Client<HyperTransport> {
    client_on(slow_limits(), config(server.base_url(), Auth::Bearer("sk-test".into())))
}

/// Tokens charged since `before`.
fn charged(client: &Client<HyperTransport>, before: f64) -> f64 {
    before - client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens")
}

fn prompt() -> ChatRequest {
    ChatRequest::new("m", vec![Message::user("Hello there.")]).max_tokens(50)
}

/// Runs `case` under the bound; a hang fails with the case's name.
async fn bounded<T>(name: &str, case: impl Future<Output = T>) -> T {
    match tokio::time::timeout(BOUND, case).await {
        Ok(result) => result,
        Err(_) => panic!("{name}: still running after {BOUND:?}"),
    }
}

/// A server answering the first request with `first` and every later one with `then`.
fn first_then(first: Vec<Step>, then: Vec<Step>) -> ScriptedHandle {
    Scripted::start(move |n, _| if n == 0 { first.clone() } else { then.clone() })
        .expect("scripted server")
}

fn stop_reason(error: &OpenAiError) -> Option<StopReason> {
    match error {
        OpenAiError::Fetch(e) => match e.kind() {
            FetchErrorKind::Failed(reason) | FetchErrorKind::Aborted(reason) => Some(*reason),
            _ => None,
        },
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------
// Headers: Retry-After and its friends on a 429, then a success.

/// (name, header, value, whether the call still succeeds)
const RETRY_HEADERS: &[(&str, &str, &str, bool)] = &[
    ("seconds", "retry-after", "0.05", true),
    ("zero seconds", "retry-after", "0", true),
    ("negative seconds", "retry-after", "-5", true),
    ("garbage seconds", "retry-after", "soon", true),
    ("exponent", "retry-after", "1e3", true),
    ("infinity", "retry-after", "inf", true),
    ("nan", "retry-after", "NaN", true),
    ("sub-nanosecond", "retry-after", "0.0000000001", true),
    ("twenty nanoseconds", "retry-after", "0.00000002", true),
    ("empty", "retry-after", "", true),
    ("spaces", "retry-after", "   ", true),
    ("a date in the past", "retry-after", "Fri, 29 Sep 2000 16:26:27 GMT", true),
    ("a malformed date", "retry-after", "Fri, 31 Feb 2023 99:99:99 GMT", true),
    ("a date far ahead", "retry-after", "Fri, 29 Sep 2090 16:26:27 GMT", false),
    ("a week", "retry-after", "604800", false),
    ("u64 max", "retry-after", "18446744073709551615", false),
    ("beyond u64", "retry-after", "99999999999999999999999999", true),
    ("a long float", "retry-after", "123456789012345678901234567890.5", true),
    ("ms", "retry-after-ms", "20", true),
    ("ms fractional", "retry-after-ms", "12.5", true),
    ("ms sub-nanosecond", "retry-after-ms", "0.0000001", true),
    ("ms negative", "retry-after-ms", "-20", true),
    ("ms garbage", "retry-after-ms", "twenty", true),
    ("ms huge", "retry-after-ms", "1e308", true),
    ("ms an hour", "retry-after-ms", "3600000", false),
    ("openai reset", "x-ratelimit-reset-requests", "20ms", true),
    ("openai reset garbage", "x-ratelimit-reset-requests", "6m0x", true),
    ("openai reset huge", "x-ratelimit-reset-tokens", "99999999h", true),
    ("generic reset epoch ms", "x-ratelimit-reset", "1791331200000", true),
    ("generic reset epoch s", "x-ratelimit-reset", "1791331200", true),
    ("generic reset negative", "x-ratelimit-reset", "-1", true),
    ("ietf", "ratelimit", "limit=10, remaining=0, reset=0", true),
    ("ietf garbage", "ratelimit", "limit=, remaining=((, reset", true),
    // The body's rate_limit_exceeded outranks the header.
    ("should-retry false", "x-should-retry", "false", true),
    ("should-retry garbage", "x-should-retry", "perhaps", true),
];

#[tokio::test]
async fn retry_headers_on_a_429_never_wedge_the_client() {
    for &(name, header, value, succeeds) in RETRY_HEADERS {
        let server = first_then(
            vec![Step::json(
                429,
                &[(header, value)],
                r#"{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}"#,
            )],
            vec![ok()],
        );
        let client = client(&server);
        let result = bounded(name, client.complete(prompt())).await;
        assert_eq!(result.is_ok(), succeeds, "{name}: {result:?}");
        // Whatever the header said, nothing hangs and the run is not aborted: a wait
        // beyond the ceiling spends the quota until then (every call fails at once,
        // nothing is sent), until it resets or the limiter is resumed.
        assert!(!client.limiter().snapshot().aborted, "{name}: aborted the run");
        if let Err(error) = &result {
            assert_eq!(error.problem(), ratebucket_openai::Problem::QuotaSpent, "{name}");
            let next = bounded(name, client.complete(prompt())).await;
            assert!(
                next.as_ref().is_err_and(|e| e.problem() == ratebucket_openai::Problem::QuotaSpent),
                "{name}: the next call was sent: {next:?}"
            );
            client.limiter().resume();
        }
        let next = bounded(name, client.complete(prompt())).await;
        assert!(next.is_ok(), "{name}: the next call failed: {next:?}");
    }
}

/// Absurd quota headers on successful replies.
const QUOTA_HEADERS: &[(&str, &str, &str)] = &[
    ("limit zero", "x-ratelimit-limit-tokens", "0"),
    ("limit negative", "x-ratelimit-limit-tokens", "-1"),
    ("limit huge", "x-ratelimit-limit-tokens", "18446744073709551615"),
    ("limit beyond u64", "x-ratelimit-limit-tokens", "99999999999999999999999"),
    ("limit float", "x-ratelimit-limit-tokens", "1.5e9"),
    ("remaining huge", "x-ratelimit-remaining-tokens", "18446744073709551615"),
    ("remaining negative", "x-ratelimit-remaining-tokens", "-5"),
    ("remaining zero", "x-ratelimit-remaining-requests", "0"),
    ("remaining garbage", "x-ratelimit-remaining-requests", "lots"),
    ("requests limit one", "x-ratelimit-limit-requests", "1"),
    ("reset zero", "x-ratelimit-reset-requests", "0s"),
    ("reset absurd", "x-ratelimit-reset-tokens", "9999999999999999999s"),
    ("generic limit huge", "x-ratelimit-limit", "18446744073709551615"),
    ("generic remaining zero", "x-ratelimit-remaining", "0"),
    ("ietf policy garbage", "ratelimit-policy", "\"x\";q=;w=0"),
];

#[tokio::test]
async fn absurd_quota_headers_on_successes_never_wedge_the_client() {
    for &(name, header, value) in QUOTA_HEADERS {
        let server =
            Scripted::start(move |_, _| vec![Step::json(200, &[(header, value)], COMPLETION)])
                .expect("scripted server");
        let client = client(&server);
        for call in 0..3 {
            let result = bounded(name, client.complete(prompt())).await;
            assert!(result.is_ok(), "{name}, call {call}: {result:?}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Bodies.

/// (name, status, body, the class the call ends with; `None` for success)
const BODIES: &[(&str, u16, &str, Option<Class>)] = &[
    ("an empty object", 200, "{}", Some(Class::Ambiguous)),
    (
        "an error in a 200",
        200,
        r#"{"error":{"message":"upstream failed","type":"server_error"}}"#,
        Some(Class::Ambiguous),
    ),
    ("a null", 200, "null", Some(Class::Ambiguous)),
    ("an array", 200, "[]", Some(Class::Ambiguous)),
    ("a string", 200, r#""hello""#, Some(Class::Ambiguous)),
    // A 2xx that is not a completion was taken, and probably billed: ambiguous, however
    // it fails to decode.
    ("not json", 200, "<html>gateway</html>", Some(Class::Ambiguous)),
    (
        "cut short",
        200,
        r#"{"choices":[{"index":0,"message":{"role":"assis"#,
        Some(Class::Ambiguous),
    ),
    (
        "an event stream to a plain call",
        200,
        "data: {\"choices\":[]}\n\ndata: [DONE]\n\n",
        Some(Class::Ambiguous),
    ),
    ("choices null", 200, r#"{"choices":null}"#, Some(Class::Ambiguous)),
    (
        "an error null",
        200,
        r#"{"error":null,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}"#,
        None,
    ),
    (
        "no usage",
        200,
        r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"ok"}}]}"#,
        None,
    ),
    ("usage null", 200, r#"{"choices":[],"usage":null}"#, None),
    (
        "usage u64 max",
        200,
        r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":18446744073709551615}}"#,
        None,
    ),
    (
        "usage wraps",
        200,
        r#"{"choices":[],"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":1,"total_tokens":0}}"#,
        None,
    ),
    (
        "usage negative",
        200,
        r#"{"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":5,"total_tokens":4}}"#,
        None,
    ),
    ("usage strings", 200, r#"{"choices":[],"usage":{"total_tokens":"many"}}"#, None),
    (
        "insufficient quota, null message",
        429,
        r#"{"error":{"message":null,"type":"insufficient_quota","code":"insufficient_quota"}}"#,
        Some(Class::Spent),
    ),
    (
        "a 400 full of nulls",
        400,
        r#"{"error":{"message":null,"type":null,"param":null,"code":null}}"#,
        Some(Class::Permanent),
    ),
    ("a 404 in html", 404, "<h1>Not found</h1>", Some(Class::Permanent)),
    (
        "a 401",
        401,
        r#"{"error":{"message":"bad key","type":"invalid_request_error","code":"invalid_api_key"}}"#,
        Some(Class::Fatal),
    ),
    ("a plain 403", 403, r#"{"error":{"message":"forbidden"}}"#, Some(Class::Fatal)),
    ("a 418", 418, "teapot", Some(Class::Permanent)),
];

#[tokio::test]
async fn bodies_that_lie_get_their_class_and_never_wedge_the_client() {
    for &(name, status, body, class) in BODIES {
        let server = first_then(vec![Step::json(status, &[], body)], vec![ok()]);
        let client =
            client_on(small_limits(), config(server.base_url(), Auth::Bearer("sk-test".into())));
        let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
        let result = bounded(name, client.complete(prompt())).await;
        match class {
            None => assert!(result.is_ok(), "{name}: {result:?}"),
            Some(class) => {
                let error = result.expect_err(name);
                assert_eq!(error.class(), Some(class), "{name}: {error}");
            }
        }
        // One reply charges at most four times its reservation, or the bucket's capacity:
        // never a debt that outlives the run.
        let reserved = client.estimate(&prompt()) as f64;
        let capacity = small_limits().tokens_per_minute.expect("tokens").div_ceil(6) as f64;
        let charged = charged(&client, before);
        assert!(
            charged <= (4.0 * reserved).max(capacity) + 1.0,
            "{name}: charged {charged} for a reservation of {reserved}"
        );
        let snapshot = client.limiter().snapshot();
        if !snapshot.aborted && !snapshot.spent {
            let next = bounded(name, client.complete(prompt())).await;
            assert!(next.is_ok(), "{name}: the next call failed: {next:?}");
        }
    }
}

#[tokio::test]
async fn status_codes_that_invite_a_retry_are_retried() {
    for (name, first) in [
        ("409 conflict", Step::json(409, &[], r#"{"error":{"message":"lock timeout"}}"#)),
        (
            "403 with retry-after",
            Step::json(403, &[("retry-after", "0.05")], r#"{"message":"secondary rate limit"}"#),
        ),
        (
            "403 with nothing remaining",
            Step::json(
                403,
                &[("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", "0.05")],
                r#"{"message":"API rate limit exceeded"}"#,
            ),
        ),
        (
            "403 with OpenAI's requests at zero",
            Step::json(
                403,
                &[("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "50ms")],
                r#"{"message":"API rate limit exceeded"}"#,
            ),
        ),
        ("503 with retry-after", Step::json(503, &[("retry-after", "0.05")], "{}")),
        ("500", Step::json(500, &[], "{}")),
        ("529 overloaded", Step::json(529, &[], "{}")),
        ("408", Step::json(408, &[], "{}")),
    ] {
        let server = first_then(vec![first], vec![ok()]);
        let client = client(&server);
        let done = bounded(name, client.complete(prompt())).await;
        let done = done.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(done.attempts, 2, "{name}");
        assert!(!client.limiter().snapshot().aborted, "{name}");
    }
}

// ---------------------------------------------------------------------------------------
// Streams.

fn sse(events: &[&str]) -> String {
    events.iter().map(|e| format!("data: {e}\n\n")).collect()
}

/// Reads a whole stream: the chunks' text and the error it ended with, if any.
async fn drain(
    client: &Client<HyperTransport>,
) -> Result<(usize, Option<OpenAiError>), OpenAiError> {
    let mut stream = client.stream(prompt()).await?;
    let mut chunks = 0;
    while let Some(item) = stream.next().await {
        match item {
            Ok(_) => chunks += 1,
            Err(e) => return Ok((chunks, Some(e))),
        }
    }
    Ok((chunks, None))
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum StreamEnd {
    Clean,
    Cut,
    Error,
    TimedOut,
    Protocol,
    Decode,
}

fn stream_cases() -> Vec<(&'static str, Vec<Step>, usize, StreamEnd)> {
    let head = || Step::sse_head(&[]);
    let text = |s: String| Step::Write(s.into_bytes());
    vec![
        (
            "clean",
            vec![head(), text(sse(&[CHUNK, CHUNK, USAGE_CHUNK, "[DONE]"]))],
            3,
            StreamEnd::Clean,
        ),
        (
            "a byte order mark first",
            vec![
                head(),
                Step::Write(b"\xEF\xBB\xBF".to_vec()),
                text(sse(&[CHUNK, USAGE_CHUNK, "[DONE]"])),
            ],
            2,
            StreamEnd::Clean,
        ),
        (
            "a null error",
            vec![
                head(),
                text(sse(&[
                    r#"{"error":null,"choices":[{"index":0,"delta":{"content":"x"}}]}"#,
                    USAGE_CHUNK,
                    "[DONE]",
                ])),
            ],
            2,
            StreamEnd::Clean,
        ),
        (
            "crlf lines",
            vec![head(), text(format!("data: {CHUNK}\r\n\r\ndata: [DONE]\r\n\r\n"))],
            1,
            StreamEnd::Clean,
        ),
        (
            "comments and keep-alives",
            vec![head(), text(format!(": ping\n\n: ping\n\ndata: {CHUNK}\n\ndata: [DONE]\n\n"))],
            1,
            StreamEnd::Clean,
        ),
        (
            "split in single bytes",
            {
                let mut steps = vec![head()];
                steps.extend(sse(&[CHUNK, "[DONE]"]).bytes().map(|b| Step::Write(vec![b])));
                steps
            },
            1,
            StreamEnd::Clean,
        ),
        ("no done", vec![head(), text(sse(&[CHUNK, USAGE_CHUNK]))], 2, StreamEnd::Cut),
        (
            "cut mid-event",
            vec![head(), text(format!("data: {CHUNK}\n\ndata: {{\"choi"))],
            1,
            StreamEnd::Cut,
        ),
        ("reset mid-stream", vec![head(), text(sse(&[CHUNK])), Step::Reset], 1, StreamEnd::Cut),
        (
            "an error chunk",
            vec![head(), text(sse(&[CHUNK, r#"{"error":{"message":"overloaded"}}"#, "[DONE]"]))],
            1,
            StreamEnd::Error,
        ),
        ("garbage json", vec![head(), text(sse(&["{not json", "[DONE]"]))], 0, StreamEnd::Decode),
        (
            "stall after the head",
            vec![head(), Step::Sleep(Duration::from_secs(30))],
            0,
            StreamEnd::TimedOut,
        ),
        (
            "stall mid-stream",
            vec![head(), text(sse(&[CHUNK])), Step::Sleep(Duration::from_secs(30))],
            1,
            StreamEnd::TimedOut,
        ),
        (
            "a trickle of keep-alives",
            {
                let mut steps = vec![head()];
                for _ in 0..5 {
                    steps.push(Step::Sleep(Duration::from_millis(100)));
                    steps.push(Step::text(": ping\n\n"));
                }
                steps.push(text(sse(&[CHUNK, "[DONE]"])));
                steps
            },
            1,
            StreamEnd::Clean,
        ),
        (
            "a flood with no line end",
            vec![head(), Step::Write(vec![b'x'; 2 << 20])],
            0,
            StreamEnd::Protocol,
        ),
        (
            "a flood of data lines",
            vec![head(), text("data: x\n".repeat(600_000))],
            0,
            StreamEnd::Protocol,
        ),
    ]
}

#[tokio::test]
async fn streams_that_stall_flood_or_lie_end_cleanly_or_with_their_error() {
    for (name, steps, expected_chunks, end) in stream_cases() {
        let server = Scripted::start(move |_, _| steps.clone()).expect("scripted server");
        let mut config = config(server.base_url(), Auth::Bearer("sk-test".into()));
        config.max_event_bytes = 1 << 20;
        let client = client_on(slow_limits(), config);
        let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
        let (chunks, error) = bounded(name, drain(&client))
            .await
            .unwrap_or_else(|e| panic!("{name}: did not open: {e}"));
        assert_eq!(chunks, expected_chunks, "{name}");
        let got = match &error {
            None => StreamEnd::Clean,
            Some(OpenAiError::StreamCut) => StreamEnd::Cut,
            Some(OpenAiError::StreamError(_)) => StreamEnd::Error,
            Some(OpenAiError::StreamTimedOut { .. }) => StreamEnd::TimedOut,
            Some(OpenAiError::StreamProtocol(_)) => StreamEnd::Protocol,
            Some(OpenAiError::Decode(_)) => StreamEnd::Decode,
            Some(other) => panic!("{name}: unexpected {other}"),
        };
        assert_eq!(got, end, "{name}: {error:?}");
        if end != StreamEnd::Clean {
            // Sent and maybe billed: the estimate stays charged.
            let charged = charged(&client, before);
            let estimate = client.estimate(&prompt()) as f64;
            assert!(charged >= estimate - 1.0, "{name}: charged {charged}, reserved {estimate}");
        }
    }
}

/// A server (or a proxy) that does not stream answers a streaming call with a plain
/// completion: that is what the error says, not a stream cut before `[DONE]`.
#[tokio::test]
async fn a_stream_answered_with_a_plain_completion_says_so() {
    let server = Scripted::start(|_, _| vec![ok()]).expect("scripted server");
    let client =
        client_on(slow_limits(), config(server.base_url(), Auth::Bearer("sk-test".into())));
    let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
    let error = bounded("plain", client.stream(prompt())).await.expect_err("not a stream");
    assert!(
        matches!(&error, OpenAiError::NotAStream(kind) if kind.contains("application/json")),
        "{error}"
    );
    assert_eq!(error.class(), Some(Class::Ambiguous), "{error}");
    assert!(error.to_string().contains("not an event stream"), "{error}");
    let charged = charged(&client, before);
    let estimate = client.estimate(&prompt()) as f64;
    assert!(charged >= estimate - 1.0, "taken: charged {charged}, reserved {estimate}");
}

#[tokio::test]
async fn a_whole_stream_deadline_ends_a_slow_but_steady_stream() {
    let server = Scripted::start(|_, _| {
        let mut steps = vec![Step::sse_head(&[])];
        for _ in 0..50 {
            steps.push(Step::Sleep(Duration::from_millis(50)));
            steps.push(Step::text(&sse(&[CHUNK])));
        }
        steps
    })
    .expect("scripted server");
    let config = config(server.base_url(), Auth::Bearer("sk-test".into()))
        .stream_deadline(Some(Duration::from_millis(400)));
    let client = client_with(config);
    let (chunks, error) = bounded("deadline", drain(&client)).await.expect("opens");
    assert!(matches!(error, Some(OpenAiError::StreamTimedOut { idle: false })), "{error:?}");
    assert!((3..20).contains(&chunks), "{chunks} chunks in 400 ms");
}

/// Streams that fail before their first event: a cut right after the head, a cut after a
/// keep-alive comment (bytes, but no event), and silence past the idle timeout.
fn failures_before_content() -> Vec<(&'static str, Vec<Step>)> {
    vec![
        ("cut after the head", vec![Step::sse_head(&[]), Step::Reset]),
        (
            "cut after a comment",
            vec![Step::sse_head(&[]), Step::text(": keep-alive\n\n"), Step::Reset],
        ),
        ("silent after the head", vec![Step::sse_head(&[]), Step::Sleep(Duration::from_secs(30))]),
    ]
}

#[tokio::test]
async fn a_stream_that_fails_before_its_first_event_is_sent_again_when_ambiguous_retries_are_on() {
    let clean = vec![Step::sse_head(&[]), Step::text(&sse(&[CHUNK, USAGE_CHUNK, "[DONE]"]))];
    for (name, first) in failures_before_content() {
        let server = first_then(first, clean.clone());
        let mut config = config(server.base_url(), Auth::Bearer("sk-test".into()));
        config.fetch.retry = config.fetch.retry.with_retry_ambiguous(true);
        // Room for two estimates, refilled at a token every six seconds: what stays
        // charged is still visible at the end.
        let limits = Limits::per_minute(6_000, 6_000).window(Duration::from_secs(3_600));
        let client = client_on(limits, config);
        let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
        let mut stream =
            bounded(name, client.stream(prompt())).await.unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut chunks = 0;
        while let Some(item) = bounded(name, stream.next()).await {
            item.unwrap_or_else(|e| panic!("{name}: {e}"));
            chunks += 1;
        }
        assert_eq!(chunks, 2, "{name}");
        assert_eq!(server.requests(), 2, "{name}: sent again once");
        assert_eq!(stream.attempts(), 2, "{name}");
        drop(stream);
        // The first opening may have been counted: its estimate stays charged, and the
        // second is charged its reported usage.
        let charged = charged(&client, before);
        let estimate = client.estimate(&prompt()) as f64;
        assert!(
            charged >= estimate + 15.0 - 1.0,
            "{name}: charged {charged}, first estimate {estimate} + usage 15"
        );
    }
}

#[tokio::test]
async fn a_stream_that_fails_before_its_first_event_is_not_sent_again_by_default() {
    for (name, first) in failures_before_content() {
        let server = first_then(first, vec![ok()]);
        let client = slow_client(&server);
        let result = bounded(name, drain(&client)).await;
        assert!(
            matches!(
                result,
                Ok((0, Some(OpenAiError::StreamCut | OpenAiError::StreamTimedOut { idle: true })))
            ),
            "{name}: {result:?}"
        );
        assert_eq!(server.requests(), 1, "{name}: not re-sent");
    }
}

// ---------------------------------------------------------------------------------------
// Silent and broken servers.

fn silent_cases() -> Vec<(&'static str, Vec<Step>, Class)> {
    vec![
        ("never answers", vec![Step::Sleep(Duration::from_secs(30))], Class::Ambiguous),
        ("resets at once", vec![Step::Reset], Class::Ambiguous),
        ("closes at once", vec![], Class::Ambiguous),
        ("not http", vec![Step::text("SSH-2.0-OpenSSH_9.6\r\n")], Class::Ambiguous),
        ("a bad status line", vec![Step::text("HTTP/1.1 abc OK\r\n\r\n")], Class::Ambiguous),
        (
            "a head, then silence",
            vec![
                Step::text("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"choi"),
                Step::Sleep(Duration::from_secs(30)),
            ],
            Class::Ambiguous,
        ),
        (
            "a short body",
            vec![Step::text(
                "HTTP/1.1 200 OK\r\ncontent-length: 1000\r\nconnection: close\r\n\r\n{}",
            )],
            Class::Ambiguous,
        ),
        (
            "a cut chunked body",
            vec![Step::text(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\n{\"choices\":[",
            )],
            Class::Ambiguous,
        ),
        ("a half head", vec![Step::text("HTTP/1.1 200 OK\r\ncontent-ty")], Class::Ambiguous),
        (
            "a slow trickle of head",
            vec![Step::text("HTTP/1.1 2"), Step::Sleep(Duration::from_secs(30))],
            Class::Ambiguous,
        ),
    ]
}

#[tokio::test]
async fn silent_and_broken_servers_are_ambiguous_charged_and_not_resent() {
    for (name, steps, class) in silent_cases() {
        let server = Scripted::start(move |_, _| steps.clone()).expect("scripted server");
        let client = slow_client(&server);
        let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
        let error = bounded(name, client.complete(prompt())).await.expect_err(name);
        assert_eq!(error.class(), Some(class), "{name}: {error}");
        assert_eq!(server.requests(), 1, "{name}: re-sent");
        let charged = charged(&client, before);
        let estimate = client.estimate(&prompt()) as f64;
        assert!(charged >= estimate - 1.0, "{name}: charged {charged} of {estimate}");
    }
}

// ---------------------------------------------------------------------------------------
// Misconfiguration: a clear error before anything is reserved or sent.

#[tokio::test]
async fn misconfiguration_is_an_error_before_anything_is_sent() {
    let server = Scripted::start(|_, _| vec![ok()]).expect("scripted server");
    let cases: Vec<(&str, Endpoint, Auth)> = vec![
        ("not a url", Endpoint::Url("not a url".into()), Auth::None),
        ("no scheme", Endpoint::Url("127.0.0.1:80/v1/chat/completions".into()), Auth::None),
        ("ftp", Endpoint::Url("ftp://127.0.0.1/v1".into()), Auth::None),
        ("a space", Endpoint::OpenAi("http://127.0.0.1 :80".into()), Auth::None),
        ("empty", Endpoint::Url(String::new()), Auth::None),
        (
            "a key with a newline",
            Endpoint::OpenAi(server.base_url()),
            Auth::Bearer("sk-abc\n".into()),
        ),
        (
            "a key with a carriage return",
            Endpoint::OpenAi(server.base_url()),
            Auth::Bearer("sk-\rabc".into()),
        ),
        (
            "an api-key with a newline",
            Endpoint::OpenAi(server.base_url()),
            Auth::ApiKey("abc\ndef".into()),
        ),
        ("a key with a nul", Endpoint::OpenAi(server.base_url()), Auth::Bearer("sk-\0".into())),
    ];
    for (name, endpoint, auth) in cases {
        let client = client_with(OpenAiConfig::new(endpoint, auth));
        let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
        let error = bounded(name, client.complete(prompt())).await.expect_err(name);
        assert!(matches!(error, OpenAiError::Config(_)), "{name}: {error}");
        let error = bounded(name, client.stream(prompt())).await.expect_err(name);
        assert!(matches!(error, OpenAiError::Config(_)), "{name}: {error}");
        assert_eq!(
            client.limiter().dimension(TOKENS).map(|v| v.state.level),
            Some(before),
            "{name}: reserved"
        );
    }
    assert_eq!(server.requests(), 0, "nothing was sent");
}

#[tokio::test]
async fn a_capacity_for_a_missing_dimension_is_an_error() {
    let client =
        client_with(OpenAiConfig::new(Endpoint::Url("http://127.0.0.1:9".into()), Auth::None));
    for dimension in [2, 7, usize::MAX] {
        assert!(client.limiter().set_limit(dimension, None, Some(10)).is_err(), "{dimension}");
    }
}

/// An hour's wait is not a pause: the quota is spent until then, for every call, and none
/// is sent to meet the same refusal.
#[tokio::test]
async fn a_retry_after_beyond_the_ceiling_spends_the_quota_until_then() {
    let server = first_then(
        vec![Step::json(
            429,
            &[("retry-after", "3600")],
            r#"{"error":{"message":"slow down","code":"rate_limit_exceeded"}}"#,
        )],
        vec![ok()],
    );
    let client = client(&server);
    let error = bounded("ceiling", client.complete(prompt())).await.expect_err("beyond");
    assert!(
        matches!(
            stop_reason(&error),
            Some(StopReason::Spent(Some(wait))) if wait == Duration::from_secs(3_600)
        ),
        "{error}"
    );
    assert_eq!(error.problem(), ratebucket_openai::Problem::QuotaSpent);
    assert!(!client.limiter().snapshot().aborted);
    let sent = server.requests();
    let next = bounded("after", client.complete(prompt())).await.expect_err("spent");
    assert_eq!(next.problem(), ratebucket_openai::Problem::QuotaSpent, "{next}");
    assert!(next.to_string().contains("resets in 59m"), "says when: {next}");
    assert_eq!(server.requests(), sent, "nothing more was sent");
    // Someone says it is over: calls go again.
    client.limiter().resume();
    assert!(bounded("resumed", client.complete(prompt())).await.is_ok());
}

#[test]
fn there_are_at_least_a_hundred_hostile_cases() {
    let cases = RETRY_HEADERS.len()
        + QUOTA_HEADERS.len()
        + BODIES.len()
        + 7
        + stream_cases().len()
        + 1
        + 2 * failures_before_content().len()
        + silent_cases().len()
        + 9
        + 3
        + 1
        + 10;
    eprintln!("{cases} hostile cases");
    assert!(cases >= 100, "{cases} cases");
}

// ---------------------------------------------------------------------------------------
// The same faults from the fake provider, on its real limits and log.

/// What a case's call must end with.
type Expect = fn(&Result<(), OpenAiError>) -> bool;

#[tokio::test]
async fn the_fake_providers_faults_are_survived() {
    use ratebucket_sim::{Fault, Sim, SimConfig, Trigger};
    let stall = Duration::from_secs(30);
    // (name, fault, streamed, what the call ends with)
    let cases: Vec<(&str, Fault, bool, Expect)> = vec![
        (
            "stall after the head, plain",
            Fault::StallAfterHead { stall },
            false,
            |r| matches!(r, Err(e) if e.class() == Some(Class::Ambiguous)),
        ),
        ("stall after the head, streamed", Fault::StallAfterHead { stall }, true, |r| {
            matches!(r, Err(OpenAiError::StreamTimedOut { idle: true }))
        }),
        ("stall mid-stream", Fault::StallMidStream { stall }, true, |r| {
            matches!(r, Err(OpenAiError::StreamTimedOut { idle: true }))
        }),
        (
            "stall mid-body",
            Fault::StallMidStream { stall },
            false,
            |r| matches!(r, Err(e) if e.class() == Some(Class::Ambiguous)),
        ),
        ("an error in a 200", Fault::ErrorIn200, false, |r| {
            matches!(r, Err(OpenAiError::NotACompletion(Some(_))))
        }),
        ("an error as the first event", Fault::ErrorIn200, true, |r| {
            matches!(r, Err(OpenAiError::StreamError(_)))
        }),
        ("absurd usage, plain", Fault::AbsurdUsage, false, Result::is_ok),
        ("absurd usage, streamed", Fault::AbsurdUsage, true, Result::is_ok),
        ("a flood, streamed", Fault::Flood { bytes: 2 << 20 }, true, |r| {
            matches!(r, Err(OpenAiError::StreamProtocol(_)))
        }),
        ("a flood, plain", Fault::Flood { bytes: 2 << 20 }, false, |r| {
            matches!(r, Err(OpenAiError::Decode(_)))
        }),
    ];
    for (name, fault, streamed, expected) in cases {
        let sim =
            Sim::start(SimConfig::default().fault(fault, Trigger::Requests(vec![0]))).expect("sim");
        let mut config = config(sim.base_url(), Auth::Bearer("sk-test".into()));
        config.max_event_bytes = 1 << 20;
        let client = client_on(small_limits(), config);
        let before = client.limiter().dimension(TOKENS).map(|v| v.state.level).expect("tokens");
        let result = bounded(name, async {
            if streamed {
                match drain(&client).await? {
                    (_, Some(e)) => Err(e),
                    (_, None) => Ok(()),
                }
            } else {
                client.complete(prompt()).await.map(|_| ())
            }
        })
        .await;
        assert!(expected(&result), "{name}: {result:?}");
        assert_eq!(sim.log().len(), 1, "{name}: not re-sent");
        let reserved = client.estimate(&prompt()) as f64;
        let capacity = small_limits().tokens_per_minute.expect("tokens").div_ceil(6) as f64;
        assert!(
            charged(&client, before) <= (4.0 * reserved).max(capacity) + 1.0,
            "{name}: absurd charge"
        );
        // The run goes on.
        let next = bounded(name, client.complete(prompt())).await;
        assert!(next.is_ok(), "{name}: the next call failed: {next:?}");
    }
}

// ---------------------------------------------------------------------------------------
// The caller's error.

/// Each failure reads as one line of what happened and what to do, with the provider's own
/// message, and its cause chain does not repeat it.
#[tokio::test]
async fn a_failure_tells_the_caller_what_happened_and_what_to_do_in_one_line() {
    let body = r#"{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    let server =
        Scripted::start(move |_, _| vec![Step::json(401, &[], body)]).expect("scripted server");
    let error = bounded("401", client(&server).complete(prompt())).await.expect_err("a bad key");
    assert_eq!(error.problem(), ratebucket_openai::Problem::Fatal);
    let message = error.to_string();
    assert!(!message.contains('\n'), "{message}");
    assert!(message.contains(ratebucket_openai::Problem::Fatal.advice()), "{message}");
    assert!(message.ends_with("the provider said: Incorrect API key provided"), "{message}");
    let mut cause = std::error::Error::source(&error);
    while let Some(e) = cause {
        assert!(!message.contains(&e.to_string()), "{e} repeated in {message}");
        cause = e.source();
    }

    let cut =
        Scripted::start(|_, _| vec![Step::sse_head(&[]), Step::Reset]).expect("scripted server");
    let error = match bounded("cut stream", client(&cut).stream(prompt())).await {
        Ok(mut stream) => loop {
            match stream.next().await {
                Some(Err(e)) => break e,
                Some(Ok(_)) => continue,
                None => panic!("a cut stream ends with an error"),
            }
        },
        Err(e) => e,
    };
    assert_eq!(error.problem(), ratebucket_openai::Problem::Ambiguous);
    assert!(error.to_string().ends_with(ratebucket_openai::Problem::Ambiguous.advice()), "{error}");
}

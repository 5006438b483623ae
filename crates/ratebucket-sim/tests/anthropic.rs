//! The fake provider's Anthropic dialect seen from a plain hyper client: the Messages API,
//! its three buckets and headers, its errors, and errors inside a stream.

use std::time::Duration;

use http::StatusCode;
use ratebucket_sim::{Dialect, Fault, LimitSpec, Refusal, Sim, SimConfig, SimHandle, Trigger};
use serde_json::{Value, json};

mod support;

use support::Reply;

const SIGNED: [(&str, &str); 2] = [("x-api-key", "sk-ant"), ("anthropic-version", "2023-06-01")];

async fn post(sim: &SimHandle, path: &str, body: &Value, headers: &[(&str, &str)]) -> Reply {
    support::post(sim, path, body, headers).await
}

fn message(content: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "claude-sim",
        "max_tokens": max_tokens,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": content}],
        "stream": stream,
    })
}

fn anthropic() -> SimConfig {
    SimConfig::default()
        .dialect(Dialect::Anthropic)
        .api_key("sk-ant")
        .completion_tokens(10, 30)
        .rpm(LimitSpec::per_minute(50))
        .itpm(LimitSpec::per_minute(40_000))
        .otpm(LimitSpec::per_minute(8_000))
}

/// The `data` of each event in a stream, with its event name.
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name =
                e.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default().to_owned();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).expect("data");
            (name, serde_json::from_str(data).expect("JSON data"))
        })
        .collect()
}

#[tokio::test]
async fn a_message_is_answered_with_usage_and_three_buckets_of_headers() {
    let sim = Sim::start(anthropic()).expect("starts");
    let reply = post(&sim, "/v1/messages", &message("Hello there", 100, false), &SIGNED).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text());
    let body = reply.json();
    assert_eq!(body["type"], "message");
    assert_eq!(body["content"][0]["type"], "text");
    let usage = &body["usage"];
    let output = usage["output_tokens"].as_u64().expect("output tokens");
    assert!((10..=30).contains(&output), "{usage}");
    let input = usage["input_tokens"].as_u64().expect("input tokens");
    assert_eq!(reply.header("anthropic-ratelimit-requests-limit"), "50");
    assert_eq!(reply.header("anthropic-ratelimit-requests-remaining"), "49");
    assert_eq!(reply.header("anthropic-ratelimit-input-tokens-limit"), "40000");
    // 40,000 less the input, rounded to thousands.
    let rounded = (40_000 - input + 500) / 1000 * 1000;
    assert_eq!(reply.header("anthropic-ratelimit-input-tokens-remaining"), rounded.to_string());
    // The output is charged max_tokens on admission: 7,900 left, rounded to thousands.
    assert_eq!(reply.header("anthropic-ratelimit-output-tokens-remaining"), "8000");
    let reset = reply.header("anthropic-ratelimit-input-tokens-reset");
    assert!(
        reset.len() == 20 && reset.ends_with('Z') && reset.as_bytes()[10] == b'T',
        "an RFC 3339 instant in whole seconds: {reset}"
    );
    assert!(reply.headers.contains_key("anthropic-ratelimit-tokens-limit"));
    let log = sim.log();
    assert_eq!(log[0].tokens_charged, input);
    // Settled to what was produced, not max_tokens.
    assert_eq!(log[0].output_tokens_charged, output);
}

#[tokio::test]
async fn the_output_reservation_is_settled_to_what_was_produced() {
    let sim = Sim::start(anthropic().otpm(LimitSpec::per_minute(250))).expect("starts");
    // max_tokens 200 of 250: a second at once does not fit while the first is reserved
    // at its maximum, but does once it settled to at most 30.
    let first = post(&sim, "/v1/messages", &message("one", 200, false), &SIGNED).await;
    assert_eq!(first.status, StatusCode::OK);
    let second = post(&sim, "/v1/messages", &message("two", 200, false), &SIGNED).await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.text());
}

#[tokio::test]
async fn over_a_limit_is_a_429_with_retry_after_naming_the_limit() {
    let sim = Sim::start(anthropic().otpm(LimitSpec::per_minute(150))).expect("starts");
    // Held at its maximum while it runs: a stream settles only as it is made.
    let config = message("first", 100, false);
    let held = post(&sim, "/v1/messages", &config, &SIGNED).await;
    assert_eq!(held.status, StatusCode::OK);
    let refused = post(&sim, "/v1/messages", &message("second", 140, false), &SIGNED).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{}", refused.text());
    let body = refused.json();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(
        body["error"]["message"].as_str().is_some_and(|m| m.contains("output tokens per minute")),
        "{body}"
    );
    let retry_after: u64 = refused.header("retry-after").parse().expect("seconds");
    assert!(retry_after >= 1);
    assert_eq!(sim.log()[1].refusal, Some(Refusal::OutputTokens));
}

#[tokio::test]
async fn requests_without_a_key_a_version_or_max_tokens_are_refused() {
    let sim = Sim::start(anthropic()).expect("starts");
    let body = message("hi", 10, false);
    let unsigned = post(&sim, "/v1/messages", &body, &[("anthropic-version", "2023-06-01")]).await;
    assert_eq!(unsigned.status, StatusCode::UNAUTHORIZED);
    assert_eq!(unsigned.json()["error"]["type"], "authentication_error");
    let unversioned = post(&sim, "/v1/messages", &body, &[("x-api-key", "sk-ant")]).await;
    assert_eq!(unversioned.status, StatusCode::BAD_REQUEST);
    let mut unbounded = body.clone();
    unbounded.as_object_mut().expect("object").remove("max_tokens");
    let unbounded = post(&sim, "/v1/messages", &unbounded, &SIGNED).await;
    assert_eq!(unbounded.status, StatusCode::BAD_REQUEST);
    assert_eq!(unbounded.json()["error"]["type"], "invalid_request_error");
    let chat = post(&sim, "/v1/chat/completions", &body, &SIGNED).await;
    assert_eq!(chat.status, StatusCode::NOT_FOUND);
    assert!(sim.log().iter().all(|e| !e.admitted));
}

#[tokio::test]
async fn a_stream_carries_anthropics_events_and_its_usage() {
    let sim = Sim::start(anthropic()).expect("starts");
    let reply = post(&sim, "/v1/messages", &message("Stream it", 100, true), &SIGNED).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let events = events(reply.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    assert!(names.contains(&"content_block_delta"));
    for (name, data) in &events {
        assert_eq!(data["type"], name.as_str(), "the data names its event");
    }
    let input = events[0].1["message"]["usage"]["input_tokens"].as_u64();
    assert_eq!(input, Some(sim.log()[0].prompt_tokens));
    let (_, delta) = events.iter().find(|(n, _)| n == "message_delta").expect("message_delta");
    assert_eq!(delta["usage"]["output_tokens"].as_u64(), Some(sim.log()[0].completion_tokens));
}

#[tokio::test]
async fn an_error_event_comes_before_any_delta_or_after_some() {
    for (overloaded, after_content) in [(false, false), (true, false), (true, true)] {
        let fault = Fault::StreamError { overloaded, after_content };
        let sim = Sim::start(anthropic().fault(fault, Trigger::FirstArrivals)).expect("starts");
        let reply = post(&sim, "/v1/messages", &message("Stream it", 100, true), &SIGNED).await;
        assert_eq!(reply.status, StatusCode::OK);
        let events = events(reply.text());
        let (name, data) = events.last().expect("events");
        assert_eq!(name, "error");
        let kind = if overloaded { "overloaded_error" } else { "rate_limit_error" };
        assert_eq!(data["error"]["type"], kind);
        let deltas = events.iter().filter(|(n, _)| n == "content_block_delta").count();
        assert_eq!(deltas > 0, after_content, "{events:?}");
        // Sent again, the same body streams whole.
        let again = post(&sim, "/v1/messages", &message("Stream it", 100, true), &SIGNED).await;
        assert!(again.text().contains("message_stop"));
        sim.shutdown();
    }
}

#[tokio::test]
async fn the_overloaded_fault_is_a_529() {
    let fault = Fault::Overloaded { retry_after: Duration::from_millis(1500) };
    let sim = Sim::start(anthropic().fault(fault, Trigger::Requests(vec![0]))).expect("starts");
    let reply = post(&sim, "/v1/messages", &message("hi", 10, false), &SIGNED).await;
    assert_eq!(reply.status.as_u16(), 529);
    assert_eq!(reply.json()["error"]["type"], "overloaded_error");
    assert_eq!(reply.header("retry-after"), "2");
}

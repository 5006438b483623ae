//! The fake provider seen from a plain hyper client on a real socket: the OpenAI shape,
//! throttling, streaming, faults and the log.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use ratebucket_sim::{
    Charging, Dialect, Fault, Headers, LimitSpec, Model, Refusal, Sim, SimConfig, SimHandle,
    Trigger,
};
use serde_json::{Value, json};

struct Reply {
    status: StatusCode,
    headers: HeaderMap,
    body: Result<Bytes, String>,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_slice(self.body.as_ref().expect("whole body")).expect("JSON body")
    }

    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("missing {name}"))
            .to_str()
            .expect("ASCII header")
    }
}

/// One request on a fresh connection; a transport failure is an `Err` with hyper's words.
async fn post(sim: &SimHandle, body: Value, headers: &[(&str, &str)]) -> Result<Reply, String> {
    let stream = tokio::net::TcpStream::connect(sim.addr()).await.map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let mut request = Request::post("/v1/chat/completions")
        .header("host", sim.addr().to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request =
        request.body(Full::new(Bytes::from(body.to_string()))).map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map(|c| c.to_bytes()).map_err(|e| e.to_string());
    Ok(Reply { status: parts.status, headers: parts.headers, body })
}

fn chat(content: &str) -> Value {
    json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 100,
    })
}

fn streamed(content: &str, include_usage: bool) -> Value {
    let mut body = chat(content);
    body["stream"] = json!(true);
    if include_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn window(limit: u64, secs: u64, model: Model) -> LimitSpec {
    LimitSpec::per_minute(limit).window(Duration::from_secs(secs)).model(model)
}

fn quick() -> SimConfig {
    SimConfig::default().latency(ratebucket_sim::Latency::Fixed(Duration::from_millis(1)))
}

#[tokio::test]
async fn a_completion_has_the_openai_shape_and_rate_limit_headers() {
    let sim = Sim::start(
        quick()
            .rpm(LimitSpec::per_minute(600))
            .tpm(LimitSpec::per_minute(90_000))
            .completion_tokens(30, 60),
    )
    .expect("starts");
    let reply = post(&sim, chat("Summarise the plot of Hamlet."), &[]).await.expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    let body = reply.json();
    assert!(body["id"].as_str().expect("id").starts_with("chatcmpl-"));
    assert_eq!(body["object"], "chat.completion");
    assert!(body["created"].as_u64().is_some());
    assert_eq!(body["model"], "gpt-4o-mini");
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(!choice["message"]["content"].as_str().expect("content").is_empty());
    assert_eq!(choice["finish_reason"], "stop");
    let usage = &body["usage"];
    let (p, c, t) = (
        usage["prompt_tokens"].as_u64().expect("prompt"),
        usage["completion_tokens"].as_u64().expect("completion"),
        usage["total_tokens"].as_u64().expect("total"),
    );
    assert_eq!(p + c, t);
    assert!((30..=60).contains(&c));
    assert_eq!(reply.header("x-ratelimit-limit-requests"), "600");
    assert_eq!(reply.header("x-ratelimit-remaining-requests"), "599");
    assert_eq!(reply.header("x-ratelimit-limit-tokens"), "90000");
    // Reserve-max-tokens charging: the prompt plus max_tokens (100).
    let remaining: u64 = reply.header("x-ratelimit-remaining-tokens").parse().expect("integer");
    assert_eq!(remaining, 90_000 - p - 100);
    assert!(reply.header("x-ratelimit-reset-requests").ends_with('s'));
    // Counted on arrival, answered after the 1 ms latency: whole milliseconds, rounded down.
    let processing: u64 = reply.header("openai-processing-ms").parse().expect("integer");
    assert!((1..1_000).contains(&processing), "{processing} ms");
    let log = sim.log();
    assert_eq!(log.len(), 1);
    assert!(log[0].admitted);
    assert_eq!(log[0].tokens_charged, p + 100);
    assert_eq!(log[0].completion_tokens, c);
}

#[tokio::test]
async fn a_throttle_carries_retry_after_retry_after_ms_and_the_openai_error() {
    let sim = Sim::start(quick().rpm(window(2, 10, Model::TokenBucket))).expect("starts");
    for _ in 0..2 {
        let ok = post(&sim, chat("hi"), &[]).await.expect("reply");
        assert_eq!(ok.status, StatusCode::OK);
    }
    let throttled = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    let error = &throttled.json()["error"];
    assert_eq!(error["code"], "rate_limit_exceeded");
    assert_eq!(error["type"], "requests");
    assert!(error["message"].as_str().expect("message").contains("Please try again in"));
    // One request refills in 5 s: whole seconds, at least 1, and the exact milliseconds.
    let secs: u64 = throttled.header("retry-after").parse().expect("whole seconds");
    let ms: u64 = throttled.header("retry-after-ms").parse().expect("milliseconds");
    assert!((4_900..=5_000).contains(&ms), "{ms}");
    assert_eq!(secs, ms.div_ceil(1000));
    assert_eq!(throttled.header("x-ratelimit-remaining-requests"), "0");
    assert_eq!(sim.log()[2].refusal, Some(Refusal::Requests));
    assert!(!sim.log()[2].admitted);
}

#[tokio::test]
async fn a_limit_of_zero_refuses_every_request_for_a_day_without_panicking() {
    for model in [Model::TokenBucket, Model::FixedWindow, Model::SlidingLog] {
        let sim = Sim::start(quick().rpm(window(0, 60, model))).expect("starts");
        for _ in 0..2 {
            let refused = post(&sim, chat("hi"), &[]).await.expect("an answer");
            assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{model:?}");
            assert_eq!(refused.header("retry-after"), "86400", "{model:?}");
        }
        assert!(sim.log().iter().all(|e| !e.admitted), "{model:?}");
    }
}

#[test]
fn an_absurd_window_is_refused_at_start_up() {
    for window in ["1e30", "0", "-1", "nan", "inf"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratebucket-sim"))
            .args(["--rpm", "10", &format!("--window={window}")])
            .output()
            .expect("runs");
        assert!(!out.status.success(), "--window {window} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("--window"), "--window {window}: {stderr}");
        assert!(!stderr.contains("panicked"), "--window {window}: {stderr}");
    }
}

#[tokio::test]
async fn a_tokens_throttle_and_a_request_too_large_are_told_apart() {
    let sim = Sim::start(quick().tpm(window(150, 10, Model::FixedWindow))).expect("starts");
    let first = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert_eq!(first.status, StatusCode::OK);
    let second = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert_eq!(second.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(second.json()["error"]["type"], "tokens");
    let mut huge = chat("hi");
    huge["max_tokens"] = json!(5_000);
    let too_large = post(&sim, huge, &[]).await.expect("reply");
    assert_eq!(too_large.status, StatusCode::TOO_MANY_REQUESTS);
    let message = too_large.json()["error"]["message"].as_str().expect("message").to_owned();
    assert!(message.starts_with("Request too large"), "{message}");
    assert_eq!(sim.log()[2].refusal, Some(Refusal::TooLarge));
}

fn sse_events(body: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(body).expect("UTF-8");
    assert!(text.ends_with("\n\n"), "events end with a blank line");
    text.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data lines only").to_owned())
        .collect()
}

#[tokio::test]
async fn a_stream_ends_with_a_usage_chunk_then_done() {
    let sim = Sim::start(quick().completion_tokens(40, 40)).expect("starts");
    let reply = post(&sim, streamed("tell me", true), &[]).await.expect("reply");
    assert_eq!(reply.header("content-type"), "text/event-stream");
    let events = sse_events(reply.body.as_ref().expect("whole stream"));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("JSON chunk"))
        .collect();
    let (usage_chunk, content_chunks) = chunks.split_last().expect("chunks");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 40);
    assert!(content_chunks.iter().all(|c| c["usage"].is_null()));
    assert!(content_chunks.iter().all(|c| c["object"] == "chat.completion.chunk"));
    let text: String = content_chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text.split_whitespace().count(), 40);
    assert_eq!(content_chunks.last().expect("final")["choices"][0]["finish_reason"], "stop");

    let plain = post(&sim, streamed("tell me", false), &[]).await.expect("reply");
    let events = sse_events(plain.body.as_ref().expect("whole stream"));
    assert!(events.iter().all(|e| !e.contains("\"usage\"")), "no usage unless asked");
}

async fn faulted(fault: Fault) -> (SimHandle, Result<Reply, String>) {
    let sim = Sim::start(
        quick().rpm(LimitSpec::per_minute(600)).fault(fault, Trigger::Requests(vec![0])),
    )
    .expect("starts");
    let reply = post(&sim, chat("fault"), &[]).await;
    (sim, reply)
}

#[tokio::test]
async fn server_errors_answer_with_their_status_and_charge_nothing() {
    for code in [500, 502, 503] {
        let (sim, reply) = faulted(Fault::Status(code)).await;
        assert_eq!(reply.expect("reply").status.as_u16(), code);
        let entry = &sim.log()[0];
        assert!(!entry.admitted);
        assert_eq!(entry.status, Some(code));
    }
    let (_sim, reply) =
        faulted(Fault::Overloaded { retry_after: Duration::from_millis(2500) }).await;
    let reply = reply.expect("reply");
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), "3");
    assert_eq!(reply.header("retry-after-ms"), "2500");
}

#[tokio::test]
async fn a_reset_before_response_is_a_transport_error_after_admission() {
    let (sim, reply) = faulted(Fault::ResetBeforeResponse).await;
    assert!(reply.is_err(), "no response expected, got {:?}", reply.map(|r| r.status));
    let entry = &sim.log()[0];
    assert!(entry.admitted, "the server took it in before resetting");
    assert_eq!(entry.status, None);
}

#[tokio::test]
async fn a_stall_outlasts_the_clients_read_timeout() {
    let (sim, reply) = {
        let sim = Sim::start(
            quick()
                .fault(Fault::Stall { stall: Duration::from_secs(30) }, Trigger::Requests(vec![0])),
        )
        .expect("starts");
        let reply =
            tokio::time::timeout(Duration::from_millis(300), post(&sim, chat("x"), &[])).await;
        (sim, reply)
    };
    assert!(reply.is_err(), "timed out");
    assert!(sim.log()[0].admitted);
    assert_eq!(sim.log()[0].finished, None);
}

#[tokio::test]
async fn a_cut_stream_stops_before_done_and_a_cut_body_half_way() {
    let sim = Sim::start(quick().fault(Fault::CutStream, Trigger::Rate(1.0))).expect("starts");
    let reply = post(&sim, streamed("x", true), &[]).await.expect("headers arrive");
    assert_eq!(reply.status, StatusCode::OK);
    assert!(reply.body.is_err(), "the body errors out");
    let plain = post(&sim, chat("x"), &[]).await.expect("headers arrive");
    assert!(plain.body.is_err());
    assert!(sim.log().iter().all(|e| e.admitted));
}

#[tokio::test]
async fn quota_auth_and_too_large_faults_answer_like_openai() {
    let (_sim, reply) = faulted(Fault::InsufficientQuota).await;
    let reply = reply.expect("reply");
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.json()["error"]["code"], "insufficient_quota");
    assert_eq!(reply.json()["error"]["type"], "insufficient_quota");

    let (_sim, reply) = faulted(Fault::Unauthorized).await;
    let reply = reply.expect("reply");
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(reply.json()["error"]["code"], "invalid_api_key");

    let (_sim, reply) = faulted(Fault::RequestTooLarge).await;
    let reply = reply.expect("reply");
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .expect("message")
            .starts_with("Request too large")
    );
}

#[tokio::test]
async fn an_api_key_is_checked_in_either_header() {
    let sim = Sim::start(quick().api_key("sk-test")).expect("starts");
    let none = post(&sim, chat("x"), &[]).await.expect("reply");
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    let bearer =
        post(&sim, chat("x"), &[("authorization", "Bearer sk-test")]).await.expect("reply");
    assert_eq!(bearer.status, StatusCode::OK);
    let azure = post(&sim, chat("x"), &[("api-key", "sk-test")]).await.expect("reply");
    assert_eq!(azure.status, StatusCode::OK);
}

#[tokio::test]
async fn faults_strike_by_request_number_or_by_rate() {
    let sim = Sim::start(quick().fault(Fault::Status(500), Trigger::Requests(vec![1, 3])))
        .expect("starts");
    let mut statuses = Vec::new();
    for i in 0..5 {
        statuses
            .push(post(&sim, chat(&format!("n{i}")), &[]).await.expect("reply").status.as_u16());
    }
    assert_eq!(statuses, [200, 500, 200, 500, 200]);

    let sim =
        Sim::start(quick().seed(7).fault(Fault::Status(502), Trigger::Rate(0.3))).expect("starts");
    let mut failed = 0;
    for i in 0..200 {
        if post(&sim, chat(&format!("r{i}")), &[]).await.expect("reply").status != StatusCode::OK {
            failed += 1;
        }
    }
    assert!((30..=90).contains(&failed), "{failed} of 200 at a 30% rate");
}

#[tokio::test]
async fn a_sliding_log_admits_exactly_its_limit_to_a_burst() {
    let sim = Sim::start(quick().rpm(window(5, 2, Model::SlidingLog))).expect("starts");
    let mut admitted = 0;
    for i in 0..20 {
        if post(&sim, chat(&format!("b{i}")), &[]).await.expect("reply").status == StatusCode::OK {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5);
    assert_eq!(sim.log().iter().filter(|e| e.admitted).count(), 5);
}

#[tokio::test]
async fn the_same_seed_and_requests_draw_the_same_completions() {
    let lengths = |sim: SimHandle| async move {
        let mut out = Vec::new();
        for i in 0..10 {
            let reply = post(&sim, chat(&format!("s{i}")), &[]).await.expect("reply");
            out.push(reply.json()["usage"]["completion_tokens"].as_u64().expect("usage"));
        }
        out
    };
    let a = lengths(Sim::start(quick().seed(42)).expect("starts")).await;
    let b = lengths(Sim::start(quick().seed(42)).expect("starts")).await;
    let c = lengths(Sim::start(quick().seed(43)).expect("starts")).await;
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[tokio::test]
async fn actual_usage_charging_charges_what_was_produced() {
    let sim = Sim::start(
        quick()
            .tpm(LimitSpec::per_minute(100_000))
            .charging(Charging::ActualUsage)
            .completion_tokens(10, 10),
    )
    .expect("starts");
    let reply = post(&sim, chat("x"), &[]).await.expect("reply");
    let total = reply.json()["usage"]["total_tokens"].as_u64().expect("total");
    assert_eq!(sim.log()[0].tokens_charged, total);
}

#[tokio::test]
async fn a_scripted_throttle_and_an_error_chunk_look_like_the_real_thing() {
    let limited = Fault::RateLimited { retry_after: Duration::from_millis(644) };
    let (_sim, reply) = faulted(limited).await;
    let reply = reply.expect("reply");
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(reply.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(reply.header("retry-after-ms"), "644");
    assert_eq!(reply.header("retry-after"), "1");

    let sim =
        Sim::start(quick().fault(Fault::ErrorChunk, Trigger::Requests(vec![0]))).expect("starts");
    let reply = post(&sim, streamed("x", true), &[]).await.expect("reply");
    let events = sse_events(reply.body.as_ref().expect("whole stream"));
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let error: Value = serde_json::from_str(&events[events.len() - 2]).expect("JSON");
    assert!(error["error"]["message"].is_string());
    assert!(events.iter().all(|e| !e.contains("\"choices\":[]")), "no usage chunk");
}

#[tokio::test]
async fn a_provider_that_books_its_own_estimate_charges_more_than_it_reports() {
    let sim = Sim::start(quick().charging(Charging::BooksEstimate).tpm(window(
        100_000,
        60,
        Model::TokenBucket,
    )))
    .expect("starts");
    let body = chat("A prompt of some length, to be counted twice.");
    let reply = post(&sim, body.clone(), &[]).await.expect("reply");
    assert_eq!(reply.status, StatusCode::OK);
    let usage = &reply.json()["usage"];
    let reported = usage["total_tokens"].as_u64().expect("usage");
    // Booked: a quarter of the body's characters plus max_tokens (100).
    let booked = (body.to_string().len() as u64).div_ceil(4) + 100;
    assert_eq!(sim.log()[0].tokens_charged, booked);
    assert!(booked > reported, "booked {booked}, reported {reported}");
    let remaining: u64 = reply.header("x-ratelimit-remaining-tokens").parse().expect("remaining");
    assert_eq!(remaining, 100_000 - booked);
}

#[tokio::test]
async fn header_styles_send_less_down_to_nothing() {
    let sim = Sim::start(quick().headers(Headers::NoReset).rpm(window(1, 10, Model::FixedWindow)))
        .expect("starts");
    let ok = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert_eq!(ok.header("x-ratelimit-limit-requests"), "1");
    assert_eq!(ok.header("x-ratelimit-remaining-requests"), "0");
    assert!(ok.headers.get("x-ratelimit-reset-requests").is_none());
    let throttled = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    // A whole window's hint, not the real wait, and nothing more precise.
    assert_eq!(throttled.header("retry-after"), "10");
    assert!(throttled.headers.get("retry-after-ms").is_none());

    let sim = Sim::start(quick().headers(Headers::None).rpm(window(1, 10, Model::FixedWindow)))
        .expect("starts");
    let ok = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert!(ok.headers.keys().all(|k| !k.as_str().starts_with("x-ratelimit")));
    let throttled = post(&sim, chat("hi"), &[]).await.expect("reply");
    assert_eq!(throttled.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(throttled.headers.get("retry-after").is_none());
}

/// A provider speaking `dialect` with 2 requests per minute, 3 per "day" (a minute here)
/// and 100,000 tokens per minute: the third request is refused by the minute's requests
/// limit, and after the day's is spent (with the minute's room made), by the day's.
fn dialect_sim(dialect: Dialect) -> SimHandle {
    Sim::start(
        quick()
            .rpm(LimitSpec::per_minute(2))
            .tpm(LimitSpec::per_minute(100_000))
            .rpd(LimitSpec::per_minute(3))
            .dialect(dialect),
    )
    .expect("sim")
}

/// The first answer and the first 429 of a provider speaking `dialect`.
async fn admitted_then_refused(dialect: Dialect) -> (Reply, Reply) {
    let sim = dialect_sim(dialect);
    let first = post(&sim, chat("one"), &[]).await.expect("answers");
    assert_eq!(first.status, StatusCode::OK);
    post(&sim, chat("two"), &[]).await.expect("answers");
    let refused = post(&sim, chat("three"), &[]).await.expect("answers");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS, "{dialect:?}");
    assert_eq!(sim.log()[2].refusal, Some(Refusal::Requests));
    (first, refused)
}

#[tokio::test]
async fn azure_sends_whole_second_resets_and_an_overdrawn_remaining() {
    let (first, refused) = admitted_then_refused(Dialect::Azure).await;
    assert_eq!(first.header("x-ratelimit-limit-requests"), "2");
    assert_eq!(first.header("x-ratelimit-remaining-requests"), "1");
    assert_eq!(first.header("x-ratelimit-reset-requests"), "30");
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), "-1");
    assert!(refused.headers.contains_key("retry-after-ms"));
    assert!(!first.headers.contains_key("x-ratelimit-limit-requests-day"));
}

#[tokio::test]
async fn gemini_sends_no_headers_and_a_retry_delay_in_the_body() {
    let (first, refused) = admitted_then_refused(Dialect::Gemini).await;
    assert!(first.headers.keys().all(|k| !k.as_str().contains("ratelimit")), "{:?}", first.headers);
    assert!(!refused.headers.contains_key("retry-after"));
    let body = refused.json();
    let error = &body[0]["error"];
    assert_eq!(error["status"], "RESOURCE_EXHAUSTED");
    let details = error["details"].as_array().expect("details");
    assert_eq!(
        details[0]["violations"][0]["quotaId"],
        "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
    );
    let delay = details[1]["retryDelay"].as_str().expect("delay");
    let secs: f64 = delay.trim_end_matches('s').parse().expect("seconds");
    assert!((29.0..=30.1).contains(&secs), "{delay}");
}

#[tokio::test]
async fn groq_reports_the_day_under_openais_requests_names() {
    let (first, refused) = admitted_then_refused(Dialect::Groq).await;
    // The requests family is the day's: 3 per day, 2 left.
    assert_eq!(first.header("x-ratelimit-limit-requests"), "3");
    assert_eq!(first.header("x-ratelimit-remaining-requests"), "2");
    assert_eq!(first.header("x-ratelimit-limit-tokens"), "100000");
    // The minute's requests limit only in the refusal's words.
    let message = refused.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("requests per min (RPM): Limit 2"), "{message}");
    assert_eq!(refused.header("retry-after"), "30");
}

#[tokio::test]
async fn cerebras_names_each_period_and_sends_float_seconds() {
    let (first, _) = admitted_then_refused(Dialect::Cerebras).await;
    assert_eq!(first.header("x-ratelimit-limit-requests-day"), "3");
    assert_eq!(first.header("x-ratelimit-limit-tokens-minute"), "100000");
    let reset: f64 = first.header("x-ratelimit-reset-requests-day").parse().expect("float seconds");
    assert!((19.0..=20.01).contains(&reset), "{reset}");
}

#[tokio::test]
async fn openrouter_reports_only_on_its_429s_with_epoch_millisecond_resets() {
    let (first, refused) = admitted_then_refused(Dialect::Openrouter).await;
    assert!(!first.headers.contains_key("x-ratelimit-limit"));
    assert_eq!(refused.header("x-ratelimit-limit"), "2");
    assert_eq!(refused.header("x-ratelimit-remaining"), "0");
    let reset: u128 = refused.header("x-ratelimit-reset").parse().expect("millis");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    assert!(reset > now && reset <= now + 61_000, "{reset} vs {now}");
}

#[tokio::test]
async fn a_spent_day_refuses_with_its_own_refusal() {
    let sim = Sim::start(
        quick()
            .rpm(LimitSpec::per_minute(100))
            .rpd(LimitSpec::per_minute(1).window(Duration::from_secs(3_600)))
            .dialect(Dialect::Groq),
    )
    .expect("sim");
    post(&sim, chat("one"), &[]).await.expect("answers");
    let refused = post(&sim, chat("two"), &[]).await.expect("answers");
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(sim.log()[1].refusal, Some(Refusal::Daily));
    let message = refused.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(message.contains("requests per day (RPD)"), "{message}");
    assert_eq!(refused.header("x-ratelimit-remaining-requests"), "0");
}

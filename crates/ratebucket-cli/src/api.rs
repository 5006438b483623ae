//! The two batch formats a run speaks: OpenAI's Batch API and Anthropic's Message Batches.
//! Each has its own output records, its own vendor knowledge and its own dimensions.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use ratebucket_anthropic::AnthropicVendor;
use ratebucket_http::dialect::Dialect;
use ratebucket_http::{ResponseHead, Vendor};
use ratebucket_openai::OpenAiVendor;
use ratebucket_rt::core::{Limit, QuotaPolicy, Report, Verdict};
use serde::Serialize;
use serde_json::{Value, json};

/// Which format the input is in, and so which API its requests go to and how the output
/// is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    /// Lines of `{"custom_id", "method", "url", "body"}` for an OpenAI-compatible endpoint;
    /// each costs one request and its tokens.
    OpenAi,
    /// Lines of `{"custom_id", "params"}` for Anthropic's Messages API; each costs one
    /// request, its input tokens, its output tokens, and both together (a server's
    /// combined limit).
    Anthropic,
}

impl Api {
    /// The limiter dimensions a line costs: requests first, then the tokens.
    pub(crate) fn dimensions(self) -> usize {
        match self {
            Api::OpenAi => 2,
            Api::Anthropic => 4,
        }
    }

    /// What the format is called in messages.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Api::OpenAi => "OpenAI Batch API",
            Api::Anthropic => "Anthropic Message Batches",
        }
    }

    /// The output record of an answer the provider gave (a success, or a refusal as it
    /// was sent).
    pub(crate) fn answer_record(self, custom_id: &str, response: &Response<Bytes>) -> String {
        let body = serde_json::from_slice::<Value>(response.body()).ok();
        match self {
            Api::OpenAi => {
                let body = body.unwrap_or_else(|| {
                    Value::String(String::from_utf8_lossy(response.body()).into_owned())
                });
                let request_id = header(response.headers(), "x-request-id");
                OutputRecord {
                    id: record_id(custom_id),
                    custom_id,
                    response: Some(ResponseRecord {
                        status_code: response.status().as_u16(),
                        request_id,
                        body,
                    }),
                    error: None,
                }
                .line()
            }
            Api::Anthropic => {
                let result = match body {
                    Some(message) if response.status() == StatusCode::OK => {
                        json!({ "type": "succeeded", "message": message })
                    }
                    body => {
                        // The provider's error body as it came (`{"type":"error","error":
                        // {...}}`), or one made from whatever else it sent.
                        let mut error = match body {
                            Some(error @ Value::Object(_)) if error.get("error").is_some() => error,
                            _ => anthropic_error(
                                "api_error",
                                &format!(
                                    "HTTP {}: {}",
                                    response.status().as_u16(),
                                    String::from_utf8_lossy(response.body())
                                ),
                            ),
                        };
                        if let Some(id) = header(response.headers(), "request-id") {
                            error["request_id"] = Value::from(id);
                        }
                        json!({ "type": "errored", "error": error })
                    }
                };
                json!({ "custom_id": custom_id, "result": result }).to_string()
            }
        }
    }

    /// The output record of a line with no answer to record: `code` says why (`ambiguous`
    /// when the request may have been executed).
    pub(crate) fn error_record(self, custom_id: &str, code: &str, message: &str) -> String {
        match self {
            Api::OpenAi => OutputRecord {
                id: record_id(custom_id),
                custom_id,
                response: None,
                error: Some(ErrorRecord { code, message }),
            }
            .line(),
            Api::Anthropic => json!({
                "custom_id": custom_id,
                "result": { "type": "errored", "error": anthropic_error(code, message) },
            })
            .to_string(),
        }
    }

    /// Whether an output record says its request may have been executed.
    pub(crate) fn is_ambiguous(self, record: &Value) -> bool {
        match self {
            Api::OpenAi => record["error"]["code"] == "ambiguous",
            Api::Anthropic => record["result"]["error"]["error"]["type"] == "ambiguous",
        }
    }

    /// The tokens an output record says its request used, per token dimension (total
    /// tokens; or input tokens as the limit counts them, output tokens, and both).
    pub(crate) fn recorded_usage(self, record: &Value) -> Option<Vec<u64>> {
        match self {
            Api::OpenAi => self.usage(&record["response"]["body"]),
            Api::Anthropic => self.usage(&record["result"]["message"]),
        }
    }

    /// The tokens a response body reports, per token dimension.
    pub(crate) fn reported_usage(self, body: &[u8]) -> Option<Vec<u64>> {
        self.usage(&serde_json::from_slice::<Value>(body).ok()?)
    }

    /// The usage of an answer's body, per token dimension.
    fn usage(self, body: &Value) -> Option<Vec<u64>> {
        let usage = &body["usage"];
        match self {
            Api::OpenAi => Some(vec![usage["total_tokens"].as_u64()?]),
            Api::Anthropic => {
                let usage: ratebucket_anthropic::Usage =
                    serde_json::from_value(usage.clone()).ok()?;
                let input = usage.counted_input();
                Some(vec![input, usage.output_tokens, input + usage.output_tokens])
            }
        }
    }
}

/// An Anthropic error object: `{"type": "error", "error": {"type", "message"}}`.
fn anthropic_error(kind: &str, message: &str) -> Value {
    json!({ "type": "error", "error": { "type": kind, "message": message } })
}

/// A header's value, if it is text.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// One line of OpenAI's Batch API output (its field order).
#[derive(Serialize)]
struct OutputRecord<'a> {
    id: String,
    custom_id: &'a str,
    response: Option<ResponseRecord<'a>>,
    error: Option<ErrorRecord<'a>>,
}

/// The provider's answer in an [`OutputRecord`].
#[derive(Serialize)]
struct ResponseRecord<'a> {
    status_code: u16,
    request_id: Option<&'a str>,
    body: Value,
}

/// Why there is no answer, in an [`OutputRecord`].
#[derive(Serialize)]
struct ErrorRecord<'a> {
    code: &'a str,
    message: &'a str,
}

impl OutputRecord<'_> {
    /// The record as one JSON line (without the newline).
    fn line(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A stable record id for `custom_id`, in the Batch API's `batch_req_...` form.
fn record_id(custom_id: &str) -> String {
    // FNV-1a: stable across runs and platforms.
    let hash = custom_id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("batch_req_{hash:016x}")
}

/// The limits a run is told (each `None` is learned from the provider's headers), in the
/// shape of its API.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Quota {
    /// Requests and tokens per window.
    OpenAi(ratebucket_openai::Limits),
    /// Requests, input tokens, output tokens and both together per window.
    Anthropic(ratebucket_anthropic::Limits),
}

impl Quota {
    /// The limiter's dimensions, in the API's order.
    pub(crate) fn per_dimension(&self) -> Vec<Limit> {
        match self {
            Quota::OpenAi(limits) => limits.per_dimension().to_vec(),
            Quota::Anthropic(limits) => limits.per_dimension().to_vec(),
        }
    }

    /// Each dimension's limit per window, in the API's order (`None`: to be learned).
    pub(crate) fn given(&self) -> Vec<Option<u64>> {
        match self {
            Quota::OpenAi(l) => vec![l.requests_per_minute, l.tokens_per_minute],
            Quota::Anthropic(l) => vec![
                l.requests_per_minute,
                l.input_tokens_per_minute,
                l.output_tokens_per_minute,
                l.tokens_per_minute,
            ],
        }
    }

    /// The window the limits count over.
    pub(crate) fn window(&self) -> Duration {
        match self {
            Quota::OpenAi(limits) => limits.window,
            Quota::Anthropic(limits) => limits.window,
        }
    }

    /// The vendor knowledge for these limits (OpenAI's read in `dialect`, if one is named).
    pub(crate) fn vendor(&self, dialect: Option<&'static Dialect>) -> BatchVendor {
        match self {
            Quota::OpenAi(limits) => {
                BatchVendor::OpenAi(OpenAiVendor::new(*limits).dialect(dialect))
            }
            Quota::Anthropic(limits) => BatchVendor::Anthropic(AnthropicVendor::new(*limits)),
        }
    }
}

/// The vendor knowledge of the run's API.
pub(crate) enum BatchVendor {
    OpenAi(OpenAiVendor),
    Anthropic(AnthropicVendor),
}

impl BatchVendor {
    /// Charges the money dimension (a budget's) what each answer's usage cost at `prices`.
    pub(crate) fn prices(self, prices: Option<ratebucket_http::price::Prices>) -> BatchVendor {
        let prices = prices.map(std::sync::Arc::new);
        match self {
            BatchVendor::OpenAi(v) => BatchVendor::OpenAi(v.prices(prices)),
            BatchVendor::Anthropic(v) => BatchVendor::Anthropic(v.prices(prices)),
        }
    }
}

impl Vendor for BatchVendor {
    fn verdict(&self, status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Option<Verdict> {
        match self {
            BatchVendor::OpenAi(v) => v.verdict(status, headers, body),
            BatchVendor::Anthropic(v) => v.verdict(status, headers, body),
        }
    }

    fn retry_hint(&self, body: &[u8]) -> Option<Duration> {
        match self {
            BatchVendor::OpenAi(v) => v.retry_hint(body),
            BatchVendor::Anthropic(v) => v.retry_hint(body),
        }
    }

    fn policies(&self) -> Vec<(usize, QuotaPolicy)> {
        match self {
            BatchVendor::OpenAi(v) => v.policies(),
            BatchVendor::Anthropic(v) => v.policies(),
        }
    }

    fn reports(&self, response: &ResponseHead<'_>) -> Vec<Report> {
        match self {
            BatchVendor::OpenAi(v) => v.reports(response),
            BatchVendor::Anthropic(v) => v.reports(response),
        }
    }

    fn charge(&self, reserved: &[u64], response: &Response<Bytes>) -> Option<Vec<u64>> {
        match self {
            BatchVendor::OpenAi(v) => v.charge(reserved, response),
            BatchVendor::Anthropic(v) => v.charge(reserved, response),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, body: &str, request_id: Option<(&str, &str)>) -> Response<Bytes> {
        let mut builder = Response::builder().status(status);
        if let Some((name, value)) = request_id {
            builder = builder.header(name, value);
        }
        builder.body(Bytes::copy_from_slice(body.as_bytes())).expect("response")
    }

    #[test]
    fn anthropic_records_are_in_the_message_batches_results_format() {
        let api = Api::Anthropic;
        let message = r#"{"id":"msg_1","type":"message","content":[],"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"cache_read_input_tokens":100,"output_tokens":7}}"#;
        let ok: Value =
            serde_json::from_str(&api.answer_record("a", &response(200, message, None)))
                .expect("json");
        assert_eq!(ok["custom_id"], "a");
        assert_eq!(ok["result"]["type"], "succeeded");
        assert_eq!(ok["result"]["message"]["id"], "msg_1");
        // Cache reads are not counted against the input limit.
        assert_eq!(api.recorded_usage(&ok), Some(vec![15, 7, 22]));

        let refusal =
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"bad"}}"#;
        let errored: Value = serde_json::from_str(
            &api.answer_record("b", &response(400, refusal, Some(("request-id", "req_9")))),
        )
        .expect("json");
        assert_eq!(errored["result"]["type"], "errored");
        assert_eq!(errored["result"]["error"]["error"]["type"], "invalid_request_error");
        assert_eq!(errored["result"]["error"]["request_id"], "req_9");
        assert!(!api.is_ambiguous(&errored));

        let not_json: Value =
            serde_json::from_str(&api.answer_record("c", &response(502, "bad gateway", None)))
                .expect("json");
        assert_eq!(not_json["result"]["error"]["error"]["type"], "api_error");

        let ambiguous: Value =
            serde_json::from_str(&api.error_record("d", "ambiguous", "may have run"))
                .expect("json");
        assert!(api.is_ambiguous(&ambiguous));
        assert_eq!(ambiguous["result"]["type"], "errored");
        assert_eq!(api.recorded_usage(&ambiguous), None);
    }

    #[test]
    fn openai_records_are_in_the_batch_api_output_format() {
        let api = Api::OpenAi;
        let body = r#"{"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#;
        let ok: Value = serde_json::from_str(
            &api.answer_record("a", &response(200, body, Some(("x-request-id", "r1")))),
        )
        .expect("json");
        assert!(ok["id"].as_str().is_some_and(|id| id.starts_with("batch_req_")));
        assert_eq!(ok["response"]["status_code"], 200);
        assert_eq!(ok["response"]["request_id"], "r1");
        assert_eq!(api.recorded_usage(&ok), Some(vec![7]));
        let ambiguous: Value =
            serde_json::from_str(&api.error_record("b", "ambiguous", "m")).expect("json");
        assert!(api.is_ambiguous(&ambiguous));
        assert_eq!(ambiguous["error"]["code"], "ambiguous");
        assert_eq!(record_id("a"), record_id("a"));
        assert_ne!(record_id("a"), record_id("b"));
    }
}

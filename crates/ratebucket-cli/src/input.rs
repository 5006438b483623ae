//! The input file: OpenAI Batch API request lines or Anthropic Message Batches requests,
//! checked before anything is sent, and where each goes.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;

use ratebucket_anthropic::{InputEstimator, MessagesRequest};
use ratebucket_openai::{CharsPerToken, ChatRequest, TokenEstimator, chat_token_bound};
use ratebucket_rt::core::Priority;
use serde::Deserialize;
use serde_json::Value;

use crate::api::Api;

/// One request line: `{"custom_id", "method", "url", "body"}`, or `{"custom_id",
/// "params"}` for Anthropic.
#[derive(Clone, Debug)]
pub(crate) struct Line {
    pub(crate) custom_id: String,
    /// The path, as the Batch API gives it (`/v1/chat/completions`).
    pub(crate) url: String,
    /// The body, serialized once.
    pub(crate) body: bytes::Bytes,
    /// Estimated prompt (input) tokens.
    pub(crate) prompt_tokens: u64,
    /// The completion limit the body sets, if any (Anthropic's `max_tokens` always).
    pub(crate) max_tokens: Option<u64>,
    /// The choices the body asks for (`n`, at least one).
    pub(crate) choices: u64,
    /// The tenant the line names (`"tenant": 7`; 0 when it names none).
    pub(crate) tenant: u32,
    /// The priority class the line names (`"priority": "interactive"`), if any.
    pub(crate) priority: Option<Priority>,
}

impl Line {
    /// The upper bound reserved: the prompt estimate and the completion limit for each
    /// choice ([`chat_token_bound`], the rule the library's clients follow).
    pub(crate) fn upper_bound(&self, default_max_tokens: u64) -> u64 {
        let limit = self.max_tokens.unwrap_or(default_max_tokens);
        chat_token_bound(self.prompt_tokens, limit, self.choices)
    }

    /// What the line reserves in each dimension of `api`: one request and its
    /// [`Line::upper_bound`] of tokens; or one request, its input estimate, its
    /// `max_tokens`, and both together.
    pub(crate) fn cost(&self, api: Api, default_max_tokens: u64) -> Vec<u64> {
        match api {
            Api::OpenAi => vec![1, self.upper_bound(default_max_tokens)],
            Api::Anthropic => {
                let output = self.max_tokens.unwrap_or(default_max_tokens);
                vec![1, self.prompt_tokens, output, self.prompt_tokens + output]
            }
        }
    }
}

/// An Anthropic Message Batches request: `{"custom_id", "params"}`.
#[derive(Deserialize)]
struct RawRequest {
    custom_id: String,
    params: Value,
    #[serde(flatten)]
    caller: RawCaller,
}

#[derive(Deserialize)]
struct RawLine {
    custom_id: String,
    method: String,
    url: String,
    body: Value,
    #[serde(flatten)]
    caller: RawCaller,
}

/// Who a line is for, beside its request: `"tenant"` (a number) and `"priority"`
/// (`interactive`, `default` or `batch`), both optional.
#[derive(Deserialize, Default)]
struct RawCaller {
    #[serde(default)]
    tenant: Option<u32>,
    #[serde(default)]
    priority: Option<String>,
}

impl RawCaller {
    fn read(&self) -> Result<(u32, Option<Priority>), String> {
        let priority = match &self.priority {
            Some(name) => {
                Some(name.parse::<Priority>().map_err(|e| format!("priority `{name}`: {e}"))?)
            }
            None => None,
        };
        Ok((self.tenant.unwrap_or(0), priority))
    }
}

/// Why the input cannot be run; nothing was sent.
#[derive(Debug)]
pub(crate) struct InputError(pub(crate) String);

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Reads and checks every line of `path`. The first line says the format: OpenAI's Batch
/// API input (`POST`, a path starting with `/`, an object body) or Anthropic's Message
/// Batches requests (`params` with `messages` and `max_tokens`, not streamed); every line
/// must be in it, each `custom_id` unique and not empty. Blank lines are skipped. The
/// first problems found are reported with their line numbers.
pub(crate) fn read(path: &Path) -> Result<(Api, Vec<Line>), InputError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| InputError(format!("cannot read {}: {e}", path.display())))?;
    let mut lines = Vec::new();
    let mut problems = Vec::new();
    let mut seen = HashSet::new();
    let api = text.lines().find(|line| !line.trim().is_empty()).map_or(Api::OpenAi, detect);
    for (n, text) in text.lines().enumerate() {
        let number = n + 1;
        if text.trim().is_empty() {
            continue;
        }
        let parsed = match api {
            Api::OpenAi => parse(text),
            Api::Anthropic => parse_anthropic(text),
        };
        match parsed {
            Ok(line) if !seen.insert(line.custom_id.clone()) => {
                problems
                    .push(format!("line {number}: custom_id `{}` appears twice", line.custom_id));
            }
            Ok(line) => lines.push(line),
            Err(e) => problems.push(format!("line {number}: {e}")),
        }
        if problems.len() >= 10 {
            break;
        }
    }
    if !problems.is_empty() {
        return Err(InputError(format!(
            "{} is not an {} input file; nothing was sent:\n  {}",
            path.display(),
            api.name(),
            problems.join("\n  ")
        )));
    }
    if lines.is_empty() {
        return Err(InputError(format!("{} has no requests", path.display())));
    }
    Ok((api, lines))
}

/// The format a line is in: Anthropic's if it has `params`, OpenAI's otherwise.
fn detect(line: &str) -> Api {
    match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(object)) if object.contains_key("params") => Api::Anthropic,
        _ => Api::OpenAi,
    }
}

/// One Anthropic Message Batches request.
fn parse_anthropic(text: &str) -> Result<Line, String> {
    let raw: RawRequest = serde_json::from_str(text).map_err(|e| {
        format!("not a Message Batches request ({e}); expected {{\"custom_id\", \"params\"}}")
    })?;
    if raw.custom_id.is_empty() {
        return Err("custom_id is empty".into());
    }
    let Value::Object(params) = &raw.params else {
        return Err("params is not a JSON object".into());
    };
    if !params.get("messages").is_some_and(Value::is_array) {
        return Err("params.messages is not a list of messages".into());
    }
    let Some(max_tokens) = params.get("max_tokens").and_then(Value::as_u64) else {
        return Err("params.max_tokens is missing (Anthropic requires it)".into());
    };
    if params.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err("params.stream: a batch records whole answers, not streams".into());
    }
    let prompt_tokens = match serde_json::from_value::<MessagesRequest>(raw.params.clone()) {
        Ok(request) => ratebucket_anthropic::CharsPerToken.input_tokens(&request),
        // Content this client does not model: four characters a token of the whole body.
        Err(_) => (raw.params.to_string().chars().count() as u64).div_ceil(4),
    };
    let body = serde_json::to_vec(&raw.params).map_err(|e| e.to_string())?;
    let (tenant, priority) = raw.caller.read()?;
    Ok(Line {
        custom_id: raw.custom_id,
        url: "/v1/messages".into(),
        body: body.into(),
        prompt_tokens,
        max_tokens: Some(max_tokens),
        choices: 1,
        tenant,
        priority,
    })
}

fn parse(text: &str) -> Result<Line, String> {
    let raw: RawLine = serde_json::from_str(text).map_err(|e| {
        format!(
            "not a request line ({e}); expected {{\"custom_id\", \"method\", \"url\", \"body\"}}"
        )
    })?;
    if raw.custom_id.is_empty() {
        return Err("custom_id is empty".into());
    }
    if !raw.method.eq_ignore_ascii_case("POST") {
        return Err(format!("method `{}`: only POST is supported", raw.method));
    }
    if !raw.url.starts_with('/') {
        return Err(format!("url `{}` is not a path like /v1/chat/completions", raw.url));
    }
    let Value::Object(object) = &raw.body else {
        return Err("body is not a JSON object".into());
    };
    let max_tokens = ["max_completion_tokens", "max_tokens", "max_output_tokens"]
        .iter()
        .find_map(|key| object.get(*key).and_then(Value::as_u64));
    let choices = object.get("n").and_then(Value::as_u64).unwrap_or(1).max(1);
    let prompt_tokens = match serde_json::from_value::<ChatRequest>(raw.body.clone()) {
        Ok(chat) => CharsPerToken.prompt_tokens(&chat),
        // Embeddings, responses and other bodies: four characters a token of the whole body.
        Err(_) => (raw.body.to_string().chars().count() as u64).div_ceil(4),
    };
    let body = serde_json::to_vec(&raw.body).map_err(|e| e.to_string())?;
    let (tenant, priority) = raw.caller.read()?;
    Ok(Line {
        custom_id: raw.custom_id,
        url: raw.url,
        body: body.into(),
        prompt_tokens,
        max_tokens,
        choices,
        tenant,
        priority,
    })
}

/// Where requests go: an OpenAI-style base URL, an Azure OpenAI deployment, or Anthropic.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// `https://api.openai.com`, `https://api.openai.com/v1`, any compatible server.
    OpenAi(String),
    /// `https://api.anthropic.com`, or a server speaking its Messages API.
    Anthropic(String),
    /// `https://NAME.openai.azure.com`, a deployment and an API version.
    Azure { resource: String, deployment: String, api_version: String },
}

impl Target {
    /// The URL `path` (`/v1/chat/completions`) is posted to.
    pub(crate) fn url(&self, path: &str) -> String {
        match self {
            Target::OpenAi(base) | Target::Anthropic(base) => {
                let base = base.trim_end_matches('/');
                match (base.ends_with("/v1"), path.strip_prefix("/v1/")) {
                    (true, Some(rest)) => format!("{base}/{rest}"),
                    _ => format!("{base}{path}"),
                }
            }
            Target::Azure { resource, deployment, api_version } => {
                let rest = path.strip_prefix("/v1").unwrap_or(path);
                format!(
                    "{}/openai/deployments/{deployment}{rest}?api-version={api_version}",
                    resource.trim_end_matches('/')
                )
            }
        }
    }

    /// The headers every request carries: the credentials for `key`, and for Anthropic
    /// the API version.
    pub(crate) fn headers(&self, key: Option<&str>) -> Vec<(&'static str, String)> {
        let mut headers = Vec::new();
        if let Some(key) = key {
            headers.push(match self {
                Target::OpenAi(_) => ("authorization", format!("Bearer {key}")),
                Target::Azure { .. } => ("api-key", key.to_owned()),
                Target::Anthropic(_) => ("x-api-key", key.to_owned()),
            });
        }
        if let Target::Anthropic(_) = self {
            headers.push(("anthropic-version", ratebucket_anthropic::API_VERSION.to_owned()));
        }
        headers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_join_without_doubling_the_version() {
        let openai = Target::OpenAi("https://api.openai.com/v1/".into());
        assert_eq!(
            openai.url("/v1/chat/completions"),
            "https://api.openai.com/v1/chat/completions"
        );
        let local = Target::OpenAi("http://127.0.0.1:8000".into());
        assert_eq!(local.url("/v1/embeddings"), "http://127.0.0.1:8000/v1/embeddings");
        let azure = Target::Azure {
            resource: "https://x.openai.azure.com".into(),
            deployment: "gpt4o".into(),
            api_version: "2024-10-21".into(),
        };
        assert_eq!(
            azure.url("/v1/chat/completions"),
            "https://x.openai.azure.com/openai/deployments/gpt4o/chat/completions?api-version=2024-10-21"
        );
        assert_eq!(azure.headers(Some("k")), [("api-key", "k".to_owned())]);
        let anthropic = Target::Anthropic("https://api.anthropic.com".into());
        assert_eq!(anthropic.url("/v1/messages"), "https://api.anthropic.com/v1/messages");
        let headers = anthropic.headers(Some("k"));
        assert_eq!(headers[0], ("x-api-key", "k".to_owned()));
        assert_eq!(headers[1].0, "anthropic-version");
    }

    #[test]
    fn bad_lines_are_refused_with_their_numbers() {
        for (text, why) in [
            ("{}", "not a request line"),
            (r#"{"custom_id":"","method":"POST","url":"/v1/chat/completions","body":{}}"#, "empty"),
            (
                r#"{"custom_id":"a","method":"GET","url":"/v1/chat/completions","body":{}}"#,
                "only POST",
            ),
            (r#"{"custom_id":"a","method":"POST","url":"v1","body":{}}"#, "not a path"),
            (r#"{"custom_id":"a","method":"POST","url":"/v1/x","body":[]}"#, "not a JSON object"),
        ] {
            let error = parse(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
        }
        let chat = r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[{"role":"user","content":"twelve chars"}],"max_tokens":7}}"#;
        let line = parse(chat).expect("valid");
        assert_eq!(line.max_tokens, Some(7));
        let chat: ChatRequest = serde_json::from_slice(&line.body).expect("chat");
        assert_eq!(line.prompt_tokens, CharsPerToken.prompt_tokens(&chat));
        assert!(line.prompt_tokens >= 3, "twelve characters are three tokens at least");
    }

    #[test]
    fn anthropic_requests_are_read_and_checked() {
        let good = r#"{"custom_id":"a","params":{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"sixteen chars!!!"}]}}"#;
        assert_eq!(detect(good), Api::Anthropic);
        let line = parse_anthropic(good).expect("valid");
        assert_eq!(line.url, "/v1/messages");
        assert_eq!(line.max_tokens, Some(50));
        assert!(line.prompt_tokens >= 4, "sixteen characters are four tokens at least");
        assert_eq!(
            line.cost(Api::Anthropic, 4096),
            vec![1, line.prompt_tokens, 50, line.prompt_tokens + 50]
        );
        let body: Value = serde_json::from_slice(&line.body).expect("json");
        assert_eq!(body["max_tokens"], 50, "the params are the body");
        for (text, why) in [
            (r#"{"custom_id":"a"}"#, "not a Message Batches request"),
            (r#"{"custom_id":"","params":{}}"#, "empty"),
            (r#"{"custom_id":"a","params":[]}"#, "not a JSON object"),
            (r#"{"custom_id":"a","params":{"max_tokens":5}}"#, "messages"),
            (r#"{"custom_id":"a","params":{"messages":[]}}"#, "max_tokens is missing"),
            (
                r#"{"custom_id":"a","params":{"messages":[],"max_tokens":5,"stream":true}}"#,
                "stream",
            ),
        ] {
            let error = parse_anthropic(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
        }
        let openai = r#"{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}"#;
        assert_eq!(detect(openai), Api::OpenAi);
    }

    #[test]
    fn a_line_asking_for_n_choices_reserves_the_completion_limit_for_each() {
        let body = |n: &str| {
            format!(
                r#"{{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"max_tokens":7{n}}}}}"#
            )
        };
        let one = parse(&body("")).expect("valid");
        let three = parse(&body(r#","n":3"#)).expect("valid");
        assert_eq!(three.upper_bound(100), one.upper_bound(100) + 2 * 7);
        let unset = parse(&body(r#","n":3"#).replace(r#","max_tokens":7"#, "")).expect("valid");
        assert_eq!(unset.upper_bound(100), unset.prompt_tokens + 3 * 100);
    }
}

//! The OpenAI chat completions wire format: lenient on what servers send, exact on what
//! the API expects.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A `/v1/chat/completions` request. Unknown parameters go in `extra` and are sent as is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// The model (for Azure deployments, may be empty).
    #[serde(default)]
    pub model: String,
    /// The conversation.
    pub messages: Vec<Message>,
    /// The completion limit (legacy name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// The completion limit (newer name; wins over `max_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    /// How many choices to generate; each may use the whole completion limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u64>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// An end-user identifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Any other parameter (tools, response_format, seed...), passed through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl ChatRequest {
    /// A request for `model` with `messages`.
    pub fn new(model: impl Into<String>, messages: Vec<Message>) -> ChatRequest {
        ChatRequest { model: model.into(), messages, ..ChatRequest::default() }
    }

    /// Sets `max_tokens`.
    pub fn max_tokens(mut self, max_tokens: u64) -> ChatRequest {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// The completion limit the request asks for, if any.
    pub fn completion_limit(&self) -> Option<u64> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// How many choices it asks for: `n`, at least one.
    pub fn choices(&self) -> u64 {
        self.n.unwrap_or(1).max(1)
    }

    /// The most tokens the call can be charged, given its prompt's estimate: see
    /// [`chat_token_bound`], with `default_max_tokens` where the request sets no limit.
    ///
    /// ```
    /// use ratebucket_openai::{ChatRequest, Message};
    ///
    /// let mut request = ChatRequest::new("m", vec![Message::user("hi")]).max_tokens(100);
    /// request.n = Some(3);
    /// assert_eq!(request.token_bound(10, 4096), 10 + 3 * 100);
    /// ```
    pub fn token_bound(&self, prompt_tokens: u64, default_max_tokens: u64) -> u64 {
        let limit = self.completion_limit().unwrap_or(default_max_tokens);
        chat_token_bound(prompt_tokens, limit, self.choices())
    }
}

/// The one cost rule of a chat completion, shared by the OpenAI client, the async-openai
/// layer and `ratebucket batch`: the prompt's tokens plus the completion limit for each of
/// the `choices` (`n`, at least one), since each choice may use all of it. Saturating.
pub fn chat_token_bound(prompt_tokens: u64, completion_limit: u64, choices: u64) -> u64 {
    prompt_tokens.saturating_add(completion_limit.saturating_mul(choices.max(1)))
}

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` (needed to reconcile a stream's cost).
    #[serde(default)]
    pub include_usage: bool,
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, `tool`...
    pub role: String,
    /// A string, or an array of content parts.
    #[serde(default)]
    pub content: Option<Value>,
    /// Any other field (name, tool_calls...), passed through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Message {
    /// A message with `role` and text `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: Some(Value::String(content.into())),
            extra: Map::new(),
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }

    /// The text of the message: the string, or the `text` of every content part.
    pub fn text(&self) -> String {
        match &self.content {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    }
}

/// A chat completion. Every field is optional on the wire; unknown fields are ignored.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ChatCompletion {
    /// The completion's id.
    #[serde(default)]
    pub id: String,
    /// `chat.completion`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: Option<Value>,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// The answers.
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Tokens used (`None` when absent, or when the report does not hold non-negative
    /// integers: a malformed report is no report, and the reservation stays charged).
    #[serde(default, deserialize_with = "lenient_usage")]
    pub usage: Option<Usage>,
}

impl ChatCompletion {
    /// The first choice's text, if any.
    pub fn text(&self) -> Option<&str> {
        self.choices.first()?.message.content.as_deref()
    }
}

/// One answer.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Choice {
    /// Its index.
    #[serde(default)]
    pub index: u32,
    /// The message.
    #[serde(default)]
    pub message: ResponseMessage,
    /// `stop`, `length`, `tool_calls`, `content_filter`...
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The assistant's message.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ResponseMessage {
    /// `assistant`.
    #[serde(default)]
    pub role: Option<String>,
    /// The text.
    #[serde(default)]
    pub content: Option<String>,
    /// A refusal, if the model refused.
    #[serde(default)]
    pub refusal: Option<String>,
}

/// Token usage, as billed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Completion tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Both.
    #[serde(default)]
    pub total_tokens: u64,
    /// What the prompt tokens were, when the provider says.
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// What a completion's prompt tokens were.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from the provider's cache (priced lower).
    #[serde(default)]
    pub cached_tokens: u64,
}

impl ratebucket_http::price::Usage for Usage {
    /// Cached prompt tokens apart from the rest; the completion as output.
    fn billed(&self) -> ratebucket_http::price::Billed {
        let cached = self.cached_tokens().min(self.prompt_tokens);
        ratebucket_http::price::Billed {
            input: self.prompt_tokens - cached,
            cached_input: cached,
            cache_write: 0,
            output: self.completion_tokens,
        }
    }
}

impl Usage {
    /// Prompt tokens read from the cache (0 when not reported).
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details.map_or(0, |d| d.cached_tokens)
    }

    /// `total_tokens`, or the sum when a server leaves it out (saturating: an absurd
    /// report is bounded when it is charged, never wrapped into a refund).
    pub fn total(&self) -> u64 {
        if self.total_tokens > 0 {
            self.total_tokens
        } else {
            self.prompt_tokens.saturating_add(self.completion_tokens)
        }
    }
}

/// One streamed chunk.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ChatCompletionChunk {
    /// The completion's id.
    #[serde(default)]
    pub id: String,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// Deltas (empty in the final usage chunk).
    #[serde(default)]
    pub choices: Vec<ChunkChoice>,
    /// Present (non-null) only in the final chunk, with `include_usage`; `None` also when
    /// malformed.
    #[serde(default, deserialize_with = "lenient_usage")]
    pub usage: Option<Usage>,
}

/// A delta of one choice.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ChunkChoice {
    /// Its index.
    #[serde(default)]
    pub index: u32,
    /// What it adds.
    #[serde(default)]
    pub delta: Delta,
    /// Set on the choice's last chunk.
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The added content.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Delta {
    /// Set on the first chunk.
    #[serde(default)]
    pub role: Option<String>,
    /// Text added.
    #[serde(default)]
    pub content: Option<String>,
}

/// An error body: `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ApiError,
}

/// An API error as servers report it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct ApiError {
    /// Human-readable (empty when the server sent none, or `null`).
    #[serde(default, deserialize_with = "null_as_default")]
    pub message: String,
    /// `requests`, `tokens`, `insufficient_quota`, `invalid_request_error`...
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    /// The offending parameter.
    #[serde(default)]
    pub param: Option<Value>,
    /// A string code (OpenAI) or the HTTP status as a number (vLLM).
    #[serde(default)]
    pub code: Option<ErrorCode>,
}

impl ApiError {
    /// Whether it says "too much now, wait": a rate limit's (`rate_limit_exceeded`,
    /// `slow_down`) or an overloaded service's (`server_is_overloaded`; `rate_limit_error`
    /// and `overloaded_error` as a proxy relays Anthropic's).
    pub fn is_throttle(&self) -> bool {
        let code = self.code.as_ref().and_then(ErrorCode::as_str);
        matches!(code, Some("rate_limit_exceeded" | "slow_down" | "server_is_overloaded"))
            || matches!(self.kind.as_deref(), Some("rate_limit_error" | "overloaded_error"))
    }
}

/// An error code: text, or a number as vLLM sends.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum ErrorCode {
    /// `rate_limit_exceeded`, `insufficient_quota`...
    Text(String),
    /// An HTTP status.
    Number(i64),
}

impl ErrorCode {
    /// The code as text, if it is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            ErrorCode::Text(s) => Some(s),
            ErrorCode::Number(_) => None,
        }
    }
}

/// Reads `null` as the type's default, as the SDKs treat a null field as an absent one.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A usage report, or `None` if it is absent or malformed: one bad field must not cost the
/// answer it came with.
fn lenient_usage<'de, D>(deserializer: D) -> Result<Option<Usage>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let value = Option::<Value>::deserialize(deserializer)?;
    Ok(value.and_then(|v| Usage::deserialize(v).ok()))
}

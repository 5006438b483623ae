//! The Messages API wire format: lenient on what the server sends, exact on what the API
//! expects.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A `POST /v1/messages` request. Unknown parameters go in `extra` and are sent as is.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MessagesRequest {
    /// The model.
    pub model: String,
    /// The most output tokens the answer may have (the API requires it; it is also what
    /// the output-tokens limit is charged on admission).
    pub max_tokens: u64,
    /// The conversation.
    pub messages: Vec<Message>,
    /// The system prompt: a string or text blocks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<Value>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Stream the answer as server-sent events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Any other parameter (tools, metadata, stop_sequences...), passed through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl MessagesRequest {
    /// A request for `model` answering `messages` in at most `max_tokens` tokens.
    pub fn new(model: impl Into<String>, max_tokens: u64, messages: Vec<Message>) -> Self {
        MessagesRequest { model: model.into(), max_tokens, messages, ..MessagesRequest::default() }
    }

    /// Sets the system prompt.
    pub fn system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(Value::String(system.into()));
        self
    }

    /// The text of the system prompt, if any (blocks joined).
    pub fn system_text(&self) -> Option<String> {
        self.system.as_ref().map(text_of)
    }
}

/// One message of the conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// `user` or `assistant`.
    pub role: String,
    /// A string, or an array of content blocks.
    pub content: Value,
}

impl Message {
    /// A user message of text.
    pub fn user(text: impl Into<String>) -> Message {
        Message { role: "user".into(), content: Value::String(text.into()) }
    }

    /// An assistant message of text (a turn of the conversation so far).
    pub fn assistant(text: impl Into<String>) -> Message {
        Message { role: "assistant".into(), content: Value::String(text.into()) }
    }

    /// The message's text: the string, or its text blocks joined.
    pub fn text(&self) -> String {
        text_of(&self.content)
    }
}

/// A string's text, or the text blocks of an array joined.
fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            blocks.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect()
        }
        _ => String::new(),
    }
}

/// A whole answer: a `message` object.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MessagesResponse {
    /// Its id (`msg_...`).
    #[serde(default)]
    pub id: String,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// `assistant`.
    #[serde(default)]
    pub role: String,
    /// The content blocks.
    #[serde(default)]
    pub content: Vec<ContentBlock>,
    /// Why it stopped: `end_turn`, `max_tokens`, `stop_sequence`, `tool_use`...
    #[serde(default)]
    pub stop_reason: Option<String>,
    /// What it used.
    #[serde(default)]
    pub usage: Usage,
}

impl MessagesResponse {
    /// The text of every text block, joined.
    pub fn text(&self) -> String {
        self.content.iter().filter_map(|b| b.text.as_deref()).collect()
    }
}

/// One content block of an answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContentBlock {
    /// `text`, `tool_use`, `thinking`...
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The other fields of the block, as sent.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// What a request used, as Anthropic counts it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Input tokens read neither from nor into the cache.
    #[serde(default)]
    pub input_tokens: u64,
    /// Output tokens.
    #[serde(default)]
    pub output_tokens: u64,
    /// Input tokens written to the cache: counted against the input-tokens limit.
    #[serde(default)]
    pub cache_creation_input_tokens: Option<u64>,
    /// Input tokens read from the cache: not counted against the input-tokens limit on
    /// most models.
    #[serde(default)]
    pub cache_read_input_tokens: Option<u64>,
}

impl ratebucket_http::price::Usage for Usage {
    /// Input, cache reads, cache writes and output, each priced apart.
    fn billed(&self) -> ratebucket_http::price::Billed {
        ratebucket_http::price::Billed {
            input: self.input_tokens,
            cached_input: self.cache_read_input_tokens.unwrap_or(0),
            cache_write: self.cache_creation_input_tokens.unwrap_or(0),
            output: self.output_tokens,
        }
    }
}

impl Usage {
    /// The input tokens the input-tokens limit counts: those not read from the cache.
    pub fn counted_input(&self) -> u64 {
        self.input_tokens.saturating_add(self.cache_creation_input_tokens.unwrap_or(0))
    }
}

/// One event of a streamed answer, as its `type` names it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum StreamEvent {
    /// `message_start`: the message, with the input usage.
    MessageStart(MessagesResponse),
    /// `content_block_start`.
    ContentBlockStart {
        /// The block's index.
        index: u64,
        /// The block as it starts.
        block: ContentBlock,
    },
    /// `content_block_delta`: a piece of content (`text_delta`, `input_json_delta`...).
    ContentBlockDelta {
        /// The block's index.
        index: u64,
        /// The delta as sent (`{"type":"text_delta","text":"..."}`).
        delta: Value,
    },
    /// `content_block_stop`.
    ContentBlockStop {
        /// The block's index.
        index: u64,
    },
    /// `message_delta`: the stop reason and the output usage so far.
    MessageDelta {
        /// `stop_reason` and `stop_sequence`.
        delta: Value,
        /// The usage it reports (output tokens, cumulative).
        usage: Usage,
    },
    /// `message_stop`: the end.
    MessageStop,
    /// `ping`: a keep-alive.
    Ping,
    /// An event of a type this crate does not know, as sent.
    Other(Value),
}

impl StreamEvent {
    /// The text of a `text_delta`, if this is one.
    pub fn text(&self) -> Option<&str> {
        match self {
            StreamEvent::ContentBlockDelta { delta, .. } => delta.get("text")?.as_str(),
            _ => None,
        }
    }

    /// Reads one event's data; an `error` event is the [`ApiError`] it carries.
    pub(crate) fn parse(value: Value) -> Result<Result<StreamEvent, ApiError>, serde_json::Error> {
        #[derive(Deserialize)]
        struct Block {
            #[serde(default)]
            index: u64,
            #[serde(default)]
            content_block: Option<ContentBlock>,
            #[serde(default)]
            delta: Option<Value>,
            #[serde(default)]
            usage: Option<Usage>,
            #[serde(default)]
            message: Option<MessagesResponse>,
            #[serde(default)]
            error: Option<ApiError>,
        }
        let kind = value.get("type").and_then(Value::as_str).map(str::to_owned);
        let Some(kind) = kind else {
            return Ok(Ok(StreamEvent::Other(value)));
        };
        let fields: Block = serde_json::from_value(value.clone())?;
        let event = match kind.as_str() {
            "error" => return Ok(Err(fields.error.unwrap_or_default())),
            "message_start" => match fields.message {
                Some(message) => StreamEvent::MessageStart(message),
                None => StreamEvent::Other(value),
            },
            "content_block_start" => match fields.content_block {
                Some(block) => StreamEvent::ContentBlockStart { index: fields.index, block },
                None => StreamEvent::Other(value),
            },
            "content_block_delta" => StreamEvent::ContentBlockDelta {
                index: fields.index,
                delta: fields.delta.unwrap_or(Value::Null),
            },
            "content_block_stop" => StreamEvent::ContentBlockStop { index: fields.index },
            "message_delta" => StreamEvent::MessageDelta {
                delta: fields.delta.unwrap_or(Value::Null),
                usage: fields.usage.unwrap_or_default(),
            },
            "message_stop" => StreamEvent::MessageStop,
            "ping" => StreamEvent::Ping,
            _ => StreamEvent::Other(value),
        };
        Ok(Ok(event))
    }
}

/// An error body: `{"type":"error","error":{"type":...,"message":...}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: ApiError,
}

/// The error object of an error body or an `error` event.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// `rate_limit_error`, `overloaded_error`, `invalid_request_error`,
    /// `authentication_error`, `api_error`...
    #[serde(rename = "type", default)]
    pub kind: String,
    /// What the provider said.
    #[serde(default)]
    pub message: String,
    /// Details some errors carry: `{"error_code": "enforced_spend_limit_reached"}` on a
    /// spend cap's 429.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<serde_json::Value>,
}

impl ApiError {
    /// The `details.error_code` an error carries, if any.
    pub fn code(&self) -> Option<&str> {
        self.details.as_ref()?.get("error_code")?.as_str()
    }

    /// Whether it says "too much now, wait": a rate limit's or the service's overload.
    pub fn is_throttle(&self) -> bool {
        matches!(self.kind.as_str(), "rate_limit_error" | "overloaded_error")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_serialises_as_the_api_expects() {
        let mut request =
            MessagesRequest::new("claude", 100, vec![Message::user("hi")]).system("Be brief.");
        request.extra.insert("metadata".into(), json!({"user_id": "7"}));
        let value = serde_json::to_value(&request).expect("serialises");
        assert_eq!(
            value,
            json!({
                "model": "claude",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "hi"}],
                "system": "Be brief.",
                "metadata": {"user_id": "7"},
            })
        );
    }

    #[test]
    fn cache_reads_are_not_counted_as_input() {
        let usage: Usage = serde_json::from_value(json!({
            "input_tokens": 10,
            "output_tokens": 5,
            "cache_creation_input_tokens": 100,
            "cache_read_input_tokens": 1000,
        }))
        .expect("usage");
        assert_eq!(usage.counted_input(), 110);
    }

    #[test]
    fn events_are_read_by_type_and_errors_apart() {
        let delta = json!({"type": "content_block_delta", "index": 0,
                           "delta": {"type": "text_delta", "text": "Hel"}});
        let event = StreamEvent::parse(delta).expect("JSON").expect("no error");
        assert_eq!(event.text(), Some("Hel"));
        let error = json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
        let error = StreamEvent::parse(error).expect("JSON").expect_err("an error");
        assert!(error.is_throttle());
        let unknown = json!({"type": "citations_delta"});
        assert!(matches!(StreamEvent::parse(unknown).expect("JSON"), Ok(StreamEvent::Other(_))));
    }
}

//! Anthropic's wire format: Messages API requests, answers, stream events and errors.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::openai::completion_text;

/// The parts of a Messages API request the provider looks at.
#[derive(Debug, Deserialize)]
pub(crate) struct MessagesRequest {
    #[serde(default)]
    pub(crate) model: Option<String>,
    pub(crate) messages: Vec<Message>,
    /// Required by the API: a request without it is refused.
    #[serde(default)]
    pub(crate) max_tokens: Option<u64>,
    #[serde(default)]
    system: Option<Value>,
    #[serde(default)]
    pub(crate) stream: bool,
    #[serde(default)]
    metadata: Option<Metadata>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Message {
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct Metadata {
    #[serde(default)]
    user_id: Option<String>,
}

impl MessagesRequest {
    /// Input tokens, estimated as the OpenAI side does: four characters per token plus a
    /// few of framing per message, the system prompt counted as one more message.
    pub(crate) fn input_tokens(&self) -> u64 {
        let messages: u64 =
            self.messages.iter().map(|m| 4 + chars(m.content.as_ref()).div_ceil(4)).sum();
        let system = self.system.as_ref().map_or(0, |s| 4 + chars(Some(s)).div_ceil(4));
        messages + system + 3
    }

    /// The caller's tag (`metadata.user_id`), if any.
    pub(crate) fn user(&self) -> Option<String> {
        self.metadata.as_ref().and_then(|m| m.user_id.clone())
    }
}

/// Characters of text in a content field: a string, or blocks with `text`.
fn chars(content: Option<&Value>) -> u64 {
    match content {
        Some(Value::String(s)) => s.chars().count() as u64,
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .map(|s| s.chars().count() as u64)
            .sum(),
        _ => 0,
    }
}

/// An answer of `output_tokens` tokens to a request of `input_tokens`.
pub(crate) struct Answer<'a> {
    pub(crate) id: u64,
    pub(crate) model: &'a str,
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// `end_turn`, or `max_tokens` when the answer was cut at the limit.
    pub(crate) stop_reason: &'a str,
}

impl Answer<'_> {
    fn usage(&self, output_tokens: u64) -> Value {
        json!({
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": output_tokens,
        })
    }

    /// The whole answer, as a plain request gets it.
    pub(crate) fn body(&self) -> Value {
        json!({
            "id": format!("msg_sim_{}", self.id),
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": completion_text(self.output_tokens)}],
            "stop_reason": self.stop_reason,
            "stop_sequence": null,
            "usage": self.usage(self.output_tokens),
        })
    }

    /// The events of a streamed answer, `message_stop` last: `message_start` (with the
    /// input usage), the text block's start, deltas and stop, `message_delta` (with the
    /// output usage) and `message_stop`; a `ping` after the block starts.
    pub(crate) fn stream_events(&self) -> Vec<String> {
        let start = json!({
            "type": "message_start",
            "message": {
                "id": format!("msg_sim_{}", self.id),
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": self.usage(1),
            }
        });
        let mut events = vec![
            event("message_start", &start),
            event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0,
                        "content_block": {"type": "text", "text": ""}}),
            ),
            event("ping", &json!({"type": "ping"})),
        ];
        let text = completion_text(self.output_tokens);
        let words: Vec<&str> = text.split_inclusive(' ').collect();
        for piece in words.chunks(8) {
            events.push(delta(&piece.concat()));
        }
        events
            .push(event("content_block_stop", &json!({"type": "content_block_stop", "index": 0})));
        events.push(event(
            "message_delta",
            &json!({
                "type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": null},
                "usage": {"output_tokens": self.output_tokens},
            }),
        ));
        events.push(event("message_stop", &json!({"type": "message_stop"})));
        events
    }
}

/// One text delta event.
pub(crate) fn delta(text: &str) -> String {
    event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}}),
    )
}

/// One server-sent event named `name`.
pub(crate) fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An Anthropic error body: `{"type":"error","error":{"type":kind,"message":...}}`.
pub(crate) fn error(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_carries_its_usage_in_the_start_and_the_delta() {
        let answer = Answer {
            id: 7,
            model: "m",
            input_tokens: 12,
            output_tokens: 30,
            stop_reason: "end_turn",
        };
        let events = answer.stream_events();
        assert!(events[0].starts_with("event: message_start\n"));
        assert!(events[0].contains("\"input_tokens\":12"));
        let delta =
            events.iter().find(|e| e.starts_with("event: message_delta")).expect("a message_delta");
        assert!(delta.contains("\"output_tokens\":30"));
        assert!(events.last().expect("events").contains("message_stop"));
    }
}

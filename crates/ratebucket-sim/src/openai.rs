//! The OpenAI wire format: request parsing, token estimates, and response bodies.

use serde::Deserialize;
use serde_json::{Value, json};

/// The parts of a chat completion request the provider looks at.
#[derive(Debug, Deserialize)]
pub(crate) struct ChatRequest {
    #[serde(default)]
    pub(crate) model: Option<String>,
    pub(crate) messages: Vec<Message>,
    #[serde(default)]
    pub(crate) max_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub(crate) stream: bool,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) user: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct Message {
    #[serde(default)]
    content: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: bool,
}

impl ChatRequest {
    /// Prompt tokens, estimated the way a provider's tokenizer roughly counts them: four
    /// characters per token, plus a few tokens of framing per message.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        let text: u64 =
            self.messages.iter().map(|m| 4 + content_chars(m.content.as_ref()).div_ceil(4)).sum();
        text + 3
    }
}

fn content_chars(content: Option<&Value>) -> u64 {
    match content {
        Some(Value::String(s)) => s.chars().count() as u64,
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(|s| s.chars().count() as u64)
            .sum(),
        _ => 0,
    }
}

/// Text standing in for a completion of `tokens` tokens.
pub(crate) fn completion_text(tokens: u64) -> String {
    const WORDS: [&str; 8] =
        ["rate ", "limit ", "token ", "bucket ", "quota ", "pause ", "grant ", "wave "];
    (0..tokens).map(|i| WORDS[(i % 8) as usize]).collect::<String>().trim_end().to_owned()
}

pub(crate) fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

pub(crate) struct Completion<'a> {
    pub(crate) id: u64,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) prompt_tokens: u64,
    pub(crate) completion_tokens: u64,
    pub(crate) finish_reason: &'a str,
}

impl Completion<'_> {
    pub(crate) fn body(&self) -> Value {
        json!({
            "id": format!("chatcmpl-sim-{}", self.id),
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": completion_text(self.completion_tokens),
                    "refusal": null,
                },
                "logprobs": null,
                "finish_reason": self.finish_reason,
            }],
            "usage": usage(self.prompt_tokens, self.completion_tokens),
            "system_fingerprint": "fp_sim",
        })
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>, with_usage: bool) -> Value {
        let mut chunk = json!({
            "id": format!("chatcmpl-sim-{}", self.id),
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": "fp_sim",
            "choices": [{ "index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason }],
        });
        if with_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The SSE events of a streamed answer, `[DONE]` last.
    pub(crate) fn stream_events(&self, include_usage: bool) -> Vec<String> {
        let mut events =
            vec![self.chunk(json!({"role": "assistant", "content": ""}), None, include_usage)];
        let text = completion_text(self.completion_tokens);
        let words: Vec<&str> = text.split_inclusive(' ').collect();
        for piece in words.chunks(8) {
            events.push(self.chunk(json!({"content": piece.concat()}), None, include_usage));
        }
        events.push(self.chunk(json!({}), Some(self.finish_reason), include_usage));
        if include_usage {
            events.push(json!({
                "id": format!("chatcmpl-sim-{}", self.id),
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": "fp_sim",
                "choices": [],
                "usage": usage(self.prompt_tokens, self.completion_tokens),
            }));
        }
        let mut lines: Vec<String> = events.iter().map(|e| format!("data: {e}\n\n")).collect();
        lines.push("data: [DONE]\n\n".to_owned());
        lines
    }
}

/// An OpenAI error body.
pub(crate) fn error(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({
        "error": {
            "message": message,
            "type": kind,
            "param": null,
            "code": code,
        }
    })
}

//! Prompt token estimates: four characters per token by default, a real BPE tokenizer
//! behind the `tiktoken` feature.

use crate::types::ChatRequest;

/// Estimates a request's prompt tokens before it is sent. The estimate only needs to be
/// close: the reservation is reconciled against the provider's reported usage.
pub trait TokenEstimator: Send + Sync + 'static {
    /// Prompt tokens of `request`.
    fn prompt_tokens(&self, request: &ChatRequest) -> u64;
}

/// Four characters per token, plus the few tokens of framing each message costs.
/// No dependencies; good for English prose, rough for code and other languages.
#[derive(Clone, Copy, Debug, Default)]
pub struct CharsPerToken;

impl TokenEstimator for CharsPerToken {
    fn prompt_tokens(&self, request: &ChatRequest) -> u64 {
        request
            .messages
            .iter()
            .map(|m| 4 + (m.text().chars().count() as u64).div_ceil(4))
            .sum::<u64>()
            + 3
    }
}

/// OpenAI's `o200k_base` tokenizer (GPT-4o and later), with the same per-message framing.
#[cfg(feature = "tiktoken")]
#[derive(Clone, Copy, Debug, Default)]
pub struct Tiktoken;

#[cfg(feature = "tiktoken")]
impl TokenEstimator for Tiktoken {
    fn prompt_tokens(&self, request: &ChatRequest) -> u64 {
        let bpe = tiktoken_rs::o200k_base_singleton();
        request
            .messages
            .iter()
            .map(|m| 4 + bpe.encode_ordinary(&m.text()).len() as u64)
            .sum::<u64>()
            + 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Message;

    #[test]
    fn four_characters_per_token_plus_framing() {
        let request = ChatRequest::new("m", vec![Message::user("abcdefgh"), Message::system("x")]);
        assert_eq!(CharsPerToken.prompt_tokens(&request), (4 + 2) + (4 + 1) + 3);
    }

    #[cfg(feature = "tiktoken")]
    #[test]
    fn tiktoken_counts_real_tokens() {
        let request = ChatRequest::new("m", vec![Message::user("Hello, world!")]);
        // "Hello", ",", " world", "!" in o200k_base.
        assert_eq!(Tiktoken.prompt_tokens(&request), 4 + 4 + 3);
    }
}

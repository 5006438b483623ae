//! Input token estimates: four characters per token by default.

use crate::types::MessagesRequest;

/// Estimates a request's input tokens before it is sent. The estimate only needs to be
/// close: the reservation is settled at the usage the provider reports.
pub trait InputEstimator: Send + Sync + 'static {
    /// Input tokens of `request`.
    fn input_tokens(&self, request: &MessagesRequest) -> u64;
}

/// Four characters per token, plus the few tokens of framing each message (and the system
/// prompt) costs. No dependencies; good for English prose, rough for code.
#[derive(Clone, Copy, Debug, Default)]
pub struct CharsPerToken;

impl InputEstimator for CharsPerToken {
    fn input_tokens(&self, request: &MessagesRequest) -> u64 {
        let framed = |chars: usize| 4 + (chars as u64).div_ceil(4);
        let messages: u64 = request.messages.iter().map(|m| framed(m.text().chars().count())).sum();
        let system = request.system_text().map_or(0, |s| framed(s.chars().count()));
        messages + system + 3
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Message;

    #[test]
    fn four_characters_per_token_plus_framing() {
        let request = MessagesRequest::new("m", 10, vec![Message::user("abcdefgh")]).system("x");
        assert_eq!(CharsPerToken.input_tokens(&request), (4 + 2) + (4 + 1) + 3);
    }
}

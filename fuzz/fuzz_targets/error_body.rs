//! Fuzzes the readers of what a provider sends back: error bodies, retry hints, and the
//! completion and chunk types.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ratebucket_openai::{ChatCompletion, ChatCompletionChunk, ErrorBody, retry_hint, verdict_for};

fuzz_target!(|data: &[u8]| {
    let _ = verdict_for(data);
    let _ = retry_hint(data);
    let _ = serde_json::from_slice::<ErrorBody>(data);
    if let Ok(completion) = serde_json::from_slice::<ChatCompletion>(data) {
        // Usage arithmetic never overflows, whatever the numbers.
        let _ = completion.usage.map(|u| u.total());
        let _ = completion.text();
    }
    if let Ok(chunk) = serde_json::from_slice::<ChatCompletionChunk>(data) {
        let _ = chunk.usage.map(|u| u.total());
    }
});

//! Fuzzes the SSE decoder: any bytes, split anywhere, give the same events or the same
//! error, and memory stays within the limit.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ratebucket_openai::SseDecoder;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, body)) = data.split_first() else {
        return;
    };
    let limit = 256;
    let whole = {
        let mut decoder = SseDecoder::with_limit(limit);
        let mut events = Vec::new();
        let result = decoder.push(body, &mut events);
        (events, result.is_ok())
    };
    let split = {
        let at = usize::from(cut).min(body.len());
        let mut decoder = SseDecoder::with_limit(limit);
        let mut events = Vec::new();
        let mut ok = decoder.push(&body[..at], &mut events).is_ok();
        if ok {
            ok = decoder.push(&body[at..], &mut events).is_ok();
        }
        (events, ok)
    };
    if whole.1 && split.1 {
        assert_eq!(whole.0, split.0, "splitting changed the events");
    }
    // At most `limit` bytes each: as characters, since invalid UTF-8 is replaced by
    // U+FFFD (three bytes for one).
    for event in &whole.0 {
        assert!(event.chars().count() <= limit, "an event beyond the limit");
    }
});

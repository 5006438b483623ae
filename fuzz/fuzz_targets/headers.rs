//! Fuzzes every header-value parser, one value at a time and as whole header maps.

#![no_main]

use std::time::{Duration, SystemTime};

use libfuzzer_sys::fuzz_target;
use ratebucket_http::headers::{
    ietf_quota, parse_go_duration, parse_retry_after, parse_retry_after_ms, parse_should_retry,
    x_ratelimit_quota,
};
use ratebucket_http::Signals;

/// Names the parsers read; the input picks which ones carry which values.
const NAMES: &[&str] = &[
    "retry-after",
    "retry-after-ms",
    "x-should-retry",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "ratelimit",
    "ratelimit-policy",
    "ratelimit-limit",
    "ratelimit-remaining",
    "ratelimit-reset",
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
];

fuzz_target!(|data: &[u8]| {
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    // Each parser is total: any bytes in, a value or nothing out, never a panic.
    let _ = parse_retry_after(data, now);
    let _ = parse_retry_after_ms(data);
    let _ = parse_should_retry(data);
    let _ = parse_go_duration(data);
    // A header map: lines of `index value`, the first byte choosing the name.
    let mut headers = http::HeaderMap::new();
    for line in data.split(|&b| b == b'\n') {
        let Some((&pick, value)) = line.split_first() else {
            continue;
        };
        let name = NAMES[usize::from(pick) % NAMES.len()];
        if let Ok(value) = http::HeaderValue::from_bytes(value) {
            headers.append(name, value);
        }
    }
    let _ = x_ratelimit_quota(&headers, now);
    let _ = ietf_quota(&headers);
    let signals = Signals::from_headers(&headers, now);
    let _ = signals.server_delay();
});

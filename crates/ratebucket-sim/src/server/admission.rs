//! Admission: whether the provider's limits let a request through, all of them or none.

use std::time::Duration;

use http::HeaderMap;

use super::dialects::{anthropic_headers, anthropic_refusal, limit_headers, refusal};
use super::{Provider, lock};
use crate::limits::Limit;
use crate::log::Refusal;

pub(super) enum Admission {
    Admitted { headers: HeaderMap },
    Throttled { headers: HeaderMap, body: serde_json::Value, refusal: Refusal },
    TooLarge { limit: u64 },
}

/// The limit a refused request ran into, as the dialects describe it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Refused {
    /// Which limit.
    pub(super) which: Refusal,
    /// Its limit per window.
    pub(super) limit: u64,
    /// Its window.
    pub(super) window: Duration,
    /// What is used of it now.
    pub(super) used: u64,
    /// What the request asked of it.
    pub(super) requested: u64,
    /// How long until the request would fit every limit.
    pub(super) wait: Duration,
}

/// How long until `amount` fits `limit` (zero without one; a day if it never can).
fn wait(limit: Option<&mut Limit>, amount: u64, now: Duration) -> Duration {
    limit
        .map(|l| l.wait_for(amount, now).unwrap_or(crate::limits::LONGEST_WAIT))
        .unwrap_or_default()
}

/// Checks every limit at once and charges them all, or none.
pub(super) fn admit(provider: &Provider, tokens: u64) -> Admission {
    let now = provider.now();
    let mut guard = lock(&provider.limits);
    let limits = &mut *guard;
    if let Some(tpm) = limits.tokens.as_ref()
        && tokens > tpm.spec().limit
    {
        return Admission::TooLarge { limit: tpm.spec().limit };
    }
    let waits = [
        (Refusal::Daily, wait(limits.daily.as_mut(), 1, now), 1),
        (Refusal::Requests, wait(limits.requests.as_mut(), 1, now), 1),
        (Refusal::Tokens, wait(limits.tokens.as_mut(), tokens, now), tokens),
    ];
    let config = &provider.config;
    if waits.iter().all(|(_, w, _)| w.is_zero()) {
        for (limit, amount) in [
            (limits.daily.as_mut(), 1),
            (limits.requests.as_mut(), 1),
            (limits.tokens.as_mut(), tokens),
        ] {
            if let Some(limit) = limit {
                limit.charge(amount, now);
            }
        }
        return Admission::Admitted { headers: limit_headers(limits, now, config, None) };
    }
    // The first limit that refuses is the one named (a day's before a minute's).
    let (which, _, requested) = *waits.iter().find(|(_, w, _)| !w.is_zero()).expect("one refuses");
    let wait = waits.iter().map(|(_, w, _)| *w).max().unwrap_or_default();
    let limit = match which {
        Refusal::Daily => limits.daily.as_mut(),
        Refusal::Requests => limits.requests.as_mut(),
        _ => limits.tokens.as_mut(),
    }
    .expect("the refusing limit is configured");
    let spec = limit.spec();
    let refused = Refused {
        which,
        limit: spec.limit,
        window: spec.window,
        used: spec.limit.saturating_sub(limit.remaining(now)),
        requested,
        wait,
    };
    let (headers, body) = refusal(limits, now, config, refused);
    Admission::Throttled { headers, body, refusal: which }
}

/// Checks Anthropic's limits at once (a request, its `input` tokens, and `output`
/// tokens: its `max_tokens`, reserved on admission; both together against a combined
/// tokens limit) and charges them all, or none.
pub(super) fn admit_messages(provider: &Provider, input: u64, output: u64) -> Admission {
    let now = provider.now();
    let mut guard = lock(&provider.limits);
    let limits = &mut *guard;
    let both = input.saturating_add(output);
    for (limit, amount) in [
        (limits.input.as_ref(), input),
        (limits.output.as_ref(), output),
        (limits.tokens.as_ref(), both),
    ] {
        if let Some(limit) = limit
            && amount > limit.spec().limit
        {
            return Admission::TooLarge { limit: limit.spec().limit };
        }
    }
    let waits = [
        (Refusal::Requests, wait(limits.requests.as_mut(), 1, now), 1),
        (Refusal::InputTokens, wait(limits.input.as_mut(), input, now), input),
        (Refusal::OutputTokens, wait(limits.output.as_mut(), output, now), output),
        (Refusal::Tokens, wait(limits.tokens.as_mut(), both, now), both),
    ];
    let resets = provider.config.resets;
    if waits.iter().all(|(_, w, _)| w.is_zero()) {
        for (limit, amount) in [
            (limits.requests.as_mut(), 1),
            (limits.input.as_mut(), input),
            (limits.output.as_mut(), output),
            (limits.tokens.as_mut(), both),
        ] {
            if let Some(limit) = limit {
                limit.charge(amount, now);
            }
        }
        return Admission::Admitted { headers: anthropic_headers(limits, now, resets) };
    }
    let (which, _, requested) = *waits.iter().find(|(_, w, _)| !w.is_zero()).expect("one refuses");
    let wait = waits.iter().map(|(_, w, _)| *w).max().unwrap_or_default();
    let limit = match which {
        Refusal::Requests => limits.requests.as_mut(),
        Refusal::InputTokens => limits.input.as_mut(),
        Refusal::Tokens => limits.tokens.as_mut(),
        _ => limits.output.as_mut(),
    }
    .expect("the refusing limit is configured");
    let spec = limit.spec();
    let refused = Refused {
        which,
        limit: spec.limit,
        window: spec.window,
        used: spec.limit.saturating_sub(limit.remaining(now)),
        requested,
        wait,
    };
    let (headers, body) = anthropic_refusal(limits, now, resets, refused);
    Admission::Throttled { headers, body, refusal: which }
}

/// Settles the output tokens a request reserved (`reserved`) to those it produced
/// (`produced`): the difference goes back to the output limit and to a combined one.
pub(super) fn settle_output(provider: &Provider, reserved: u64, produced: u64) {
    let now = provider.now();
    let mut guard = lock(&provider.limits);
    let limits = &mut *guard;
    let back = reserved.saturating_sub(produced);
    for limit in [limits.output.as_mut(), limits.tokens.as_mut()].into_iter().flatten() {
        limit.refund(back, now);
    }
}

/// Anthropic's headers as they stand now (a plain answer's, sent once it is made: its
/// resets are instants, so they are written when the answer leaves).
pub(super) fn anthropic_headers_now(provider: &Provider) -> HeaderMap {
    let now = provider.now();
    anthropic_headers(&mut lock(&provider.limits), now, provider.config.resets)
}

//! What a dimension learns from and what it has learned: its [`QuotaPolicy`], one
//! [`QuotaReport`] of the provider's, and the [`LearnedQuota`] a snapshot shows.

use std::time::Duration;

use super::ProviderModel;
use crate::time::Instant;

/// How a dimension learns from the provider's reports
/// ([`Change::Policy`](crate::Change::Policy)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuotaPolicy {
    /// The window the provider counts its limit over (a minute for RPM and TPM).
    pub window: Duration,
    /// The limit per window the user configured, if any: a reported limit below it is
    /// adopted, one above it never is. `None`: the provider's reported limit is adopted.
    pub configured: Option<u64>,
    /// Whether to lend the provider's whole capacity once its reports show a bucket that
    /// refills continuously (otherwise the conservative burst, a sixth of the limit, is
    /// kept; see [`Limit::per`](crate::Limit::per)).
    pub provider_burst: bool,
    /// Whether the provider documents that it counts in continuous buckets (Anthropic
    /// does): its first report that agrees with a bucket is taken at its word, without
    /// waiting for a run of reports to span the evidence an unknown provider must show;
    /// the first that contradicts one still makes it a window. Off by default.
    pub documented_bucket: bool,
}

impl QuotaPolicy {
    /// A configured `limit` per `window`, lowered by a smaller reported one.
    pub fn known(limit: u64, window: Duration) -> QuotaPolicy {
        QuotaPolicy {
            window,
            configured: Some(limit),
            provider_burst: true,
            documented_bucket: false,
        }
    }

    /// No limit known: the provider's reported limit per `window` is adopted.
    pub fn unknown(window: Duration) -> QuotaPolicy {
        QuotaPolicy { window, configured: None, provider_burst: true, documented_bucket: false }
    }

    /// Keeps the conservative burst even against a provider that refills continuously.
    pub fn conservative(mut self) -> QuotaPolicy {
        self.provider_burst = false;
        self
    }

    /// Takes the provider at its documented word that it counts in continuous buckets
    /// ([`QuotaPolicy::documented_bucket`]).
    pub fn documented_bucket(mut self) -> QuotaPolicy {
        self.documented_bucket = true;
        self
    }
}

/// One report of the provider's on one dimension, as a reply's headers carried it (IETF
/// `RateLimit` fields, `x-ratelimit-*`, or any other form an adapter reads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuotaReport {
    /// Units allowed per window.
    pub limit: Option<u64>,
    /// Units left when the provider took the request.
    pub remaining: Option<u64>,
    /// Time until the quota is whole again.
    pub reset: Option<Duration>,
    /// The window the provider says `limit` is counted over (IETF `RateLimit-Policy`'s
    /// `w`), when it says; `None`: the window in force (the policy's, at first).
    pub window: Option<Duration>,
    /// The wall-clock time the reply was read, as time since the UNIX epoch, when the
    /// adapter gives it (the core reads no clock). A provider that counts in fixed windows
    /// and sends no reset is first taken to align them to the clock, as gateways counting
    /// per clock minute do; its reports confirm or refute that (see `edges.rs`).
    pub clock: Option<Duration>,
    /// The step `remaining` is rounded to the nearest multiple of (Anthropic rounds its
    /// token counts to thousands); 0 or 1 when it is exact. A rounded `remaining` lowers
    /// the level only to the least it can stand for, widens the band a bucket's reset must
    /// fall in, and teaches no booked charge.
    pub precision: u64,
    /// Whether `reset` came as an instant (an RFC 3339 time, Unix seconds or milliseconds)
    /// and was turned into a wait against the clock as the reply was read. The provider
    /// wrote it earlier, at some moment between the request's send and that reading, so
    /// it may read short by up to that span; the learning allows for it when it tells a
    /// bucket from a window.
    pub reset_as_instant: bool,
    /// The resolution `reset` was written at, when its form says: a second for an RFC 3339
    /// instant or an HTTP-date without a fraction (Anthropic's resets), a millisecond for
    /// epoch milliseconds. Zero where the form does not say: the learning tells it from
    /// the values (a wait in whole seconds is a multiple of one). An instant turned into a
    /// wait reads at any fraction of its resolution, so only the form can tell it.
    pub reset_resolution: Duration,
}

/// What a dimension has learned of the provider
/// ([`Arbiter::dimension`](crate::Arbiter::dimension)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LearnedQuota {
    /// The limit per window in force: configured, lowered or adopted.
    pub limit: Option<u64>,
    /// The window that limit is counted over: the policy's, or the provider's own when it
    /// reports a different one with a stricter rate (see [`QuotaReport::window`]).
    pub window: Duration,
    /// How the provider appears to count.
    pub model: ProviderModel,
    /// Whether the dimension lends the provider's whole capacity (a continuous bucket was
    /// recognised) and follows its reports.
    pub provider_burst: bool,
    /// Whether each trailing window is capped at the limit (the provider counts in
    /// windows).
    pub guarded: bool,
    /// For a provider that counts in fixed windows and sends no reset: the latest instant
    /// one of its windows may have begun at, found from the moment its `remaining` jumped
    /// back up (the others begin whole windows away). Each window's limit is spent from
    /// then on.
    pub window_edge: Option<Instant>,
}

//! The settings of a fetcher: `FetchConfig`.

use std::time::Duration;

use ratebucket_rt::core::{QuotaPolicy, RetryPolicy};

#[cfg(doc)]
use crate::Fetcher;

/// Settings of a [`Fetcher`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FetchConfig {
    /// The retry policy (backoff, ceilings, `retry_ambiguous`, deadline).
    pub retry: RetryPolicy,
    /// What one request costs, per limiter dimension. `[1]` by default: one request.
    pub cost: Vec<u64>,
    /// The limiter dimension that `x-ratelimit-remaining` / `RateLimit` quotas are folded
    /// into, if any. Dimension 0 (requests) by default.
    pub fold_dimension: Option<usize>,
    /// How `fold_dimension` learns from the quotas folded into it (set on the limiter when
    /// the fetcher is made; see [`FetchConfig::learn`]). `None`: the limiter keeps
    /// whatever policy it has, and without one a quota's `remaining` only lowers the level.
    pub learn: Option<QuotaPolicy>,
    /// Time allowed from sending until the whole body is read.
    pub read_timeout: Duration,
    /// Largest response body read, in bytes.
    pub max_body: usize,
    /// Seed for backoff jitter.
    pub seed: u64,
}

impl Default for FetchConfig {
    fn default() -> FetchConfig {
        FetchConfig {
            retry: RetryPolicy::default(),
            cost: vec![1],
            fold_dimension: Some(0),
            learn: None,
            read_timeout: Duration::from_secs(60),
            max_body: 16 << 20,
            seed: 0x5eed,
        }
    }
}

impl FetchConfig {
    /// Sets the retry policy.
    pub fn retry(mut self, retry: RetryPolicy) -> FetchConfig {
        self.retry = retry;
        self
    }

    /// Sets the per-request cost.
    pub fn cost(mut self, cost: Vec<u64>) -> FetchConfig {
        self.cost = cost;
        self
    }

    /// Learns the provider from the quotas its replies report on `fold_dimension`, under
    /// `policy`: the limit (adopted when unknown, lowered when the provider's is smaller),
    /// the burst a continuously refilling provider lends, and a cap per window for one
    /// that counts in windows (see [`Arbiter::observe_quota`](ratebucket_rt::core::Arbiter::observe_quota)). Build the limiter's bucket
    /// for that dimension from the same limit, or from a cautious start when it is unknown
    /// (for instance `Limit::per_second(1)`).
    pub fn learn(mut self, policy: QuotaPolicy) -> FetchConfig {
        self.learn = Some(policy);
        self
    }

    /// Sets the read timeout.
    pub fn read_timeout(mut self, timeout: Duration) -> FetchConfig {
        self.read_timeout = timeout;
        self
    }

    /// Sets the jitter seed.
    pub fn seed(mut self, seed: u64) -> FetchConfig {
        self.seed = seed;
        self
    }

    /// These settings for call number `call` of a service that makes a fetcher per call:
    /// its backoff jitter draws from a seed of its own, so calls retrying together do not
    /// back off in step.
    pub fn for_call(&self, call: u64) -> FetchConfig {
        self.clone().seed(self.seed ^ call.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }
}

//! The shared limits as a process last knew them, lowered in both directions: what the
//! quota learned reaches the local limiter, what the local limiter learned reaches the
//! quota.

use std::sync::atomic::Ordering;

use ratebucket_tokio::Limiter;
use ratebucket_tokio::core::Rate;

use crate::Shared;
use crate::script::{Lease, Remote};

/// Per dimension, the shared rate (permits per second) and capacity as last known.
#[derive(Debug)]
pub(crate) struct SharedLimits {
    pub(crate) rates: Vec<f64>,
    pub(crate) capacities: Vec<u64>,
}

impl SharedLimits {
    /// Takes lower shared limits a lease carried into the local limiter.
    pub(crate) fn adopt(&mut self, limiter: &Limiter, lease: &Lease) {
        for d in 0..self.rates.len() {
            let rate = lease.rates[d];
            if rate > 0.0 && rate < self.rates[d] * (1.0 - 1e-9) {
                self.rates[d] = rate;
                if let Ok(rate) = Rate::from_per_second_f64(rate) {
                    let _ = limiter.set_limit(d, Some(rate), None);
                }
            }
            let capacity = lease.capacities[d];
            if capacity > 0 && capacity < self.capacities[d] {
                self.capacities[d] = capacity;
                let _ = limiter.set_limit(d, None, Some(capacity));
            }
        }
    }

    /// Sends lower limits the local limiter learned to the shared bucket.
    pub(crate) async fn share(&mut self, limiter: &Limiter, remote: &mut Remote, shared: &Shared) {
        for d in 0..self.rates.len() {
            let Some(state) = limiter.dimension(d).map(|v| v.state) else {
                continue;
            };
            let (rate, capacity) = (state.rate.per_second_f64(), state.capacity);
            let lower_rate = rate < self.rates[d] * (1.0 - 1e-9);
            let lower_capacity = capacity < self.capacities[d];
            if !lower_rate && !lower_capacity {
                continue;
            }
            let rate = self.rates[d].min(rate);
            let capacity = self.capacities[d].min(capacity);
            // Until the quota exists in Redis (no lease yet), tried again every tick.
            if let Ok(Some(_)) = remote.lower(d, rate, capacity).await {
                shared.round_trips.fetch_add(1, Ordering::Relaxed);
                self.rates[d] = rate;
                self.capacities[d] = capacity;
                tracing::debug!(target: "ratebucket", dimension = d, rate, capacity, "shared a lower limit");
            }
        }
    }
}

//! Metrics through the `metrics` facade (feature `metrics`): what a dashboard of a paced API
//! shows. Without the feature every function here is empty and compiles away.
//!
//! Series are recorded as the limiter is used (the limit gauges too), so a limiter named
//! before its first use reports under that name only.
//!
//! Every series carries a `limiter` label (the limiter's name); per-dimension series also
//! carry `dimension` (its name):
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `ratebucket_grants_total` | counter | limiter | reservations granted |
//! | `ratebucket_waits_total` | counter | limiter | grants that had to wait |
//! | `ratebucket_wait_seconds` | histogram | limiter | how long each waiting grant waited |
//! | `ratebucket_throttles_total` | counter | limiter | throttled replies (429s) reported |
//! | `ratebucket_pauses_total` | counter | limiter | pool-wide pauses (one per wave of 429s) |
//! | `ratebucket_paused_milliseconds_total` | counter | limiter | time the gate was closed for |
//! | `ratebucket_refunded_total` | counter | limiter, dimension | over-estimates given back at commit |
//! | `ratebucket_debt_total` | counter | limiter, dimension | under-estimates charged at commit |
//! | `ratebucket_level` | gauge | limiter, dimension | permits available (negative: debt) |
//! | `ratebucket_queued` | gauge | limiter | waiters queued |
//! | `ratebucket_queued_cost` | gauge | limiter, dimension | the queue's depth in this dimension: what its waiters ask of it |
//! | `ratebucket_limit` | gauge | limiter, dimension | the limit per window in force (configured, lowered or learned), or the provider's last reported one |
//! | `ratebucket_provider_remaining` | gauge | limiter, dimension | what the provider last said remained |
//! | `ratebucket_spent` | gauge | limiter | 1 while the provider's quota is reported spent (every call refused until it resets), else 0 |
//! | `ratebucket_rate_per_second` | gauge | limiter, dimension | refill rate in force (learned or adapted) |
//! | `ratebucket_capacity` | gauge | limiter, dimension | capacity (learned or set) |
//! | `ratebucket_window_limit` | gauge | limiter, dimension | a learned trailing-window cap |
//! | `ratebucket_tenant_queued` | gauge | limiter, tenant, priority | a tenant's calls queued in a class |
//! | `ratebucket_tenant_granted_total` | counter | limiter, tenant, priority | a tenant's calls granted from the queue in a class |
//!
//! Tenants appear once they have queued or been given a weight (`Limiter::set_weight`).

#[cfg(feature = "metrics")]
mod enabled {
    use std::sync::Arc;
    use std::time::Duration;

    use metrics::{counter, gauge, histogram};
    use ratebucket_core::{Arbiter, Instant, Priority};

    use crate::names::Names;

    fn labels(names: &Names, dimension: usize) -> [(&'static str, Arc<str>); 2] {
        [("limiter", Arc::clone(&names.limiter)), ("dimension", names.dimension(dimension))]
    }

    pub(crate) fn granted(names: &Names, waited: Duration) {
        let limiter = Arc::clone(&names.limiter);
        counter!("ratebucket_grants_total", "limiter" => limiter.clone()).increment(1);
        if !waited.is_zero() {
            counter!("ratebucket_waits_total", "limiter" => limiter.clone()).increment(1);
            histogram!("ratebucket_wait_seconds", "limiter" => limiter).record(waited);
        }
    }

    /// What the express lane granted and refunded since the last call (see
    /// `lane::Tally`).
    pub(crate) fn express(names: &Names, grants: u64, refunded: &[u64]) {
        if grants > 0 {
            counter!("ratebucket_grants_total", "limiter" => Arc::clone(&names.limiter))
                .increment(grants);
        }
        for (d, &refunded) in refunded.iter().enumerate() {
            if refunded > 0 {
                counter!("ratebucket_refunded_total", &labels(names, d)).increment(refunded);
            }
        }
    }

    pub(crate) fn throttled(names: &Names) {
        counter!("ratebucket_throttles_total", "limiter" => Arc::clone(&names.limiter))
            .increment(1);
    }

    pub(crate) fn paused(names: &Names, pause: Duration) {
        let limiter = Arc::clone(&names.limiter);
        counter!("ratebucket_pauses_total", "limiter" => limiter.clone()).increment(1);
        let millis = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX);
        counter!("ratebucket_paused_milliseconds_total", "limiter" => limiter).increment(millis);
    }

    pub(crate) fn committed(names: &Names, reserved: &[u64], actual: &[u64]) {
        for (d, (&reserved, &actual)) in reserved.iter().zip(actual).enumerate() {
            if actual < reserved {
                counter!("ratebucket_refunded_total", &labels(names, d))
                    .increment(reserved - actual);
            } else if actual > reserved {
                counter!("ratebucket_debt_total", &labels(names, d)).increment(actual - reserved);
            }
        }
    }

    pub(crate) fn levels(names: &Names, arbiter: &Arbiter, now: Instant) {
        let status = arbiter.status();
        gauge!("ratebucket_queued", "limiter" => Arc::clone(&names.limiter))
            .set(status.queued as f64);
        gauge!("ratebucket_spent", "limiter" => Arc::clone(&names.limiter))
            .set(f64::from(u8::from(status.spent)));
        for d in 0..status.dimensions {
            let Some(dimension) = arbiter.dimension(d, now) else {
                continue;
            };
            gauge!("ratebucket_level", &labels(names, d)).set(dimension.level);
            gauge!("ratebucket_queued_cost", &labels(names, d)).set(dimension.queued_cost as f64);
            let reported = dimension.reported;
            let limit = dimension.learned.and_then(|l| l.limit).or(reported.and_then(|r| r.limit));
            if let Some(limit) = limit {
                gauge!("ratebucket_limit", &labels(names, d)).set(limit as f64);
            }
            if let Some(remaining) = reported.and_then(|r| r.remaining) {
                gauge!("ratebucket_provider_remaining", &labels(names, d)).set(remaining as f64);
            }
        }
        limits(names, arbiter);
        tenants(names, arbiter);
    }

    /// Each known tenant's calls queued and granted, per class.
    fn tenants(names: &Names, arbiter: &Arbiter) {
        // A query: the latest instant seen stands for a time before it.
        for standing in arbiter.snapshot(ratebucket_core::Instant::ZERO).tenants {
            let tenant = standing.tenant;
            for priority in Priority::ALL {
                let labels = [
                    ("limiter", Arc::clone(&names.limiter)),
                    ("tenant", Arc::from(tenant.0.to_string())),
                    ("priority", Arc::from(priority.name())),
                ];
                gauge!("ratebucket_tenant_queued", &labels)
                    .set(standing.queued[priority.index()] as f64);
                counter!("ratebucket_tenant_granted_total", &labels)
                    .absolute(standing.granted[priority.index()]);
            }
        }
    }

    /// The limit gauges, published with the levels after every change of state.
    fn limits(names: &Names, arbiter: &Arbiter) {
        for d in 0..arbiter.status().dimensions {
            let Some(dimension) = arbiter.dimension(d, Instant::ZERO) else {
                continue;
            };
            gauge!("ratebucket_rate_per_second", &labels(names, d))
                .set(dimension.rate.per_second_f64());
            gauge!("ratebucket_capacity", &labels(names, d)).set(dimension.capacity as f64);
            if let Some((limit, _)) = dimension.window_limit {
                gauge!("ratebucket_window_limit", &labels(names, d)).set(limit as f64);
            }
        }
    }
}

#[cfg(feature = "metrics")]
pub(crate) use enabled::*;

#[cfg(not(feature = "metrics"))]
mod disabled {
    use std::time::Duration;

    use ratebucket_core::{Arbiter, Instant};

    use crate::names::Names;

    #[inline(always)]
    pub(crate) fn granted(_: &Names, _: Duration) {}
    #[inline(always)]
    pub(crate) fn express(_: &Names, _: u64, _: &[u64]) {}
    #[inline(always)]
    pub(crate) fn throttled(_: &Names) {}
    #[inline(always)]
    pub(crate) fn paused(_: &Names, _: Duration) {}
    #[inline(always)]
    pub(crate) fn committed(_: &Names, _: &[u64], _: &[u64]) {}
    #[inline(always)]
    pub(crate) fn levels(_: &Names, _: &Arbiter, _: Instant) {}
}

#[cfg(not(feature = "metrics"))]
pub(crate) use disabled::*;

/// Whether metrics are compiled in.
pub(crate) const ENABLED: bool = cfg!(feature = "metrics");

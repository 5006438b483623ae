//! Introspection: what a snapshot of a limiter and of one of its dimensions holds.

use std::sync::Arc;
use std::time::Duration;

use ratebucket_core::{DimensionSnapshot, GateConfig};

use crate::limiter::Limiter;

/// What a limiter holds and has learned, from [`Limiter::snapshot`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Snapshot {
    /// The limiter's name.
    pub name: Arc<str>,
    /// One entry per dimension, in the order costs name them.
    pub dimensions: Vec<DimensionView>,
    /// Waiters queued.
    pub queued: usize,
    /// How long the pause under way still lasts (`None`: the gate is open).
    pub paused_for: Option<Duration>,
    /// How many times the gate has closed.
    pub pauses: u64,
    /// Whether the run was aborted.
    pub aborted: bool,
    /// Whether the provider reported the quota spent: every reservation is refused at once
    /// until it resets, or until [`Limiter::resume`] once its limit is raised.
    pub spent: bool,
    /// The gate's settings: how long a throttle pauses the pool, at most and by default.
    pub gate: GateConfig,
    /// Reservations granted through the arbiter and not yet ended: the requests in flight
    /// (the express lane's grants count once they are sent).
    pub in_flight: usize,
    /// The most requests in flight allowed now, stated or learned from the provider's
    /// refusals; `None`: no bound.
    pub max_in_flight: Option<u32>,
}

/// One dimension of a [`Snapshot`]: its name and state.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct DimensionView {
    /// The dimension's name (`"tokens"`), or its index.
    pub name: Arc<str>,
    /// Its level, rates, capacity, queued cost, and what was learned about the provider.
    pub state: DimensionSnapshot,
}

impl Snapshot {
    /// `limiter`'s state now (see [`Limiter::snapshot`]).
    pub(crate) fn of(limiter: &Limiter) -> Snapshot {
        let shared = &limiter.shared;
        let now = shared.now();
        let state = shared.lock();
        let core = state.arbiter.snapshot(now);
        let status = state.arbiter.status();
        let names = shared.names();
        let dimensions = core.dimensions.into_iter().enumerate();
        Snapshot {
            name: Arc::clone(&names.limiter),
            dimensions: dimensions
                .map(|(d, state)| DimensionView { name: names.dimension(d), state })
                .collect(),
            queued: core.queued,
            paused_for: core.paused_until.map(|at| at.saturating_duration_since(now)),
            pauses: core.epoch.get(),
            aborted: core.aborted,
            spent: status.spent,
            gate: status.gate.config(),
            in_flight: core.in_flight,
            max_in_flight: core.max_in_flight,
        }
    }
}

impl DimensionView {
    /// `limiter`'s `dimension` now (see [`Limiter::dimension`]), the express lane's
    /// permits counted as available.
    pub(crate) fn of(limiter: &Limiter, dimension: usize) -> Option<DimensionView> {
        let shared = &limiter.shared;
        let now = shared.now();
        let mut state = shared.peek().arbiter.dimension(dimension, now)?;
        state.level += shared.lane.pool(dimension) as f64;
        Some(DimensionView { name: shared.names().dimension(dimension), state })
    }
}

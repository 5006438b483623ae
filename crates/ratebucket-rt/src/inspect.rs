//! Introspection: names for the limiter and its dimensions, snapshots, and drain estimates.

use std::sync::Arc;
use std::time::Duration;

use ratebucket_core::{DimensionSnapshot, GateConfig, InvalidLimit};

use crate::error::ReserveError;
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

impl Limiter {
    /// The limiter's name (`"limiter"` unless set with [`Limiter::with_name`]).
    pub fn name(&self) -> Arc<str> {
        Arc::clone(&self.shared.names().limiter)
    }

    /// Names the limiter (for example `"openai/gpt-4o-mini"`): spans, metrics, snapshots and
    /// errors use it. Every handle sees the new name. Name it before use: metric series
    /// already recorded keep the old name.
    pub fn with_name(self, name: impl Into<Arc<str>>) -> Limiter {
        let name = name.into();
        self.shared.rename(|names| names.limiter = name);
        self
    }

    /// Names `dimension` (`"requests"`, `"tokens"`).
    pub fn name_dimension(
        &self,
        dimension: usize,
        name: impl Into<Arc<str>>,
    ) -> Result<(), InvalidLimit> {
        let name = name.into();
        let mut renamed = Err(InvalidLimit::NoSuchDimension(dimension));
        self.shared.rename(|names| {
            if let Some(slot) = names.dimensions.get_mut(dimension) {
                *slot = name;
                renamed = Ok(());
            }
        });
        renamed
    }

    /// `dimension`'s name and state now: its level (the express lane's permits counted as
    /// available; negative while in debt), rates, capacity, queued cost, and what has been
    /// learned of the provider (the limit, the charge per unit reserved). `None` if there
    /// is no such dimension. A query: nothing changes.
    pub fn dimension(&self, dimension: usize) -> Option<DimensionView> {
        let now = self.shared.now();
        let state = self.shared.peek();
        let mut view = state.arbiter.dimension(dimension, now)?;
        view.level += self.shared.lane.pool(dimension) as f64;
        Some(DimensionView { name: self.shared.names().dimension(dimension), state: view })
    }

    /// Every dimension's level, rate (in force and configured), capacity, queued cost and
    /// what has been learned about the provider (synced levels, window caps), with the
    /// gate's state. A query: nothing changes.
    pub fn snapshot(&self) -> Snapshot {
        let now = self.shared.now();
        let state = self.shared.lock();
        let core = state.arbiter.snapshot(now);
        Snapshot {
            name: Arc::clone(&self.shared.names().limiter),
            dimensions: core
                .dimensions
                .into_iter()
                .enumerate()
                .map(|(d, dimension)| DimensionView {
                    name: self.shared.names().dimension(d),
                    state: dimension,
                })
                .collect(),
            queued: core.queued,
            paused_for: core.paused_until.map(|at| at.saturating_duration_since(now)),
            pauses: core.epoch.get(),
            aborted: core.aborted,
            spent: state.arbiter.status().spent,
            gate: state.arbiter.status().gate.config(),
        }
    }

    /// How long from now until everything queued, plus `more` (one entry per dimension:
    /// work not yet reserved, such as the rest of a batch), would be granted at the rates
    /// in force, counting the pause under way: what a progress bar's ETA should use.
    ///
    /// Pass the expected charge of the work to come (for example the mean committed cost
    /// so far, times the items left), not its upper bound, for an ETA rather than a worst
    /// case. See [`Desk::estimate_drain`](ratebucket_core::Desk::estimate_drain).
    pub fn estimate_drain(&self, more: &[u64]) -> Result<Duration, ReserveError> {
        let now = self.shared.now();
        self.shared.lock().arbiter.desk().estimate_drain(more, now)
    }
}

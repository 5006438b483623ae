//! A limiter for synchronous code: calls block the calling thread, and the limiter's driver
//! runs on smol's global executor (a thread of its own), so the caller needs no runtime.

use std::time::{Duration, Instant};

use ratebucket_rt::core::{ArbiterConfig, InvalidLimit, Limit};
use ratebucket_rt::{Reservation, ReserveError, ReserveOptions};
use smol::block_on;

use crate::SmolTimer;

/// A blocking front end to an async [`Limiter`](ratebucket_rt::Limiter).
///
/// Cheap to clone; clones share the quota. It can be shared with async code through
/// [`Limiter::handle`], so threads and tasks draw on one pool.
///
/// ```
/// use std::time::Duration;
/// use ratebucket_smol::blocking::Limiter;
/// use ratebucket_smol::core::Limit;
///
/// let limiter = Limiter::new([Limit::per_second(100)])?;
/// for _ in 0..3 {
///     limiter.acquire(&[1])?; // blocks until a permit is free, and spends it
///     // ... call the API ...
/// }
/// // Reserve an upper bound, give back what was not used.
/// let reservation = limiter.reserve_timeout(&[10], Duration::from_secs(1))?;
/// reservation.commit(&[4])?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct Limiter {
    inner: ratebucket_rt::Limiter,
}

impl Limiter {
    /// A limiter enforcing `limits` (one per dimension, in the order costs name them),
    /// full now.
    pub fn new(limits: impl IntoIterator<Item = Limit>) -> Result<Limiter, InvalidLimit> {
        Limiter::with_config(limits, ArbiterConfig::default())
    }

    /// [`Limiter::new`] with explicit arbiter settings.
    pub fn with_config(
        limits: impl IntoIterator<Item = Limit>,
        config: ArbiterConfig,
    ) -> Result<Limiter, InvalidLimit> {
        let inner = ratebucket_rt::Limiter::from_limits(limits, config, SmolTimer)?;
        Ok(Limiter { inner })
    }

    /// Blocks until `cost` is granted, and spends it for good (nothing is reconciled).
    pub fn acquire(&self, cost: &[u64]) -> Result<(), ReserveError> {
        block_on(self.inner.acquire(cost))
    }

    /// [`Limiter::acquire`], giving up with [`ReserveError::WouldWait`] at once when the
    /// wait would exceed `timeout`, or [`ReserveError::DeadlinePassed`] if it runs out
    /// while queued.
    pub fn acquire_timeout(&self, cost: &[u64], timeout: Duration) -> Result<(), ReserveError> {
        let reservation = self.reserve_timeout(cost, timeout)?;
        // The cost names as many dimensions as the reservation that was just granted.
        let _ = reservation.commit(cost);
        Ok(())
    }

    /// Blocks until `cost` (an upper bound) is granted. Commit the real cost on the
    /// returned [`Reservation`]; dropping it unused gives it all back.
    pub fn reserve(&self, cost: &[u64]) -> Result<Reservation, ReserveError> {
        block_on(self.inner.reserve(cost))
    }

    /// [`Limiter::reserve`] within `timeout` (see [`Limiter::acquire_timeout`]).
    pub fn reserve_timeout(
        &self,
        cost: &[u64],
        timeout: Duration,
    ) -> Result<Reservation, ReserveError> {
        let options = ReserveOptions::default().deadline(Instant::now() + timeout);
        block_on(self.inner.reserve(cost).with(options))
    }

    /// Refuses at once unless `cost` can be granted now.
    pub fn try_reserve(&self, cost: &[u64]) -> Result<Reservation, ReserveError> {
        self.inner.try_reserve(cost)
    }

    /// The async limiter behind it, to share the same quota with async code.
    pub fn handle(&self) -> &ratebucket_rt::Limiter {
        &self.inner
    }
}

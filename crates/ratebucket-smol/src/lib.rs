//! ratebucket on smol: the [`Timer`] for async-io's timers and smol's executor, and
//! constructors.
//!
//! Everything else — the [`Limiter`] handle, reservations, the gate — is
//! `ratebucket-rt`, re-exported here. The limiter's driver runs on smol's global executor,
//! so a limiter works under `smol::block_on` as well as inside spawned tasks.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ratebucket_smol::{limiter, core::TokenBucket};
//!
//! smol::block_on(async {
//!     let now = ratebucket_smol::core::Instant::ZERO;
//!     let limiter = limiter(vec![
//!         TokenBucket::per_minute(600, now)?,    // requests
//!         TokenBucket::per_minute(90_000, now)?, // tokens
//!     ])?;
//!     let reservation = limiter.reserve(&[1, 1_000]).await?;
//!     // ... call the API; it reports 312 tokens used ...
//!     reservation.commit(&[1, 312])?;
//!     Ok(())
//! })
//! # }
//! ```

pub mod blocking;

use std::time::Instant;

use ratebucket_rt::core::{ArbiterConfig, InvalidLimit, Limit, TokenBucket};

pub use ratebucket_rt::*;

/// async-io's timers and smol's global executor.
#[derive(Clone, Copy, Debug, Default)]
pub struct SmolTimer;

impl Timer for SmolTimer {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture {
        let timer = async_io::Timer::at(deadline);
        Box::pin(async move {
            timer.await;
        })
    }

    fn spawn(&self, task: BoxFuture) {
        smol::spawn(task).detach();
    }
}

/// A [`Limiter`] on smol enforcing `limits` (one per dimension, in the order costs name
/// them), every bucket full now, with the default arbiter settings.
///
/// ```no_run
/// use ratebucket_smol::core::Limit;
/// # fn main() -> Result<(), ratebucket_smol::core::InvalidLimit> {
/// let limiter = ratebucket_smol::limiter_for([Limit::per_minute(600), Limit::per_minute(90_000)])?;
/// # let _ = limiter; Ok(()) }
/// ```
pub fn limiter_for(limits: impl IntoIterator<Item = Limit>) -> Result<Limiter, InvalidLimit> {
    Limiter::from_limits(limits, ArbiterConfig::default(), SmolTimer)
}

/// A [`Limiter`] on smol, with the default arbiter settings.
pub fn limiter(buckets: Vec<TokenBucket>) -> Result<Limiter, InvalidLimit> {
    limiter_with(buckets, ArbiterConfig::default())
}

/// A [`Limiter`] on smol, with explicit arbiter settings.
pub fn limiter_with(
    buckets: Vec<TokenBucket>,
    config: ArbiterConfig,
) -> Result<Limiter, InvalidLimit> {
    Limiter::with_timer(buckets, config, SmolTimer)
}

//! ratebucket on tokio: the [`Timer`] for tokio's clock and timers, and constructors.
//!
//! Everything else — the [`Limiter`] handle, reservations, the gate — is
//! `ratebucket-rt`, re-exported here. tokio's paused test clock is honoured: the limiter
//! reads time through `tokio::time::Instant`.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ratebucket_tokio::{limiter, core::TokenBucket};
//!
//! let now = ratebucket_tokio::core::Instant::ZERO;
//! let limiter = limiter(vec![
//!     TokenBucket::per_minute(600, now)?,    // requests
//!     TokenBucket::per_minute(90_000, now)?, // tokens
//! ])?;
//! let reservation = limiter.reserve(&[1, 1_000]).await?;
//! // ... call the API; it reports 312 tokens used ...
//! reservation.commit(&[1, 312])?;
//! # Ok(())
//! # }
//! ```

use std::time::Instant;

use ratebucket_rt::core::{ArbiterConfig, InvalidLimit, Limit, TokenBucket};
use tokio::runtime::Handle;

pub use ratebucket_rt::*;

/// tokio's clock, timers and spawner, bound to the runtime it was created in.
#[derive(Clone, Debug)]
pub struct TokioTimer {
    handle: Handle,
}

impl TokioTimer {
    /// A timer on the current tokio runtime.
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub fn current() -> TokioTimer {
        TokioTimer::with_handle(Handle::current())
    }

    /// A timer on the runtime behind `handle`.
    pub fn with_handle(handle: Handle) -> TokioTimer {
        TokioTimer { handle }
    }
}

impl Timer for TokioTimer {
    fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    fn sleep_until(&self, deadline: Instant) -> BoxFuture {
        Box::pin(tokio::time::sleep_until(deadline.into()))
    }

    fn spawn(&self, task: BoxFuture) {
        drop(self.handle.spawn(task));
    }
}

/// A [`Limiter`] on tokio enforcing `limits` (one per dimension, in the order costs name
/// them), every bucket full now, with the default arbiter settings.
///
/// ```no_run
/// use ratebucket_tokio::core::Limit;
/// # fn main() -> Result<(), ratebucket_tokio::core::InvalidLimit> {
/// let limiter = ratebucket_tokio::limiter_for([Limit::per_minute(600), Limit::per_minute(90_000)])?;
/// # let _ = limiter; Ok(()) }
/// ```
pub fn limiter_for(limits: impl IntoIterator<Item = Limit>) -> Result<Limiter, InvalidLimit> {
    Limiter::from_limits(limits, ArbiterConfig::default(), TokioTimer::current())
}

/// A [`Limiter`] on the current tokio runtime, with the default arbiter settings.
///
/// # Panics
///
/// Outside a tokio runtime.
pub fn limiter(buckets: Vec<TokenBucket>) -> Result<Limiter, InvalidLimit> {
    limiter_with(buckets, ArbiterConfig::default())
}

/// A [`Limiter`] on the current tokio runtime, with explicit arbiter settings.
///
/// # Panics
///
/// Outside a tokio runtime.
pub fn limiter_with(
    buckets: Vec<TokenBucket>,
    config: ArbiterConfig,
) -> Result<Limiter, InvalidLimit> {
    Limiter::with_timer(buckets, config, TokioTimer::current())
}

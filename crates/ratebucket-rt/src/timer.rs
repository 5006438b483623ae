//! The one thing a runtime must provide: a clock, a sleep and a way to spawn the driver.

use std::future::Future;
use std::pin::Pin;
use std::time::Instant;

/// A boxed, sendable future, as runtimes hand them around.
pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What a runtime adapter implements so a [`Limiter`](crate::Limiter) can run on it.
///
/// Three methods: read the runtime's clock (which may be virtual, as tokio's paused
/// time is), sleep until an instant, and spawn the limiter's driver task.
pub trait Timer: Send + Sync + 'static {
    /// The runtime's idea of now.
    fn now(&self) -> Instant;

    /// A future that completes at `deadline`.
    fn sleep_until(&self, deadline: Instant) -> BoxFuture;

    /// Runs `task` in the background until it completes.
    fn spawn(&self, task: BoxFuture);
}

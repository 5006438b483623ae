//! The async layer of ratebucket: one [`Limiter`] handle that thousands of tasks share, on
//! any runtime.
//!
//! A [`Limiter`] wraps the sans-IO [`Arbiter`](ratebucket_core::Arbiter) of
//! `ratebucket-core` behind a mutex, a table of wakers and a driver task:
//!
//! - [`Limiter::reserve`] returns a named future ([`Reserve`]) that resolves to a
//!   [`Reservation`], an RAII guard: [`Reservation::commit`] reconciles the actual cost;
//!   dropping it uncommitted releases it whole. Dropping a pending `Reserve` at any point
//!   withdraws its claim. Nothing leaks by forgetting.
//! - The express lane: while nothing needs order (nobody queued, the gate open, no report
//!   being learned from), a reservation is granted and committed in one atomic word, with
//!   no lock, ticket or clock read; every input that needs order closes the lane first
//!   (ADR 0023). [`Limiter::try_reserve`] is the call that never waits (governor's
//!   `check()`).
//! - One wakeup per grant: the driver wakes exactly the waiter whose ticket was granted,
//!   never the whole queue.
//! - [`ReserveOptions`] refuse at once, with the wait that was refused, when the wait would
//!   exceed `max_wait` or a deadline; a deadline is also honoured while queued.
//! - [`Limiter::gate_open`] waits out the pool-wide pause that
//!   [`Limiter::throttle`] starts; the arbiter grants nothing while the gate is closed.
//! - Core events are emitted as `tracing` events under the `ratebucket` target.
//!
//! Runtimes plug in through the three-method [`Timer`] trait; `ratebucket-tokio` and
//! `ratebucket-smol` implement it.

mod error;
mod gate;
mod inspect;
mod keyed;
mod lane;
mod limiter;
mod metrics;
mod names;
mod reserve;
mod shared;
mod stripes;
mod sync;
mod timer;

pub use error::ReserveError;
pub use gate::{GateOpen, SendWhenOpen};
pub use inspect::{DimensionView, Snapshot};
pub use keyed::{KeyedError, KeyedLimiter};
pub use limiter::{Limiter, Stats};
pub use ratebucket_core as core;
pub use reserve::{Reservation, Reserve, ReserveOptions};
pub use shared::LATE_WAKEUP;
pub use timer::{BoxFuture, Timer};

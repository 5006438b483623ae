//! The synchronization primitives the async layer uses, swapped for loom's under `--cfg loom`.
//!
//! Only the lock and the counters are modelled: they are where tasks, the driver and
//! drops race. `Arc` and `Weak` stay std's (loom has no `Weak`); the driver's exit on the
//! last handle is still checked, because a driver that never ends is a deadlock to loom.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

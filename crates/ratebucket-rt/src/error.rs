//! Why a reservation through the async layer did not produce a grant.

use core::fmt;
use std::time::Duration;

use ratebucket_core::{Refusal, ReserveError as CoreError};

/// Why [`Limiter::reserve`](crate::Limiter::reserve) failed.
///
/// "Never" errors (`CostExceedsCapacity`, `WrongDimensions`, `Aborted`) are told apart from
/// "not yet" ones (`WouldWait`, `DeadlinePassed`), which carry or imply when to try again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// The cost names a different number of dimensions than the limiter has.
    WrongDimensions {
        /// Dimensions of the limiter.
        expected: usize,
        /// Entries in the cost.
        got: usize,
    },
    /// The cost exceeds a dimension's capacity: it can never be granted.
    CostExceedsCapacity {
        /// The dimension.
        dimension: usize,
        /// The cost asked for.
        cost: u64,
        /// That dimension's capacity.
        capacity: u64,
    },
    /// The wait would exceed `max_wait` (or the deadline): refused at once.
    WouldWait {
        /// The wait that was refused; try again after it.
        retry_after: Duration,
    },
    /// The deadline passed while the reservation was queued; its claim was withdrawn.
    DeadlinePassed,
    /// A dimension's capacity was lowered below the cost while it was queued.
    CapacityLowered {
        /// The dimension.
        dimension: usize,
    },
    /// The limiter was aborted by a fatal failure.
    Aborted,
}

impl ReserveError {
    /// For "not yet" errors, how long to wait before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            ReserveError::WouldWait { retry_after } => Some(retry_after),
            _ => None,
        }
    }
}

impl From<CoreError> for ReserveError {
    fn from(e: CoreError) -> ReserveError {
        match e {
            CoreError::WrongDimensions { expected, got } => {
                ReserveError::WrongDimensions { expected, got }
            }
            CoreError::CostExceedsCapacity {
                dimension,
                cost,
                capacity,
            } => ReserveError::CostExceedsCapacity {
                dimension,
                cost,
                capacity,
            },
            CoreError::WouldWait { retry_after } => ReserveError::WouldWait { retry_after },
            _ => ReserveError::Aborted,
        }
    }
}

impl From<Refusal> for ReserveError {
    fn from(r: Refusal) -> ReserveError {
        match r {
            Refusal::CostExceedsCapacity { dimension } => {
                ReserveError::CapacityLowered { dimension }
            }
            _ => ReserveError::Aborted,
        }
    }
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReserveError::WrongDimensions { expected, got } => {
                CoreError::WrongDimensions { expected, got }.fmt(f)
            }
            ReserveError::CostExceedsCapacity {
                dimension,
                cost,
                capacity,
            } => CoreError::CostExceedsCapacity {
                dimension,
                cost,
                capacity,
            }
            .fmt(f),
            ReserveError::WouldWait { retry_after } => CoreError::WouldWait { retry_after }.fmt(f),
            ReserveError::DeadlinePassed => {
                f.write_str("the deadline passed before the reservation was granted")
            }
            ReserveError::CapacityLowered { dimension } => write!(
                f,
                "dimension {dimension}'s capacity was lowered below this cost while it waited"
            ),
            ReserveError::Aborted => f.write_str("the limiter was aborted by a fatal failure"),
        }
    }
}

impl std::error::Error for ReserveError {}

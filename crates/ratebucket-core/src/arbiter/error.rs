//! Why a reservation or an operation on a ticket was refused, and where a ticket stands.

use core::fmt;
use std::time::Duration;

use crate::event::Refusal;
use crate::time::humanise;

/// Why a reservation was not granted: refused when asked, or given up while queued.
///
/// "Never" errors (`CostExceedsCapacity`, `WrongDimensions`, `Aborted`) are told apart from
/// "not yet" ones (`WouldWait`, `DeadlinePassed`), which carry or imply when to try again.
/// The async layer reports the same type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReserveError {
    /// The cost names a different number of dimensions than the arbiter has.
    WrongDimensions {
        /// Dimensions of the arbiter.
        expected: usize,
        /// Entries in the cost.
        got: usize,
    },
    /// Never: the cost exceeds a dimension's capacity, so no amount of waiting grants it.
    CostExceedsCapacity {
        /// The dimension.
        dimension: usize,
        /// The cost asked for.
        cost: u64,
        /// That dimension's capacity.
        capacity: u64,
    },
    /// Not yet: the wait would exceed the caller's `max_wait`. Retry after `retry_after`.
    WouldWait {
        /// The estimated wait that was refused.
        retry_after: Duration,
    },
    /// The arbiter was aborted by a fatal failure; nothing more is granted.
    Aborted,
    /// The caller's deadline passed while the reservation was queued; its claim was
    /// withdrawn.
    DeadlinePassed,
    /// A dimension's capacity was lowered below the cost while it was queued.
    CapacityLowered {
        /// The dimension.
        dimension: usize,
    },
    /// Not before the quota resets: the provider reported a quota spent (of a dimension
    /// over a longer window than its bucket's, a day's; or, as a refusal said, the
    /// account's: a spend cap, a usage limit, a wait beyond the retry ceiling), and the
    /// caller's `max_wait` or deadline does not reach its reset.
    QuotaSpent {
        /// The dimension, when the provider's answer named one.
        dimension: Option<usize>,
        /// How long until the quota resets, as the provider said, from the refusal; `None`
        /// when it did not say: spent until someone raises it (then
        /// [`Arbiter::resume`](crate::Arbiter::resume)).
        resets_in: Option<Duration>,
    },
    /// Never: the cost exceeds what the caller's tenant may take of a dimension at once
    /// (its cap, [`Arbiter::set_cap`](crate::Arbiter::set_cap)).
    CostExceedsCap {
        /// The dimension.
        dimension: usize,
        /// The cost asked for.
        cost: u64,
        /// The most the tenant's cap holds of that dimension.
        cap: u64,
    },
    /// Not before the budget renews: a budget dimension ([`Change::Budget`](crate::Change::Budget)) cannot cover
    /// the cost, even were everything in flight refunded.
    BudgetSpent {
        /// The dimension.
        dimension: usize,
        /// How long until the budget renews, from the refusal.
        renews_in: Duration,
    },
}

impl ReserveError {
    /// For "not yet" errors, how long to wait before trying again.
    pub fn retry_after(&self) -> Option<Duration> {
        match *self {
            ReserveError::WouldWait { retry_after } => Some(retry_after),
            ReserveError::QuotaSpent { resets_in, .. } => resets_in,
            ReserveError::BudgetSpent { renews_in, .. } => Some(renews_in),
            _ => None,
        }
    }
}

impl From<Refusal> for ReserveError {
    /// Why a queued reservation was refused, as the error its waiter receives.
    fn from(refusal: Refusal) -> ReserveError {
        match refusal {
            Refusal::CostExceedsCapacity { dimension } => {
                ReserveError::CapacityLowered { dimension }
            }
            Refusal::Aborted => ReserveError::Aborted,
            Refusal::QuotaSpent { dimension, resets_in } => {
                ReserveError::QuotaSpent { dimension, resets_in }
            }
            Refusal::BudgetSpent { dimension, renews_in } => {
                ReserveError::BudgetSpent { dimension, renews_in }
            }
        }
    }
}

impl fmt::Display for ReserveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReserveError::WrongDimensions { expected, got } => {
                write!(f, "cost has {got} entries but the limiter has {expected} dimensions")
            }
            ReserveError::CostExceedsCapacity { dimension, cost, capacity } => write!(
                f,
                "cost {cost} exceeds the capacity {capacity} of dimension {dimension} and can \
                 never be granted; raise that bucket's capacity or split the request"
            ),
            ReserveError::WouldWait { retry_after } => write!(
                f,
                "the wait of {retry_after:?} would exceed the allowed maximum; retry later"
            ),
            ReserveError::Aborted => f.write_str("the limiter was aborted by a fatal failure"),
            ReserveError::DeadlinePassed => {
                f.write_str("the deadline passed before the reservation was granted")
            }
            ReserveError::CapacityLowered { dimension } => write!(
                f,
                "dimension {dimension}'s capacity was lowered below this cost while it waited"
            ),
            ReserveError::QuotaSpent { dimension, resets_in } => {
                f.write_str("the provider's quota")?;
                if let Some(dimension) = dimension {
                    write!(f, " of dimension {dimension}")?;
                }
                match resets_in {
                    Some(resets_in) => write!(f, " is spent; it resets in {}", humanise(resets_in)),
                    None => f.write_str(
                        " is spent until its limit is raised; resume the limiter once it is",
                    ),
                }
            }
            ReserveError::CostExceedsCap { dimension, cost, cap } => write!(
                f,
                "cost {cost} exceeds the {cap} of dimension {dimension} the tenant's cap allows \
                 at once, and can never be granted; raise the cap or split the request"
            ),
            ReserveError::BudgetSpent { dimension, renews_in } => write!(
                f,
                "the budget of dimension {dimension} cannot cover this cost; it renews in {}",
                humanise(renews_in)
            ),
        }
    }
}

impl std::error::Error for ReserveError {}

/// Why an operation on a ticket failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TicketError {
    /// The ticket's reservation already ended (committed, released, cancelled, refused)
    /// or never existed.
    Unknown,
    /// The reservation is still queued; only granted reservations can be committed or
    /// released.
    NotGranted,
    /// The reservation's request was sent already, so its grant cannot be taken back.
    AlreadySent,
    /// The actual cost names a different number of dimensions than the arbiter has.
    WrongDimensions {
        /// Dimensions of the arbiter.
        expected: usize,
        /// Entries given.
        got: usize,
    },
}

impl fmt::Display for TicketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TicketError::Unknown => f.write_str("no live reservation has this ticket"),
            TicketError::NotGranted => f.write_str("the reservation has not been granted yet"),
            TicketError::AlreadySent => {
                f.write_str("the reservation's request was sent already; its grant stands")
            }
            TicketError::WrongDimensions { expected, got } => {
                write!(f, "actual cost has {got} entries but the limiter has {expected} dimensions")
            }
        }
    }
}

impl std::error::Error for TicketError {}

/// Where a ticket stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TicketState {
    /// Waiting in the queue.
    Queued,
    /// Granted and holding its reservation.
    Granted,
}

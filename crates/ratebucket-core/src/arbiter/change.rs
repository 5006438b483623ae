//! Changing what a dimension is: its rate, capacity, window guard, learning policy, funds,
//! budget, ramp.

use super::rules::{Budget, Ramp};
use crate::bucket::Rate;
use crate::learn::QuotaPolicy;
use crate::window::WindowGuard;

/// A change to one dimension, made by [`Arbiter::change`](crate::Arbiter::change).
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Change {
    /// The configured refill rate from now on (adaptive rates return to it, never above).
    Rate(Rate),
    /// The capacity from now on. Queued waiters whose cost no longer fits are refused with
    /// [`Event::Refused`](crate::Event::Refused).
    Capacity(u64),
    /// A cap of a limit per trailing window on top of the bucket, or none: safe against
    /// providers that count in fixed windows or sliding logs whatever the bucket's burst
    /// (see [`WindowGuard`]). Queued reservations the new cap can never admit are refused
    /// with [`Refusal::CostExceedsCapacity`](crate::Refusal::CostExceedsCapacity). A new guard counts every reservation granted
    /// and not yet ended (they may still reach the provider inside the window it caps);
    /// what ended before it was installed is for the provider's report to tell.
    WindowGuard(Option<WindowGuard>),
    /// Learn from the provider's reports under this policy ([`Arbiter::observe_quota`](crate::Arbiter::observe_quota)).
    /// The policy the dimension already has changes nothing (what it learned stays);
    /// another starts learning afresh. The bucket is left as it is: build it from the same
    /// limit ([`Limit::per`](crate::Limit::per) of the configured limit, or a cautious
    /// start when none is known); reports move it from then on.
    Policy(QuotaPolicy),
    /// Hands permits to a funded bucket ([`TokenBucket::funded`](crate::TokenBucket::funded)), never above its
    /// capacity, and grants whatever now fits. [`Arbiter::change`](crate::Arbiter::change) returns how many were
    /// taken; the rest did not fit and stay the caller's.
    Fund(u64),
    /// Takes back every whole permit the bucket holds above zero (see
    /// [`TokenBucket::withdraw`](crate::TokenBucket::withdraw)): a funded share's unspent part, to return.
    /// [`Arbiter::change`](crate::Arbiter::change) returns how many.
    Withdraw,
    /// Takes back at most this many whole permits of a funded bucket's level (see
    /// [`TokenBucket::withdraw_at_most`](crate::TokenBucket::withdraw_at_most)): the part
    /// of a share whose time to be spent is over. [`Arbiter::change`](crate::Arbiter::change)
    /// returns how many.
    WithdrawAtMost(u64),
    /// Takes what reservations on a funded dimension did not use, kept apart since (a
    /// funded share never spends a refund again; a budget does, within its period). [`Arbiter::change`](crate::Arbiter::change)
    /// returns how many; [`Change::Withdraw`] takes them too.
    Reclaim,
    /// Makes the dimension a budget: `amount` per day, month or period, renewed whole
    /// when each starts, a reservation it cannot cover refused at once (see [`Budget`]).
    /// Queued reservations costing more than the amount are refused with
    /// [`Refusal::CostExceedsCapacity`](crate::Refusal::CostExceedsCapacity).
    Budget(Budget),
    /// Bounds how fast the dimension's admitted rate rises ([`Ramp`]), or lifts the bound
    /// (`None`): after a cold start (its next grant), a pause, or a rate learned or
    /// raised, the rate rises at most at the ramp's slope, so a provider that refuses
    /// sudden increases is not tripped. Off by default.
    Ramp(Option<Ramp>),
}

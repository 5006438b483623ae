//! Sans-IO state machines for pacing calls to APIs that enforce several rate limits at once.
//!
//! An LLM provider counts requests per minute *and* tokens per minute; a call must be
//! granted against both or neither, its true token cost is known only after the reply, and
//! when the provider answers 429 the whole pool of callers should pause once. This crate is
//! the machinery for that, with no runtime, no I/O and no clock:
//!
//! - [`TokenBucket`]: one dimension, continuous lazy refill, exact integer arithmetic, a
//!   level that may go negative (debt). `per_minute` limits get a capacity of one sixth of
//!   the limit while refilling at the real rate.
//! - [`Arbiter`]: the buckets of every dimension plus a fair queue (first come, first
//!   served within a tenant and class). The head is granted across all dimensions
//!   atomically or not at all, once every rule allows it: spent quotas, budgets, tenants'
//!   caps, the first request alone, the probe of a window edge, requests in flight
//!   ([`ArbiterConfig::max_in_flight`], or learned from [`Settle::Crowded`]) and a
//!   [`Ramp`] on how fast a dimension's rate may rise. Waiters can be cancelled at any
//!   time; [`Ticket`]s are generational. Conservative backfilling is available behind
//!   [`ArbiterConfig::backfill`].
//! - Three events, three inputs. A **reservation**: [`Arbiter::reserve`] an upper bound.
//!   A **send**: [`Arbiter::stamp_send_if_open`] stamps the request as it leaves, only
//!   while the gate is open. A **reply**: [`Arbiter::reply`] takes everything the
//!   provider's answer says as one input ([`Reply`]): how the reservation ends
//!   ([`Settle`]: charged its actual cost, with the over-estimate refunded and an
//!   under-estimate as debt; returned whole; kept as reserved when nobody knows; or
//!   throttled, crowded, spent or fatal), and the quota [`Report`]s it carried, then
//!   grants once. Nobody is granted between the parts of a reply, so a refund the
//!   provider did not honour never launches a waiter. ([`Arbiter::commit`],
//!   [`Arbiter::release`] and [`Arbiter::cancel`] end a reservation with no reply to
//!   tell.)
//! - [`Gate`]: the pool-wide pause. Throttles from one epoch close it once; stale epochs are
//!   ignored.
//! - [`classify`] and [`Retry`]: the retry table over neutral inputs, with full-jitter
//!   backoff from an injected [`fastrand::Rng`].
//! - Learning the provider, as a policy: [`Change::Policy`] gives a dimension a
//!   [`QuotaPolicy`] (the window, the configured limit if any, whether to take the
//!   provider's burst). Each [`QuotaReport`] a reply carries (limit, remaining, reset,
//!   window), stamped with the send it answers, is read by the dimension's policy against
//!   a view of its state; the policy changes nothing itself but returns adjustments (a
//!   rate, a capacity, a guard installed or removed, the level synced, raised or lowered),
//!   which the arbiter applies in order and then grants once. [`Arbiter::dimension`] says
//!   what was learned ([`LearnedQuota`]): the limit, how the provider counts (a bucket,
//!   found by [`BucketInference`]; a fixed window, whose edges are found even without a
//!   reset; a sliding log), its burst and the charge it books per unit reserved. Reports
//!   only lower a configured limit, stale ones are ignored, and where the provider refills
//!   continuously every report is read as a floor (only what had ended before the request
//!   left was surely counted) and a ceiling. A provider that books more than is reserved
//!   has reservations raised to that; with [`ArbiterConfig::reserve_usage`], one that books
//!   what replies use (it charges after the reply) has them lowered to a high quantile of
//!   the replies' usage, an overrun charged as debt.
//! - [`WindowGuard`]: an optional cap of a limit per trailing window on a dimension, for
//!   providers that count in fixed windows or sliding logs, corrected by the quota
//!   reports of their replies.
//! - The express lane's lease: while nothing needs order, [`Desk::lease`] lends
//!   whole permits out of the buckets (lowering their ceilings by as much, so the buckets
//!   and the lane together never hold more than the capacity) for an adapter to grant
//!   without the arbiter; [`Desk::give_back`] takes back what is left before any
//!   input that needs order.
//! - Tenants and budgets: [`Arbiter::reserve_for`] names a [`Caller`] (a [`Tenant`] and a
//!   [`Priority`]); queued reservations are ordered by weighted fair share over each
//!   call's dominant dimension, higher classes first until lower ones have aged;
//!   [`Arbiter::set_cap`] caps a tenant at a share of every limit, what the cap cannot
//!   take waiting apart so it never holds back another tenant.
//!   [`Change::Budget`] makes a dimension a [`Budget`]: an allowance (money, reserved at a
//!   call's highest price and committed at what it cost) per day, month or [`Period`],
//!   renewed whole, refusing at once what it cannot cover.
//! - [`Event`]s for everything above, for logs and plots.
//!
//! # The rules
//!
//! Every state-changing call takes `now` (an [`Instant`] on the caller's timeline); the
//! core never reads a clock, never sleeps and never spawns. A `now` earlier than one
//! already seen counts as the latest seen. Outputs are polled: [`Arbiter::poll_event`] for
//! what happened, [`Arbiter::poll_timeout`] for when to come back.
//!
//! # The run loop, on a virtual clock
//!
//! ```
//! use ratebucket_core::{Arbiter, ArbiterConfig, Event, Instant, Rate, TokenBucket};
//!
//! let t0 = Instant::ZERO;
//! // 2 requests and 100 tokens per second, each with one second of burst.
//! let requests = TokenBucket::new(Rate::per_second(2)?, 2, t0)?;
//! let tokens = TokenBucket::new(Rate::per_second(100)?, 100, t0)?;
//! let mut arbiter = Arbiter::new(vec![requests, tokens], ArbiterConfig::default(), t0)?;
//!
//! // Five calls, each reserving 1 request and an upper bound of 60 tokens.
//! let tickets: Vec<_> = (0..5)
//!     .map(|_| arbiter.reserve(&[1, 60], t0))
//!     .collect::<Result<_, _>>()?;
//!
//! let mut now = t0;
//! let mut granted_at = Vec::new();
//! loop {
//!     while let Some(event) = arbiter.poll_event() {
//!         if let Event::Granted { ticket, .. } = event {
//!             granted_at.push(now);
//!             // ... send the request; the reply reports 20 tokens used ...
//!             arbiter.commit(ticket, &[1, 20], now)?;
//!         }
//!     }
//!     match arbiter.poll_timeout() {
//!         Some(deadline) => {
//!             now = deadline; // a real driver sleeps until `deadline`
//!             arbiter.handle_timeout(now);
//!         }
//!         None => break,
//!     }
//! }
//! assert_eq!(granted_at.len(), tickets.len());
//! // Reconciling 60 down to 20 kept the token bucket from binding: the requests bucket
//! // (2 of burst, then one every 500 ms) sets the pace.
//! assert_eq!(granted_at.last(), Some(&Instant::from_millis(1500)));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

mod arbiter;
mod books;
mod bucket;
mod event;
mod gate;
mod ids;
mod learn;
mod rate;
mod retry;
mod time;
mod window;

// The crate's own tests name it as the integration tests do.
#[cfg(test)]
extern crate self as ratebucket_core;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) use arbiter::FoldOutcome;

pub use arbiter::{
    Adapt, Arbiter, ArbiterConfig, ArbiterSnapshot, Budget, Caller, Change, Desk,
    DimensionSnapshot, Lease, MAX_CHARGE_FACTOR, MAX_LANE_DIMENSIONS, MAX_WEIGHT, Period, Priority,
    Ramp, Replied, Reply, Report, Reported, ReserveError, SendStamp, Settle, Status, Tenant,
    TenantSnapshot, Ticket, TicketError, TicketState, UnknownPriority,
};
pub use bucket::{InvalidLimit, Limit, MAX_LIMIT, Rate, TokenBucket};
pub use event::{Event, Refusal};
/// The seeded generator retry jitter draws from ([`RetryPolicy::backoff`], [`Retry::decide`]).
pub use fastrand::Rng;
pub use gate::{Epoch, Gate, GateConfig, ThrottleOutcome};
pub use learn::{
    BucketInference, LearnedQuota, ProviderModel, QuotaObservation, QuotaPolicy, QuotaReport,
};
pub use retry::{
    Action, Class, FailureKind, MAX_SPENT, Outcome, Retry, RetryPolicy, StopReason, Verdict,
    classify,
};
pub use time::Instant;
pub use window::WindowGuard;

//! The `Limiter` handle users hold: reserving, the gate, the provider's reports, limits and
//! queries, over the state in `shared.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ratebucket_core::{
    Arbiter, ArbiterConfig, Change, Instant, InvalidLimit, Limit, Rate, SendStamp, Tenant,
    TenantSnapshot, ThrottleOutcome, TicketState, TokenBucket,
};

use crate::error::ReserveError;
use crate::gate::{GateOpen, SendWhenOpen};
use crate::inspect::{DimensionView, Snapshot};
use crate::metrics;
use crate::names::Names;
use crate::reserve::{Reservation, Reserve, ReserveOptions};
use crate::shared::Shared;
use crate::stripes::Stripes;
use crate::sync::Ordering;
use crate::timer::Timer;

/// A rate limiter over several dimensions, shared by every task that calls the API.
///
/// Cheap to clone (an `Arc`), `Send + Sync`. Created by a runtime adapter
/// (`ratebucket_tokio::Limiter::new`, `ratebucket_smol::Limiter::new`) or directly with
/// [`Limiter::with_timer`]. A background driver task, spawned on creation, grants queued
/// reservations when their time comes; it ends when the last handle is dropped.
#[derive(Clone)]
pub struct Limiter {
    pub(crate) shared: Arc<Shared>,
    /// The handles its reservations hold, one per thread's stripe.
    pub(crate) stripes: Arc<Stripes>,
}

impl Limiter {
    /// A limiter enforcing `limits` (one per dimension, in the order costs name them),
    /// every bucket full when it starts, on the runtime behind `timer`.
    pub fn from_limits(
        limits: impl IntoIterator<Item = Limit>,
        config: ArbiterConfig,
        timer: impl Timer,
    ) -> Result<Limiter, InvalidLimit> {
        let limits: Vec<Limit> = limits.into_iter().collect();
        let buckets = limits
            .iter()
            .map(|limit| limit.bucket(Instant::ZERO))
            .collect::<Result<Vec<_>, _>>()?;
        let names = Names::new(limits.iter().map(Limit::name));
        Limiter::build(buckets, names, config, timer)
    }

    /// A limiter over `buckets` (one per dimension, in the order costs name them) on the
    /// runtime behind `timer`. Spawns the driver task with [`Timer::spawn`]. The limiter's
    /// clock starts at [`Instant::ZERO`]: make the buckets at that instant (or use
    /// [`Limiter::from_limits`], which needs no instant).
    pub fn with_timer(
        buckets: Vec<TokenBucket>,
        config: ArbiterConfig,
        timer: impl Timer,
    ) -> Result<Limiter, InvalidLimit> {
        let names = Names::new(buckets.iter().map(|_| None));
        Limiter::build(buckets, names, config, timer)
    }

    fn build(
        buckets: Vec<TokenBucket>,
        names: Names,
        config: ArbiterConfig,
        timer: impl Timer,
    ) -> Result<Limiter, InvalidLimit> {
        let arbiter = Arbiter::new(buckets, config, Instant::ZERO)?;
        let shared = Shared::start(arbiter, names, timer);
        let stripes = Arc::new(Stripes::new(&shared));
        Ok(Limiter { shared, stripes })
    }

    /// Reserves `cost` (one entry per dimension): resolves when the reservation is granted
    /// across every dimension. See [`Reserve`].
    /// Limits on the wait go on the future: `limiter.reserve(cost).with(options)`
    /// ([`Reserve::with`]).
    #[inline]
    pub fn reserve<'a>(&'a self, cost: &'a [u64]) -> Reserve<'a> {
        Reserve::new(self, cost, ReserveOptions::default())
    }

    /// Reserves `cost` only if it can be granted now, without waiting: governor's
    /// `check()`. Refuses with [`ReserveError::WouldWait`] (carrying the estimated wait)
    /// otherwise, and with the other [`ReserveError`]s as [`Limiter::reserve`] does.
    ///
    /// While nothing needs order it is served by the express lane: one compare-and-swap,
    /// no lock and no clock read.
    #[inline]
    pub fn try_reserve(&self, cost: &[u64]) -> Result<Reservation, ReserveError> {
        match self.shared.lane.try_take(cost) {
            Some(grant) => Ok(Reservation::of_lane(self.stripes.here(), grant)),
            None => self.try_reserve_slow(cost),
        }
    }

    /// [`Limiter::try_reserve`] through the arbiter.
    #[inline(never)]
    fn try_reserve_slow(&self, cost: &[u64]) -> Result<Reservation, ReserveError> {
        let now = self.shared.now();
        let mut state = self.shared.lock();
        let reserved = state.arbiter.reserve_within(cost, Some(Duration::ZERO), now);
        let result = match reserved {
            Ok(ticket) if state.arbiter.state(ticket) == Some(TicketState::Granted) => {
                Ok(Reservation::of_ticket(self.stripes.here(), ticket))
            }
            Ok(ticket) => {
                // Estimated to go at once but held back (the first request still alone).
                state.arbiter.cancel(ticket, now);
                let retry_after =
                    state.arbiter.desk().estimate_drain(cost, now).unwrap_or_default();
                Err(ReserveError::WouldWait { retry_after })
            }
            Err(e) => Err(e),
        };
        self.shared.settle(state);
        result
    }

    /// Waits until `cost` is granted and takes it for good: the pacing loop's call
    /// (`loop { limiter.acquire(&[1]).await?; call().await; }`), where the cost is known
    /// up front and nothing is reconciled. Unlike a [`Reservation`] dropped unsent, which
    /// is returned at once, acquired quota stays spent.
    pub async fn acquire(&self, cost: &[u64]) -> Result<(), ReserveError> {
        let reservation = self.reserve(cost).await?;
        // The cost names as many dimensions as the reservation that was just granted.
        let _ = reservation.commit(cost);
        Ok(())
    }

    /// Resolves once the pool-wide gate is open (immediately if it is).
    pub fn gate_open(&self) -> GateOpen<'_> {
        GateOpen::new(&self.shared)
    }

    /// Whether dropping this handle and making a fresh limiter from the same limits would
    /// change nothing: no other handle or reservation exists, no one waits, the gate is
    /// open, no window guard holds history, and every bucket is full.
    pub(crate) fn is_dormant(&self) -> bool {
        // This handle's own, and its stripes' (held by this handle alone, and by no
        // reservation).
        let handles = 1 + self.stripes.len();
        if Arc::strong_count(&self.shared) != handles
            || Arc::strong_count(&self.stripes) != 1
            || !self.stripes.unheld()
        {
            return false;
        }
        let now = self.shared.now();
        let mut state = self.shared.lock();
        let arbiter = &mut state.arbiter;
        if arbiter.status().queued > 0
            || !arbiter.status().gate.is_open(now)
            || arbiter.status().aborted
            || arbiter.status().spent
        {
            return false;
        }
        (0..arbiter.status().dimensions).all(|d| {
            arbiter.dimension(d, now).is_some_and(|dimension| {
                dimension.window_limit.is_none() && dimension.level >= dimension.capacity as f64
            })
        })
    }

    /// Waits until the gate is open, then stamps the request `reservation` pays for, in
    /// one step under the limiter's lock (see [`SendWhenOpen`]). This is the call to make
    /// right before sending: unlike [`Limiter::gate_open`] followed by a stamp, no
    /// throttle can close the gate in between.
    ///
    /// A grant of the express lane becomes an ordinary ticket here (one lock).
    pub fn send_when_open(&self, reservation: &mut Reservation) -> SendWhenOpen<'_> {
        if let Some(sent) = reservation.take_sent() {
            return SendWhenOpen::stamped(&self.shared, sent);
        }
        SendWhenOpen::new(&self.shared, reservation.ticket_for_send())
    }

    /// Stamps a request about to be sent, for [`Limiter::throttle`] and header folds.
    pub fn stamp_send(&self) -> SendStamp {
        // A stamp emits no event and moves no deadline: nothing to settle.
        let now = self.shared.now();
        self.shared.lock().arbiter.stamp_send(now)
    }

    /// Reports a throttled reply to a request stamped `sent`. The first report of a wave
    /// closes the gate for `retry_after` (capped) and pauses every waiter; the rest of the
    /// wave is stale and changes nothing.
    ///
    /// A closing throttle also sets every level to zero and writes off what was granted
    /// before it ([`Arbiter::throttle`]): after the pause, only what refills is granted. A
    /// limiter whose rate is next to nothing (a test's "frozen" bucket) therefore grants
    /// nothing more after a throttle.
    pub fn throttle(&self, sent: SendStamp, retry_after: Option<Duration>) -> ThrottleOutcome {
        if metrics::ENABLED {
            metrics::throttled(&self.shared.names());
        }
        self.update(|arbiter, now| arbiter.throttle(sent, retry_after, now))
    }

    /// Makes `change` to `dimension` now ([`Arbiter::change`]) and wakes whoever then
    /// fits: a learning policy ([`Change::Policy`], fed by
    /// [`Reservation::reply`](crate::Reservation::reply) and [`Reservation::observe`](crate::Reservation::observe)); permits
    /// handed to a funded bucket ([`Change::Fund`], for a share of a quota metered out
    /// elsewhere, such as a lease) or taken back ([`Change::Withdraw`]); a budget
    /// ([`Change::Budget`]); a rate, capacity or window guard. Returns the permits a
    /// `Fund` took or a `Withdraw` took back (zero otherwise); an error, with nothing
    /// changed, for a dimension the limiter lacks or a value no bucket takes.
    ///
    /// ```no_run
    /// use std::time::{SystemTime, UNIX_EPOCH};
    /// use ratebucket_rt::core::{Budget, Change, Period};
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let limiter: ratebucket_rt::Limiter = unimplemented!();
    /// // Dimension 0 counts micro-dollars: $20 a day, renewed at midnight UTC.
    /// let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH)?;
    /// let budget = Budget { amount: 20_000_000, period: Period::Day, since_epoch };
    /// limiter.change(0, Change::Budget(budget))?;
    /// # Ok(()) }
    /// ```
    pub fn change(&self, dimension: usize, change: Change) -> Result<u64, InvalidLimit> {
        self.update(|arbiter, now| arbiter.change(dimension, change, now))
    }

    /// Sets `tenant`'s weight in the fair share of a busy pool (every tenant weighs 1 until
    /// set; within `1..=`[`MAX_WEIGHT`](ratebucket_core::MAX_WEIGHT)). Calls name their
    /// tenant with [`ReserveOptions::caller`](crate::ReserveOptions::caller).
    pub fn set_weight(&self, tenant: Tenant, weight: u32) -> Result<(), InvalidLimit> {
        self.update(|arbiter, _| arbiter.set_weight(tenant, weight))
    }

    /// Caps `tenant` at `share` of every limit (in (0, 1]), or lifts its cap (`None`): its
    /// calls take at most that share of each dimension's burst and rate, and those its cap
    /// cannot take wait apart, never ahead of another tenant's ([`Arbiter::set_cap`]). A
    /// call costing more than the cap holds fails with
    /// [`ReserveError::CostExceedsCap`](crate::ReserveError::CostExceedsCap). While any
    /// tenant is capped, every call goes through the arbiter (no express lane).
    pub fn set_cap(&self, tenant: Tenant, share: Option<f64>) -> Result<(), InvalidLimit> {
        self.update(|arbiter, now| arbiter.set_cap(tenant, share, now))
    }

    /// `tenant`'s weight and cap, its calls queued per class (and parked under its cap),
    /// and what the queue granted it.
    pub fn tenant(&self, tenant: Tenant) -> TenantSnapshot {
        self.update(|arbiter, _| arbiter.tenant(tenant))
    }

    /// Changes `dimension`'s refill rate, its capacity, or both (a limit learned
    /// elsewhere, or set), whichever is given: a new rate is the configured one from now on
    /// (adaptive rates return to it, never above); queued costs that no longer fit a new
    /// capacity fail with
    /// [`ReserveError::CapacityLowered`](crate::ReserveError::CapacityLowered). Nothing
    /// changes if the capacity is invalid or there is no such dimension.
    pub fn set_limit(
        &self,
        dimension: usize,
        rate: Option<Rate>,
        capacity: Option<u64>,
    ) -> Result<(), InvalidLimit> {
        self.update(|arbiter, now| {
            match capacity {
                Some(0) => return Err(InvalidLimit::ZeroCapacity),
                Some(c) if c > ratebucket_core::MAX_LIMIT => return Err(InvalidLimit::TooLarge),
                _ => {}
            }
            if let Some(rate) = rate {
                arbiter.change(dimension, Change::Rate(rate), now)?;
            }
            match capacity {
                Some(capacity) => {
                    arbiter.change(dimension, Change::Capacity(capacity), now).map(drop)
                }
                None => arbiter
                    .dimension(dimension, Instant::ZERO)
                    .map(|d| d.rate)
                    .map(drop)
                    .ok_or(InvalidLimit::NoSuchDimension(dimension)),
            }
        })?;
        let names = self.shared.names();
        tracing::debug!(
            target: "ratebucket",
            limiter = %names.limiter,
            dimension = %names.dimension(dimension),
            rate = ?rate,
            capacity = ?capacity,
            "limit changed"
        );
        Ok(())
    }

    /// Stops the run after a fatal failure: every queued reservation fails with
    /// [`ReserveError::Aborted`](crate::ReserveError::Aborted), and so do later ones, until
    /// [`Limiter::resume`].
    pub fn abort(&self) {
        self.update(|arbiter, now| arbiter.desk().abort(now));
    }

    /// Accepts reservations again after [`Limiter::abort`], or after the provider reported
    /// its quota spent until someone raises it, once the cause is dealt with (a key
    /// replaced, credit added, a limit raised). Waiters refused meanwhile stay refused.
    pub fn resume(&self) {
        self.update(|arbiter, now| arbiter.resume(now));
    }

    /// Runs `f` on the arbiter at the current instant, then delivers whatever it caused
    /// (wakes granted waiters, emits events, re-arms the driver).
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut Arbiter, Instant) -> R) -> R {
        let mut state = self.shared.lock();
        let now = self.shared.now();
        let result = f(&mut state.arbiter, now);
        self.shared.settle(state);
        result
    }

    /// A future that completes after `duration`, on the limiter's runtime (for backoff and
    /// timeouts in adapters, so they stay runtime-agnostic).
    pub fn sleep(&self, duration: Duration) -> crate::BoxFuture {
        self.shared.sleep(duration)
    }

    /// Counters for observability: how often reservation futures were polled, and how many
    /// they resolved. Their ratio is the polls per grant (2 when every waiter is polled once
    /// to queue and once when granted).
    ///
    /// They also carry the liveness watchdog: [`Stats::late_wakeups`] and
    /// [`Stats::overdue`] stay zero unless a waiter that was due went unserved for more
    /// than [`LATE_WAKEUP`](crate::LATE_WAKEUP), which is a lost wakeup (or a runtime starved for that long).
    pub fn stats(&self) -> Stats {
        let (overdue, locks) = {
            let mut state = self.shared.peek();
            let now = self.shared.now();
            // The lock this call took is not counted.
            state.locks -= 1;
            (state.overdue(now), state.locks)
        };
        Stats {
            reserve_polls: self.shared.polls.load(Ordering::Relaxed),
            reservations: self.shared.resolved.load(Ordering::Relaxed),
            late_wakeups: self.shared.late.load(Ordering::Relaxed),
            overdue,
            locks,
        }
    }

    /// The limiter's current instant on the core's timeline.
    pub fn now(&self) -> Instant {
        self.shared.now()
    }

    /// The limiter's name (`"limiter"` unless set with [`Limiter::with_name`]).
    pub fn name(&self) -> Arc<str> {
        Arc::clone(&self.shared.names().limiter)
    }

    /// Names the limiter (for example `"openai/gpt-4o-mini"`): spans, metrics, snapshots and
    /// errors use it. Every handle sees the new name. Name it before use: metric series
    /// already recorded keep the old name.
    pub fn with_name(self, name: impl Into<Arc<str>>) -> Limiter {
        let name = name.into();
        self.shared.rename(|names| names.limiter = name);
        self
    }

    /// Names `dimension` (`"requests"`, `"tokens"`).
    pub fn name_dimension(
        &self,
        dimension: usize,
        name: impl Into<Arc<str>>,
    ) -> Result<(), InvalidLimit> {
        let name = name.into();
        let mut renamed = Err(InvalidLimit::NoSuchDimension(dimension));
        self.shared.rename(|names| {
            if let Some(slot) = names.dimensions.get_mut(dimension) {
                *slot = name;
                renamed = Ok(());
            }
        });
        renamed
    }

    /// `dimension`'s name and state now: its level (the express lane's permits counted as
    /// available; negative while in debt), rates, capacity, queued cost, and what has been
    /// learned of the provider (the limit, the charge per unit reserved). `None` if there
    /// is no such dimension. A query: nothing changes.
    pub fn dimension(&self, dimension: usize) -> Option<DimensionView> {
        DimensionView::of(self, dimension)
    }

    /// Every dimension's level, rate (in force and configured), capacity, queued cost and
    /// what has been learned about the provider (synced levels, window caps), with the
    /// gate's state. A query: nothing changes.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::of(self)
    }

    /// How long from now until everything queued, plus `more` (one entry per dimension:
    /// work not yet reserved, such as the rest of a batch), would be granted at the rates
    /// in force, counting the pause under way: what a progress bar's ETA should use.
    ///
    /// Pass the expected charge of the work to come (for example the mean committed cost
    /// so far, times the items left), not its upper bound, for an ETA rather than a worst
    /// case. See [`Desk::estimate_drain`](ratebucket_core::Desk::estimate_drain).
    pub fn estimate_drain(&self, more: &[u64]) -> Result<Duration, ReserveError> {
        let now = self.shared.now();
        self.shared.lock().arbiter.desk().estimate_drain(more, now)
    }
}

/// Counters of a [`Limiter`], from [`Limiter::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Polls of `Reserve` futures.
    pub reserve_polls: u64,
    /// `Reserve` futures that resolved (granted or refused).
    pub reservations: u64,
    /// Wakeups that came more than [`LATE_WAKEUP`](crate::LATE_WAKEUP) after they were due: the driver
    /// waking that long after the deadline it slept towards, or a granted waiter polled
    /// that long after its grant woke it. Zero in a healthy run.
    pub late_wakeups: u64,
    /// Waiters that, at the time of the call, have been due for more than
    /// [`LATE_WAKEUP`](crate::LATE_WAKEUP) without being served: the head of the queue ready (gate open)
    /// but not granted, or granted and woken but not polled. Nonzero means a hang is
    /// under way.
    pub overdue: usize,
    /// Times a caller took the limiter's lock (the calls to `stats` and the driver's
    /// wakeups, which follow the runtime's schedule, not counted): every reservation,
    /// send and reply the express lane could not serve takes it once or more. How many
    /// one operation costs is the difference of two readings around it.
    pub locks: u64,
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.peek();
        f.debug_struct("Limiter")
            .field("dimensions", &state.arbiter.status().dimensions)
            .field("queued", &state.arbiter.status().queued)
            .finish()
    }
}

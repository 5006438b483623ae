//! The shared `Limiter` handle: the arbiter behind a mutex, a waker table and a driver task.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::Waker;
use std::time::Duration;

use event_listener::Event as Notify;
use ratebucket_core::{
    Arbiter, ArbiterConfig, Event, FoldOutcome, Instant, InvalidLimit, Rate, Refusal, SendStamp,
    ThrottleOutcome, Ticket, TokenBucket,
};

use crate::gate::GateOpen;
use crate::reserve::{Reserve, ReserveOptions};
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
}

pub(crate) struct Shared {
    state: Mutex<State>,
    /// Polls of `Reserve` futures, and reservations they resolved (for `Limiter::stats`).
    pub(crate) polls: AtomicU64,
    pub(crate) resolved: AtomicU64,
    pub(crate) timer: Box<dyn Timer>,
    origin: std::time::Instant,
    /// Tells the driver that the next deadline may have moved earlier.
    changed: Notify,
}

pub(crate) struct State {
    pub(crate) arbiter: Arbiter,
    /// The waker of each queued ticket, by slot.
    wakers: Vec<Option<Waker>>,
    /// Why queued tickets were refused, until their futures collect it.
    refused: HashMap<Ticket, Refusal>,
    /// The deadline the driver is sleeping towards.
    armed: Option<Instant>,
}

impl Limiter {
    /// A limiter over `buckets` (one per dimension, in the order costs name them) on the
    /// runtime behind `timer`. Spawns the driver task with [`Timer::spawn`].
    pub fn with_timer(
        buckets: Vec<TokenBucket>,
        config: ArbiterConfig,
        timer: impl Timer,
    ) -> Result<Limiter, InvalidLimit> {
        let origin = timer.now();
        let arbiter = Arbiter::new(buckets, config, Instant::ZERO)?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                arbiter,
                wakers: Vec::new(),
                refused: HashMap::new(),
                armed: None,
            }),
            polls: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            timer: Box::new(timer),
            origin,
            changed: Notify::new(),
        });
        let driver = drive(Arc::downgrade(&shared));
        shared.timer.spawn(Box::pin(driver));
        Ok(Limiter { shared })
    }

    /// Reserves `cost` (one entry per dimension): resolves when the reservation is granted
    /// across every dimension. See [`Reserve`].
    pub fn reserve<'a>(&'a self, cost: &'a [u64]) -> Reserve<'a> {
        Reserve::new(self, cost, ReserveOptions::default())
    }

    /// [`Limiter::reserve`] with a `max_wait` and/or a deadline.
    pub fn reserve_with<'a>(&'a self, cost: &'a [u64], options: ReserveOptions) -> Reserve<'a> {
        Reserve::new(self, cost, options)
    }

    /// Resolves once the pool-wide gate is open (immediately if it is).
    pub fn gate_open(&self) -> GateOpen<'_> {
        GateOpen::new(self)
    }

    /// Permits available now in `dimension` (negative while in debt or while waiters are
    /// ahead of the level); `None` if there is no such dimension.
    pub fn available(&self, dimension: usize) -> Option<f64> {
        self.update(|arbiter, now| arbiter.available(dimension, now))
    }

    /// Waiters currently queued.
    pub fn queued(&self) -> usize {
        self.shared.lock().arbiter.queued()
    }

    /// Stamps a request about to be sent, for [`Limiter::throttle`] and header folds.
    pub fn stamp_send(&self) -> SendStamp {
        // A stamp emits no event and moves no deadline: nothing to settle.
        let now = self.shared.now();
        self.shared.lock().arbiter.stamp_send(now)
    }

    /// Stamps the request a granted reservation pays for and tracks it as in flight until
    /// the reservation ends (for [`Limiter::sync_level`]).
    pub fn stamp_send_for(&self, ticket: Ticket) -> SendStamp {
        let now = self.shared.now();
        self.shared.lock().arbiter.stamp_send_for(ticket, now)
    }

    /// Moves a dimension's level within the bounds a provider's remaining sets, given what
    /// was in flight (may raise it; only for providers known to refill continuously). See
    /// [`Arbiter::sync_level`].
    pub fn sync_level(&self, dimension: usize, sent: SendStamp, remaining: u64) -> FoldOutcome {
        self.update(|arbiter, now| arbiter.sync_level(dimension, sent, remaining, now))
    }

    /// Reports a throttled reply to a request stamped `sent`. The first report of a wave
    /// closes the gate for `retry_after` (capped) and pauses every waiter; the rest of the
    /// wave is stale and changes nothing.
    pub fn throttle(&self, sent: SendStamp, retry_after: Option<Duration>) -> ThrottleOutcome {
        self.update(|arbiter, now| arbiter.throttle(sent, retry_after, now))
    }

    /// Folds a provider's "remaining" for `dimension` (lowers only; stale ignored).
    pub fn observe_remaining(
        &self,
        dimension: usize,
        sent: SendStamp,
        remaining: u64,
    ) -> FoldOutcome {
        self.update(|arbiter, now| arbiter.observe_remaining(dimension, sent, remaining, now))
    }

    /// Changes a dimension's refill rate.
    pub fn set_rate(&self, dimension: usize, rate: Rate) {
        self.update(|arbiter, now| arbiter.set_rate(dimension, rate, now));
    }

    /// Changes a dimension's capacity; queued costs that no longer fit fail with
    /// [`ReserveError::CapacityLowered`](crate::ReserveError::CapacityLowered).
    pub fn set_capacity(&self, dimension: usize, capacity: u64) -> Result<(), InvalidLimit> {
        self.update(|arbiter, now| arbiter.set_capacity(dimension, capacity, now))
    }

    /// Stops the run after a fatal failure: every queued reservation fails with
    /// [`ReserveError::Aborted`](crate::ReserveError::Aborted), and so do later ones.
    pub fn abort(&self) {
        self.update(|arbiter, now| arbiter.abort(now));
    }

    /// Whether [`Limiter::abort`] was called.
    pub fn is_aborted(&self) -> bool {
        self.shared.lock().arbiter.is_aborted()
    }

    /// Runs `f` on the arbiter at the current instant, then delivers whatever it caused
    /// (wakes granted waiters, emits events, re-arms the driver). The escape hatch for
    /// adapters that need more of the core than the methods above expose.
    pub fn update<R>(&self, f: impl FnOnce(&mut Arbiter, Instant) -> R) -> R {
        let mut state = self.shared.lock();
        let now = self.shared.now();
        let result = f(&mut state.arbiter, now);
        self.shared.settle(state);
        result
    }

    /// A future that completes after `duration`, on the limiter's runtime (for backoff and
    /// timeouts in adapters, so they stay runtime-agnostic).
    pub fn sleep(&self, duration: Duration) -> crate::BoxFuture {
        let timer = &self.shared.timer;
        match timer.now().checked_add(duration) {
            Some(deadline) => timer.sleep_until(deadline),
            None => Box::pin(std::future::pending()),
        }
    }

    /// Counters for observability: how often reservation futures were polled, and how many
    /// they resolved. Their ratio is the polls per grant (2 when every waiter is polled once
    /// to queue and once when granted).
    pub fn stats(&self) -> Stats {
        Stats {
            reserve_polls: self.shared.polls.load(Ordering::Relaxed),
            reservations: self.shared.resolved.load(Ordering::Relaxed),
        }
    }

    /// The limiter's current instant on the core's timeline.
    pub fn now(&self) -> Instant {
        self.shared.now()
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
}

impl Stats {
    /// Polls per resolved reservation.
    pub fn polls_per_grant(&self) -> f64 {
        self.reserve_polls as f64 / self.reservations.max(1) as f64
    }
}

impl fmt::Debug for Limiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("Limiter")
            .field("dimensions", &state.arbiter.dimensions())
            .field("queued", &state.arbiter.queued())
            .finish()
    }
}

impl Shared {
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn now(&self) -> Instant {
        Instant::from_duration(self.timer.now().saturating_duration_since(self.origin))
    }

    /// The runtime instant of a core instant; `None` for "never".
    pub(crate) fn to_std(&self, at: Instant) -> Option<std::time::Instant> {
        if at.is_never() {
            return None;
        }
        self.origin.checked_add(at.since_origin())
    }

    /// Delivers the arbiter's events: wakes granted or refused waiters (after unlocking),
    /// logs the rest, and tells the driver if the next deadline moved earlier.
    pub(crate) fn settle(&self, mut state: MutexGuard<'_, State>) {
        let mut wake: Vec<Waker> = Vec::new();
        while let Some(event) = state.arbiter.poll_event() {
            match event {
                Event::Granted { ticket, waited } => {
                    if let Some(w) = state.wakers.get_mut(ticket.slot()).and_then(Option::take) {
                        wake.push(w);
                    }
                    if waited > Duration::ZERO {
                        tracing::trace!(target: "ratebucket", ?ticket, ?waited, "waited");
                    }
                    tracing::trace!(target: "ratebucket", ?ticket, "granted");
                }
                Event::Refused { ticket, reason } => {
                    state.refused.insert(ticket, reason);
                    if let Some(w) = state.wakers.get_mut(ticket.slot()).and_then(Option::take) {
                        wake.push(w);
                    }
                    tracing::debug!(target: "ratebucket", ?ticket, ?reason, "refused");
                }
                Event::Rejected {
                    would_wait,
                    max_wait,
                } => tracing::debug!(target: "ratebucket", ?would_wait, ?max_wait, "rejected"),
                Event::Throttled { epoch, pause, .. } => {
                    tracing::info!(target: "ratebucket", epoch = epoch.get(), ?pause, "throttled");
                }
                Event::Committed { ticket } => {
                    tracing::trace!(target: "ratebucket", ?ticket, "committed");
                }
                Event::Released { ticket } => {
                    tracing::trace!(target: "ratebucket", ?ticket, "released");
                }
                Event::Cancelled { ticket } => {
                    tracing::trace!(target: "ratebucket", ?ticket, "cancelled");
                }
                Event::Lowered {
                    dimension,
                    from,
                    to,
                } => tracing::debug!(target: "ratebucket", dimension, from, to, "lowered"),
                other => tracing::trace!(target: "ratebucket", event = ?other),
            }
        }
        let next = state.arbiter.poll_timeout();
        let earlier = match (next, state.armed) {
            (Some(next), Some(armed)) => next < armed,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if earlier {
            state.armed = next;
        }
        drop(state);
        if earlier {
            self.changed.notify(1);
        }
        for w in wake {
            w.wake();
        }
    }

    pub(crate) fn register(state: &mut State, ticket: Ticket, waker: &Waker) {
        let slot = ticket.slot();
        if state.wakers.len() <= slot {
            state.wakers.resize(slot + 1, None);
        }
        match &mut state.wakers[slot] {
            Some(w) if w.will_wake(waker) => {}
            entry => *entry = Some(waker.clone()),
        }
    }

    pub(crate) fn forget(state: &mut State, ticket: Ticket) -> Option<Refusal> {
        if let Some(entry) = state.wakers.get_mut(ticket.slot()) {
            *entry = None;
        }
        state.refused.remove(&ticket)
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Lets the driver see that the last handle is gone.
        self.changed.notify(usize::MAX);
    }
}

/// The driver: sleeps until the arbiter's next deadline (or until told it moved), then
/// grants whatever is due. Holds only a weak reference, so it ends with the last handle.
async fn drive(weak: Weak<Shared>) {
    loop {
        let (sleep, listener) = {
            let Some(shared) = weak.upgrade() else { return };
            let listener = shared.changed.listen();
            let mut state = shared.lock();
            let now = shared.now();
            state.arbiter.handle_timeout(now);
            let next = state.arbiter.poll_timeout();
            state.armed = next;
            shared.settle(state);
            let sleep = next
                .and_then(|at| shared.to_std(at))
                .map(|at| shared.timer.sleep_until(at));
            (sleep, listener)
        };
        match sleep {
            Some(sleep) => futures_lite::future::or(sleep, listener).await,
            None => listener.await,
        }
    }
}

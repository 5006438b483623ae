//! The state behind every `Limiter` handle: the arbiter under its lock, the express lane,
//! the wakers of queued tickets, settling what the arbiter did, and the driver task.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, Weak};
use std::task::Waker;
use std::time::Duration;

use event_listener::Event as Notify;
use ratebucket_core::{Arbiter, Event, Instant, Refusal, Ticket};

use crate::lane::{Lane, Tally};
use crate::metrics;
use crate::names::Names;
use crate::sync::{AtomicU64, Mutex, MutexGuard, Ordering};
use crate::timer::Timer;

/// `repr(C)` keeps the lane first, on the cache line of the `Arc`'s counts: an express
/// grant touches both, and under contention one line moving between cores is cheaper
/// than two.
#[repr(C)]
pub(crate) struct Shared {
    /// The express lane: permits leased out of the arbiter, granted without the lock.
    pub(crate) lane: Lane,
    /// What the lane did, for the metrics (with the `metrics` feature only).
    pub(crate) tally: Tally,
    state: Mutex<State>,
    /// What the limiter and its dimensions are called: read on every span and metric,
    /// written only when renamed, so kept out of the arbiter's lock.
    names: RwLock<Names>,
    /// Polls of `Reserve` futures, and reservations they resolved (for `Limiter::stats`).
    pub(crate) polls: AtomicU64,
    pub(crate) resolved: AtomicU64,
    /// Wakeups that came more than [`LATE_WAKEUP`] after they were due.
    pub(crate) late: AtomicU64,
    pub(crate) timer: Box<dyn Timer>,
    origin: std::time::Instant,
    /// Tells the driver that the next deadline may have moved earlier.
    changed: Notify,
}

pub(crate) struct State {
    pub(crate) arbiter: Arbiter,
    /// Each queued ticket's waker, by slot, and when a grant woke it.
    waiters: Vec<Waiter>,
    /// Why queued tickets were refused, until their futures collect it.
    refused: HashMap<Ticket, Refusal>,
    /// The deadline the driver is sleeping towards.
    armed: Option<Instant>,
    /// Times the lock was taken ([`Stats::locks`](crate::Stats::locks)).
    pub(crate) locks: u64,
}

/// What the limiter keeps for one queued ticket.
#[derive(Default)]
struct Waiter {
    /// Woken when the ticket is granted or refused.
    waker: Option<Waker>,
    /// When a grant woke it, until its future collects the grant.
    woken_at: Option<Instant>,
}

impl State {
    /// Waiters due more than [`LATE_WAKEUP`] ago and still not served at `now`.
    pub(crate) fn overdue(&mut self, now: Instant) -> usize {
        let late = |at: Instant| now.saturating_duration_since(at) > LATE_WAKEUP;
        let uncollected = self.waiters.iter().filter(|w| w.woken_at.is_some_and(late)).count();
        let head_stuck = self.arbiter.status().queued > 0
            && self.arbiter.status().gate.is_open(now)
            && self.arbiter.poll_timeout().is_some_and(late);
        uncollected + usize::from(head_stuck)
    }
}

/// How late a wakeup may come before the watchdog in
/// [`Limiter::stats`](crate::Limiter::stats) counts it: generous, so that only a lost
/// wakeup (or a runtime starved for seconds) trips it.
pub const LATE_WAKEUP: Duration = Duration::from_secs(2);

impl Shared {
    /// A future that completes after `duration`, on the limiter's runtime; never, for a
    /// duration past what the clock can express.
    pub(crate) fn sleep(&self, duration: Duration) -> crate::timer::BoxFuture {
        match self.timer.now().checked_add(duration) {
            Some(deadline) => self.timer.sleep_until(deadline),
            None => Box::pin(std::future::pending()),
        }
    }

    /// The shared state over `arbiter`, its lane leased if it can be, and its driver
    /// spawned on `timer`'s runtime (the limiter's clock starts now, at
    /// [`Instant::ZERO`]).
    pub(crate) fn start(arbiter: Arbiter, names: Names, timer: impl Timer) -> Arc<Shared> {
        let origin = timer.now();
        let shared = Arc::new(Shared {
            lane: Lane::new(arbiter.status().dimensions),
            tally: Tally::default(),
            state: Mutex::new(State {
                arbiter,
                waiters: Vec::new(),
                refused: HashMap::new(),
                armed: None,
                locks: 0,
            }),
            polls: AtomicU64::new(0),
            resolved: AtomicU64::new(0),
            late: AtomicU64::new(0),
            names: RwLock::new(names),
            timer: Box::new(timer),
            origin,
            changed: Notify::new(),
        });
        {
            let mut state = shared.lock();
            shared.lease(&mut state, Instant::ZERO);
        }
        let driver = drive(Arc::downgrade(&shared));
        shared.timer.spawn(Box::pin(driver));
        shared
    }

    /// Takes the lock for an input to the arbiter: the express lane is closed first and
    /// what it held returned, so the arbiter sees every permit and grants in order.
    /// [`Shared::settle`] leases to the lane again when nothing needs order.
    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        let mut state = self.peek();
        if let Some(unused) = self.lane.close() {
            let dims = state.arbiter.status().dimensions;
            state.arbiter.desk().give_back(&unused[..dims], self.now());
        }
        state
    }

    /// Takes the lock for a query, leaving the express lane as it is.
    pub(crate) fn peek(&self) -> MutexGuard<'_, State> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.locks += 1;
        state
    }

    /// Leases what the arbiter can spare to the express lane, if nothing needs order.
    pub(crate) fn lease(&self, state: &mut State, now: Instant) {
        if self.lane.most() == 0 || state.arbiter.status().lane_leased {
            return;
        }
        if let Some(lease) = state.arbiter.desk().lease(self.lane.most(), now) {
            self.lane.open(&lease);
        }
    }

    /// What the limiter and its dimensions are called.
    pub(crate) fn names(&self) -> RwLockReadGuard<'_, Names> {
        self.names.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Renames the limiter or its dimensions.
    pub(crate) fn rename(&self, f: impl FnOnce(&mut Names)) {
        f(&mut self.names.write().unwrap_or_else(PoisonError::into_inner));
    }

    /// Now, on the core's timeline (from the limiter's start).
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
        // Read only when a waiter is woken: the fast path reads the clock once, not twice.
        let mut now = None;
        let mut wake: Vec<Waker> = Vec::new();
        while let Some(event) = state.arbiter.poll_event() {
            match event {
                Event::Granted { ticket, waited } => {
                    metrics::granted(&self.names(), waited);
                    if let Some(waiter) = state.waiters.get_mut(ticket.slot())
                        && let Some(w) = waiter.waker.take()
                    {
                        waiter.woken_at = Some(*now.get_or_insert_with(|| self.now()));
                        wake.push(w);
                    }
                    if waited > Duration::ZERO {
                        tracing::trace!(target: "ratebucket", ?ticket, ?waited, "waited");
                    }
                    tracing::trace!(target: "ratebucket", ?ticket, "granted");
                }
                Event::Refused { ticket, reason } => {
                    state.refused.insert(ticket, reason);
                    if let Some(w) =
                        state.waiters.get_mut(ticket.slot()).and_then(|w| w.waker.take())
                    {
                        wake.push(w);
                    }
                    tracing::debug!(target: "ratebucket", ?ticket, ?reason, "refused");
                }
                Event::Rejected { would_wait, max_wait } => {
                    tracing::debug!(target: "ratebucket", ?would_wait, ?max_wait, "rejected")
                }
                Event::Throttled { epoch, pause, .. } => {
                    metrics::paused(&self.names(), pause);
                    tracing::info!(
                        target: "ratebucket",
                        limiter = %self.names().limiter,
                        epoch = epoch.get(),
                        ?pause,
                        "gate closed: every caller pauses"
                    );
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
                Event::Distrusted { ticket, dimension, reported, charged } => tracing::warn!(
                    target: "ratebucket",
                    ?ticket,
                    dimension,
                    reported,
                    charged,
                    "usage report beyond belief: charged the trusted ceiling instead"
                ),
                Event::Lowered { dimension, from, to } => tracing::debug!(
                    target: "ratebucket",
                    limiter = %self.names().limiter,
                    dimension = %self.names().dimension(dimension),
                    from,
                    to,
                    "level lowered to the provider's count"
                ),
                Event::RateChanged { dimension, from, to } => {
                    tracing::debug!(
                        target: "ratebucket",
                        limiter = %self.names().limiter,
                        dimension = %self.names().dimension(dimension),
                        from = from.per_second_f64(),
                        to = to.per_second_f64(),
                        "rate adapted (per second)"
                    );
                }
                other => tracing::trace!(target: "ratebucket", event = ?other),
            }
        }
        if metrics::ENABLED {
            let now = *now.get_or_insert_with(|| self.now());
            let (grants, refunded) = self.tally.take();
            let dims = state.arbiter.status().dimensions.min(refunded.len());
            metrics::express(&self.names(), grants, &refunded[..dims]);
            metrics::levels(&self.names(), &state.arbiter, now);
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
        let status = state.arbiter.status();
        if !status.lane_leased && status.lane_may_lease {
            let now = *now.get_or_insert_with(|| self.now());
            self.lease(&mut state, now);
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
        if state.waiters.len() <= slot {
            state.waiters.resize_with(slot + 1, Waiter::default);
        }
        match &mut state.waiters[slot].waker {
            Some(w) if w.will_wake(waker) => {}
            entry => *entry = Some(waker.clone()),
        }
    }

    /// Clears `ticket`'s waiter entry as its future resolves (or is dropped), counting a
    /// collection that came late, and returns why it was refused, if it was.
    pub(crate) fn forget(&self, state: &mut State, ticket: Ticket) -> Option<Refusal> {
        if let Some(waiter) = state.waiters.get_mut(ticket.slot()) {
            let woken_at = waiter.woken_at.take();
            waiter.waker = None;
            if woken_at.is_some_and(|at| self.now().saturating_duration_since(at) > LATE_WAKEUP) {
                self.late.fetch_add(1, Ordering::Relaxed);
            }
        }
        state.refused.remove(&ticket)
    }

    /// Counts a driver wakeup that came long after the deadline it slept towards.
    fn check_driver_wakeup(&self, armed: Option<Instant>, now: Instant) {
        if armed.is_some_and(|at| now.saturating_duration_since(at) > LATE_WAKEUP) {
            self.late.fetch_add(1, Ordering::Relaxed);
        }
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
            // The driver's wakeups follow the runtime's schedule: not counted.
            state.locks -= 1;
            let now = shared.now();
            shared.check_driver_wakeup(state.armed.filter(|&at| at <= now), now);
            state.arbiter.handle_timeout(now);
            let next = state.arbiter.poll_timeout();
            state.armed = next;
            shared.settle(state);
            let sleep =
                next.and_then(|at| shared.to_std(at)).map(|at| shared.timer.sleep_until(at));
            (sleep, listener)
        };
        match sleep {
            Some(sleep) => futures_lite::future::or(sleep, listener).await,
            None => listener.await,
        }
    }
}

//! The background side: leasing from Redis to fund the local limiter, sharing its pauses
//! and learned limits, and falling back to a local share when Redis is away.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ratebucket_tokio::Limiter;
use ratebucket_tokio::core::Change;
use tokio::time::Instant;

use crate::backend::Backend;
use crate::credit::{Booking, Credit};
use crate::fallback::{Fallback, Reach};
use crate::limits::SharedLimits;
use crate::listener::take_pause;
use crate::script::{Ask, Failure, Keys, Lease, Remote, Visit};
use crate::{Shared, SharedConfig};

/// A lease lapses after this many lease periods without a renewal.
const LEASE_PERIODS_TO_LAPSE: u32 = 3;

/// The longest a process waiting for its share is told to stay away, in lease periods
/// (the lease script caps its hint at the same).
const MOST_PERIODS_AWAY: u32 = 8;

/// Between attempts to reach Redis while on the fallback share.
pub(crate) const RETRY: Duration = Duration::from_millis(250);

/// One dimension's demand, as a lease asks it.
#[derive(Clone, Copy, Debug)]
struct Demand {
    /// Permits to ask for: what waits plus a lease period of spending, less what is held.
    want: u64,
    /// The cost of the waiters queued.
    queued: f64,
    /// What must come before the first waiter can go: its cost less what is held (a
    /// grant below it would sit idle here while the waiter still waits).
    need: u64,
    /// What the limiter holds.
    level: f64,
}

pub(crate) struct Driver {
    limiter: Limiter,
    config: SharedConfig,
    remote: Remote,
    shared: Arc<Shared>,
    /// Whether this process has seen the shared state (a missing one was lost).
    seen: bool,
    /// The shared limits as last known.
    limits: SharedLimits,
    /// Spending per dimension, permits per second, smoothed over a lease period.
    spend: Vec<f64>,
    last_level: Vec<f64>,
    funded_since: Vec<u64>,
    /// Permits to give back with the next lease: what a lease granted that did not fit
    /// locally, what reservations did not use, and credit whose time to be spent is over.
    give_back: Vec<u64>,
    /// The credit funded from leases and not yet spent (see [`Credit`]); each part's time
    /// to be spent ends a lease period after its start.
    credit: Credit,
    /// How Redis has been answering this process.
    reach: Reach,
    /// When the last lease was answered.
    last_lease: Instant,
    /// Processes holding a live record at the last lease, this one included: the
    /// fallback share's divisor when more than `expected_processes`.
    fleet: u32,
    /// Redis does not answer, and the process is not (yet) on its fallback share: it has
    /// never held a lease, or Redis is only slow so far.
    unreachable: bool,
    last_tick: Instant,
    next_lease: Instant,
    /// Whether the last lease asked for what a waiter needed (not only spare demand).
    asked_need: bool,
    /// Whether the last lease left demand unmet: Redis counts this process as wanting
    /// until it comes back, so it comes back as soon as it wants nothing.
    counted_wanting: bool,
    valid_until: Option<Instant>,
    /// On the fallback share: what it has accrued.
    fallback: Option<Fallback>,
    /// A booked grant (see the lease script), not yet spendable.
    booked: Option<Booking>,
    /// The last lease that asked for something booked it, granted nothing, or left the
    /// bucket without a unit: the quota is spoken for, so spending ahead is not asked for
    /// until a lease leaves room again.
    congested: bool,
    /// The last two ticks at which something was spent, the earlier first, and the last
    /// at which more than one call waited.
    spent_at: [Option<Instant>; 2],
    crowded_at: Option<Instant>,
    /// The listener's count of lost contacts, as last seen.
    contact_seen: u64,
    next_retry: Instant,
    /// Local pauses seen so far (the limiter's epoch), to announce new ones.
    pauses_seen: u64,
    /// Draws where in the first lease period after a shared pause this process comes
    /// back (seeded by its id: every process draws its own).
    rng: fastrand::Rng,
}

impl Driver {
    pub(crate) fn new(
        id: String,
        backend: Backend,
        config: SharedConfig,
        limiter: Limiter,
        shared: Arc<Shared>,
    ) -> Driver {
        let dims = config.limits.len();
        let now = Instant::now();
        let seed = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        Driver {
            rng: fastrand::Rng::with_seed(seed),
            remote: Remote::new(backend, Keys::new(&config.name), id, config.timeout),
            limits: SharedLimits {
                rates: config
                    .limits
                    .iter()
                    .map(|l| l.amount() as f64 / l.period().as_secs_f64())
                    .collect(),
                capacities: config.limits.iter().map(|l| l.capacity()).collect(),
            },
            spend: vec![0.0; dims],
            last_level: vec![0.0; dims],
            funded_since: vec![0; dims],
            give_back: vec![0; dims],
            credit: Credit::new(dims),
            reach: Reach::default(),
            last_lease: now,
            fleet: 1,
            unreachable: false,
            last_tick: now,
            next_lease: now,
            asked_need: false,
            counted_wanting: false,
            valid_until: None,
            fallback: None,
            booked: None,
            congested: false,
            spent_at: [None, None],
            crowded_at: None,
            contact_seen: 0,
            next_retry: now,
            pauses_seen: limiter.snapshot().pauses,
            limiter,
            config,
            shared,
            seen: false,
        }
    }

    pub(crate) async fn run(mut self) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.config.tick) => {}
                () = self.shared.stop.notified() => {}
            }
            if self.shared.stopping.load(Ordering::Relaxed) {
                self.leave().await;
                return;
            }
            self.step().await;
        }
    }

    async fn step(&mut self) {
        let now = Instant::now();
        let dt = now.saturating_duration_since(self.last_tick);
        self.last_tick = now;
        self.measure_spend(now, dt);
        self.announce_pause().await;
        self.limits.share(&self.limiter, &mut self.remote, &self.shared).await;
        if self.valid_until.is_some_and(|until| now > until) {
            // Not renewed in time: what it held may have been handed out again.
            self.valid_until = None;
            for dimension in 0..self.dims() {
                let _ = self.limiter.change(dimension, Change::Withdraw);
            }
            self.credit.clear();
            self.resync_levels();
        }
        if self.fallback.is_some() {
            self.fund_fallback(dt);
            if now >= self.next_retry {
                self.next_retry = now + RETRY;
                let wants = self.wants();
                self.visit(now, &wants, Visit::Lease).await;
            }
        } else {
            self.settle_credit(now);
            if self.unreachable {
                // Never leased, or Redis only slow so far: what is held is spent, nothing
                // is funded on this process's own, and Redis is asked again now and then.
                if now >= self.next_retry {
                    self.next_retry = now + RETRY;
                    let wants = self.wants();
                    self.visit(now, &wants, Visit::Lease).await;
                }
                return;
            }
            let lost = self.shared.lost_contact.load(Ordering::Relaxed);
            // The gate's subscription ended: Redis may have gone or restarted. A lease now
            // finds out (and falls back, or rejoins) even with nothing to ask for.
            let contact_lost = lost != self.contact_seen;
            self.contact_seen = lost;
            if self.booked.as_ref().is_some_and(|booking| booking.contact != lost) {
                // Redis may have restarted since: the recreated quota does not owe it, and
                // spending it would be spending twice. Asked for again below.
                self.booked = None;
            }
            if self.booked.as_ref().is_some_and(|booking| now >= booking.at)
                && let Some(booking) = self.booked.take()
            {
                self.fund(&booking.granted, booking.ends);
            }
            // What is to be given back goes with a lease at most twice a period.
            let returning = self.give_back.iter().any(|&g| g > 0)
                && now.saturating_duration_since(self.last_lease) >= self.config.lease_period / 2;
            if self.booked.is_some() {
                // The first waiter is served by the booking: nothing to ask for it until
                // then, but what is to be given back is not kept from the others.
                if returning {
                    let wants = self.wants();
                    self.visit(now, &wants, Visit::GiveBack).await;
                }
                return;
            }
            let wants = self.wants();
            // A waiter that appeared since the last lease asked for nothing it needed is
            // not kept waiting for a hint given to spare demand.
            let needs_now = !self.asked_need && wants.iter().any(|w| w.need > 0);
            // One counted as wanting that no longer wants says so at once: its share goes
            // to the others now, not when it was due back.
            let done_wanting = self.counted_wanting && wants.iter().all(|w| w.want == 0);
            if contact_lost
                || done_wanting
                || returning
                || ((now >= self.next_lease || needs_now) && self.lease_due(now, &wants))
            {
                self.visit(now, &wants, Visit::Lease).await;
            }
        }
    }

    /// Accrues the fallback share and hands whole permits to the limiter, never letting it
    /// hold more than the share's capacity.
    fn fund_fallback(&mut self, dt: Duration) {
        let divisor = self.fallback_divisor();
        let Some(fallback) = &mut self.fallback else {
            return;
        };
        let limits = (self.limits.rates.as_slice(), self.limits.capacities.as_slice());
        for (d, taken) in fallback.fund(&self.limiter, limits, divisor, dt).into_iter().enumerate()
        {
            self.funded_since[d] += taken;
            self.shared.fallback_funded.fetch_add(taken, Ordering::Relaxed);
        }
    }

    /// Keeps the credit's books: what was spent since the last tick is taken from the
    /// oldest credit; credit whose time to be spent is over is withdrawn, and what
    /// reservations did not use reclaimed, both to be given back with the next lease. So
    /// every permit this process grants was funded by a lease at most a lease period
    /// before: the bound in the crate docs rests on it.
    fn settle_credit(&mut self, now: Instant) {
        for d in 0..self.dims() {
            let level = self.limiter.dimension(d).map(|v| v.state.level).unwrap_or(0.0);
            let whole = level.max(0.0).floor() as u64;
            let over = self.credit.settle(d, whole, now);
            if over > 0 {
                let taken = self.limiter.change(d, Change::WithdrawAtMost(over)).unwrap_or(0);
                self.give_back[d] += taken;
                // Not spending: the next measure of spend must not count it.
                self.last_level[d] -= taken as f64;
            }
            self.give_back[d] += self.limiter.change(d, Change::Reclaim).unwrap_or(0);
        }
    }

    /// The fallback share is `1 / n` of every limit: `n` the processes expected, or as
    /// many as held a record at the last lease if more.
    fn fallback_divisor(&self) -> u32 {
        self.config.expected_processes.max(self.fleet)
    }

    fn dims(&self) -> usize {
        self.limits.rates.len()
    }

    /// Updates the smoothed spend of every dimension from the change of its level, and
    /// counts the lease periods in a row in which something was spent.
    fn measure_spend(&mut self, now: Instant, dt: Duration) {
        let period = self.config.lease_period.as_secs_f64();
        let weight = (dt.as_secs_f64() / period).min(1.0);
        let mut spent_now = false;
        for d in 0..self.dims() {
            let level = self.limiter.dimension(d).map(|v| v.state.level).unwrap_or(0.0);
            let spent = (self.last_level[d] + self.funded_since[d] as f64 - level).max(0.0);
            spent_now |= spent > 0.0;
            if dt > Duration::ZERO {
                let rate = spent / dt.as_secs_f64();
                self.spend[d] += (rate - self.spend[d]) * weight;
            }
            self.last_level[d] = level;
            self.funded_since[d] = 0;
        }
        if spent_now {
            self.spent_at = [self.spent_at[1], Some(now)];
        }
    }

    /// Whether the spending lasts: seen at two ticks within the last lease period, or more
    /// than one call waiting at once (one call is not a demand to lease ahead for).
    fn spending_lasts(&self, now: Instant) -> bool {
        let lately = |at: Option<Instant>| {
            at.is_some_and(|at| now.saturating_duration_since(at) <= self.config.lease_period)
        };
        lately(self.spent_at[0]) || lately(self.crowded_at)
    }

    fn resync_levels(&mut self) {
        for d in 0..self.dims() {
            self.last_level[d] = self.limiter.dimension(d).map(|v| v.state.level).unwrap_or(0.0);
        }
    }

    /// What each dimension wants: what waits, plus a lease period of spending, less what
    /// is held.
    fn wants(&mut self) -> Vec<Demand> {
        let snapshot = self.limiter.snapshot();
        if snapshot.queued > 1 {
            self.crowded_at = Some(Instant::now());
        }
        let period = self.config.lease_period.as_secs_f64();
        (0..self.dims())
            .map(|d| {
                let state = &snapshot.dimensions[d].state;
                let queued = state.queued_cost as f64;
                let level = self.limiter.dimension(d).map(|v| v.state.level).unwrap_or(0.0);
                let target = queued + self.spend[d] * period;
                let want = (target - level).ceil().max(0.0);
                // The first waiter takes its cost raised by a learned charge (`head_cost`),
                // which the queued sum does not count: asking for less would leave it
                // waiting with nothing asked for.
                let need = (state.head_cost as f64 - level).ceil().max(0.0) as u64;
                let need = need.min(self.limits.capacities[d]);
                let want = (want as u64).min(self.limits.capacities[d]).max(need);
                Demand { want, queued, need, level }
            })
            .collect()
    }

    fn lease_due(&self, now: Instant, wants: &[Demand]) -> bool {
        // A lease is renewed while it holds something, before it lapses.
        let holds = wants.iter().any(|w| w.level >= 1.0);
        let renew = holds
            && self.valid_until.is_some_and(|until| {
                until.saturating_duration_since(now) < self.config.lease_period
            });
        let period = self.config.lease_period.as_secs_f64();
        let lasts = self.spending_lasts(now);
        let low = wants.iter().enumerate().any(|(d, w)| {
            w.want > 0
                && (w.need > 0
                    || w.queued > w.level
                    // Spending ahead is asked for only for a demand that lasts (not one
                    // call), and when the quota has room for it (not while it is spoken
                    // for).
                    || (lasts
                        && !self.congested
                        && w.level < self.spend[d] * period / 2.0))
        });
        low || renew
    }

    /// A call to the lease script for `visit`: a lease, or only giving back.
    async fn visit(&mut self, now: Instant, wants: &[Demand], visit: Visit) {
        let asks: Vec<Ask> = (0..self.dims())
            .map(|d| Ask {
                rate: self.limits.rates[d],
                capacity: self.limits.capacities[d],
                want: wants[d].want,
                need: wants[d].need,
                give_back: self.give_back[d],
            })
            .collect();
        let ttl = self.config.lease_period * LEASE_PERIODS_TO_LAPSE;
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        match self.remote.lease(ttl_ms, self.seen, visit, &asks).await {
            Ok(lease) => self.leased(lease, wants, ttl, now),
            Err(failure) => self.failed(now, failure),
        }
    }

    fn leased(&mut self, lease: Lease, wants: &[Demand], ttl: Duration, now: Instant) {
        self.asked_need = wants.iter().any(|w| w.need > 0);
        let shared = Arc::clone(&self.shared);
        shared.round_trips.fetch_add(1, Ordering::Relaxed);
        self.reach.answered();
        self.last_lease = now;
        self.fleet = u32::try_from(lease.live).unwrap_or(u32::MAX).max(1);
        if self.fallback.take().is_some() {
            // What the fallback funded was never counted in Redis: dropped.
            for d in 0..self.dims() {
                let _ = self.limiter.change(d, Change::Withdraw);
            }
            self.credit.clear();
            self.resync_levels();
            tracing::info!(target: "ratebucket", quota = %self.config.name, "redis back: leasing again");
        }
        if std::mem::take(&mut self.unreachable) {
            tracing::info!(target: "ratebucket", quota = %self.config.name, "redis answers: leasing");
        }
        shared.degraded.store(false, Ordering::Relaxed);
        if lease.created && self.seen {
            shared.recreated.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(target: "ratebucket", quota = %self.config.name, "shared quota was lost; recreated empty");
        }
        self.seen = true;
        self.give_back.iter_mut().for_each(|g| *g = 0);
        // Counted before the funds wake anyone, so a waiter granted from them sees it.
        let total: u64 = lease.granted.iter().sum();
        if total > 0 {
            shared.leases.fetch_add(1, Ordering::Relaxed);
            shared.leased.fetch_add(total, Ordering::Relaxed);
        }
        let start = Duration::from_micros(lease.start_us);
        if wants.iter().any(|w| w.want > 0) {
            let satisfied = lease.granted.iter().zip(wants).all(|(&g, w)| g >= w.want);
            // Satisfied, the hint says when the bucket will hold a unit again, if it does
            // not now.
            self.congested = !start.is_zero() || total == 0 || (satisfied && lease.hint_us > 0);
        }
        // `now` is when the lease was asked, before the script read Redis's clock: its
        // grants' time to be spent ends a lease period after their start from then.
        let ends = now + start + self.config.lease_period;
        if start.is_zero() {
            self.fund(&lease.granted, ends);
        } else if total > 0 {
            // Spent from its start on (timed here, after the round trip: never early).
            let contact = shared.lost_contact.load(Ordering::Relaxed);
            let (at, granted) = (Instant::now() + start, lease.granted.clone());
            self.booked = Some(Booking { at, ends, granted, contact });
        }
        let paused_for = Duration::from_micros(lease.paused_for_us);
        if lease.paused_for_us > 0 {
            take_pause(&self.limiter, &shared, lease.epoch, lease.paused_for_us);
        } else {
            shared.known_epoch.fetch_max(lease.epoch, Ordering::Relaxed);
        }
        self.limits.adopt(&self.limiter, &lease);
        self.valid_until = Some(now + start + ttl);
        let unmet = lease.granted.iter().zip(wants).any(|(&granted, w)| granted < w.want);
        self.counted_wanting = unmet;
        let period = self.config.lease_period;
        self.next_lease = if unmet {
            // Come back when told: when this process's share of the refill covers what is
            // missing (the script keeps it counted as wanting until then), and before
            // what it holds lapses.
            let hint = Duration::from_micros(lease.hint_us);
            let back = now + hint.clamp(period / 16, period * MOST_PERIODS_AWAY);
            let holds =
                wants.iter().any(|w| w.level >= 1.0) || lease.granted.iter().any(|&g| g > 0);
            if holds { back.min(now + ttl.saturating_sub(period / 2)) } else { back }
        } else {
            now
        };
        if !paused_for.is_zero() {
            // Paused, nothing is granted here before the pause's end: this process comes
            // back at a point of the first lease period after it, drawn for itself, so
            // that a fleet resuming from one pause spreads over the quota's first refill
            // instead of every process asking (and sending) at its first instant.
            let period = self.config.lease_period;
            let back = now + paused_for + period.mul_f64(self.rng.f64());
            self.next_lease = self.next_lease.max(back);
        }
    }

    /// Hands `granted` (per dimension) to the local limiter as credit whose time to be
    /// spent ends at `ends`; what does not fit is given back with the next lease.
    fn fund(&mut self, granted: &[u64], ends: Instant) {
        for (d, &granted) in granted.iter().enumerate() {
            if granted == 0 {
                continue;
            }
            let taken = self.limiter.change(d, Change::Fund(granted)).unwrap_or(0);
            self.funded_since[d] += taken;
            self.give_back[d] += granted - taken;
            self.credit.add(d, ends, taken);
        }
    }

    /// Redis did not answer a lease: the process falls back to its own share, or (never
    /// having leased, or Redis only slow so far) spends what it holds and waits (see
    /// [`Reach::falls_back`]).
    fn failed(&mut self, now: Instant, failure: Failure) {
        // A booking made on a Redis now out of reach is not spent: the fallback share
        // paces from here, and the quota may come back without it (a restart).
        self.booked = None;
        let shared = &self.shared;
        shared.failures.fetch_add(1, Ordering::Relaxed);
        shared.degraded.store(true, Ordering::Relaxed);
        self.next_retry = now + RETRY;
        if self.fallback.is_some() {
            return;
        }
        let lapse = self.config.lease_period * LEASE_PERIODS_TO_LAPSE;
        if !self.reach.falls_back(failure, now, lapse) {
            if !std::mem::replace(&mut self.unreachable, true) {
                tracing::warn!(
                    target: "ratebucket",
                    quota = %self.config.name,
                    ?failure,
                    leased = self.reach.ever_answered(),
                    "redis does not answer: spending what is held, funding nothing until it does"
                );
            }
            return;
        }
        self.unreachable = false;
        if self.fallback.is_none() {
            shared.fallbacks.fetch_add(1, Ordering::Relaxed);
            self.credit.clear();
            tracing::warn!(
                target: "ratebucket",
                quota = %self.config.name,
                share = self.fallback_divisor(),
                "redis unreachable: pacing on the fallback share (1/share of every limit)"
            );
            self.fallback = Some(Fallback::new(self.dims()));
        }
    }

    /// Announces a pause the local limiter took (a throttle seen here) to the others.
    /// An announcement Redis did not answer is made again at the next tick, with what is
    /// left of the pause, while Redis is otherwise answering.
    async fn announce_pause(&mut self) {
        let snapshot = self.limiter.snapshot();
        if snapshot.pauses <= self.pauses_seen {
            return;
        }
        let Some(pause) = snapshot.paused_for.filter(|p| !p.is_zero()) else {
            self.pauses_seen = snapshot.pauses;
            return;
        };
        let pause_us = u64::try_from(pause.as_micros()).unwrap_or(u64::MAX);
        match self.remote.pause(pause_us).await {
            Ok(outcome) => {
                self.pauses_seen = snapshot.pauses;
                self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
                self.shared.known_epoch.fetch_max(outcome.epoch, Ordering::Relaxed);
                if outcome.closed {
                    self.shared.pauses_sent.fetch_add(1, Ordering::Relaxed);
                }
            }
            // Out of reach: the others cannot lease either; the pause stays local.
            Err(_) if self.fallback.is_some() || self.unreachable => {
                self.pauses_seen = snapshot.pauses;
            }
            Err(_) => {}
        }
    }

    /// Leaves the quota: returns what is held unspent and withdraws the demand.
    async fn leave(&mut self) {
        let asks: Vec<Ask> = (0..self.dims())
            .map(|d| Ask {
                rate: self.limits.rates[d],
                capacity: self.limits.capacities[d],
                want: 0,
                need: 0,
                give_back: if self.fallback.is_some() {
                    0
                } else {
                    let booked = self.booked.as_ref().map_or(0, |booking| booking.granted[d]);
                    self.limiter.change(d, Change::Withdraw).unwrap_or(0)
                        + self.give_back[d]
                        + booked
                },
            })
            .collect();
        if let Ok(lease) = self.remote.lease(0, true, Visit::Leave, &asks).await {
            self.shared.round_trips.fetch_add(1, Ordering::Relaxed);
            if lease.created {
                // Redis lost the quota and this goodbye recreated it (empty).
                self.shared.recreated.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

//! Who a reservation is for ([`Caller`]: a [`Tenant`] and a [`Priority`]) and the order
//! that follows: weighted fair share between tenants over the dominant dimension, and
//! priority classes that age, as one sort key per queued reservation ([`Fair`]).
//!
//! The order is start-time fair queuing over dominant-resource costs: a reservation's cost
//! is its *dominant* demand, the longest any of its dimensions takes to refill it
//! (`cost[d] / rate[d]`, in seconds). Each flow (one tenant in one class) keeps a finish
//! tag; a reservation that queues starts at the later of the pool's virtual time and its
//! flow's finish tag, and moves the finish tag on by its dominant demand over its tenant's
//! weight (split between the classes the tenant is busy in). Its sort key is that start
//! tag plus its class's aging lead. The virtual time is the largest start tag granted: in
//! a saturated pool it moves at one second over the busy weight per second. A class's lead
//! is scaled by the weight of every tenant known (at least the busy weight, and the same
//! for every call of a class), so a lead of `L` means: a call of that class yields to calls
//! of higher classes that arrive up to about `L` of service after it, and no longer.

use core::fmt;
use std::collections::HashMap;
use std::time::Duration;

use crate::bucket::InvalidLimit;

/// A tenant of a shared quota: an opaque number the caller chooses (an account, a plan, a
/// job). Tenant 0 is everyone who does not say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(pub u32);

/// A priority class: a higher class is granted first; a lower one ages (see
/// [`ArbiterConfig::aging`](crate::ArbiterConfig::aging)), so its wait stays bounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Priority {
    /// Someone is waiting on the reply (a chat turn): ahead of every other class.
    Interactive,
    /// Neither interactive nor batch.
    #[default]
    Default,
    /// Background work (a nightly batch): behind the other classes, until it has aged.
    Batch,
}

impl Priority {
    /// Every class, highest first.
    pub const ALL: [Priority; 3] = [Priority::Interactive, Priority::Default, Priority::Batch];

    /// Its index in [`Priority::ALL`] (and in [`ArbiterConfig::aging`](crate::ArbiterConfig::aging)).
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its name: `interactive`, `default` or `batch`.
    pub const fn name(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Default => "default",
            Priority::Batch => "batch",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl core::str::FromStr for Priority {
    type Err = UnknownPriority;

    fn from_str(s: &str) -> Result<Priority, UnknownPriority> {
        Priority::ALL
            .into_iter()
            .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
            .ok_or(UnknownPriority)
    }
}

/// A priority name that is none of `interactive`, `default` and `batch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnknownPriority;

impl fmt::Display for UnknownPriority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown priority: expected interactive, default or batch")
    }
}

impl std::error::Error for UnknownPriority {}

/// Who a reservation is for: its tenant and its priority class. The default is tenant 0
/// in [`Priority::Default`], which keeps the queue first come, first served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Caller {
    /// Whose share it counts against.
    pub tenant: Tenant,
    /// Its class.
    pub priority: Priority,
}

impl Caller {
    /// `tenant`, in the default class.
    pub const fn tenant(tenant: u32) -> Caller {
        Caller { tenant: Tenant(tenant), priority: Priority::Default }
    }

    /// This caller in class `priority`.
    pub const fn priority(mut self, priority: Priority) -> Caller {
        self.priority = priority;
        self
    }
}

/// The largest weight a tenant may have ([`Arbiter::set_weight`](crate::Arbiter::set_weight)).
pub const MAX_WEIGHT: u32 = 1_000_000;

/// A tenant's standing ([`Arbiter::tenant`](crate::Arbiter::tenant)).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct TenantSnapshot {
    /// The tenant.
    pub tenant: Tenant,
    /// Its weight (1 unless set).
    pub weight: u32,
    /// Its reservations queued now, per class ([`Priority::index`]).
    pub queued: [usize; 3],
    /// Its reservations granted from the queue, per class (grants on arrival, with nobody
    /// waiting, are not counted: there was nothing to share).
    pub granted: [u64; 3],
    /// The dominant demand granted it from the queue, in seconds of refill (its share of
    /// a saturated pool is this over the sum of every tenant's).
    pub served: f64,
    /// Its cap, as a share of each limit ([`Arbiter::set_cap`](crate::Arbiter::set_cap)), if it has one.
    pub cap: Option<f64>,
    /// Its reservations waiting for room under its cap, not yet queued.
    pub parked: usize,
}

/// One flow's finish tag.
#[derive(Clone, Copy, Debug, Default)]
struct Flow {
    finish: u64,
}

/// A tenant's weight and what it has queued and been granted.
#[derive(Clone, Copy, Debug, Default)]
struct Account {
    /// Set by [`Arbiter::set_weight`](crate::Arbiter::set_weight); 0 stands for the default, 1.
    weight: u32,
    queued: [usize; 3],
    granted: [u64; 3],
    served: f64,
}

impl Account {
    fn weight(&self) -> u64 {
        u64::from(self.weight.max(1))
    }

    fn busy(&self) -> bool {
        self.queued.iter().any(|&q| q > 0)
    }
}

/// The fair-queuing state: virtual time, each flow's finish tag, each tenant's account.
#[derive(Clone, Debug, Default)]
pub(super) struct Fair {
    /// The largest start tag granted (nanoseconds of virtual service).
    virtual_now: u64,
    flows: HashMap<(Tenant, Priority), Flow>,
    accounts: HashMap<Tenant, Account>,
    /// The summed weight of the tenants with something queued.
    busy_weight: u64,
    /// The summed weight of every tenant with an account: what leads are scaled by.
    known_weight: u64,
}

/// A queued reservation's place in the order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Key {
    /// Start tag plus the class's lead.
    pub(super) tag: u64,
    /// Arrival order, among equal tags.
    pub(super) arrival: u64,
}

impl Fair {
    /// Sets `tenant`'s weight, within `1..=`[`MAX_WEIGHT`].
    pub(super) fn set_weight(&mut self, tenant: Tenant, weight: u32) -> Result<(), InvalidLimit> {
        if weight == 0 || weight > MAX_WEIGHT {
            return Err(InvalidLimit::Weight(weight));
        }
        let known = &mut self.known_weight;
        let account = self.accounts.entry(tenant).or_insert_with(|| {
            *known += 1;
            Account::default()
        });
        *known = *known - account.weight() + u64::from(weight.max(1));
        if account.busy() {
            self.busy_weight = self.busy_weight - account.weight() + u64::from(weight.max(1));
        }
        account.weight = weight;
        Ok(())
    }

    /// The key and start tag of a reservation of `caller` queuing with dominant demand
    /// `demand` (seconds), with `lead` (its class's aging), arriving `arrival`-th.
    pub(super) fn enqueue(
        &mut self,
        caller: Caller,
        demand: f64,
        lead: Duration,
        arrival: u64,
    ) -> (Key, u64) {
        let known = &mut self.known_weight;
        let account = self.accounts.entry(caller.tenant).or_insert_with(|| {
            *known += 1;
            Account::default()
        });
        let weight = account.weight();
        if !account.busy() {
            self.busy_weight += weight;
        }
        account.queued[caller.priority.index()] += 1;
        // A tenant busy in several classes splits its weight between them: its weight is
        // its own, however its calls are classed. Tags move by demand over weight, so
        // calls queued before the busy tenants changed keep their fair order.
        let classes = account.queued.iter().filter(|&&q| q > 0).count().max(1);
        let share = weight as f64 / classes as f64;
        // Virtual time moves at one second over the busy weight per second of a saturated
        // pool. A class's lead, a duration, is scaled by the weight of every tenant known
        // (never less than the busy weight, so the lead takes at most its duration; and
        // the same for every call of a class while no tenant appears, so it never reorders
        // calls of one class).
        let flow = self.flows.entry((caller.tenant, caller.priority)).or_default();
        let start = self.virtual_now.max(flow.finish);
        let advance = (demand / share * 1e9).min(u64::MAX as f64) as u64;
        flow.finish = start.saturating_add(advance);
        (self.place(lead, start, arrival), start)
    }

    /// The key of a reservation starting at `start` with `lead` (its class's aging, scaled
    /// by the weight of every tenant known), arriving `arrival`-th.
    pub(super) fn place(&self, lead: Duration, start: u64, arrival: u64) -> Key {
        let lead = lead.as_secs_f64() / self.known_weight.max(1) as f64;
        let lead = (lead * 1e9).min(u64::MAX as f64) as u64;
        Key { tag: start.saturating_add(lead), arrival }
    }

    /// The key and start of a reservation put back in the queue without one (granted on
    /// arrival): at the pool's virtual time, ahead of its flow's backlog.
    pub(super) fn requeue_key(
        &mut self,
        caller: Caller,
        lead: Duration,
        arrival: u64,
    ) -> (Key, u64) {
        self.count_in(caller);
        (self.place(lead, self.virtual_now, arrival), self.virtual_now)
    }

    /// A reservation that had a key is queued again with it.
    pub(super) fn count_in(&mut self, caller: Caller) {
        let known = &mut self.known_weight;
        let account = self.accounts.entry(caller.tenant).or_insert_with(|| {
            *known += 1;
            Account::default()
        });
        if !account.busy() {
            self.busy_weight += account.weight();
        }
        account.queued[caller.priority.index()] += 1;
    }

    /// A reservation of `caller` stops waiting; `granted` (with its start tag and its
    /// dominant demand) when it was granted.
    pub(super) fn leave(&mut self, caller: Caller, granted: Option<(u64, f64)>) {
        let account = self.accounts.entry(caller.tenant).or_default();
        let queued = &mut account.queued[caller.priority.index()];
        *queued = queued.saturating_sub(1);
        if !account.busy() {
            self.busy_weight = self.busy_weight.saturating_sub(account.weight());
        }
        if let Some((start, demand)) = granted {
            account.granted[caller.priority.index()] += 1;
            account.served += demand;
            self.virtual_now = self.virtual_now.max(start);
        }
        if !account.busy() {
            // A flow whose finish tag the virtual time passed starts from the virtual time
            // anyway: forget it, so memory follows the tenants that are busy.
            let now = self.virtual_now;
            for priority in Priority::ALL {
                if let Some(flow) = self.flows.get(&(caller.tenant, priority))
                    && flow.finish <= now
                {
                    self.flows.remove(&(caller.tenant, priority));
                }
            }
        }
    }

    /// `tenant`'s standing.
    pub(super) fn snapshot(&self, tenant: Tenant) -> TenantSnapshot {
        let account = self.accounts.get(&tenant).copied().unwrap_or_default();
        TenantSnapshot {
            tenant,
            weight: account.weight.max(1),
            queued: account.queued,
            granted: account.granted,
            served: account.served,
            cap: None,
            parked: 0,
        }
    }

    /// Every tenant with an account (a weight set, or something queued once).
    pub(super) fn tenants(&self) -> impl Iterator<Item = Tenant> + '_ {
        self.accounts.keys().copied()
    }
}

//! Arbiter settings: backfilling, the gate's pauses, adaptive rates, the first reservation
//! alone, requests in flight.

use std::time::Duration;

use crate::gate::GateConfig;

/// Arbiter settings.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct ArbiterConfig {
    /// Conservative backfilling: let a later waiter go before the head when that provably
    /// does not delay the head's grant time (assuming reservations are upper bounds).
    /// Off by default.
    pub backfill: bool,
    /// How many waiters behind the head backfilling looks at per pass.
    pub backfill_depth: usize,
    /// The gate's pauses.
    pub gate: GateConfig,
    /// Adaptive rates: how the arbiter backs off when the provider throttles and recovers
    /// as calls succeed. `None` keeps the configured rates fixed.
    pub adapt: Option<Adapt>,
    /// The first reservation goes alone: nothing else is granted until the provider's
    /// first report is folded (`sync_level`, `observe_remaining`, `adopt_remaining`) or
    /// that reservation ends. What the provider booked for it is then known before a burst
    /// leaves at the client's own estimate. Costs one round trip at the start; off by
    /// default.
    pub first_alone: bool,
    /// Reservations reserve what replies use, for a provider that charges usage after the
    /// reply: once its reports show it books what a reply used, not what was reserved (a
    /// learned booked charge clearly below one, near the replies' mean usage), each
    /// reservation of a dimension takes a high quantile of the replies' usage against their
    /// reservations instead of the whole reservation, and an overrun is charged as debt at
    /// the commit. Tighter than the provider's own admission, so a request may leave when
    /// the provider holds less than it will use; off by default.
    pub reserve_usage: bool,
    /// Each priority class's lead, indexed by [`Priority::index`](crate::Priority::index): a queued reservation of
    /// a class is ordered as though it had arrived this much virtual service later, so it
    /// yields to higher classes arriving within that span, and no longer (its wait is
    /// bounded: see the README's section on tenants). Interactive 0, default 5 s, batch
    /// 60 s.
    pub aging: [Duration; 3],
    /// The most requests in flight, each held from its grant until its reservation ends
    /// (the reply, the stream's end, the call's drop). `None` (the default): no bound
    /// until the provider refuses for requests in flight (`Settle::Crowded`), then one
    /// learned from its refusals: lowered below the number refused, raised again by one
    /// per limit's worth of answers while it is in use (additive increase, multiplicative
    /// decrease), and a number refused not tried again for a minute.
    pub max_in_flight: Option<u32>,
}

impl Default for ArbiterConfig {
    fn default() -> ArbiterConfig {
        ArbiterConfig {
            backfill: false,
            backfill_depth: 64,
            gate: GateConfig::default(),
            adapt: Some(Adapt::default()),
            first_alone: false,
            reserve_usage: false,
            aging: [Duration::ZERO, Duration::from_secs(5), Duration::from_secs(60)],
            max_in_flight: None,
        }
    }
}

/// Multiplicative decrease on a throttle, then a probe back up over time, driven by the
/// provider.
///
/// When a throttle closes the gate, every dimension's rate is multiplied by `decrease`
/// (never below `floor` times the configured rate), and the rate that met the throttle is
/// remembered as the dimension's ceiling. From the end of the pause the rate climbs back,
/// by elapsed time and not by successes: over one step to nine tenths of that ceiling,
/// then by a tenth of the ceiling per further step, up to the configured rate. A step is
/// the provider's window for a dimension that knows it (a [`QuotaPolicy`](crate::QuotaPolicy)
/// given with [`Change::Policy`](crate::Change::Policy)), so the rate is probed
/// back over a window; `probe` otherwise. A provider whose real limit is below the
/// configured one is thus met just under its real rate, and touched again at most about
/// once a step; a correctly configured client never throttles and never changes rate.
///
/// Dimensions whose level follows the provider's own count (synced to its reports) keep
/// their rate: there a stray 429 is not evidence of a lower limit.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Adapt {
    /// Factor applied to the rates when the gate closes, in (0, 1].
    pub decrease: f64,
    /// How long the climb back to nine tenths of the rate that met the throttle takes; each
    /// further tenth of it takes as long again. A dimension that knows its provider's
    /// window climbs by that instead.
    pub probe: Duration,
    /// The lowest the rates go, as a fraction of the configured rate.
    pub floor: f64,
}

impl Default for Adapt {
    /// Halve on a throttle, back near the rate that failed within ten seconds, never below
    /// a tenth of the configured rate.
    fn default() -> Adapt {
        Adapt { decrease: 0.5, probe: Duration::from_secs(10), floor: 0.1 }
    }
}

impl Adapt {
    /// These settings with another `probe` duration.
    pub fn with_probe(mut self, probe: Duration) -> Adapt {
        self.probe = probe;
        self
    }
}

impl ArbiterConfig {
    /// Turns conservative backfilling on or off.
    pub fn with_backfill(mut self, on: bool) -> ArbiterConfig {
        self.backfill = on;
        self
    }

    /// Sets the gate's pauses.
    pub fn with_gate(mut self, gate: GateConfig) -> ArbiterConfig {
        self.gate = gate;
        self
    }

    /// Sets (or, with `None`, turns off) adaptive rates.
    pub fn with_adapt(mut self, adapt: Option<Adapt>) -> ArbiterConfig {
        self.adapt = adapt;
        self
    }

    /// Sets whether the first reservation goes alone ([`ArbiterConfig::first_alone`]).
    pub fn with_first_alone(mut self, on: bool) -> ArbiterConfig {
        self.first_alone = on;
        self
    }

    /// Sets the lead of each priority class ([`ArbiterConfig::aging`]), highest first.
    pub fn with_aging(mut self, aging: [Duration; 3]) -> ArbiterConfig {
        self.aging = aging;
        self
    }

    /// Sets whether reservations reserve what replies use once the provider is seen to
    /// charge that ([`ArbiterConfig::reserve_usage`]).
    pub fn with_reserve_usage(mut self, on: bool) -> ArbiterConfig {
        self.reserve_usage = on;
        self
    }

    /// Sets the most requests in flight ([`ArbiterConfig::max_in_flight`]; `None`: learned
    /// from the provider's refusals).
    pub fn with_max_in_flight(mut self, most: Option<u32>) -> ArbiterConfig {
        self.max_in_flight = most;
        self
    }
}

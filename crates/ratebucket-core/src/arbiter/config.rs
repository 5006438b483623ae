//! Arbiter settings: backfilling, the gate's pauses, adaptive rates.

use super::*;

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
}

impl Default for ArbiterConfig {
    fn default() -> ArbiterConfig {
        ArbiterConfig {
            backfill: false,
            backfill_depth: 64,
            gate: GateConfig::default(),
            adapt: Some(Adapt::default()),
        }
    }
}

/// Additive-increase, multiplicative-decrease of the refill rates, driven by the provider.
///
/// When a throttle closes the gate, every dimension's rate is multiplied by `decrease`
/// (never below `floor` times the configured rate); each committed reservation then adds
/// `increase` times the configured rate back, never above the configured rate. A provider
/// whose real limit is below the configured one is thus met near its real rate instead of
/// with a 429 storm after every pause; a correctly configured client never throttles and
/// never changes rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adapt {
    /// Factor applied to the rates when the gate closes, in (0, 1].
    pub decrease: f64,
    /// Fraction of the configured rate added back per committed reservation.
    pub increase: f64,
    /// The lowest the rates go, as a fraction of the configured rate.
    pub floor: f64,
}

impl Default for Adapt {
    /// Halve on a throttle, recover over about two hundred successes, never below a tenth.
    fn default() -> Adapt {
        Adapt {
            decrease: 0.5,
            increase: 0.005,
            floor: 0.1,
        }
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
}

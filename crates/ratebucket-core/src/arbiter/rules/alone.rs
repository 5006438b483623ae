//! Rules that let one request out at a time: the first request alone, until the
//! provider's first report is in ([`FirstAlone`]), and the probe of a window edge that
//! learning supposes ([`Probe`]).

use super::{Admission, Ask, Ctx, Ended, Rule};
use crate::time::Instant;

/// The first reservation goes alone ([`ArbiterConfig::first_alone`]): nothing else is
/// granted until the provider has reported on every dimension or that reservation ended.
///
/// [`ArbiterConfig::first_alone`]: crate::ArbiterConfig::first_alone
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FirstAlone {
    on: bool,
}

impl FirstAlone {
    /// The rule, on or off.
    pub(crate) fn new(on: bool) -> FirstAlone {
        FirstAlone { on }
    }

    /// The provider reported on every dimension, or a request went without the rule (the
    /// express lane): others may go with it. Whether it was still on.
    pub(crate) fn end(&mut self) -> bool {
        std::mem::take(&mut self.on)
    }
}

impl Rule for FirstAlone {
    fn idle(&self) -> bool {
        !self.on
    }

    fn admit(&mut self, _ask: &Ask<'_>, ctx: &Ctx<'_>, _now: Instant) -> Admission {
        if self.on && ctx.in_flight() > 0 { Admission::Queue } else { Admission::Admit }
    }

    /// Waits for the reply to the one in flight.
    fn ready(&self, _ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        (!self.on || ctx.in_flight() == 0).then_some(now)
    }

    fn ended(
        &mut self,
        _ask: &Ask<'_>,
        _how: Ended,
        _used: Option<&[u64]>,
        _in_flight: usize,
        _now: Instant,
    ) {
        self.on = false;
    }
}

/// A supposed window edge probed one request at a time: from `from`, reservations go one
/// at a time, each let past the window guard, until the probe's reply confirms or refutes
/// the edge (`Adjust::Probe`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Probe {
    from: Option<Instant>,
}

impl Probe {
    /// Probes from `from` on (`None`: no longer).
    pub(crate) fn set(&mut self, from: Option<Instant>) {
        self.from = from;
    }

    /// From when the probe goes past the window guard, if one is set.
    pub(crate) fn from(&self) -> Option<Instant> {
        self.from
    }

    /// Whether a probe is under way at `now`: requests go one at a time, past the guard.
    #[inline]
    pub(crate) fn active(&self, now: Instant) -> bool {
        self.from.is_some_and(|from| now >= from)
    }

    /// Whether a request sent at `sent` left while probing.
    pub(crate) fn probed(&self, sent: Option<Instant>) -> bool {
        self.from.is_some_and(|from| sent.is_some_and(|at| at >= from))
    }
}

impl Rule for Probe {
    fn idle(&self) -> bool {
        self.from.is_none()
    }

    fn admit(&mut self, _ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Admission {
        if self.active(now) && ctx.in_flight() > 0 { Admission::Queue } else { Admission::Admit }
    }

    /// While probing, waits for the reply to the probe in flight.
    fn ready(&self, _ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        (!self.active(now) || ctx.in_flight() == 0).then_some(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::dims::Dims;
    use crate::arbiter::fair::Caller;
    use crate::arbiter::tickets::{SlotState, Tickets};
    use crate::books::Books;
    use crate::bucket::TokenBucket;
    use std::time::Duration;

    #[test]
    fn one_at_a_time_while_on_then_everyone() {
        let dims = Dims::new(vec![TokenBucket::per_second(10, Instant::ZERO).unwrap()]);
        let books = Books::new(1);
        let mut tickets = Tickets::new(1);
        let ask = Ask { cost: &[1], estimate: &[1], caller: Caller::default(), max_wait: None };
        let now = Instant::ZERO;
        let mut first = FirstAlone::new(true);
        let mut probe = Probe::default();
        probe.set(Some(now + Duration::from_secs(1)));
        {
            let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
            assert_eq!(first.admit(&ask, &ctx, now), Admission::Admit);
        }
        let one = tickets.allocate(&[1], SlotState::Granted, Caller::default(), now);
        let ctx = Ctx { dims: &dims, books: &books, tickets: &tickets };
        // One in flight: the first waits for its reply; the probe only from its instant.
        assert_eq!(first.admit(&ask, &ctx, now), Admission::Queue);
        assert_eq!(first.ready(&ask, &ctx, now), None);
        assert_eq!(probe.admit(&ask, &ctx, now), Admission::Admit);
        let then = now + Duration::from_secs(1);
        assert_eq!(probe.admit(&ask, &ctx, then), Admission::Queue);
        assert_eq!(probe.ready(&ask, &ctx, then), None);
        assert!(probe.probed(Some(then)) && !probe.probed(Some(now)));
        first.ended(&ask, Ended::Answered, None, 0, now);
        assert!(first.idle());
        assert_eq!(first.admit(&ask, &ctx, now), Admission::Admit);
        let _ = one;
    }
}

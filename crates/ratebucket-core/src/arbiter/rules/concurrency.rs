//! The concurrency rule: a bound on the requests in flight, each held from its grant until
//! its reservation ends (the reply, the stream's end, the call's drop). Stated, it is kept;
//! otherwise it is learned from the provider's refusals for requests in flight (additive
//! increase, multiplicative decrease) and is no bound at all until the first of them.

use std::time::Duration;

use super::{Admission, Ask, Ctx, Ended, Rule};
use crate::time::Instant;

/// What a refusal for requests in flight leaves of the limit that met it.
const DECREASE: f64 = 0.9;

/// How long a number in flight that was refused is not tried again.
const PROBE_AGAIN: Duration = Duration::from_secs(60);

/// The bound on requests in flight.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Concurrency {
    /// A limit the user stated: kept whatever the provider says.
    stated: Option<u32>,
    /// The limit learned from refusals; `None` until the first.
    learned: Option<f64>,
    /// The fewest in flight a refusal was met at, and when: not tried again for
    /// [`PROBE_AGAIN`].
    refused_at: Option<(u32, Instant)>,
}

impl Concurrency {
    /// At most `stated` in flight, or (`None`) as many as the provider's refusals allow.
    pub(crate) fn new(stated: Option<u32>) -> Concurrency {
        Concurrency { stated: stated.map(|n| n.max(1)), learned: None, refused_at: None }
    }

    /// The most requests in flight allowed now (`None`: no bound).
    pub(crate) fn limit(&self) -> Option<u32> {
        self.stated.or(self.learned.map(|l| l as u32))
    }

    /// Whether `in_flight` leaves room for one more.
    fn room(&self, in_flight: usize) -> bool {
        self.limit().is_none_or(|limit| in_flight < limit as usize)
    }
}

impl Rule for Concurrency {
    fn idle(&self) -> bool {
        self.limit().is_none()
    }

    fn admit(&mut self, _ask: &Ask<'_>, ctx: &Ctx<'_>, _now: Instant) -> Admission {
        if self.room(ctx.in_flight()) { Admission::Admit } else { Admission::Queue }
    }

    /// At the limit, waits for a request in flight to end.
    fn ready(&self, _ask: &Ask<'_>, ctx: &Ctx<'_>, now: Instant) -> Option<Instant> {
        self.room(ctx.in_flight()).then_some(now)
    }

    /// A refusal for requests in flight lowers a learned limit below the number that met
    /// it; an answer while the limit was in use raises it by one per limit's worth of
    /// answers, never back to a number refused within [`PROBE_AGAIN`].
    fn ended(
        &mut self,
        _ask: &Ask<'_>,
        how: Ended,
        _used: Option<&[u64]>,
        in_flight: usize,
        now: Instant,
    ) {
        if self.stated.is_some() {
            return;
        }
        let with_it = u32::try_from(in_flight + 1).unwrap_or(u32::MAX);
        match how {
            Ended::Crowded => {
                let fewest = self
                    .refused_at
                    .filter(|&(_, at)| now.saturating_duration_since(at) < PROBE_AGAIN)
                    .map_or(with_it, |(n, _)| n.min(with_it));
                self.refused_at = Some((fewest, now));
                let from = self.learned.unwrap_or(f64::from(with_it)).min(f64::from(with_it));
                self.learned = Some((from * DECREASE).floor().max(1.0));
            }
            Ended::Answered => {
                let Some(limit) = self.learned else { return };
                // Only a limit in use is evidence that more would do.
                if f64::from(with_it) < limit.floor() {
                    return;
                }
                let mut raised = limit + 1.0 / limit.max(1.0);
                if let Some((refused, at)) = self.refused_at {
                    if now.saturating_duration_since(at) < PROBE_AGAIN {
                        raised = raised.min(f64::from(refused.saturating_sub(1).max(1)));
                    } else {
                        self.refused_at = None;
                    }
                }
                self.learned = Some(raised);
            }
            Ended::Returned | Ended::Requeued => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask() -> Ask<'static> {
        Ask { cost: &[1], estimate: &[1], caller: Default::default(), max_wait: None }
    }

    fn at(secs: u64) -> Instant {
        Instant::ZERO + Duration::from_secs(secs)
    }

    #[test]
    fn a_stated_limit_is_kept_whatever_the_provider_says() {
        let mut rule = Concurrency::new(Some(4));
        assert!(rule.room(3) && !rule.room(4));
        rule.ended(&ask(), Ended::Crowded, None, 2, at(0));
        assert_eq!(rule.limit(), Some(4));
    }

    #[test]
    fn refusals_lower_a_learned_limit_and_answers_raise_it_short_of_the_refused_number() {
        let mut rule = Concurrency::new(None);
        assert!(rule.idle(), "no bound until a refusal");
        // Refused with 20 in flight (19 others and this one): at most 18 from now.
        rule.ended(&ask(), Ended::Crowded, None, 19, at(0));
        assert_eq!(rule.limit(), Some(18));
        // Answers while the limit is in use climb back, one per limit's worth, but not
        // to the 20 refused while that is recent.
        for _ in 0..1_000 {
            rule.ended(&ask(), Ended::Answered, None, 25, at(1));
        }
        assert_eq!(rule.limit(), Some(19));
        // Answers with the limit unused are no evidence.
        let mut idle = Concurrency::new(None);
        idle.ended(&ask(), Ended::Crowded, None, 9, at(0));
        let before = idle.limit();
        for _ in 0..100 {
            idle.ended(&ask(), Ended::Answered, None, 0, at(1));
        }
        assert_eq!(idle.limit(), before);
        // Long after the refusal, the refused number is tried again.
        for _ in 0..100 {
            rule.ended(&ask(), Ended::Answered, None, 25, at(61));
        }
        assert!(rule.limit() > Some(19), "{:?}", rule.limit());
        // And a second refusal halves nothing below one.
        let mut one = Concurrency::new(None);
        one.ended(&ask(), Ended::Crowded, None, 0, at(0));
        assert_eq!(one.limit(), Some(1));
    }
}

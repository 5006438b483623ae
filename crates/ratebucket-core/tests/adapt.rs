//! Adaptive rates against a provider below the configured limit that sends no headers, on
//! the virtual clock: the rate is probed back over the provider's window.

use std::cmp::Reverse;
use std::time::Duration;

use ratebucket_core::{
    Adapt, Arbiter, ArbiterConfig, Change, Event, Instant, Limit, QuotaPolicy, SendStamp, Ticket,
    TokenBucket,
};

const LATENCY: Duration = Duration::from_millis(20);

/// The provider's window, short as in the bench (a minute, scaled).
const WINDOW: Duration = Duration::from_millis(250);

/// A provider bucket of `limit` per `WINDOW` that starts full, refilling continuously.
struct Provider {
    limit: f64,
    level: f64,
    at: Instant,
}

impl Provider {
    /// Admits a request at `at`, or refuses it with the wait until it would be admitted
    /// (which an error message says, as OpenAI's "try again in 20ms" does).
    fn admit(&mut self, at: Instant) -> Result<(), Duration> {
        let per_second = self.limit / WINDOW.as_secs_f64();
        let refill = at.saturating_duration_since(self.at).as_secs_f64() * per_second;
        self.level = (self.level + refill).min(self.limit);
        self.at = at;
        if self.level >= 1.0 {
            self.level -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.level) / per_second))
        }
    }
}

/// Runs `n` requests, queued at once, through a client told 100 per window against a
/// provider of 40 that sends no rate-limit headers, only 429s whose message says how long
/// to wait; each 429 is reported and its request queued again. A granted request leaves
/// only while the gate is open. Returns when the last was admitted and how many 429s
/// there were.
fn run(n: usize, adapt: Adapt) -> (Instant, usize) {
    let config = ArbiterConfig::default().with_adapt(Some(adapt));
    let told: TokenBucket = Limit::per(100, WINDOW).bucket(Instant::ZERO).unwrap();
    let mut arbiter = Arbiter::new(vec![told], config, Instant::ZERO).unwrap();
    // The window the limit is counted over, which the client was told with it.
    arbiter.change(0, Change::Policy(QuotaPolicy::known(100, WINDOW)), Instant::ZERO).unwrap();
    let mut provider = Provider { limit: 40.0, level: 40.0, at: Instant::ZERO };
    for _ in 0..n {
        arbiter.reserve(&[1], Instant::ZERO).unwrap();
    }
    type Reply = (Instant, Ticket, SendStamp, Result<(), Duration>);
    let mut replies: Vec<Reply> = Vec::new();
    let mut granted: Vec<Ticket> = Vec::new();
    let (mut now, mut admitted, mut throttled, mut last) = (Instant::ZERO, 0, 0, Instant::ZERO);
    while admitted < n {
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                granted.push(ticket);
            }
        }
        let mut reopens = None;
        granted.retain(|&ticket| match arbiter.stamp_send_if_open(ticket, now) {
            Ok(sent) => {
                let answer = provider.admit(now + LATENCY / 2);
                replies.push((now + LATENCY, ticket, sent, answer));
                false
            }
            Err(at) => {
                reopens = Some(at);
                true
            }
        });
        replies.sort_by_key(|r| Reverse(r.0));
        let next = [replies.last().map(|r| r.0), arbiter.poll_timeout(), reopens]
            .into_iter()
            .flatten()
            .min()
            .expect("something is pending");
        now = next.max(now);
        arbiter.handle_timeout(now);
        while replies.last().is_some_and(|r| r.0 <= now) {
            let (at, ticket, sent, answer) = replies.pop().unwrap();
            if let Err(wait) = answer {
                throttled += 1;
                arbiter.throttle(sent, Some(wait), at);
                arbiter.release(ticket, at).unwrap();
                arbiter.reserve(&[1], at).unwrap();
            } else {
                arbiter.commit(ticket, &[1], at).unwrap();
                admitted += 1;
                last = at;
            }
        }
    }
    (last, throttled)
}

#[test]
fn a_provider_below_the_configured_limit_is_met_near_its_rate_with_few_429s() {
    // The provider's bound: its burst of 40, then 40 a window.
    let n = 600;
    let bound = WINDOW.mul_f64((n as f64 - 40.0) / 40.0) + LATENCY;
    let (last, throttled) = run(n, Adapt::default());
    let ratio = last.as_nanos() as f64 / bound.as_nanos() as f64;
    assert!(ratio <= 1.10, "{last:?}: {ratio:.3}x the bound, {throttled} 429s");
    // At most five 429s a provider window, as a gentle probe makes.
    let windows = last.as_nanos().div_ceil(WINDOW.as_nanos() as u64);
    assert!(throttled as u64 <= 5 * windows, "{throttled} 429s in {windows} windows");
}

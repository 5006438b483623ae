//! The behaviour suite every runtime adapter runs, identically: FIFO and all-or-nothing
//! grants, cancellation safety, one wakeup per grant, the gate, and wait limits.
//!
//! Each adapter's `tests/behaviour.rs` includes this file and implements [`Rt`].

#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use ratebucket_rt::core::{
    Arbiter, ArbiterConfig, Event, Instant, Rate, ThrottleOutcome, TokenBucket,
};
use ratebucket_rt::{Limiter, ReserveError, ReserveOptions};

pub type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the suite needs from a runtime.
pub trait Rt: 'static {
    /// Timing slack for assertions: zero on a paused clock, a few ms on real time.
    const SLACK: Duration;
    /// How late a wakeup may come on this runtime under any load: nothing on a paused
    /// clock; on real time, the limiter's own watchdog bound (`LATE_WAKEUP`), since a
    /// loaded machine may run a woken task late, but never early.
    const LATE: Duration;
    fn limiter(buckets: Vec<TokenBucket>, config: ArbiterConfig) -> Limiter;
    fn spawn<T: Send + 'static>(f: impl Future<Output = T> + Send + 'static) -> Boxed<T>;
    fn sleep(d: Duration) -> Boxed<()>;
    fn now() -> std::time::Instant;
}

fn bucket(rate: Rate, capacity: u64) -> TokenBucket {
    TokenBucket::new(rate, capacity, Instant::ZERO).expect("valid bucket")
}

fn per_second(n: u64) -> Rate {
    Rate::per_second(n).expect("valid rate")
}

/// A refill so slow (one permit per ~104 days) that levels only move by grants and refunds.
fn frozen() -> Rate {
    Rate::new(1, Duration::from_nanos(ratebucket_rt::core::MAX_LIMIT)).expect("valid rate")
}

/// Counts the polls of the future it wraps.
pub struct Counted<F> {
    inner: Pin<Box<F>>,
    polls: Arc<AtomicUsize>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.fetch_add(1, Ordering::Relaxed);
        self.inner.as_mut().poll(cx)
    }
}

/// Polls the inner future at most `budget` times, yielding between polls, then drops it.
pub struct DropAfter<F> {
    inner: Option<Pin<Box<F>>>,
    budget: usize,
}

impl<F: Future> Future for DropAfter<F> {
    type Output = Option<F::Output>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.budget == 0 {
            self.inner = None;
            return Poll::Ready(None);
        }
        self.budget -= 1;
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match inner.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    }
}

fn since(start: std::time::Instant, at: std::time::Instant) -> Duration {
    at.saturating_duration_since(start)
}

/// Whether something due at `expected` happened at `actual`: never early (beyond the
/// clock's slack), and late by no more than the runtime's allowance.
fn on_time<R: Rt>(actual: Duration, expected: Duration) -> bool {
    actual + R::SLACK >= expected && actual <= expected + R::SLACK + R::LATE
}

/// The grant instants the core computes for these costs on a virtual clock.
fn reference_schedule(buckets: &[TokenBucket], costs: &[[u64; 2]]) -> Vec<Duration> {
    let mut arbiter =
        Arbiter::new(buckets.to_vec(), ArbiterConfig::default(), Instant::ZERO).expect("arbiter");
    let tickets: Vec<_> =
        costs.iter().map(|c| arbiter.reserve(c, Instant::ZERO).expect("fits")).collect();
    let mut at = vec![Duration::MAX; costs.len()];
    let mut now = Instant::ZERO;
    loop {
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                let i = tickets.iter().position(|t| *t == ticket).expect("ours");
                at[i] = now.since_origin();
                // Committed at once, as the tasks below do.
                arbiter.commit(ticket, &costs[i], now).expect("granted");
            }
        }
        match arbiter.poll_timeout() {
            Some(t) => {
                now = t;
                arbiter.handle_timeout(now);
            }
            None => return at,
        }
    }
}

/// Grants follow arrival order and the pace both limits set together: the async layer
/// reproduces, under real concurrency, the schedule the core computes on a virtual clock.
pub async fn fifo_all_or_nothing_across_two_dimensions<R: Rt>() {
    let buckets = vec![bucket(per_second(20), 1), bucket(per_second(1000), 100)];
    let costs: Vec<[u64; 2]> =
        (0..20).map(|i| if i % 3 == 0 { [1, 100] } else { [1, 10] }).collect();
    let expected = reference_schedule(&buckets, &costs);
    let limiter = R::limiter(buckets, ArbiterConfig::default());
    let start = R::now();
    let granted: Arc<Mutex<Vec<(usize, Duration)>>> = Arc::default();
    let mut tasks = Vec::new();
    for (i, cost) in costs.iter().copied().enumerate() {
        let limiter = limiter.clone();
        let granted = Arc::clone(&granted);
        let mut task: Boxed<()> = Box::pin(async move {
            let reservation = limiter.reserve(&cost).await.expect("granted");
            granted.lock().unwrap().push((i, since(start, R::now())));
            reservation.commit(&cost).expect("commit");
        });
        // The first poll joins the queue: do it here, in order, then let it run anywhere.
        let done = futures_lite::future::poll_once(&mut task).await.is_some();
        assert_eq!(done, i == 0, "only the first fits at once");
        if !done {
            tasks.push(R::spawn(task));
        }
    }
    for t in tasks {
        t.await;
    }
    let mut granted = granted.lock().unwrap().clone();
    granted.sort_by_key(|&(_, at)| at);
    let order: Vec<usize> = granted.iter().map(|&(i, _)| i).collect();
    assert_eq!(order, (0..costs.len()).collect::<Vec<_>>(), "FIFO");
    for (i, at) in granted {
        assert!(
            on_time::<R>(at, expected[i]),
            "waiter {i} granted at {at:?}, the core says {:?}",
            expected[i]
        );
    }
    assert_eq!(limiter.snapshot().queued, 0);
}

/// 10,000 reservations, each dropped after a random number of polls (while queued or
/// just granted) or committed at a random actual: afterwards every level equals capacity
/// minus what was committed. Nothing leaked, nothing minted.
pub async fn cancellation_at_any_await_point_leaks_nothing<R: Rt>() {
    const N: u64 = 10_000;
    let capacity = [N, 20_000];
    let limiter = R::limiter(
        vec![bucket(frozen(), capacity[0]), bucket(frozen(), capacity[1])],
        ArbiterConfig::default(),
    );
    let committed = Arc::new([AtomicUsize::new(0), AtomicUsize::new(0)]);
    let mut tasks = Vec::new();
    for i in 0..N {
        let limiter = limiter.clone();
        let committed = Arc::clone(&committed);
        tasks.push(R::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(i);
            let cost = [1, rng.u64(1..=1_000)];
            let budget = rng.usize(0..6);
            let reserve = async { limiter.reserve(&cost).await };
            let outcome = DropAfter { inner: Some(Box::pin(reserve)), budget }.await;
            let Some(result) = outcome else { return };
            let reservation = result.expect("no error but by cancellation");
            for _ in 0..rng.usize(0..3) {
                futures_lite::future::yield_now().await;
            }
            if rng.bool() {
                let actual = [1, rng.u64(0..=2)];
                reservation.commit(&actual).expect("commit");
                committed[0].fetch_add(1, Ordering::Relaxed);
                committed[1].fetch_add(actual[1] as usize, Ordering::Relaxed);
            } else {
                drop(reservation);
            }
        }));
    }
    for t in tasks {
        t.await;
    }
    assert_eq!(limiter.snapshot().queued, 0, "no waiter left behind");
    for d in 0..2 {
        let expected = (capacity[d] - committed[d].load(Ordering::Relaxed) as u64) as f64;
        let level = limiter.dimension(d).map(|v| v.state.level).expect("dimension");
        assert!(
            (level - expected).abs() < 1e-3,
            "dimension {d}: level {level}, expected {expected}"
        );
    }
}

/// 2,000 waiters at 1,000/s: each is polled once to join the queue and once when its own
/// grant arrives. No thundering herd.
pub async fn one_wakeup_per_grant<R: Rt>() -> f64 {
    const N: usize = 2_000;
    let limiter = R::limiter(
        vec![bucket(per_second(1000), 1), bucket(per_second(1_000_000), 1_000_000)],
        ArbiterConfig::default(),
    );
    let polls = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..N {
        let limiter = limiter.clone();
        let polls = Arc::clone(&polls);
        tasks.push(R::spawn(async move {
            let reserve = async { limiter.reserve(&[1, 1]).await };
            let counted = Counted { inner: Box::pin(reserve), polls };
            counted.await.expect("granted").commit(&[1, 1]).expect("commit");
        }));
    }
    for t in tasks {
        t.await;
    }
    let per_grant = polls.load(Ordering::Relaxed) as f64 / N as f64;
    assert!(per_grant <= 2.05, "{per_grant} polls per grant");
    per_grant
}

/// A throttle closes the gate once: holders waiting on the gate and queued reservations
/// all resume at the deadline, each polled a bounded number of times; the rest of the
/// wave is stale and neither re-closes nor extends the pause.
pub async fn a_closed_gate_pauses_every_waiter_once_and_reopens_at_the_deadline<R: Rt>() {
    let limiter = R::limiter(
        vec![bucket(per_second(10_000), 1_000), bucket(per_second(10_000), 1_000)],
        ArbiterConfig::default(),
    );
    let pause = Duration::from_millis(400);
    let start = R::now();
    let wave: Vec<_> = (0..50).map(|_| limiter.stamp_send()).collect();
    let outcomes: Vec<_> = wave.iter().map(|s| limiter.throttle(*s, Some(pause))).collect();
    let closures = outcomes.iter().filter(|o| matches!(o, ThrottleOutcome::Closed { .. })).count();
    assert_eq!(closures, 1, "fifty throttles of one wave, one pause");
    let polls = Arc::new(AtomicUsize::new(0));
    let resumed: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut tasks = Vec::new();
    for i in 0..40 {
        let limiter = limiter.clone();
        let polls = Arc::clone(&polls);
        let resumed = Arc::clone(&resumed);
        tasks.push(R::spawn(async move {
            let work = async {
                if i % 2 == 0 {
                    limiter.gate_open().await;
                } else {
                    limiter.reserve(&[1, 1]).await.expect("granted").release();
                }
            };
            Counted { inner: Box::pin(work), polls }.await;
            resumed.lock().unwrap().push(since(start, R::now()));
        }));
    }
    R::sleep(Duration::from_millis(100)).await;
    // A late reply from the same wave changes nothing.
    assert_eq!(limiter.throttle(wave[0], Some(Duration::from_secs(30))), ThrottleOutcome::Stale);
    for t in tasks {
        t.await;
    }
    for at in resumed.lock().unwrap().iter() {
        assert!(on_time::<R>(*at, pause), "resumed at {at:?}");
    }
    let per_waiter = polls.load(Ordering::Relaxed) as f64 / 40.0;
    assert!(per_waiter <= 3.0, "{per_waiter} polls per waiter");
}

/// `max_wait` refuses at once with the wait it refused; a deadline is honoured while
/// queued, and the withdrawn claim frees the queue.
pub async fn max_wait_and_deadlines_are_honoured<R: Rt>() {
    let limiter = R::limiter(
        vec![bucket(per_second(10), 1), bucket(per_second(1000), 1000)],
        ArbiterConfig::default(),
    );
    let held = limiter.reserve(&[1, 1]).await.expect("first fits");
    let started = R::now();
    let refused = limiter
        .reserve(&[1, 1])
        .with(ReserveOptions::default().max_wait(Duration::from_millis(50)))
        .await;
    let retry_after = refused.unwrap_err().retry_after().expect("not yet, rather than never");
    // The estimate is the wait left when it was made: never short of the truth.
    let elapsed = since(started, R::now());
    assert!(
        retry_after <= Duration::from_millis(100) + R::SLACK
            && retry_after + elapsed + R::SLACK >= Duration::from_millis(100),
        "retry after {retry_after:?}"
    );
    assert!(elapsed <= R::SLACK + R::LATE, "refused without waiting");

    // Accepted on the estimate (100 ms < 150 ms), then the rate drops: the deadline wins.
    let deadline = R::now() + Duration::from_millis(150);
    let waiting = limiter.reserve(&[1, 1]).with(ReserveOptions::default().deadline(deadline));
    let slow = async {
        R::sleep(Duration::from_millis(10)).await;
        limiter.set_limit(0, Some(Rate::per_second(1).expect("rate")), None).expect("dimension 0");
    };
    let (result, ()) = futures_lite::future::zip(waiting, slow).await;
    assert_eq!(result.unwrap_err(), ReserveError::DeadlinePassed);
    let waited = since(started, R::now());
    assert!(on_time::<R>(waited, Duration::from_millis(150)), "gave up after {waited:?}");
    assert_eq!(limiter.snapshot().queued, 0, "the claim was withdrawn");
    drop(held);
    let too_big = limiter.reserve(&[2, 1]).await;
    assert!(matches!(too_big, Err(ReserveError::CostExceedsCapacity { dimension: 0, .. })));
}

/// A reservation asked to send on its grant is stamped by the grant, under the grant's
/// own lock: `send_when_open` then takes no lock, the stamp is the send's (a throttle on
/// it closes the gate), and the reservation counts as sent (dropped, it stays charged).
/// While the gate is closed the grant waits, and is stamped when the gate reopens.
pub async fn a_reservation_sent_on_grant_is_stamped_by_its_grant<R: Rt>() {
    let limiter = R::limiter(vec![bucket(frozen(), 3)], ArbiterConfig::default());
    // A send opens the provider's books, which keeps every grant in the arbiter.
    let _opened = limiter.stamp_send();
    let on_grant = ReserveOptions::default().send_on_grant();
    let before = limiter.stats().locks;
    let mut reservation = limiter.reserve(&[1]).with(on_grant).await.expect("fits");
    let sent = limiter.send_when_open(&mut reservation).await.expect("the gate is open");
    assert_eq!(limiter.stats().locks - before, 1, "one lock: grant and stamp");
    drop(reservation);
    let now = ReserveOptions::default().max_wait(Duration::ZERO);
    let rest = limiter.reserve(&[3]).with(now).await;
    assert!(
        matches!(rest, Err(ReserveError::WouldWait { .. })),
        "the dropped reservation was sent and stays charged: {rest:?}"
    );
    let pause = Duration::from_millis(100);
    assert!(
        matches!(limiter.throttle(sent, Some(pause)), ThrottleOutcome::Closed { .. }),
        "the stamp is the send's"
    );
    // Granted while the gate is closed (a throttle leaves the frozen bucket empty, so
    // raise the limit): stamped only when it reopens.
    limiter.set_limit(0, Some(per_second(1000)), None).expect("dimension 0");
    let started = R::now();
    let mut reservation = limiter.reserve(&[1]).with(on_grant).await.expect("fits");
    limiter.send_when_open(&mut reservation).await.expect("the gate reopens");
    let waited = since(started, R::now());
    assert!(waited + R::SLACK >= pause, "sent {waited:?} into a pause of {pause:?}");
}

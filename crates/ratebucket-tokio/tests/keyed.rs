//! `KeyedLimiter`: a limiter per key, made lazily, each with its own quota and gate,
//! dropped only when dropping it loses nothing, and never more than `max_keys` alive.

use std::time::Duration;

use ratebucket_tokio::core::{Limit, Rate};
use ratebucket_tokio::{KeyedError, KeyedLimiter, ReserveError, ReserveOptions};

/// Two permits of burst, one more every second.
fn keyed() -> KeyedLimiter<&'static str> {
    KeyedLimiter::new(|_key: &&str| {
        ratebucket_tokio::limiter_for([Limit::new(Rate::per_second(1).expect("rate"), 2)])
    })
}

fn now_only() -> ReserveOptions {
    ReserveOptions::default().max_wait(Duration::ZERO)
}

#[tokio::test(start_paused = true)]
async fn each_key_has_its_own_quota_and_the_same_key_shares_one() {
    let keyed = keyed();
    let a = keyed.get(&"gpt-4o").expect("made");
    a.acquire(&[2]).await.expect("a's burst");
    // The same key: the same, now empty, quota.
    let again = keyed.get(&"gpt-4o").expect("found");
    assert!(matches!(
        again.reserve(&[1]).with(now_only()).await,
        Err(ReserveError::WouldWait { .. })
    ));
    // Another key: a full quota of its own.
    let b = keyed.get(&"gpt-4o-mini").expect("made");
    b.acquire(&[2]).await.expect("b's burst");
    assert_eq!(keyed.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn a_throttle_pauses_only_its_key() {
    let keyed = keyed();
    let a = keyed.get(&"a").expect("made");
    let b = keyed.get(&"b").expect("made");
    let mut reservation = a.reserve(&[1]).await.expect("granted");
    let sent = a.send_when_open(&mut reservation).await.expect("open");
    a.throttle(sent, Some(Duration::from_secs(30)));
    reservation.release();
    // b's gate is open: it is granted and sends at once.
    let mut other = b.reserve(&[1]).await.expect("granted");
    let started = tokio::time::Instant::now();
    b.send_when_open(&mut other).await.expect("open");
    assert_eq!(started.elapsed(), Duration::ZERO);
    // a's callers wait out the pause.
    let started = tokio::time::Instant::now();
    a.gate_open().await;
    assert_eq!(started.elapsed(), Duration::from_secs(30));
}

#[tokio::test(start_paused = true)]
async fn a_key_is_dropped_only_once_a_new_limiter_would_be_the_same() {
    let keyed = keyed();
    keyed.get(&"a").expect("made").acquire(&[2]).await.expect("burst");
    // Drained: a fresh limiter would start full, so "a" must stay.
    assert_eq!(keyed.evict_dormant(), 0);
    // A handle is held: it stays, however full.
    let held = keyed.get(&"b").expect("made");
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(keyed.evict_dormant(), 1, "a has refilled; b is held");
    assert_eq!(keyed.len(), 1);
    drop(held);
    assert_eq!(keyed.evict_dormant(), 1);
    assert!(keyed.is_empty());
}

#[tokio::test(start_paused = true)]
async fn memory_is_bounded_without_forgetting_anyones_quota() {
    let keyed = keyed().max_keys(2);
    keyed.get(&"a").expect("made").acquire(&[1]).await.expect("a");
    keyed.get(&"b").expect("made").acquire(&[1]).await.expect("b");
    // Both still refilling: a third key would need one of them forgotten.
    assert_eq!(keyed.get(&"c").expect_err("full"), KeyedError::TooManyKeys { max_keys: 2 });
    assert_eq!(keyed.len(), 2);
    tokio::time::advance(Duration::from_secs(1)).await;
    // Both full again: they make room.
    keyed.get(&"c").expect("room made");
    assert_eq!(keyed.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn invalid_limits_for_a_key_are_an_error_and_leave_nothing_behind() {
    let keyed =
        KeyedLimiter::new(|rpm: &u64| ratebucket_tokio::limiter_for([Limit::per_minute(*rpm)]));
    assert!(matches!(keyed.get(&0), Err(KeyedError::InvalidLimit(_))));
    assert!(keyed.is_empty());
    keyed.get(&60).expect("valid");
    assert_eq!(keyed.len(), 1);
}

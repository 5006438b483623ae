//! The retry table, row by row, and the policy's actions over it.

use std::time::Duration;

use ratebucket_core::Rng;
use ratebucket_core::{
    Action, Class, FailureKind, Instant, Outcome, Retry, RetryPolicy, StopReason, Verdict, classify,
};

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[test]
fn success_is_ok() {
    for status in [200, 201, 204, 299] {
        assert_eq!(classify(&Outcome::status(status)), Class::Ok, "{status}");
    }
}

#[test]
fn a_429_and_a_503_with_retry_after_are_throttled() {
    assert_eq!(classify(&Outcome::status(429)), Class::Throttled);
    assert_eq!(classify(&Outcome::status(503).with_retry_after(secs(3))), Class::Throttled);
}

#[test]
fn a_403_that_carries_a_rate_limit_is_throttled_not_fatal() {
    // GitHub: a secondary limit with Retry-After, a primary one with remaining 0.
    assert_eq!(classify(&Outcome::status(403).with_retry_after(secs(60))), Class::Throttled);
    assert_eq!(classify(&Outcome::status(403).with_quota_exhausted()), Class::Throttled);
    assert_eq!(classify(&Outcome::status(403)), Class::Fatal, "a plain 403");
}

#[test]
fn server_errors_timeouts_and_unreached_servers_are_retryable() {
    // 409 too: a conflict on the server's side, which the major SDKs retry.
    for status in [500, 502, 503, 504, 529, 599, 408, 409] {
        assert_eq!(classify(&Outcome::status(status)), Class::Retryable, "{status}");
    }
    for kind in [FailureKind::ConnectRefused, FailureKind::ConnectTimeout] {
        assert_eq!(classify(&Outcome::failure(kind)), Class::Retryable, "{kind:?}");
    }
}

#[test]
fn failures_after_the_request_was_sent_are_ambiguous() {
    for kind in [FailureKind::ReadTimeout, FailureKind::ResetAfterSend, FailureKind::BodyCut] {
        assert_eq!(classify(&Outcome::failure(kind)), Class::Ambiguous, "{kind:?}");
    }
}

#[test]
fn other_client_errors_and_request_too_large_are_permanent() {
    for status in [400, 404, 413, 422] {
        assert_eq!(classify(&Outcome::status(status)), Class::Permanent, "{status}");
    }
    let too_large = Outcome::status(429).with_verdict(Verdict::Permanent);
    assert_eq!(classify(&too_large), Class::Permanent);
}

#[test]
fn bad_credentials_and_exhausted_quota_are_fatal() {
    for status in [401, 403] {
        assert_eq!(classify(&Outcome::status(status)), Class::Fatal, "{status}");
    }
    let quota = Outcome::status(429).with_verdict(Verdict::Fatal);
    assert_eq!(classify(&quota), Class::Fatal);
}

#[test]
fn x_should_retry_overrides_the_status_class() {
    let no = Outcome::status(500).with_should_retry(false);
    assert_eq!(classify(&no), Class::Permanent);
    let yes = Outcome::status(400).with_should_retry(true);
    assert_eq!(classify(&yes), Class::Retryable);
    let ok = Outcome::status(200).with_should_retry(false);
    assert_eq!(classify(&ok), Class::Ok);
    // A body verdict outranks the header.
    let quota = Outcome::status(429).with_verdict(Verdict::Fatal).with_should_retry(true);
    assert_eq!(classify(&quota), Class::Fatal);
}

fn decide(policy: RetryPolicy, outcome: Outcome) -> Action {
    Retry::new(policy).decide(&outcome, Instant::ZERO, &mut Rng::with_seed(7))
}

#[test]
fn each_class_maps_to_its_action() {
    let p = RetryPolicy::default();
    assert_eq!(decide(p, Outcome::status(200)), Action::Done);
    assert_eq!(
        decide(p, Outcome::status(429).with_retry_after(secs(2))),
        Action::PauseAndRetry { retry_after: Some(secs(2)) }
    );
    assert!(matches!(decide(p, Outcome::status(502)), Action::RetryAfter { .. }));
    assert_eq!(
        decide(p, Outcome::failure(FailureKind::ReadTimeout)),
        Action::Fail(StopReason::Class(Class::Ambiguous))
    );
    assert_eq!(decide(p, Outcome::status(404)), Action::Fail(StopReason::Class(Class::Permanent)));
    assert_eq!(decide(p, Outcome::status(401)), Action::Abort(StopReason::Class(Class::Fatal)));
}

#[test]
fn ambiguous_failures_are_retried_only_when_asked() {
    let p = RetryPolicy::default().with_retry_ambiguous(true);
    assert!(matches!(decide(p, Outcome::failure(FailureKind::BodyCut)), Action::RetryAfter { .. }));
}

/// A wait of days is not a pause: the quota is spent until then, for every call.
#[test]
fn a_retry_after_beyond_the_ceiling_means_spent_until_then() {
    let p = RetryPolicy::default();
    let days = secs(16 * 24 * 3600);
    for status in [429, 503] {
        assert_eq!(
            decide(p, Outcome::status(status).with_retry_after(days)),
            Action::Spent { resets_in: Some(days) },
            "{status}"
        );
    }
    assert!(matches!(
        decide(p, Outcome::status(429).with_retry_after(secs(120))),
        Action::PauseAndRetry { .. }
    ));
    // Decades away is not believed about when: spent until someone raises it.
    assert_eq!(
        decide(p, Outcome::status(429).with_retry_after(secs(u64::MAX))),
        Action::Spent { resets_in: None }
    );
}

/// Spent, busy or wrong: a vendor's verdict says which, whatever the status.
#[test]
fn a_spent_quota_is_told_from_a_busy_pool_and_a_wrong_request() {
    let p = RetryPolicy::default();
    let spent = Outcome::status(429).with_verdict(Verdict::Spent);
    assert_eq!(decide(p, spent), Action::Spent { resets_in: None });
    assert_eq!(
        decide(p, spent.with_retry_after(secs(30))),
        Action::Spent { resets_in: Some(secs(30)) },
        "its reset, when said"
    );
    let busy = Outcome::status(498).with_verdict(Verdict::Retryable);
    assert_eq!(classify(&busy), Class::Retryable);
    assert!(matches!(decide(p, busy), Action::RetryAfter { .. }));
    assert_eq!(classify(&Outcome::status(498)), Class::Permanent);
}

/// Too many in flight is neither a pause of the pool nor a failure: the request goes again
/// (after its own wait, if the provider named one), counted as a throttle.
#[test]
fn a_refusal_for_requests_in_flight_is_retried_without_a_pause() {
    let p = RetryPolicy::default().with_max_throttles(2);
    let crowded = Outcome::status(429).with_verdict(Verdict::Crowded);
    assert_eq!(classify(&crowded), Class::Crowded);
    assert_eq!(decide(p, crowded), Action::CrowdedRetry { retry_after: None });
    assert_eq!(
        decide(p, crowded.with_retry_after(secs(1))),
        Action::CrowdedRetry { retry_after: Some(secs(1)) }
    );
    let mut retry = Retry::new(p);
    let mut rng = Rng::with_seed(1);
    for _ in 0..2 {
        let a = retry.decide(&crowded, Instant::ZERO, &mut rng);
        assert!(matches!(a, Action::CrowdedRetry { .. }));
    }
    assert_eq!(
        retry.decide(&crowded, Instant::ZERO, &mut rng),
        Action::Fail(StopReason::ThrottlesExhausted)
    );
}

#[test]
fn throttles_do_not_spend_retry_attempts() {
    let p = RetryPolicy::default().with_max_retries(1);
    let mut retry = Retry::new(p);
    let mut rng = Rng::with_seed(1);
    for _ in 0..10 {
        let a = retry.decide(&Outcome::status(429), Instant::ZERO, &mut rng);
        assert!(matches!(a, Action::PauseAndRetry { .. }));
    }
    let a = retry.decide(&Outcome::status(500), Instant::ZERO, &mut rng);
    assert!(matches!(a, Action::RetryAfter { .. }));
    let a = retry.decide(&Outcome::status(500), Instant::ZERO, &mut rng);
    assert_eq!(a, Action::Fail(StopReason::RetriesExhausted));
    assert_eq!(retry.attempts(), 12);
}

#[test]
fn backoff_is_full_jitter_exponential_and_reproducible_from_a_seed() {
    let p = RetryPolicy::default();
    let draws = |seed| {
        let mut rng = Rng::with_seed(seed);
        (0..12).map(|n| p.backoff(n, &mut rng)).collect::<Vec<_>>()
    };
    assert_eq!(draws(42), draws(42));
    assert_ne!(draws(42), draws(43));
    let mut rng = Rng::with_seed(9);
    for n in 0..40 {
        let ceiling = (p.base_backoff * 2u32.saturating_pow(n.min(20))).min(p.max_backoff);
        let mut max_seen = Duration::ZERO;
        for _ in 0..200 {
            let d = p.backoff(n, &mut rng);
            assert!(d <= ceiling, "retry {n}: {d:?} above {ceiling:?}");
            max_seen = max_seen.max(d);
        }
        // Full jitter spreads over the whole range, not a narrow band near the top.
        assert!(max_seen > ceiling.mul_f64(0.9), "retry {n}");
    }
}

#[test]
fn a_server_requested_wait_replaces_the_backoff() {
    let p = RetryPolicy::default();
    assert_eq!(
        decide(p, Outcome::status(500).with_retry_after(secs(3))),
        Action::RetryAfter { delay: secs(3) }
    );
}

#[test]
fn the_overall_deadline_aborts_instead_of_starting_late() {
    let p = RetryPolicy::default().with_deadline(Instant::from_secs(1));
    assert_eq!(
        decide(p, Outcome::status(500).with_retry_after(secs(5))),
        Action::Abort(StopReason::DeadlineExhausted)
    );
    assert_eq!(
        decide(p, Outcome::status(429).with_retry_after(secs(5))),
        Action::Abort(StopReason::DeadlineExhausted)
    );
}

//! The metrics a small batch records, through a local `metrics` recorder, against a real
//! server on 127.0.0.1.

mod observe;

use std::collections::HashMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use observe::{call, fetcher, paced, throttles_once};

/// Every series recorded, by name and sorted labels: `name{a=1,b=2}`.
fn series(snapshotter: &metrics_util::debugging::Snapshotter) -> HashMap<String, DebugValue> {
    let mut seen = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> =
            key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        labels.sort();
        seen.insert(format!("{}{{{}}}", key.name(), labels.join(",")), value);
    }
    seen
}

#[test]
fn a_small_batch_records_grants_throttles_pauses_refunds_levels_and_limits() {
    let server = throttles_once();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            let fetcher = fetcher(paced());
            for _ in 0..4 {
                call(&fetcher, &server.base_url()).await;
            }
        })
    });

    let seen = series(&snapshotter);
    let counter = |name: &str| match seen.get(name) {
        Some(DebugValue::Counter(n)) => *n,
        other => panic!("{name}: {other:?} in {:?}", seen.keys()),
    };
    let gauge = |name: &str| match seen.get(name) {
        Some(DebugValue::Gauge(v)) => v.into_inner(),
        other => panic!("{name}: {other:?} in {:?}", seen.keys()),
    };
    let limiter = "limiter=scripted/api";
    assert!(
        seen.keys().all(|k| k.contains(limiter)),
        "every series carries the limiter's name: {:?}",
        seen.keys()
    );
    // Five grants: the throttled attempt's and one per call.
    assert_eq!(counter(&format!("ratebucket_grants_total{{{limiter}}}")), 5);
    assert_eq!(counter(&format!("ratebucket_throttles_total{{{limiter}}}")), 1);
    assert_eq!(counter(&format!("ratebucket_pauses_total{{{limiter}}}")), 1);
    assert_eq!(counter(&format!("ratebucket_paused_milliseconds_total{{{limiter}}}")), 50);
    assert_eq!(counter(&format!("ratebucket_attempts_total{{class=Throttled,{limiter}}}")), 1);
    assert_eq!(counter(&format!("ratebucket_attempts_total{{class=Ok,{limiter}}}")), 4);
    // Each call reserved 100 tokens and used 40.
    assert_eq!(
        counter(&format!("ratebucket_refunded_total{{dimension=tokens,{limiter}}}")),
        4 * 60
    );
    assert!(!seen.contains_key(&format!("ratebucket_debt_total{{dimension=tokens,{limiter}}}")));
    assert_eq!(gauge(&format!("ratebucket_capacity{{dimension=tokens,{limiter}}}")), 100_000.0);
    assert!(gauge(&format!("ratebucket_rate_per_second{{dimension=requests,{limiter}}}")) > 0.0);
    assert_eq!(gauge(&format!("ratebucket_queued{{{limiter}}}")), 0.0);
    let level = gauge(&format!("ratebucket_level{{dimension=tokens,{limiter}}}"));
    assert!(level > 0.0 && level <= 100_000.0, "level {level}");
    // Per dimension, what the provider said: the limit in force and what remained; the
    // queue's depth; and whether the quota is spent.
    let requests = |name: &str| gauge(&format!("{name}{{dimension=requests,{limiter}}}"));
    assert_eq!(requests("ratebucket_limit"), 1_000.0);
    assert_eq!(requests("ratebucket_provider_remaining"), 990.0);
    assert_eq!(requests("ratebucket_queued_cost"), 0.0);
    assert_eq!(gauge(&format!("ratebucket_spent{{{limiter}}}")), 0.0);
}

#[test]
fn calls_that_name_a_tenant_are_counted_per_tenant_and_class() {
    use bytes::Bytes;
    use ratebucket_rt::Limiter;
    use ratebucket_rt::core::{ArbiterConfig, Caller, Limit, Priority};

    let server = throttles_once();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    metrics::with_local_recorder(&recorder, || {
        runtime.block_on(async {
            // One request at a time, 50 a second: the calls queue.
            let limits = [Limit::per_second(50).with_capacity(1), Limit::per_second(100_000)];
            let limiter = Limiter::from_limits(
                limits,
                ArbiterConfig::default(),
                ratebucket_tokio::TokioTimer::current(),
            )
            .expect("limiter")
            .with_name("tenants");
            let fetcher = fetcher(limiter);
            let mut calls = tokio::task::JoinSet::new();
            for _ in 0..6 {
                let mut request = http::Request::post(format!("{}/", server.base_url()))
                    .body(Bytes::new())
                    .expect("request");
                request.extensions_mut().insert(Caller::tenant(5).priority(Priority::Interactive));
                let fetcher = fetcher.clone();
                calls.spawn(async move {
                    fetcher
                        .fetch_costed(&[1, 100], |_| ratebucket_http::copy_request(&request))
                        .await
                        .map(drop)
                });
            }
            while let Some(result) = calls.join_next().await {
                result.expect("joined").expect("answered");
            }
        })
    });
    let granted = series(&snapshotter)
        .remove("ratebucket_tenant_granted_total{limiter=tenants,priority=interactive,tenant=5}");
    // Six calls, one 429 sent again: every grant but those made on arrival came from the
    // queue, in tenant 5's interactive class.
    match granted {
        Some(DebugValue::Counter(n)) => assert!(n >= 4, "{n} granted from the queue"),
        other => panic!("no per-tenant series: {other:?}"),
    }
}

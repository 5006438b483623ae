//! Names, snapshots and drain estimates through the async handle, on tokio's paused clock.

use std::time::Duration;

use ratebucket_tokio::core::{InvalidLimit, Limit};

#[tokio::test(start_paused = true)]
async fn a_limiter_names_itself_and_its_dimensions() {
    let limiter = ratebucket_tokio::limiter_for([
        Limit::per_second(10).named("requests"),
        Limit::per_second(1_000),
    ])
    .expect("limiter")
    .with_name("api/model");
    assert_eq!(&*limiter.name(), "api/model");
    assert_eq!(limiter.dimension(0).map(|v| v.name).as_deref(), Some("requests"));
    assert_eq!(limiter.dimension(1).map(|v| v.name).as_deref(), Some("1"));
    limiter.name_dimension(1, "tokens").expect("exists");
    assert_eq!(limiter.name_dimension(2, "nope"), Err(InvalidLimit::NoSuchDimension(2)));
    let snapshot = limiter.snapshot();
    assert_eq!(&*snapshot.name, "api/model");
    let names: Vec<&str> = snapshot.dimensions.iter().map(|d| &*d.name).collect();
    assert_eq!(names, ["requests", "tokens"]);
}

#[tokio::test(start_paused = true)]
async fn the_drain_estimate_is_when_queued_work_is_granted() {
    // 10 a second, 10 of burst: 10 go at once, and 25 more take 2.5 s.
    let limiter = ratebucket_tokio::limiter_for([Limit::per_second(10)]).expect("limiter");
    let started = tokio::time::Instant::now();
    assert_eq!(limiter.estimate_drain(&[35]), Ok(Duration::from_millis(2_500)));
    let tasks: Vec<_> = (0..35)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(&[1]).await })
        })
        .collect();
    tokio::task::yield_now().await;
    let snapshot = limiter.snapshot();
    assert_eq!(snapshot.queued, 25);
    assert_eq!(snapshot.dimensions[0].state.queued_cost, 25);
    assert_eq!(limiter.estimate_drain(&[0]), Ok(Duration::from_millis(2_500)));
    for task in tasks {
        task.await.expect("task").expect("granted");
    }
    assert_eq!(started.elapsed(), Duration::from_millis(2_500));
    assert_eq!(limiter.snapshot().queued, 0);
}

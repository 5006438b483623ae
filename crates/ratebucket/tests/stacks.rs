//! The facade's `reqwest` and `tower` features bring the README's "bring your own stack"
//! rows through `ratebucket` alone.

use ratebucket::http::tower::PaceLayer;
use ratebucket::http::{FetchConfig, Fetcher, ReqwestTransport};
use ratebucket::{Limit, Limiter};

fn limiter() -> Limiter {
    ratebucket::limiter([Limit::per_second(10)]).expect("limiter")
}

#[tokio::test]
async fn reqwest_and_tower_are_reached_through_the_facade() {
    let client = reqwest::Client::new();
    let fetcher = Fetcher::new(ReqwestTransport::new(client), limiter(), FetchConfig::default());
    assert_eq!(fetcher.limiter().snapshot().dimensions.len(), 1);
    let layer = PaceLayer::new(limiter(), FetchConfig::default()).cost(|_req| vec![1]);
    let _ = layer;
}

/// The README's per-key row, as written, with `&str` keys.
#[tokio::test]
async fn the_readme_keyed_row_compiles_with_str_keys() {
    use ratebucket::KeyedLimiter;
    fn rpm_of(model: &str) -> u64 {
        if model.starts_with("gpt-4o") { 500 } else { 60 }
    }
    let keyed =
        KeyedLimiter::<&str>::new(|model| ratebucket::limiter([Limit::per_minute(rpm_of(model))]));
    let limiter = keyed.get(&"gpt-4o-mini").expect("a limiter for the key");
    let row = r"KeyedLimiter::<&str>::new(\|model\| ratebucket::limiter([Limit::per_minute(rpm_of(model))]))";
    assert!(
        include_str!("../../../README.md").contains(row),
        "the README's row is the line compiled here"
    );
    limiter.acquire(&[1]).await.expect("granted");
}

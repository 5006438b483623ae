//! A request's own Retry-After: a request refused with a longer wait than the one that
//! closed the pool's gate (an earlier answer of the same wave) is not sent again before
//! its own wait has passed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport};
use ratebucket_rt::core::{Instant as CoreInstant, Rate, TokenBucket};
use ratebucket_sim::{Scripted, Step};

/// Which request a raw one is (`request N` in its body).
fn which(raw: &[u8]) -> usize {
    let text = String::from_utf8_lossy(raw);
    let (_, rest) = text.split_once("request ").expect("a numbered request");
    rest.chars().take_while(char::is_ascii_digit).collect::<String>().parse().expect("a number")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_for_its_own_retry_after_whatever_the_pools_pause() {
    // The first arrival is refused at 50 ms with a wait of 1 s (it closes the gate); the
    // second, sent in the same wave, at 150 ms with a wait of 3 s (its epoch is stale: the
    // gate is not closed again). Everything after is answered.
    let arrivals: Arc<Mutex<Vec<(usize, Instant)>>> = Arc::default();
    let seen = Arc::clone(&arrivals);
    let server = Scripted::start(move |n: usize, raw: &[u8]| {
        seen.lock().expect("log").push((which(raw), Instant::now()));
        let refused = |after: u64, wait: &str| {
            vec![
                Step::Sleep(Duration::from_millis(after)),
                Step::json(429, &[("retry-after", wait)], r#"{"error":"slow down"}"#),
            ]
        };
        match n {
            0 => refused(50, "1"),
            1 => refused(150, "3"),
            _ => vec![Step::json(200, &[], "{}")],
        }
    })
    .expect("server");
    let bucket = TokenBucket::new(Rate::per_second(1_000).expect("rate"), 10, CoreInstant::ZERO)
        .expect("bucket");
    let limiter = ratebucket_tokio::limiter(vec![bucket]).expect("limiter");
    let fetcher = Fetcher::new(HyperTransport::default(), limiter, FetchConfig::default());
    let calls: Vec<_> = (0..2)
        .map(|i| {
            let fetcher = fetcher.clone();
            let url = format!("{}/v1/x", server.base_url());
            tokio::spawn(async move {
                let request = http::Request::post(url)
                    .body(Bytes::from(format!("request {i}")))
                    .expect("request");
                fetcher.fetch(request).await.map(|f| f.attempts)
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.expect("joins").expect("answered"), 2);
    }
    let arrivals = arrivals.lock().expect("log").clone();
    assert_eq!(arrivals.len(), 4, "{arrivals:?}");
    // The request told to wait 3 s: its second arrival comes no sooner than that after
    // its answer (150 ms after its first arrival).
    let (told_three, first) = arrivals[1];
    let again = arrivals
        .iter()
        .skip(2)
        .find(|(who, _)| *who == told_three)
        .map(|(_, at)| *at)
        .expect("sent again");
    let waited = again - first;
    assert!(
        waited >= Duration::from_millis(3_150),
        "sent again {waited:?} after its first send, within its own 3 s"
    );
}

//! An axum server calling a rate-limited upstream through the tower layer: however many
//! clients hit the server at once, the upstream sees its limit kept and one pause per wave
//! of 429s. Upstream and clients are local: `cargo run -p ratebucket-http --features tower --example tower_axum`.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratebucket_http::FetchConfig;
use ratebucket_http::tower::PaceLayer;
use ratebucket_rt::core::Limit;
use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use tower::{Layer, ServiceExt};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The upstream: 600 requests per 5 s window (a real one counts per minute; this one
    // is shortened so the example runs in seconds).
    let window = Duration::from_secs(5);
    let upstream = Sim::start(SimConfig::default().rpm(LimitSpec::per_minute(600).window(window)))?;
    let upstream_url = format!("{}/v1/chat/completions", upstream.base_url());

    // The server's way out: hyper-util's client behind the pacing layer.
    let limiter = ratebucket_tokio::limiter_for([Limit::per(600, window)])?;
    let paced = PaceLayer::new(limiter, FetchConfig::default())
        .layer(Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>());

    let app = axum::Router::new()
        .route(
            "/ask",
            post(|State((paced, url)): State<(_, String)>, body: Bytes| async move {
                let request =
                    http::Request::post(url.as_str()).body(Full::new(body)).expect("valid");
                let paced: ratebucket_http::tower::Paced<_> = paced;
                match paced.oneshot(request).await {
                    Ok(response) => {
                        let status =
                            StatusCode::from_u16(response.status().as_u16()).expect("status");
                        let body = response
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes())
                            .unwrap_or_default();
                        (status, body)
                    }
                    Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Bytes::from(e.to_string())),
                }
            }),
        )
        .with_state((paced, upstream_url));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // 150 clients at once.
    let start = Instant::now();
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let calls: Vec<_> = (0..150)
        .map(|i| {
            let client = client.clone();
            let body =
                format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi {i}"}}]}}"#);
            let request = http::Request::post(format!("http://{addr}/ask"))
                .body(Full::new(Bytes::from(body)));
            tokio::spawn(async move {
                client.request(request.expect("valid")).await.map(|r| r.status())
            })
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        if call.await?.is_ok_and(|s| s.is_success()) {
            ok += 1;
        }
    }
    let throttled = upstream.log().iter().filter(|e| e.status == Some(429)).count();
    println!(
        "{ok} of 150 answered through the axum server in {:.1} s; the upstream answered {throttled} 429s",
        start.elapsed().as_secs_f64()
    );
    server.abort();
    assert_eq!(ok, 150);
    Ok(())
}

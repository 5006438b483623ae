//! Puts ratebucket in front of an HTTP stack of your own by implementing `Transport`.
//!
//! Here the "existing stack" is a bare hyper connection per request with an
//! authorisation header added on the way out; reqwest, a tower service or a pooled
//! hyper client plug in the same way. Run with
//! `cargo run -p ratebucket-http --example custom_transport`.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::rt::TokioIo;
use ratebucket_http::{FetchConfig, Fetcher, SendFuture, Transport, TransportError, box_body};
use ratebucket_sim::{LimitSpec, Sim, SimConfig};
use ratebucket_tokio::core::{Instant, TokenBucket};

/// An HTTP stack the application already had: adds its credentials to every request.
struct MyStack {
    api_key: String,
}

impl Transport for MyStack {
    fn send(&self, mut request: Request<Bytes>) -> SendFuture<'_> {
        Box::pin(async move {
            let authority =
                request.uri().authority().cloned().ok_or_else(|| {
                    TransportError::new(std::io::Error::other("no host in the URI"))
                })?;
            let bearer = format!("Bearer {}", self.api_key);
            let headers = request.headers_mut();
            headers
                .insert(http::header::AUTHORIZATION, bearer.parse().map_err(TransportError::new)?);
            headers.insert(
                http::header::HOST,
                authority.as_str().parse().map_err(TransportError::new)?,
            );
            let port = authority.port_u16().unwrap_or(80);
            let stream = tokio::net::TcpStream::connect((authority.host(), port))
                .await
                .map_err(TransportError::new)?;
            let (mut sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(TransportError::new)?;
            tokio::spawn(connection);
            let response = sender
                .send_request(request.map(Full::new))
                .await
                // `TransportError::new` tells a refused connect (retryable) from a reset
                // after send (ambiguous) by walking the error's sources.
                .map_err(TransportError::new)?;
            Ok(response.map(box_body))
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let sim = Sim::start(SimConfig::default().api_key("sk-local").rpm(LimitSpec::per_minute(600)))?;
    let limiter = ratebucket_tokio::limiter(vec![TokenBucket::per_minute(600, Instant::ZERO)?])?;
    let stack = MyStack { api_key: "sk-local".to_owned() };
    let fetcher =
        Fetcher::new(stack, limiter, FetchConfig::default().read_timeout(Duration::from_secs(5)));
    let request = Request::post(format!("{}/v1/chat/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(Bytes::from_static(br#"{"messages":[{"role":"user","content":"hello"}]}"#))?;
    let fetched = fetcher.fetch(request).await?;
    println!(
        "{} after {} attempt(s); the provider reports {:?}",
        fetched.response.status(),
        fetched.attempts,
        fetched.response.headers().get("x-ratelimit-remaining-requests")
    );
    Ok(())
}

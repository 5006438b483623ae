//! Calls cancelled mid-flight, on both built-in transports: one cancelled while its
//! connection is still being made never left and is returned to the limiter; one cancelled
//! after its request was written stays charged as reserved (the provider may count it).

use std::future::Future;
use std::io::Read;
use std::net::TcpListener;
use std::time::Duration;

use bytes::Bytes;
use ratebucket_http::{FetchConfig, Fetcher, HyperTransport, SmolTransport, Transport};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{MAX_LIMIT, Rate, TokenBucket};

/// What a call meets at the silent server.
#[derive(Clone, Copy)]
enum Silent {
    /// A TLS handshake that never completes (the request cannot leave).
    Handshake,
    /// A request written, never answered.
    Answer,
}

/// A server on 127.0.0.1 that accepts one connection and stays silent on it; the channel
/// says when the client has written to it. It lets go of the connection after 10 s.
fn silent_server() -> (u16, smol::channel::Receiver<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    let (wrote, written) = smol::channel::bounded(1);
    std::thread::spawn(move || {
        let Ok((mut stream, _)) = listener.accept() else {
            return;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let mut first = [0u8; 64];
        if matches!(stream.read(&mut first), Ok(n) if n > 0) {
            let _ = wrote.try_send(());
        }
        // Held open and unanswered until the client closes it or 10 s pass.
        let mut rest = [0u8; 4096];
        while matches!(stream.read(&mut rest), Ok(n) if n > 0) {}
    });
    (port, written)
}

/// One dimension of 10 that never refills during a test.
fn frozen() -> TokenBucket {
    let slow = Rate::new(1, Duration::from_nanos(MAX_LIMIT)).expect("rate");
    TokenBucket::new(slow, 10, ratebucket_rt::core::Instant::ZERO).expect("bucket")
}

fn level(limiter: &Limiter) -> f64 {
    limiter.dimension(0).expect("dimension 0").state.level
}

fn post(url: String) -> http::Request<Bytes> {
    http::Request::post(url)
        .header("content-type", "application/json")
        .body(Bytes::from_static(b"{\"model\":\"m\",\"messages\":[]}"))
        .expect("request")
}

/// Where the call is sent to meet the server `kind` (TLS for a handshake that stalls).
fn url(kind: Silent, port: u16) -> String {
    match kind {
        Silent::Handshake => format!("https://127.0.0.1:{port}/v1/chat/completions"),
        Silent::Answer => format!("http://127.0.0.1:{port}/v1/chat/completions"),
    }
}

/// Starts one call (cost 1) against a silent server, cancels it once the client has
/// written to the server (a TLS hello, or the request), and returns the level left.
async fn cancel_midway<T: Transport>(kind: Silent, transport: T, limiter: Limiter) -> f64 {
    let (port, written) = silent_server();
    let fetcher = Fetcher::new(transport, limiter.clone(), FetchConfig::default());
    let call = fetcher.fetch(post(url(kind, port)));
    let cancelled = cancelled_when(call, async {
        written.recv().await.expect("the client writes to the server");
    })
    .await;
    assert!(cancelled, "the call ended by itself, but the server never answers");
    level(&limiter)
}

/// Runs `call` until `cancel` completes; `true` if `call` was dropped unfinished.
async fn cancelled_when(call: impl Future, cancel: impl Future<Output = ()>) -> bool {
    use smol::future::FutureExt;
    let call = async {
        call.await;
        false
    };
    let cancel = async {
        cancel.await;
        true
    };
    call.or(cancel).await
}

#[tokio::test]
async fn hyper_a_call_cancelled_while_its_connection_is_made_is_returned() {
    let limiter = ratebucket_tokio::limiter(vec![frozen()]).expect("limiter");
    let transport = HyperTransport::new(Duration::from_secs(5));
    let left = cancel_midway(Silent::Handshake, transport, limiter).await;
    assert!((left - 10.0).abs() < 1e-6, "level {left}: charged, never sent");
}

#[tokio::test]
async fn hyper_a_call_cancelled_after_its_request_left_stays_charged() {
    let limiter = ratebucket_tokio::limiter(vec![frozen()]).expect("limiter");
    let transport = HyperTransport::new(Duration::from_secs(5));
    let left = cancel_midway(Silent::Answer, transport, limiter).await;
    assert!((left - 9.0).abs() < 1e-6, "level {left}: a sent request was returned");
}

#[test]
fn smol_a_call_cancelled_while_its_connection_is_made_is_returned() {
    smol::block_on(async {
        let limiter = ratebucket_smol::limiter(vec![frozen()]).expect("limiter");
        let transport = SmolTransport::new(Duration::from_secs(5));
        let left = cancel_midway(Silent::Handshake, transport, limiter).await;
        assert!((left - 10.0).abs() < 1e-6, "level {left}: charged, never sent");
    });
}

#[test]
fn smol_a_call_cancelled_after_its_request_left_stays_charged() {
    smol::block_on(async {
        let limiter = ratebucket_smol::limiter(vec![frozen()]).expect("limiter");
        let transport = SmolTransport::new(Duration::from_secs(5));
        let left = cancel_midway(Silent::Answer, transport, limiter).await;
        assert!((left - 9.0).abs() < 1e-6, "level {left}: a sent request was returned");
    });
}

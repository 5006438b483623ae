//! `complete()` and `stream()` over HTTPS against the fake provider, on tokio and on smol,
//! over HTTP/1.1 and HTTP/2, with a certificate made when the test runs.

use std::sync::Arc;
use std::time::Duration;

use futures_lite::StreamExt;
use ratebucket_http::tls::{CertificateDer, trusting};
use ratebucket_http::{HyperTransport, SmolTransport, Transport};
use ratebucket_openai::{
    Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig, OpenAiError,
};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::Instant;
use ratebucket_sim::tls::{Alpn, TestCertificate};
use ratebucket_sim::{Sim, SimConfig, SimHandle};

fn limits() -> Limits {
    Limits::per_minute(6_000, 600_000)
}

fn prompt(i: usize) -> ChatRequest {
    ChatRequest::new("gpt-4o-mini", vec![Message::user(format!("Say hello {i}."))]).max_tokens(40)
}

fn tls_sim(cert: &TestCertificate, alpn: Alpn) -> SimHandle {
    let config = cert.server_config(alpn).expect("server config");
    Sim::start_tls(SimConfig::default(), Arc::clone(&config)).expect("sim starts")
}

fn config(sim: &SimHandle) -> OpenAiConfig {
    assert!(sim.base_url().starts_with("https://"), "{}", sim.base_url());
    OpenAiConfig::new(Endpoint::OpenAi(sim.base_url()), Auth::Bearer("sk-test".into()))
}

/// Ten completions and ten streams, all of which must succeed and be answered over the
/// protocol ALPN picked.
async fn exercise<T: Transport>(client: Client<T>, sim: &SimHandle, http2: bool) {
    let mut calls = Vec::new();
    for i in 0..10 {
        let client = client.clone();
        calls.push(async move { client.complete(prompt(i)).await });
    }
    for call in calls {
        let completion = call.await.expect("completes over TLS");
        assert!(completion.completion.usage.is_some());
    }
    for i in 0..10 {
        let mut stream = client.stream(prompt(100 + i)).await.expect("opens over TLS");
        let mut chunks = 0;
        while let Some(chunk) = stream.next().await {
            chunk.expect("a chunk");
            chunks += 1;
        }
        assert!(chunks > 0);
        assert!(stream.usage().is_some(), "the usage chunk arrived");
    }
    let log = sim.log();
    assert_eq!(log.len(), 20, "each call sent once");
    // (A stream's entry is finished by the server after the client saw its end, so the
    // status of the last one may not be written yet: admission is what is checked.)
    assert!(
        log.iter().all(|e| e.admitted && e.refusal.is_none() && e.http2 == http2),
        "every request admitted over {}: {:?}",
        if http2 { "HTTP/2" } else { "HTTP/1.1" },
        log.iter().filter(|e| !e.admitted || e.http2 != http2).collect::<Vec<_>>()
    );
}

fn tokio_client(sim: &SimHandle, root: CertificateDer<'static>) -> Client<HyperTransport> {
    let limiter: Limiter =
        ratebucket_tokio::limiter(limits().buckets(Instant::ZERO).expect("limits"))
            .expect("limiter");
    let transport =
        HyperTransport::with_tls(Duration::from_secs(5), trusting([root]).expect("tls config"));
    Client::new(transport, limiter, limits(), config(sim))
}

fn smol_client(sim: &SimHandle, root: CertificateDer<'static>) -> Client<SmolTransport> {
    smol_client_on(sim, smol_transport(root))
}

fn smol_transport(root: CertificateDer<'static>) -> SmolTransport {
    SmolTransport::with_tls(Duration::from_secs(5), trusting([root]).expect("tls config"))
}

fn smol_client_on(sim: &SimHandle, transport: SmolTransport) -> Client<SmolTransport> {
    let limiter: Limiter =
        ratebucket_smol::limiter(limits().buckets(Instant::ZERO).expect("limits"))
            .expect("limiter");
    Client::new(transport, limiter, limits(), config(sim))
}

#[tokio::test]
async fn tokio_speaks_https_over_http2() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = tls_sim(&cert, Alpn::H2AndHttp11);
    exercise(tokio_client(&sim, cert.der()), &sim, true).await;
}

#[tokio::test]
async fn tokio_speaks_https_over_http1() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = tls_sim(&cert, Alpn::Http11);
    exercise(tokio_client(&sim, cert.der()), &sim, false).await;
}

#[test]
fn smol_speaks_https_over_http2() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = tls_sim(&cert, Alpn::H2AndHttp11);
    smol::block_on(exercise(smol_client(&sim, cert.der()), &sim, true));
}

#[test]
fn smol_speaks_https_over_http1_and_reuses_its_connections() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = tls_sim(&cert, Alpn::Http11);
    let transport = smol_transport(cert.der());
    let client = smol_client_on(&sim, transport.clone());
    smol::block_on(async {
        exercise(client.clone(), &sim, false).await;
        // One call at a time, each once the last one's connection is back in the pool:
        // after the first, none of them opens a connection.
        client.complete(prompt(200)).await.expect("completes");
        let before = sim.connections();
        for i in 1..6 {
            idle_connection(&transport).await;
            client.complete(prompt(200 + i)).await.expect("completes");
        }
        assert_eq!(sim.connections(), before, "the idle connection was reused");
    });
}

/// Waits (bounded) until the transport holds an idle connection: it goes back to the pool
/// on a task of its own once its response has been read.
async fn idle_connection(transport: &SmolTransport) {
    for _ in 0..5_000 {
        if transport.idle_connections() > 0 {
            return;
        }
        smol::Timer::after(Duration::from_millis(1)).await;
    }
    panic!("no connection went back to the pool within 5 s");
}

#[tokio::test]
async fn an_untrusted_certificate_fails_the_handshake_and_sends_nothing() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = tls_sim(&cert, Alpn::H2AndHttp11);
    // Trusts a different certificate than the one the server presents.
    let other = TestCertificate::generate().expect("certificate");
    let mut client = tokio_client(&sim, other.der());
    let mut retry = ratebucket_rt::core::RetryPolicy::default().with_max_retries(0);
    retry.base_backoff = Duration::from_millis(1);
    client = Client::new(
        HyperTransport::with_tls(
            Duration::from_secs(5),
            trusting([other.der()]).expect("tls config"),
        ),
        client.limiter().clone(),
        limits(),
        config(&sim).fetch(ratebucket_http::FetchConfig::default().retry(retry)),
    );
    let error = client.complete(prompt(0)).await.expect_err("untrusted");
    assert!(matches!(error, OpenAiError::Fetch(_)), "a transport failure: {error}");
    assert!(sim.log().is_empty(), "no request reached the server");
}

/// A private CA in one builder call, the defaults kept (the limiter it makes, the
/// first request alone); without it, the refusal is a configuration error naming the fix.
#[tokio::test]
async fn the_builder_trusts_a_private_ca_in_one_call() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = tls_sim(&cert, Alpn::H2AndHttp11);
    let builder =
        || Client::builder(Endpoint::OpenAi(sim.base_url())).api_key("sk-test").limits(limits());
    let untrusting = builder().build().expect("builds");
    let error =
        untrusting.complete(prompt(0)).await.expect_err("the default roots do not know a test CA");
    let message = error.to_string();
    assert!(message.contains("trust its CA"), "{message}");
    assert!(sim.log().is_empty(), "nothing reached the provider");

    let trusting = builder().trust_pem(cert.pem()).build().expect("builds");
    let completion = trusting.complete(prompt(1)).await.expect("trusted");
    assert!(completion.completion.usage.is_some());

    let broken = builder().trust_pem("no certificate here").build();
    assert!(
        matches!(&broken, Err(OpenAiError::Config(m)) if m.contains("no CERTIFICATE")),
        "{broken:?}"
    );
}

//! Certificates: a private CA trusted in one call beside the default roots, and every
//! certificate the client refuses a configuration error that names its cause and its fix,
//! sent once and never retried. Certificates are made when the tests run.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ratebucket_http::tls::{self, TlsError};
use ratebucket_http::{FetchConfig, FetchError, Fetcher, HyperTransport, Problem};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{Rate, TokenBucket};
use ratebucket_sim::tls::{Alpn, TestCertificate};
use ratebucket_sim::{Sim, SimConfig, SimHandle};

fn limiter() -> Limiter {
    let rate = Rate::per_second(1_000).expect("rate");
    let bucket = TokenBucket::new(rate, 1_000, ratebucket_rt::core::Instant::ZERO).expect("bucket");
    ratebucket_tokio::limiter(vec![bucket]).expect("limiter")
}

fn serving(cert: &TestCertificate) -> SimHandle {
    let config = cert.server_config(Alpn::H2AndHttp11).expect("server config");
    Sim::start_tls(SimConfig::default(), Arc::clone(&config)).expect("sim starts")
}

fn request(sim: &SimHandle) -> http::Request<Bytes> {
    let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    http::Request::post(format!("{}/v1/chat/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(Bytes::from_static(body.as_bytes()))
        .expect("request")
}

async fn fetch(transport: HyperTransport, sim: &SimHandle) -> Result<u16, FetchError> {
    let fetcher = Fetcher::new(transport, limiter(), FetchConfig::default());
    let fetched = fetcher.fetch(request(sim)).await?;
    Ok(fetched.response.status().as_u16())
}

fn trusting(cert: &TestCertificate) -> HyperTransport {
    let config = tls::adding_pem(cert.pem().as_bytes()).expect("the PEM is read");
    HyperTransport::with_tls(Duration::from_secs(5), config)
}

/// The refusal's contract: a configuration error after one attempt, one line naming the
/// cause and the fix, and nothing reached the provider.
fn assert_refused(error: &FetchError, sim: &SimHandle, names: &str, cause: &str) {
    let message = error.to_string();
    assert_eq!(error.problem(), Problem::Config, "{message}");
    assert_eq!(error.attempts(), 1, "no retry fixes a certificate: {message}");
    assert!(message.contains(names), "{message}");
    assert!(message.contains(cause), "{message}");
    assert!(!message.contains('\n'), "one line: {message}");
    assert!(sim.log().is_empty(), "nothing reached the provider");
}

#[tokio::test]
async fn an_unknown_issuer_is_a_configuration_error_not_an_outage() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = serving(&cert);
    let error = fetch(HyperTransport::default(), &sim)
        .await
        .expect_err("the bundled roots do not know a test CA");
    assert_refused(&error, &sim, "trust its CA", "UnknownIssuer");
}

#[tokio::test]
async fn a_private_ca_is_trusted_beside_the_default_roots_from_a_pem_file() {
    let cert = TestCertificate::generate().expect("certificate");
    let sim = serving(&cert);
    let dir = tempfile::Builder::new().prefix("ratebucket-ca-").tempdir().expect("dir");
    let file = dir.path().join("ca.pem");
    std::fs::write(&file, cert.pem()).expect("pem written");
    let config = tls::adding_pem_file(&file).expect("the file is read");
    let transport = HyperTransport::with_tls(Duration::from_secs(5), config);
    assert_eq!(fetch(transport, &sim).await.expect("trusted"), 200);
    assert_eq!(sim.log().len(), 1);
}

#[tokio::test]
async fn an_expired_certificate_is_named_as_such() {
    let cert = TestCertificate::generate_for(&["localhost", "127.0.0.1"], true).expect("cert");
    let sim = serving(&cert);
    let error = fetch(trusting(&cert), &sim).await.expect_err("expired");
    assert_refused(&error, &sim, "validity period", "Expired");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_named_as_such() {
    let cert = TestCertificate::generate_for(&["example.invalid"], false).expect("cert");
    let sim = serving(&cert);
    let error = fetch(trusting(&cert), &sim).await.expect_err("wrong name");
    assert_refused(&error, &sim, "for another name", "NotValidForName");
}

#[test]
fn a_file_without_a_certificate_is_refused_with_its_name() {
    assert!(matches!(tls::adding_pem(b"not a certificate"), Err(TlsError::Pem(_))));
    let missing = tls::adding_pem_file("/nonexistent/ca.pem").expect_err("no such file");
    assert!(missing.to_string().contains("/nonexistent/ca.pem"), "{missing}");
}

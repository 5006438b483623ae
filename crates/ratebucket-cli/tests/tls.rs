//! `--ca-cert`: a provider behind a private CA is reached with its certificate trusted,
//! and refused with the fix named, before anything is sent, without it.

mod support;

use std::sync::Arc;

use ratebucket_sim::tls::{Alpn, TestCertificate};
use ratebucket_sim::{Sim, SimConfig};
use support::{records, spawn, temp_dir, write_input};

const LINES: usize = 5;
const ARGS: &[&str] = &["--rpm", "1000", "--tpm", "10000000", "--window", "1"];

#[test]
fn a_private_ca_is_trusted_with_ca_cert_and_named_without_it() {
    let cert = TestCertificate::generate().expect("certificate");
    let config = cert.server_config(Alpn::H2AndHttp11).expect("server config");
    let sim = Sim::start_tls(SimConfig::default(), Arc::clone(&config)).expect("sim starts");
    let dir = temp_dir("tls");
    let input = write_input(&dir, LINES);
    let output = dir.join("output.jsonl");

    let refused = spawn(&input, &output, &sim.base_url(), ARGS).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("trust its CA"), "{stderr}");
    assert!(stderr.contains("--ca-cert"), "{stderr}");
    assert!(sim.log().is_empty(), "nothing was sent");
    assert!(records(&output).is_empty());

    let ca = dir.join("ca.pem");
    std::fs::write(&ca, cert.pem()).expect("pem written");
    let ca = ca.to_string_lossy().into_owned();
    let mut args = ARGS.to_vec();
    args.extend(["--ca-cert", &ca]);
    let trusted = spawn(&input, &output, &sim.base_url(), &args).wait_with_output().expect("runs");
    let stderr = String::from_utf8_lossy(&trusted.stderr);
    assert_eq!(trusted.status.code(), Some(0), "{stderr}");
    assert_eq!(records(&output).len(), LINES);
}

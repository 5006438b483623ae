//! Certificates made at run time, so the fake provider can speak HTTPS without a file.

use std::io;
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

pub use rustls;

/// Which application protocols a TLS server offers through ALPN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alpn {
    /// `h2` first, then `http/1.1`: a client that speaks HTTP/2 gets it.
    H2AndHttp11,
    /// Only `http/1.1`.
    Http11,
}

/// A self-signed certificate for `localhost` and `127.0.0.1`, made when called, and its
/// key. Trust [`TestCertificate::der`] on the client side.
#[derive(Debug)]
pub struct TestCertificate {
    cert: CertificateDer<'static>,
    pem: String,
    key: PrivatePkcs8KeyDer<'static>,
    key_pem: String,
}

impl TestCertificate {
    /// Generates a fresh key and certificate.
    pub fn generate() -> io::Result<TestCertificate> {
        TestCertificate::generate_for(&["localhost", "127.0.0.1"], false)
    }

    /// Generates a fresh key and a certificate for `names` (DNS names or IP addresses),
    /// valid now, or one that expired in 2001 when `expired`: for the failures a client
    /// must name (a certificate for another host, an expired one).
    pub fn generate_for(names: &[&str], expired: bool) -> io::Result<TestCertificate> {
        let names: Vec<String> = names.iter().map(|&n| n.to_owned()).collect();
        let mut params = rcgen::CertificateParams::new(names).map_err(io::Error::other)?;
        if expired {
            params.not_before = rcgen::date_time_ymd(2000, 1, 1);
            params.not_after = rcgen::date_time_ymd(2001, 1, 1);
        }
        let key = rcgen::KeyPair::generate().map_err(io::Error::other)?;
        let cert = params.self_signed(&key).map_err(io::Error::other)?;
        Ok(TestCertificate {
            cert: cert.der().clone(),
            pem: cert.pem(),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            key_pem: key.serialize_pem(),
        })
    }

    /// The certificate, PEM-encoded (what a `--ca-cert` file holds).
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// The private key, PEM-encoded (PKCS #8), for a server that reads it from a file.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The certificate, DER-encoded: the one root a client must trust.
    pub fn der(&self) -> CertificateDer<'static> {
        self.cert.clone()
    }

    /// A server configuration presenting this certificate and offering `alpn`.
    pub fn server_config(&self, alpn: Alpn) -> io::Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_no_client_auth()
            .with_single_cert(vec![self.cert.clone()], PrivateKeyDer::Pkcs8(self.key.clone_key()))
            .map_err(io::Error::other)?;
        config.alpn_protocols = match alpn {
            Alpn::H2AndHttp11 => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            Alpn::Http11 => vec![b"http/1.1".to_vec()],
        };
        Ok(Arc::new(config))
    }
}

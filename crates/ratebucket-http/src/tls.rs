//! TLS settings both built-in transports share: rustls on the ring provider, trusting the
//! bundled WebPKI roots (or the system's store with `native-roots`).
//!
//! Each transport sets its own ALPN protocols (`h2` and `http/1.1`), so a configuration
//! made here needs nothing more.
//!
//! **A private CA** (a self-hosted server, a company's TLS proxy) is trusted in one call,
//! beside the default roots: [`adding_pem_file`] (or [`adding_pem`] for bytes), handed to
//! `HyperTransport::with_tls` / `SmolTransport::with_tls`. The OpenAI client's builder
//! takes the same file (`ClientBuilder::trust_pem_file`), and `ratebucket batch` takes
//! `--ca-cert FILE`. Alternatively, the `native-roots` feature trusts the operating
//! system's store instead of the bundled roots; it honours `SSL_CERT_FILE` and
//! `SSL_CERT_DIR`, so a CA added to the system (or named by those variables) is trusted.
//!
//! A certificate the client refuses (an unknown issuer, an expired certificate, one for
//! another name) is a configuration error, not a network failure: it is not retried, and
//! the error names the cause and the fix.
//!
//! ```
//! # fn main() -> Result<(), ratebucket_http::tls::TlsError> {
//! // Trust one private root (a company CA, or a certificate made for a test) and nothing else.
//! # let der: ratebucket_http::tls::CertificateDer<'static> = vec![].into();
//! let config = ratebucket_http::tls::trusting([der]);
//! # let _ = config;
//! # Ok(()) }
//! ```

use std::error::Error as StdError;
use std::fmt;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;

pub use rustls;
pub use rustls_pki_types::CertificateDer;

/// Why a TLS client configuration could not be made.
#[derive(Debug)]
#[non_exhaustive]
pub enum TlsError {
    /// rustls refused the settings.
    Rustls(rustls::Error),
    /// The system's certificate store could not be read, or held no usable root.
    NativeRoots(String),
    /// A certificate given to trust was not a valid root.
    BadRoot(String),
    /// A PEM file of roots could not be read, or held no certificate.
    Pem(String),
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Rustls(e) => write!(f, "TLS settings refused: {e}"),
            TlsError::NativeRoots(e) => {
                write!(f, "cannot load the system's root certificates: {e}")
            }
            TlsError::BadRoot(e) => write!(f, "not a usable root certificate: {e}"),
            TlsError::Pem(e) => write!(f, "cannot read the certificates to trust: {e}"),
        }
    }
}

impl std::error::Error for TlsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TlsError::Rustls(e) => Some(e),
            _ => None,
        }
    }
}

/// The default client configuration: the WebPKI roots bundled with the crate, or, with the
/// `native-roots` feature, the operating system's store.
pub fn default_config() -> Result<rustls::ClientConfig, TlsError> {
    with_roots(default_roots()?)
}

/// A client configuration trusting exactly `roots` (a private CA, a test certificate).
pub fn trusting(
    roots: impl IntoIterator<Item = CertificateDer<'static>>,
) -> Result<rustls::ClientConfig, TlsError> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root).map_err(|e| TlsError::BadRoot(e.to_string()))?;
    }
    with_roots(store)
}

/// The default roots ([`default_config`]) and every certificate in `pem` (one or more
/// `-----BEGIN CERTIFICATE-----` blocks): a private CA trusted beside the public ones.
pub fn adding_pem(pem: &[u8]) -> Result<rustls::ClientConfig, TlsError> {
    let mut store = default_roots()?;
    let mut added = 0;
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| TlsError::Pem(e.to_string()))?;
        store.add(cert).map_err(|e| TlsError::BadRoot(e.to_string()))?;
        added += 1;
    }
    if added == 0 {
        return Err(TlsError::Pem("no CERTIFICATE block found".into()));
    }
    with_roots(store)
}

/// [`adding_pem`] with the certificates read from the PEM file at `path`.
pub fn adding_pem_file(path: impl AsRef<Path>) -> Result<rustls::ClientConfig, TlsError> {
    let path = path.as_ref();
    let pem = std::fs::read(path).map_err(|e| TlsError::Pem(format!("{}: {e}", path.display())))?;
    adding_pem(&pem).map_err(|e| match e {
        TlsError::Pem(why) => TlsError::Pem(format!("{}: {why}", path.display())),
        other => other,
    })
}

/// The certificate problem behind a failed connection, if that is what it was: one line
/// naming the cause and the fix, for a configuration error.
pub(crate) fn certificate_problem(error: &(dyn StdError + 'static)) -> Option<String> {
    use rustls::CertificateError as C;
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = current {
        if let Some(rustls::Error::InvalidCertificate(cause)) = e.downcast_ref::<rustls::Error>() {
            let fix = match cause {
                C::UnknownIssuer | C::BadSignature => {
                    "the server's certificate is not issued by a trusted root: trust its CA (a PEM file: tls::adding_pem_file, ClientBuilder::trust_pem_file, `ratebucket batch --ca-cert`; or the system's store with the native-roots feature)"
                }
                C::Expired
                | C::ExpiredContext { .. }
                | C::NotValidYet
                | C::NotValidYetContext { .. } => {
                    "the server's certificate is outside its validity period: renew it, or check this machine's clock"
                }
                C::NotValidForName | C::NotValidForNameContext { .. } => {
                    "the server's certificate is for another name: check the host in the URL"
                }
                _ => "the server's certificate was refused: check the URL and the roots trusted",
            };
            return Some(format!("{fix} (TLS: {cause:?})"));
        }
        // An io::Error hides the error it wraps from `source()` (it answers with that
        // error's own source): step into it instead.
        current = match e.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => e.source(),
        };
    }
    None
}

fn with_roots(roots: rustls::RootCertStore) -> Result<rustls::ClientConfig, TlsError> {
    // An explicit provider: the process-wide default may be unset, or be another crate's.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

#[cfg(not(feature = "native-roots"))]
fn default_roots() -> Result<rustls::RootCertStore, TlsError> {
    Ok(rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() })
}

#[cfg(feature = "native-roots")]
fn default_roots() -> Result<rustls::RootCertStore, TlsError> {
    let loaded = rustls_native_certs::load_native_certs();
    let mut store = rustls::RootCertStore::empty();
    let (added, _ignored) = store.add_parsable_certificates(loaded.certs);
    if added == 0 {
        let why = loaded
            .errors
            .first()
            .map_or_else(|| "no certificates found".to_owned(), ToString::to_string);
        return Err(TlsError::NativeRoots(why));
    }
    Ok(store)
}

/// `config` with the ALPN protocols a transport speaks: `h2` first when it can, then
/// `http/1.1`.
#[cfg(feature = "smol")]
pub(crate) fn with_alpn(mut config: rustls::ClientConfig, h2: bool) -> rustls::ClientConfig {
    config.alpn_protocols =
        if h2 { vec![b"h2".to_vec(), b"http/1.1".to_vec()] } else { vec![b"http/1.1".to_vec()] };
    config
}

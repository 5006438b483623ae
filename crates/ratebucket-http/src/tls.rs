//! TLS settings both built-in transports share: rustls on the ring provider, trusting the
//! bundled WebPKI roots (or the system's store with `native-roots`).
//!
//! Each transport sets its own ALPN protocols (`h2` and `http/1.1`), so a configuration
//! made here needs nothing more.
//!
//! ```
//! # fn main() -> Result<(), ratebucket_http::tls::TlsError> {
//! // Trust one private root (a company CA, or a certificate made for a test) and nothing else.
//! # let der: ratebucket_http::tls::CertificateDer<'static> = vec![].into();
//! let config = ratebucket_http::tls::trusting([der]);
//! # let _ = config;
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

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
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TlsError::Rustls(e) => write!(f, "TLS settings refused: {e}"),
            TlsError::NativeRoots(e) => {
                write!(f, "cannot load the system's root certificates: {e}")
            }
            TlsError::BadRoot(e) => write!(f, "not a usable root certificate: {e}"),
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
        store
            .add(root)
            .map_err(|e| TlsError::BadRoot(e.to_string()))?;
    }
    with_roots(store)
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
    Ok(rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    })
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
    config.alpn_protocols = if h2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    config
}

//! How requests reach the server: a small trait any HTTP stack can implement, and
//! ready-made transports on hyper-util (tokio) and on smol, both speaking HTTPS.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use ratebucket_rt::core::FailureKind;

use crate::failure::failure_kind;

/// A boxed error, as transports report them.
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A response body as transports hand it over.
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// The future a [`Transport`] returns.
pub type SendFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, TransportError>> + Send + 'a>>;

/// Sends one request and returns the response head with its (unread) body.
///
/// Implement it to put ratebucket in front of any HTTP stack: an existing hyper client,
/// reqwest, a tower service. Map failures with [`TransportError::new`], which classifies
/// them, or say what happened with [`TransportError::with_kind`].
pub trait Transport: Send + Sync + 'static {
    /// Sends `request`.
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_>;

    /// Sends `request`, calling [`Departure::leave`] the moment its bytes may reach the
    /// wire (once its connection is made), and not writing it if that returns `false` (the
    /// call was cancelled first). The fetcher sends through this method: a call cancelled
    /// before its request left is then returned to the limiter instead of charged.
    ///
    /// The default says the request leaves as it is handed to [`Transport::send`], so a
    /// transport that does not override it has every cancelled call charged once sent.
    fn send_departing(&self, request: Request<Bytes>, departure: Departure) -> SendFuture<'_> {
        departure.leave();
        self.send(request)
    }

    /// Whether this transport can send to `uri` at all, checked once per fetch before
    /// anything is reserved or sent: a reason it cannot (`ftp://`, `https://` on a
    /// transport built without TLS) is a configuration error, not a network failure.
    ///
    /// The default accepts `http` and `https` URIs with a host.
    fn check(&self, uri: &http::Uri) -> Result<(), String> {
        check_scheme(uri, &["http", "https"])
    }
}

/// Accepts an absolute URI with a host whose scheme is one of `schemes`.
pub fn check_scheme(uri: &http::Uri, schemes: &[&str]) -> Result<(), String> {
    let Some(scheme) = uri.scheme_str() else {
        return Err(format!(
            "`{uri}` has no scheme: write {}://HOST/...",
            schemes.first().copied().unwrap_or("https")
        ));
    };
    let Some(authority) = uri.authority() else {
        return Err(format!("`{uri}` has no host"));
    };
    // `http::Uri` keeps a port as written; one beyond 65535 can never be connected to.
    // Read byte by byte: this runs once per call.
    let written = authority.as_str();
    let host_port = match written.bytes().rposition(|b| b == b'@') {
        Some(at) => &written[at + 1..],
        None => written,
    };
    if !host_port.ends_with(']')
        && let Some(colon) = host_port.bytes().rposition(|b| b == b':')
    {
        let port = &host_port[colon + 1..];
        if port.parse::<u16>().is_err() {
            return Err(format!("`{uri}`: port `{port}` is not a port (0 to 65535)"));
        }
    }
    if !schemes.iter().any(|s| s.eq_ignore_ascii_case(scheme)) {
        return Err(format!(
            "`{uri}`: this transport speaks {}, not `{scheme}`",
            schemes.join(" and ")
        ));
    }
    Ok(())
}

/// [`Transport::check`] for the built-in transports: `http`, and `https` with the `tls`
/// feature (saying which feature to enable when it is missing).
#[cfg(any(feature = "tokio", feature = "smol"))]
pub(crate) fn check_builtin(uri: &http::Uri) -> Result<(), String> {
    let schemes: &[&str] = if cfg!(feature = "tls") { &["http", "https"] } else { &["http"] };
    check_scheme(uri, schemes).map_err(|error| {
        if !cfg!(feature = "tls") && uri.scheme_str() == Some("https") {
            format!("{error} (enable ratebucket-http's `tls` feature for https)")
        } else {
            error
        }
    })
}

/// A failed send, with the kind of failure that decides whether it is retried.
#[derive(Debug)]
pub struct TransportError {
    kind: FailureKind,
    source: BoxError,
}

impl TransportError {
    /// Wraps `source`, classifying it with [`failure_kind`].
    pub fn new(source: impl Into<BoxError>) -> TransportError {
        let source = source.into();
        TransportError { kind: failure_kind(source.as_ref()), source }
    }

    /// Wraps `source` with an explicit kind.
    pub fn with_kind(kind: FailureKind, source: impl Into<BoxError>) -> TransportError {
        TransportError { kind, source: source.into() }
    }

    /// `with_kind` without the generic conversion, for use inside async blocks (where
    /// `Into<BoxError>` trips higher-ranked lifetime inference).
    pub(crate) fn boxed(kind: FailureKind, source: BoxError) -> TransportError {
        TransportError { kind, source }
    }

    /// What kind of failure it was.
    pub fn kind(&self) -> FailureKind {
        self.kind
    }
}

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.source)
    }
}

impl StdError for TransportError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(self.source.as_ref())
    }
}

/// Boxes any body whose errors convert into [`BoxError`].
pub fn box_body<B>(body: B) -> ResponseBody
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

mod departure;
pub use self::departure::{Departure, RequestBody};

#[cfg(feature = "tokio")]
mod hyper;
#[cfg(feature = "tokio")]
pub use self::hyper::HyperTransport;

#[cfg(feature = "smol")]
mod smol;
#[cfg(feature = "smol")]
pub use self::smol::SmolTransport;

#[cfg(feature = "reqwest")]
mod reqwest;
#[cfg(feature = "reqwest")]
pub use self::reqwest::{ReqwestTransport, reqwest_failure};

#[cfg(test)]
mod tests {
    use super::check_scheme;

    fn check(uri: &str) -> Result<(), String> {
        check_scheme(&uri.parse().expect("a URI"), &["http", "https"])
    }

    #[test]
    fn ports_are_read_after_the_user_and_outside_brackets() {
        for good in [
            "http://127.0.0.1:8080/",
            "HTTPS://example.com/v1",
            "http://user:pass@host:443/",
            "http://[::1]/",
            "http://[::1]:65535/",
            "http://us:er@[::1]/",
        ] {
            assert_eq!(check(good), Ok(()), "{good}");
        }
        for (bad, says) in [
            ("http://127.0.0.1:99999/", "99999"),
            ("http://user:1@host:70000/", "70000"),
            ("http://[::1]:65536/", "65536"),
            ("ftp://host/", "`ftp`"),
            ("/relative", "no scheme"),
        ] {
            let error = check(bad).expect_err(bad);
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}

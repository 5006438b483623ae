//! A transport over a `reqwest::Client` the application already has: its proxies, TLS
//! settings, connection pool and default headers all stay in force.

use bytes::Bytes;
use http::Request;
use ratebucket_rt::core::FailureKind;

use super::{SendFuture, Transport, TransportError, box_body};

/// Sends through a [`reqwest::Client`].
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let limiter: ratebucket_rt::Limiter = unimplemented!();
/// use ratebucket_http::{FetchConfig, Fetcher, ReqwestTransport};
///
/// let client = reqwest::Client::builder().build()?; // proxies, TLS, timeouts: yours
/// let fetcher = Fetcher::new(ReqwestTransport::new(client), limiter, FetchConfig::default());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug, Default)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    /// Sends through `client`.
    pub fn new(client: reqwest::Client) -> ReqwestTransport {
        ReqwestTransport { client }
    }

    /// The client it sends through.
    pub fn client(&self) -> &reqwest::Client {
        &self.client
    }
}

impl Transport for ReqwestTransport {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        Box::pin(async move {
            let request = reqwest::Request::try_from(request.map(reqwest::Body::from))
                .map_err(reqwest_failure)?;
            let response = self.client.execute(request).await.map_err(reqwest_failure)?;
            Ok(http::Response::from(response).map(box_body))
        })
    }
}

/// The failure kind of a reqwest error: a failed or timed-out connect never reached the
/// server; a timeout after that may have been executed; anything else is classified from
/// the hyper and I/O errors underneath, as for the other transports.
pub fn reqwest_failure(error: reqwest::Error) -> TransportError {
    if error.is_connect() {
        let kind = if error.is_timeout() {
            FailureKind::ConnectTimeout
        } else {
            FailureKind::ConnectRefused
        };
        return TransportError::with_kind(kind, error);
    }
    if error.is_timeout() {
        return TransportError::with_kind(FailureKind::ReadTimeout, error);
    }
    if error.is_body() || error.is_decode() {
        return TransportError::with_kind(FailureKind::BodyCut, error);
    }
    TransportError::new(error)
}

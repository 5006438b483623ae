//! How requests reach the server: a small trait any HTTP stack can implement, and
//! ready-made transports on hyper-util (tokio) and on smol.

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
        TransportError {
            kind: failure_kind(source.as_ref()),
            source,
        }
    }

    /// Wraps `source` with an explicit kind.
    pub fn with_kind(kind: FailureKind, source: impl Into<BoxError>) -> TransportError {
        TransportError {
            kind,
            source: source.into(),
        }
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

#[cfg(feature = "tokio")]
pub use hyper_transport::HyperTransport;

#[cfg(feature = "tokio")]
mod hyper_transport {
    use std::time::Duration;

    use bytes::Bytes;
    use http::Request;
    use http_body_util::Full;
    use hyper_util::client::legacy::Client;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;

    use super::{SendFuture, Transport, TransportError, box_body};

    /// The convenience transport: hyper-util's pooled HTTP/1 client on tokio.
    #[derive(Clone, Debug)]
    pub struct HyperTransport {
        client: Client<HttpConnector, Full<Bytes>>,
    }

    impl HyperTransport {
        /// A pooled client whose connection attempts give up after `connect_timeout`.
        pub fn new(connect_timeout: Duration) -> HyperTransport {
            let mut connector = HttpConnector::new();
            connector.set_connect_timeout(Some(connect_timeout));
            connector.set_nodelay(true);
            HyperTransport::with_client(Client::builder(TokioExecutor::new()).build(connector))
        }

        /// Wraps an existing hyper-util client.
        pub fn with_client(client: Client<HttpConnector, Full<Bytes>>) -> HyperTransport {
            HyperTransport { client }
        }
    }

    impl Default for HyperTransport {
        /// Connection attempts time out after ten seconds.
        fn default() -> HyperTransport {
            HyperTransport::new(Duration::from_secs(10))
        }
    }

    impl Transport for HyperTransport {
        fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
            let request = request.map(Full::new);
            Box::pin(async move {
                let response = self
                    .client
                    .request(request)
                    .await
                    .map_err(TransportError::new)?;
                Ok(response.map(box_body))
            })
        }
    }
}

#[cfg(feature = "smol")]
pub use smol_transport::SmolTransport;

#[cfg(feature = "smol")]
mod smol_transport {
    use http::Request;
    use http_body_util::Full;
    use smol_hyper::rt::FuturesIo;

    use super::{SendFuture, Transport, TransportError, box_body};

    /// A transport on smol: one HTTP/1 connection per request (no pooling), for code that
    /// runs without tokio.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct SmolTransport;

    impl Transport for SmolTransport {
        fn send(&self, request: Request<bytes::Bytes>) -> SendFuture<'_> {
            Box::pin(async move {
                let authority = request
                    .uri()
                    .authority()
                    .ok_or_else(|| {
                        TransportError::with_kind(
                            ratebucket_rt::core::FailureKind::ConnectRefused,
                            "request URI has no host",
                        )
                    })?
                    .clone();
                let port = authority.port_u16().unwrap_or(80);
                let stream = smol::net::TcpStream::connect((authority.host(), port))
                    .await
                    .map_err(TransportError::new)?;
                let _ = stream.set_nodelay(true);
                let (mut sender, connection) =
                    hyper::client::conn::http1::handshake(FuturesIo::new(stream))
                        .await
                        .map_err(TransportError::new)?;
                smol::spawn(async move {
                    let _ = connection.await;
                })
                .detach();
                // A bare connection: origin-form target and an explicit Host.
                let (mut parts, body) = request.into_parts();
                if !parts.headers.contains_key(http::header::HOST)
                    && let Ok(host) = http::HeaderValue::from_str(authority.as_str())
                {
                    parts.headers.insert(http::header::HOST, host);
                }
                if let Some(path) = parts.uri.path_and_query().cloned() {
                    parts.uri = path.into();
                }
                let request = Request::from_parts(parts, Full::new(body));
                let response = sender
                    .send_request(request)
                    .await
                    .map_err(TransportError::new)?;
                Ok(response.map(box_body))
            })
        }
    }
}

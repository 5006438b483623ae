//! The smol transport: hyper's connection API over async-io sockets, HTTPS through
//! futures-rustls with HTTP/2 chosen by ALPN, and a small pool of idle connections.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::{TrySendError, http1, http2};
use ratebucket_rt::core::FailureKind;
use smol_hyper::rt::FuturesIo;

use super::{Departure, SendFuture, Transport, TransportError, box_body, check_builtin};
use crate::body::copy_request;

/// Idle HTTP/1.1 connections kept per host.
const MAX_IDLE_PER_HOST: usize = 32;

/// A transport for code that runs on smol (or any executor, with smol's global one
/// driving the connections): no tokio anywhere.
///
/// HTTP/1.1 connections are kept for reuse once their response has been read; with the
/// `tls` feature (on by default) `https://` is spoken through rustls, and an HTTP/2
/// connection, when the server picks it by ALPN, is shared by all requests to that host.
/// Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct SmolTransport {
    inner: Arc<Inner>,
}

struct Inner {
    connect_timeout: Duration,
    #[cfg(feature = "tls")]
    tls: futures_rustls::TlsConnector,
    pool: Mutex<HashMap<Origin, Vec<Connection>>>,
}

/// Where a connection goes.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Origin {
    https: bool,
    host: String,
    port: u16,
}

/// A connection's sending half.
enum Connection {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl SmolTransport {
    /// A transport whose connection attempts give up after `connect_timeout`, trusting the
    /// default roots ([`tls::default_config`](crate::tls::default_config)).
    ///
    /// # Panics
    ///
    /// With the `native-roots` feature, when the system's store holds no usable root:
    /// use [`SmolTransport::with_tls`] to handle that case.
    pub fn new(connect_timeout: Duration) -> SmolTransport {
        #[cfg(feature = "tls")]
        {
            let config =
                crate::tls::default_config().unwrap_or_else(|e| panic!("ratebucket-http: {e}"));
            SmolTransport::with_tls(connect_timeout, config)
        }
        #[cfg(not(feature = "tls"))]
        {
            SmolTransport::build(connect_timeout)
        }
    }

    /// A transport with your own TLS settings; its ALPN protocols are replaced by `h2`
    /// and `http/1.1`.
    #[cfg(feature = "tls")]
    pub fn with_tls(
        connect_timeout: Duration,
        config: crate::tls::rustls::ClientConfig,
    ) -> SmolTransport {
        let config = crate::tls::with_alpn(config, true);
        SmolTransport {
            inner: Arc::new(Inner {
                connect_timeout,
                tls: futures_rustls::TlsConnector::from(Arc::new(config)),
                pool: Mutex::default(),
            }),
        }
    }

    #[cfg(not(feature = "tls"))]
    fn build(connect_timeout: Duration) -> SmolTransport {
        SmolTransport { inner: Arc::new(Inner { connect_timeout, pool: Mutex::default() }) }
    }

    /// Idle connections held for reuse, over all hosts (HTTP/2 connections count once).
    pub fn idle_connections(&self) -> usize {
        self.inner.pool().values().map(Vec::len).sum()
    }
}

impl Default for SmolTransport {
    /// Connection attempts time out after ten seconds.
    fn default() -> SmolTransport {
        SmolTransport::new(Duration::from_secs(10))
    }
}

impl std::fmt::Debug for SmolTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmolTransport")
            .field("connect_timeout", &self.inner.connect_timeout)
            .field("idle_connections", &self.idle_connections())
            .finish_non_exhaustive()
    }
}

impl Transport for SmolTransport {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        self.send_departing(request, Departure::new())
    }

    /// The request leaves as it is handed to a connection that is ready for it: a call
    /// cancelled while its connection is made (TCP, TLS) never left.
    fn send_departing(&self, request: Request<Bytes>, departure: Departure) -> SendFuture<'_> {
        Box::pin(async move {
            let origin = Origin::of(request.uri())?;
            // A pooled connection the server has since closed refuses the request before
            // writing any of it; hyper hands it back and a fresh connection takes it.
            while let Some(connection) = self.inner.take(&origin) {
                leave(&departure)?;
                match self.inner.send_on(&origin, connection, copy_request(&request)).await {
                    Ok(response) => return Ok(response.map(box_body)),
                    Err(mut refused) => {
                        if refused.take_message().is_none() {
                            return Err(TransportError::new(refused.into_error()));
                        }
                    }
                }
            }
            let connection = self.inner.connect(&origin).await?;
            leave(&departure)?;
            match self.inner.send_on(&origin, connection, request).await {
                Ok(response) => Ok(response.map(box_body)),
                Err(refused) => Err(TransportError::new(refused.into_error())),
            }
        })
    }

    fn check(&self, uri: &Uri) -> Result<(), String> {
        check_builtin(uri)
    }
}

/// Marks the request as leaving, on a connection ready for it; an error if the call was
/// withdrawn first (then nothing is written).
fn leave(departure: &Departure) -> Result<(), TransportError> {
    if departure.leave() {
        Ok(())
    } else {
        Err(TransportError::with_kind(
            FailureKind::ConnectRefused,
            "the call was cancelled before its request left",
        ))
    }
}

impl Origin {
    fn of(uri: &Uri) -> Result<Origin, TransportError> {
        let no_host =
            || TransportError::with_kind(FailureKind::ConnectRefused, "request URI has no host");
        let authority = uri.authority().ok_or_else(no_host)?;
        let https = uri.scheme_str() == Some("https");
        Ok(Origin {
            https,
            host: authority.host().to_owned(),
            port: authority.port_u16().unwrap_or(if https { 443 } else { 80 }),
        })
    }

    /// The value of a `Host` header for it (the port only when not the default).
    fn host_header(&self) -> String {
        let default = if self.https { 443 } else { 80 };
        if self.port == default {
            self.host.clone()
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

type Sent = Result<Response<Incoming>, TrySendError<Request<Full<Bytes>>>>;

impl Inner {
    fn pool(&self) -> std::sync::MutexGuard<'_, HashMap<Origin, Vec<Connection>>> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A live idle connection to `origin`: an HTTP/2 one is shared (it stays pooled), an
    /// HTTP/1.1 one is taken out until its response has been read.
    fn take(&self, origin: &Origin) -> Option<Connection> {
        let mut pool = self.pool();
        let idle = pool.get_mut(origin)?;
        idle.retain(|c| match c {
            Connection::H1(s) => !s.is_closed(),
            Connection::H2(s) => !s.is_closed(),
        });
        if let Some(Connection::H2(shared)) = idle.iter().find(|c| matches!(c, Connection::H2(_))) {
            return Some(Connection::H2(shared.clone()));
        }
        idle.pop()
    }

    /// Sends on `connection`; an HTTP/1.1 connection goes back to the pool once its
    /// response body has been read to the end.
    async fn send_on(
        self: &Arc<Self>,
        origin: &Origin,
        connection: Connection,
        request: Request<Bytes>,
    ) -> Sent {
        let (mut parts, body) = request.into_parts();
        match connection {
            Connection::H1(mut sender) => {
                // A bare HTTP/1.1 connection: origin-form target and an explicit Host.
                if !parts.headers.contains_key(http::header::HOST)
                    && let Ok(host) = http::HeaderValue::from_str(&origin.host_header())
                {
                    parts.headers.insert(http::header::HOST, host);
                }
                if let Some(path) = parts.uri.path_and_query().cloned() {
                    parts.uri = path.into();
                }
                let response =
                    sender.try_send_request(Request::from_parts(parts, Full::new(body))).await?;
                let inner = Arc::clone(self);
                let origin = origin.clone();
                smol::spawn(async move {
                    if sender.ready().await.is_ok() {
                        let mut pool = inner.pool();
                        let idle = pool.entry(origin).or_default();
                        if idle.len() < MAX_IDLE_PER_HOST {
                            idle.push(Connection::H1(sender));
                        }
                    }
                })
                .detach();
                Ok(response)
            }
            Connection::H2(mut sender) => {
                sender.try_send_request(Request::from_parts(parts, Full::new(body))).await
            }
        }
    }

    /// Opens a connection to `origin` (TLS for `https`), HTTP/2 when ALPN chose it.
    async fn connect(self: &Arc<Self>, origin: &Origin) -> Result<Connection, TransportError> {
        let timeout = self.connect_timeout;
        let tcp = futures_lite::future::or(
            async {
                smol::net::TcpStream::connect((origin.host.as_str(), origin.port))
                    .await
                    .map_err(TransportError::new)
            },
            async {
                smol::Timer::after(timeout).await;
                Err(TransportError::with_kind(
                    FailureKind::ConnectTimeout,
                    format!("no connection to {}:{} within {timeout:?}", origin.host, origin.port),
                ))
            },
        )
        .await?;
        let _ = tcp.set_nodelay(true);
        if !origin.https {
            return h1(FuturesIo::new(tcp)).await;
        }
        #[cfg(feature = "tls")]
        {
            let name =
                rustls_pki_types::ServerName::try_from(origin.host.clone()).map_err(|e| {
                    TransportError::with_kind(FailureKind::ConnectRefused, e.to_string())
                })?;
            let tls = self.tls.connect(name, tcp).await.map_err(|e| {
                // A failed handshake never reached the application: nothing was sent.
                TransportError::with_kind(FailureKind::ConnectRefused, e)
            })?;
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
            let io = FuturesIo::new(tls);
            if !h2 {
                return h1(io).await;
            }
            let (sender, connection) =
                http2::handshake(SmolSpawn, io).await.map_err(TransportError::new)?;
            smol::spawn(async move {
                let _ = connection.await;
            })
            .detach();
            self.pool().entry(origin.clone()).or_default().push(Connection::H2(sender.clone()));
            Ok(Connection::H2(sender))
        }
        #[cfg(not(feature = "tls"))]
        {
            Err(TransportError::with_kind(
                FailureKind::ConnectRefused,
                "https needs ratebucket-http's `tls` feature",
            ))
        }
    }
}

/// An HTTP/1.1 handshake on `io`, its connection driven by a smol task.
async fn h1<I>(io: I) -> Result<Connection, TransportError>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(io).await.map_err(TransportError::new)?;
    smol::spawn(async move {
        let _ = connection.await;
    })
    .detach();
    Ok(Connection::H1(sender))
}

/// Runs HTTP/2's background tasks on smol's global executor.
#[cfg(feature = "tls")]
#[derive(Clone, Copy, Debug)]
struct SmolSpawn;

#[cfg(feature = "tls")]
impl<F> hyper::rt::Executor<F> for SmolSpawn
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        smol::spawn(future).detach();
    }
}

//! The tokio transport: hyper-util's pooled client, HTTPS through hyper-rustls with HTTP/2
//! chosen by ALPN.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{
    Departure, RequestBody, SendFuture, Transport, TransportError, box_body, check_builtin,
};

#[cfg(feature = "tls")]
type Connector = hyper_rustls::HttpsConnector<HttpConnector>;
#[cfg(not(feature = "tls"))]
type Connector = HttpConnector;

/// The convenience transport: hyper-util's pooled client on tokio.
///
/// With the `tls` feature (on by default) it speaks `https://` as well as `http://`,
/// through rustls, offering HTTP/2 and HTTP/1.1 by ALPN: the server's choice is used,
/// and an HTTP/2 connection carries many requests at once. Plain `http://` is HTTP/1.1.
#[derive(Clone, Debug)]
pub struct HyperTransport {
    client: Client<Connector, RequestBody>,
}

impl HyperTransport {
    /// A pooled client whose connection attempts give up after `connect_timeout`,
    /// trusting the default roots ([`tls::default_config`](crate::tls::default_config)).
    ///
    /// # Panics
    ///
    /// With the `native-roots` feature, when the system's store holds no usable root:
    /// use [`HyperTransport::with_tls`] to handle that case.
    pub fn new(connect_timeout: Duration) -> HyperTransport {
        #[cfg(feature = "tls")]
        {
            let config =
                crate::tls::default_config().unwrap_or_else(|e| panic!("ratebucket-http: {e}"));
            HyperTransport::with_tls(connect_timeout, config)
        }
        #[cfg(not(feature = "tls"))]
        {
            HyperTransport::with_connector(http_connector(connect_timeout))
        }
    }

    /// A pooled client with your own TLS settings (roots, client certificates); its ALPN
    /// protocols are replaced by `h2` and `http/1.1`.
    #[cfg(feature = "tls")]
    pub fn with_tls(
        connect_timeout: Duration,
        mut config: crate::tls::rustls::ClientConfig,
    ) -> HyperTransport {
        config.alpn_protocols.clear();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_or_http()
            .enable_all_versions()
            .wrap_connector(http_connector(connect_timeout));
        HyperTransport::with_connector(connector)
    }

    fn with_connector(connector: Connector) -> HyperTransport {
        HyperTransport::with_client(Client::builder(TokioExecutor::new()).build(connector))
    }

    /// Wraps an existing hyper-util client. Its body type, [`RequestBody`], tells the
    /// fetcher when a request leaves (hyper looks at a body only on a connection).
    pub fn with_client(client: Client<Connector, RequestBody>) -> HyperTransport {
        HyperTransport { client }
    }
}

fn http_connector(connect_timeout: Duration) -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect_timeout));
    connector.set_nodelay(true);
    // With TLS, the layer around it takes `https://` itself.
    connector.enforce_http(!cfg!(feature = "tls"));
    connector
}

impl Default for HyperTransport {
    /// Connection attempts time out after ten seconds.
    fn default() -> HyperTransport {
        HyperTransport::new(Duration::from_secs(10))
    }
}

impl Transport for HyperTransport {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        self.send_departing(request, Departure::new())
    }

    /// The request leaves when hyper first looks at its body, on a connection: a call
    /// cancelled while its connection is made (TCP, TLS) never left.
    fn send_departing(&self, request: Request<Bytes>, departure: Departure) -> SendFuture<'_> {
        let request = request.map(|bytes| RequestBody::new(bytes, departure));
        Box::pin(async move {
            let response = self.client.request(request).await.map_err(TransportError::new)?;
            Ok(response.map(box_body))
        })
    }

    fn check(&self, uri: &http::Uri) -> Result<(), String> {
        check_builtin(uri)
    }
}

//! A plain hyper client for the fake provider's tests: one request on a connection of
//! its own, its answer read whole.

#![allow(dead_code)] // each test file uses its own part

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use ratebucket_sim::SimHandle;
use serde_json::Value;

/// An answer read whole.
pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    /// A header's value, which must be there.
    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .unwrap_or_else(|| panic!("missing {name}"))
            .to_str()
            .expect("ASCII header")
    }

    /// The body as text.
    pub(crate) fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("UTF-8")
    }
}

/// Posts `body` to `path` with `headers`.
pub(crate) async fn post(
    sim: &SimHandle,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Reply {
    let stream = tokio::net::TcpStream::connect(sim.addr()).await.expect("connects");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake");
    tokio::spawn(conn);
    let mut request = Request::post(path)
        .header("host", sim.addr().to_string())
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let request = request.body(Full::new(Bytes::from(body.to_string()))).expect("request");
    let response = sender.send_request(request).await.expect("answered");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("whole body").to_bytes();
    Reply { status: parts.status, headers: parts.headers, body }
}

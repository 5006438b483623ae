//! Response bodies: whole, or fed chunk by chunk from a task (for SSE, stalls and cuts).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use tokio::sync::mpsc;

/// The body type of every response.
pub(crate) type ResponseBody = BoxBody<Bytes, io::Error>;

pub(crate) fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).map_err(|never| match never {}).boxed()
}

/// A body fed through a channel; an `Err` item aborts the connection mid-body.
pub(crate) struct ChannelBody {
    rx: mpsc::Receiver<Result<Bytes, io::Error>>,
}

impl ChannelBody {
    pub(crate) fn channel() -> (mpsc::Sender<Result<Bytes, io::Error>>, ResponseBody) {
        let (tx, rx) = mpsc::channel(16);
        (tx, ChannelBody { rx }.boxed())
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.rx.poll_recv(cx).map(|item| item.map(|chunk| chunk.map(Frame::data)))
    }
}

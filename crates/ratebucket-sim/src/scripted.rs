//! A scripted raw HTTP server on 127.0.0.1: each request is answered with the bytes, pauses
//! and hang-ups a test chooses, for the replies no well-behaved server sends.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One step of a scripted reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Write these bytes.
    Write(Vec<u8>),
    /// Wait this long before the next step (a stall, when it is long).
    Sleep(Duration),
    /// Reset the connection (close it with unread data and no graceful shutdown).
    Reset,
}

impl Step {
    /// A whole response with `status`, `headers` and `body`: `Content-Length` set and the
    /// connection closed after it.
    pub fn response(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Step {
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\ncontent-length: {}\r\nconnection: close\r\n",
            reason(status),
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        let mut bytes = head.into_bytes();
        bytes.extend_from_slice(body);
        Step::Write(bytes)
    }

    /// A JSON response.
    pub fn json(status: u16, headers: &[(&str, &str)], body: &str) -> Step {
        let mut all = vec![("content-type", "application/json")];
        all.extend_from_slice(headers);
        Step::response(status, &all, body.as_bytes())
    }

    /// The head of a 200 server-sent-event stream (no length: the body runs until the
    /// connection closes), to be followed by [`Step::Write`]s of events.
    pub fn sse_head(headers: &[(&str, &str)]) -> Step {
        let mut head = String::from(
            "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n",
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        Step::Write(head.into_bytes())
    }

    /// Bytes to write, from text.
    pub fn text(text: &str) -> Step {
        Step::Write(text.as_bytes().to_vec())
    }
}

fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Unknown")
}

/// What a script sees of a request: its number (from 0, in arrival order) and its raw
/// bytes (head and body).
pub type Script = dyn Fn(usize, &[u8]) -> Vec<Step> + Send + Sync;

/// Starts scripted servers.
#[derive(Debug)]
pub struct Scripted;

impl Scripted {
    /// Binds 127.0.0.1 on a free port and answers every request with `script(n, request)`,
    /// on a thread of its own. Every connection is closed after one reply.
    pub fn start(
        script: impl Fn(usize, &[u8]) -> Vec<Step> + Send + Sync + 'static,
    ) -> std::io::Result<ScriptedHandle> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let requests: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
        let seen = Arc::clone(&requests);
        let script: Arc<Script> = Arc::new(script);
        let (stop, mut stopped) = watch::channel(false);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new()
            .name(format!("ratebucket-scripted {addr}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    loop {
                        tokio::select! {
                            _ = stopped.changed() => return,
                            accepted = listener.accept() => {
                                let Ok((stream, _)) = accepted else { continue };
                                let (script, seen) = (Arc::clone(&script), Arc::clone(&seen));
                                tokio::spawn(play(stream, script, seen));
                            }
                        }
                    }
                });
            })?;
        Ok(ScriptedHandle { addr, requests, stop, thread: Some(thread) })
    }
}

/// Reads one request and plays the script's answer to it.
async fn play(mut stream: TcpStream, script: Arc<Script>, seen: Arc<Mutex<Vec<Vec<u8>>>>) {
    let Some(request) = read_request(&mut stream).await else {
        return;
    };
    let number = {
        let mut seen = seen.lock().unwrap_or_else(PoisonError::into_inner);
        seen.push(request.clone());
        seen.len() - 1
    };
    for step in script(number, &request) {
        match step {
            Step::Write(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
                let _ = stream.flush().await;
            }
            Step::Sleep(pause) => tokio::time::sleep(pause).await,
            Step::Reset => {
                let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
                return;
            }
        }
    }
    let _ = stream.shutdown().await;
}

/// A request's head and `Content-Length` body; `None` if the client hung up first.
async fn read_request(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || bytes.len() > 1 << 20 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while bytes.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
    Some(bytes)
}

/// A running scripted server. Dropping it shuts it down.
#[derive(Debug)]
pub struct ScriptedHandle {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
}

impl ScriptedHandle {
    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many requests arrived.
    pub fn requests(&self) -> usize {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// The raw requests received so far.
    pub fn received(&self) -> Vec<Vec<u8>> {
        self.requests.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for ScriptedHandle {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

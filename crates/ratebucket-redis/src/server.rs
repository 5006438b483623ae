//! A throwaway `redis-server` for tests and benchmarks: started on a free loopback port in
//! a directory of its own, stopped (and the directory removed) when dropped.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where to find `redis-server`: `$REDIS_SERVER`, else the first `redis-server` on `PATH`.
pub fn find_redis_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("REDIS_SERVER") {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file())
}

/// A `redis-server` child process listening on 127.0.0.1, persisting nothing.
#[derive(Debug)]
pub struct RedisServer {
    binary: PathBuf,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts one on a free port, in a new temporary directory, and waits until it answers.
    ///
    /// Fails with [`io::ErrorKind::NotFound`] and a message saying how to install it when
    /// there is no `redis-server` ([`find_redis_server`]).
    pub fn start() -> io::Result<RedisServer> {
        let binary = find_redis_server().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "redis-server not found: install it (Debian/Ubuntu: `apt-get install redis-server`), \
                 or set REDIS_SERVER to its path",
            )
        })?;
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let dir = std::env::temp_dir().join(format!(
            "ratebucket-redis-{}-{port}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir)?;
        let mut server = RedisServer {
            binary,
            dir,
            port,
            child: None,
        };
        server.spawn()?;
        Ok(server)
    }

    fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(&self.binary)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                return Err(io::Error::other(format!(
                    "redis-server exited at start ({status}); is port {} taken?",
                    self.port
                )));
            }
            if TcpStream::connect(self.addr()).is_ok_and(|s| ping(s).is_ok()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "redis-server did not answer within 10 s",
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Its URL, for [`redis::Client::open`].
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The directory it runs in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Kills it (as a crash would: nothing is saved, every connection drops).
    pub fn kill(&mut self) -> io::Result<()> {
        if let Some(mut child) = self.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Starts it again on the same port, empty (a restart that lost its data).
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill()?;
        self.spawn()
    }
}

fn ping(mut stream: TcpStream) -> io::Result<()> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(io::Error::other("unexpected reply to PING"))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

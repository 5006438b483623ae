//! Throwaway `redis-server`s for tests and benchmarks, alone or as a cluster: each started
//! on a free loopback port in a directory of its own, stopped (and the directory removed)
//! when dropped.

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
    /// Arguments beyond the defaults (a cluster node's, a TLS server's, a Sentinel's).
    extra: Vec<String>,
    /// A configuration file given first (a Sentinel's, which it rewrites).
    config_file: Option<PathBuf>,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts one on a free port, in a new temporary directory, and waits until it answers.
    ///
    /// Fails with [`io::ErrorKind::NotFound`] and a message saying how to install it when
    /// there is no `redis-server` ([`find_redis_server`]).
    pub fn start() -> io::Result<RedisServer> {
        RedisServer::start_with(Vec::new())
    }

    /// Starts one that speaks only TLS (`rediss://`, see [`RedisServer::tls_url`]) on a free
    /// port, presenting the certificate and key in the PEM files given, and not asking
    /// clients for certificates.
    pub fn start_tls(cert_pem: &Path, key_pem: &Path) -> io::Result<RedisServer> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        RedisServer::start_with(vec![
            "--tls-port".into(),
            TLS_PORT.into(),
            "--port".into(),
            "0".into(),
            "--tls-cert-file".into(),
            path(cert_pem),
            "--tls-key-file".into(),
            path(key_pem),
            "--tls-ca-cert-file".into(),
            path(cert_pem),
            "--tls-auth-clients".into(),
            "no".into(),
        ])
    }

    /// Its URL over TLS, for a server from [`RedisServer::start_tls`].
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}/", self.port)
    }

    /// Whether it speaks only TLS.
    fn tls_only(&self) -> bool {
        self.extra.iter().any(|a| a == "--tls-port")
    }

    /// [`RedisServer::start`] with `extra` arguments after the defaults.
    fn start_with(extra: Vec<String>) -> io::Result<RedisServer> {
        RedisServer::start_configured(extra, None)
    }

    /// Starts a Redis Sentinel on a free port, watching `primary` as `service` (one
    /// Sentinel is a quorum here), for [`SharedLimiter::connect_sentinel`](crate::SharedLimiter::connect_sentinel).
    pub fn start_sentinel(primary: &RedisServer, service: &str) -> io::Result<RedisServer> {
        let config = format!(
            "sentinel monitor {service} 127.0.0.1 {port} 1\n\
             sentinel down-after-milliseconds {service} 1000\n",
            port = primary.port
        );
        RedisServer::start_configured(vec!["--sentinel".into()], Some(config))
    }

    /// [`RedisServer::start_with`], with a configuration file written first.
    fn start_configured(extra: Vec<String>, config: Option<String>) -> io::Result<RedisServer> {
        let binary = find_redis_server().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "redis-server not found: install it (Debian/Ubuntu: `apt-get install redis-server`), \
                 or set REDIS_SERVER to its path",
            )
        })?;
        let dir = std::env::temp_dir().join(format!(
            "ratebucket-redis-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir_all(&dir)?;
        let mut server =
            RedisServer { binary, dir, port: 0, extra, config_file: None, child: None };
        if config.is_some() {
            server.config_file = Some(server.dir.join("server.conf"));
        }
        // A port found free can be taken (by any process's outgoing connection) before the
        // server binds it; a server that exits at start is tried again on another port.
        let mut attempts = 0;
        loop {
            server.port = free_port()?;
            if let Some(file) = &server.config_file
                && let Some(config) = &config
            {
                // A Sentinel rewrites its file; each attempt starts from the one given.
                std::fs::write(file, config.as_bytes())?;
            }
            match server.spawn() {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempts < START_ATTEMPTS => {
                    attempts += 1;
                }
                Err(e) => return Err(e),
                Ok(()) => return Ok(server),
            }
        }
    }

    fn spawn(&mut self) -> io::Result<()> {
        let child = Command::new(&self.binary)
            .args(&self.config_file)
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir)
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(
                self.extra
                    .iter()
                    .map(|a| if a == TLS_PORT { self.port.to_string() } else { a.clone() }),
            )
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
                self.child = None;
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "redis-server exited at start ({status}); is port {} taken?",
                        self.port
                    ),
                ));
            }
            // A TLS-only server is ready when it accepts connections.
            if TcpStream::connect(self.addr()).is_ok_and(|s| self.tls_only() || ping(s).is_ok()) {
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
    ///
    /// The port stays; when another process's connection holds it for a moment, the start is
    /// tried again for up to five seconds.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill()?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match self.spawn() {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                result => return result,
            }
        }
    }
}

/// How many more ports a server that exits at start is tried on.
const START_ATTEMPTS: u32 = 8;

/// A loopback port that was free a moment ago.
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn ping(mut stream: TcpStream) -> io::Result<()> {
    use std::io::{Read, Write};
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" { Ok(()) } else { Err(io::Error::other("unexpected reply to PING")) }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Stands for the server's own port among its extra arguments.
const TLS_PORT: &str = "{port}";

/// Slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// A throwaway Redis Cluster of masters without replicas, each a [`RedisServer`] on a free
/// loopback port with a cluster bus port of its own; the slots are split evenly between
/// them. Stopped when dropped.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts `masters` nodes (at least one), introduces them to each other and assigns the
    /// slots, then waits until every node says the cluster is ok.
    pub fn start(masters: usize) -> io::Result<RedisCluster> {
        if masters == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a cluster needs at least one master",
            ));
        }
        let nodes = (0..masters)
            .map(|_| {
                // The bus port can be taken too: a node that cannot start gets another.
                let mut attempts = 0;
                loop {
                    let bus = free_port()?;
                    let started = RedisServer::start_with(
                        [
                            "--cluster-enabled",
                            "yes",
                            "--cluster-config-file",
                            "nodes.conf",
                            "--cluster-node-timeout",
                            "2000",
                            "--cluster-port",
                            &bus.to_string(),
                        ]
                        .map(str::to_owned)
                        .to_vec(),
                    );
                    match started {
                        Err(e)
                            if e.kind() == io::ErrorKind::AddrInUse
                                && attempts < START_ATTEMPTS =>
                        {
                            attempts += 1;
                        }
                        started => return started.map(|server| (server, bus)),
                    }
                }
            })
            .collect::<io::Result<Vec<_>>>()?;
        let count = u16::try_from(masters).unwrap_or(SLOTS).min(SLOTS);
        for (i, (node, _)) in nodes.iter().enumerate() {
            let i = u16::try_from(i).unwrap_or(SLOTS);
            let (first, last) = (SLOTS / count * i, SLOTS / count * (i + 1) - 1);
            let last = if i + 1 == count { SLOTS - 1 } else { last };
            command(node, &["CLUSTER", "ADDSLOTSRANGE", &first.to_string(), &last.to_string()])?;
        }
        for (node, bus) in &nodes[1..] {
            let (port, bus) = (node.port.to_string(), bus.to_string());
            command(&nodes[0].0, &["CLUSTER", "MEET", "127.0.0.1", &port, &bus])?;
        }
        let cluster = RedisCluster { nodes: nodes.into_iter().map(|(node, _)| node).collect() };
        cluster.wait_ok(Duration::from_secs(20))?;
        Ok(cluster)
    }

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_ok(&self, limit: Duration) -> io::Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let ok = self.nodes.iter().filter(|n| n.child.is_some()).all(|node| {
                command(node, &["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the cluster was not ok within {limit:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every node's URL, to pass to [`SharedLimiter::connect_cluster`](crate::SharedLimiter::connect_cluster).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The nodes, in the order they were started.
    pub fn nodes(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The index of the node that owns `key`'s slot.
    pub fn owner_of(&self, key: &str) -> io::Result<usize> {
        let slot: u16 = command(&self.nodes[0], &["CLUSTER", "KEYSLOT", key])?
            .trim()
            .parse()
            .map_err(|_| io::Error::other("CLUSTER KEYSLOT did not answer a slot"))?;
        let count = u16::try_from(self.nodes.len()).unwrap_or(SLOTS).min(SLOTS);
        Ok(usize::from((slot / (SLOTS / count)).min(count - 1)))
    }
}

/// Sends one command to `node` and returns its reply as text (a status, a bulk string or an
/// integer).
pub fn command(node: &RedisServer, args: &[&str]) -> io::Result<String> {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut stream = TcpStream::connect(node.addr())?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut request = format!("*{}\r\n", args.len());
    for arg in args {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let line = line.trim_end();
    match line.split_at_checked(1) {
        Some(("+" | ":", rest)) => Ok(rest.to_owned()),
        Some(("-", error)) => Err(io::Error::other(format!("redis: {error}"))),
        Some(("$", len)) => {
            let len: usize =
                len.parse().map_err(|_| io::Error::other("a bulk reply without a length"))?;
            let mut body = vec![0; len + 2];
            reader.read_exact(&mut body)?;
            body.truncate(len);
            String::from_utf8(body).map_err(|_| io::Error::other("a reply that is not text"))
        }
        _ => Err(io::Error::other(format!("an unexpected reply: {line}"))),
    }
}

//! Where a shared quota lives: one Redis named by a URL, the primary Redis Sentinel names, or
//! a Redis Cluster named by some of its nodes, and the one connection type the scripts run
//! over whichever it is.

use std::sync::Arc;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// One Redis, the primary Sentinel names, or a cluster.
#[derive(Clone)]
#[allow(clippy::large_enum_variant)] // one per limiter, made once
pub(crate) enum Backend {
    /// A server (or a managed Redis, or a proxy) at one URL.
    Single(redis::Client),
    /// A Redis Cluster: the quota's keys share one hash slot, so every script runs on the
    /// node that owns it; `nodes` are the addresses given, each a way to the gate's
    /// channel (a cluster carries a `PUBLISH` to every node).
    Cluster { client: ClusterClient, nodes: Vec<redis::Client> },
    /// The primary the Sentinels name, asked again at every new connection (so a failover
    /// is followed as soon as a call to the old primary fails).
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

impl Backend {
    /// A new connection; the cluster's is routed by key, and follows the slot when it moves.
    pub(crate) async fn connect(&self) -> RedisResult<Connection> {
        match self {
            Backend::Single(client) => {
                Ok(Connection::Single(ConnectionManager::new(client.clone()).await?))
            }
            Backend::Cluster { client, .. } => {
                Ok(Connection::Cluster(client.get_async_connection().await?))
            }
            Backend::Sentinel(sentinel) => {
                let primary = sentinel.lock().await.async_get_client().await?;
                Ok(Connection::Single(ConnectionManager::new(primary).await?))
            }
        }
    }

    /// The server a listener subscribes through on its `attempt`-th try: the one server,
    /// the cluster's nodes in turn, or the primary the Sentinels name now.
    pub(crate) async fn subscriber(&self, attempt: usize) -> RedisResult<redis::Client> {
        match self {
            Backend::Single(client) => Ok(client.clone()),
            Backend::Cluster { nodes, .. } => Ok(nodes[attempt % nodes.len()].clone()),
            Backend::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await,
        }
    }
}

/// A connection to one Redis or to a cluster.
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(con) => con.req_packed_command(cmd),
            Connection::Cluster(con) => con.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(con) => con.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(con) => con.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(con) => con.get_db(),
            Connection::Cluster(con) => con.get_db(),
        }
    }
}

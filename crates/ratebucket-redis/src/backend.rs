//! Where a shared quota lives: one Redis named by a URL, or a Redis Cluster named by some of
//! its nodes, and the one connection type the scripts run over either way.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// One Redis, or a cluster.
#[derive(Clone)]
pub(crate) enum Backend {
    /// A server (or a managed Redis, or a proxy) at one URL.
    Single(redis::Client),
    /// A Redis Cluster: the quota's keys share one hash slot, so every script runs on the
    /// node that owns it; `nodes` are the addresses given, each a way to the gate's
    /// channel (a cluster carries a `PUBLISH` to every node).
    Cluster {
        client: Box<ClusterClient>,
        nodes: Vec<redis::Client>,
    },
}

impl Backend {
    /// A new connection; the cluster's is routed by key, and follows the slot when it moves.
    pub(crate) async fn connect(&self) -> RedisResult<Connection> {
        match self {
            Backend::Single(client) => Ok(Connection::Single(
                ConnectionManager::new(client.clone()).await?,
            )),
            Backend::Cluster { client, .. } => {
                Ok(Connection::Cluster(client.get_async_connection().await?))
            }
        }
    }

    /// The servers a listener may subscribe through, in the order to try them.
    pub(crate) fn subscribers(&self) -> Vec<redis::Client> {
        match self {
            Backend::Single(client) => vec![client.clone()],
            Backend::Cluster { nodes, .. } => nodes.clone(),
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

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
    /// A server in this process, for simulated fleets.
    #[cfg(feature = "fleet")]
    Model(crate::model::Model),
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
            #[cfg(feature = "fleet")]
            Backend::Model(model) => {
                if model.is_down() {
                    return Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into());
                }
                Ok(Connection::Model(model.clone()))
            }
        }
    }

    /// A subscription to `channel` on its `attempt`-th try, through the one server, the
    /// cluster's nodes in turn, or the primary the Sentinels name now.
    pub(crate) async fn subscribe(
        &self,
        attempt: usize,
        channel: &str,
    ) -> RedisResult<Subscription> {
        let client = match self {
            Backend::Single(client) => client.clone(),
            Backend::Cluster { nodes, .. } => nodes[attempt % nodes.len()].clone(),
            Backend::Sentinel(sentinel) => sentinel.lock().await.async_get_client().await?,
            #[cfg(feature = "fleet")]
            Backend::Model(model) => {
                return model.subscribe(channel.as_bytes()).map(Subscription::Model).ok_or_else(
                    || std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into(),
                );
            }
        };
        let mut pubsub = client.get_async_pubsub().await?;
        pubsub.subscribe(channel).await?;
        Ok(Subscription::Redis(Box::pin(pubsub.into_on_message())))
    }
}

/// The messages published on a channel, until the subscription ends.
pub(crate) enum Subscription {
    Redis(std::pin::Pin<Box<dyn futures_lite::Stream<Item = redis::Msg> + Send>>),
    #[cfg(feature = "fleet")]
    Model(tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>),
}

impl Subscription {
    /// The next message's payload, or `None` once the subscription has ended.
    pub(crate) async fn next(&mut self) -> Option<Vec<u8>> {
        use futures_lite::StreamExt;
        match self {
            Subscription::Redis(messages) => {
                messages.next().await.map(|message| message.get_payload_bytes().to_vec())
            }
            #[cfg(feature = "fleet")]
            Subscription::Model(receiver) => receiver.recv().await,
        }
    }
}

/// A connection to one Redis or to a cluster.
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    #[cfg(feature = "fleet")]
    Model(crate::model::Model),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(con) => con.req_packed_command(cmd),
            Connection::Cluster(con) => con.req_packed_command(cmd),
            #[cfg(feature = "fleet")]
            Connection::Model(model) => Box::pin(model.call(cmd)),
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
            #[cfg(feature = "fleet")]
            Connection::Model(_) => Box::pin(async {
                Err(redis::RedisError::from((
                    redis::ErrorKind::Client,
                    "model redis",
                    "pipelines are not served".to_owned(),
                )))
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(con) => con.get_db(),
            Connection::Cluster(con) => con.get_db(),
            #[cfg(feature = "fleet")]
            Connection::Model(_) => 0,
        }
    }
}

//! Many processes, one quota: ratebucket's limiter leasing slices of every limit from a
//! bucket held in Redis.
//!
//! Each process runs an ordinary [`Limiter`] (FIFO, every dimension granted at once or not
//! at all, the pool-wide gate), but over **funded** buckets
//! ([`TokenBucket::funded`](ratebucket_tokio::core::TokenBucket::funded)) that never refill
//! by themselves. A background task keeps them funded from one token bucket per dimension
//! held in Redis:
//!
//! - **Leases.** One Lua script refills the shared bucket on Redis's clock (`TIME`), records
//!   the process's unmet demand, and hands it a slice of every dimension in one atomic
//!   step: one round trip per lease, never per request. Slices follow demand (what waits
//!   in the local queue plus what the process spent over the last lease period). Each
//!   process wanting more than it gets has a share that refills at the rate divided among
//!   such processes, so none starves another. A lease tells a process still wanting more
//!   when to come back: when its share will have refilled what its first waiter lacks (or
//!   what it wants, up to what the share holds), at most eight lease periods away; it makes
//!   no round trip until then and stays counted as wanting, and one that has not come back
//!   by then (a quarter period later, at least a period and a quarter after its last
//!   lease) no longer counts, so its share goes to the others. A share always
//!   reaches what the process's first waiter lacks, and a grant covers that in every
//!   dimension or is not made: with more processes than the quota has units, each is
//!   granted in turn instead of every share rounding down to nothing.
//! - **Bookings.** A first waiter that neither the share nor the bucket covers yet is
//!   booked, within 32 lease periods: the script grants its need at once, dated to when
//!   the share and the bucket will cover it, and takes it from the bucket at that instant
//!   (the bucket is kept as its level at the last booking's start, so later ones queue
//!   behind and none is dated before an earlier one); the process spends it only from
//!   then. One round trip serves the waiter however long it waits. A process asks to
//!   lease ahead of its waiters only for a demand that lasts (more than one call waiting,
//!   or spending at two ticks within a period) and while the quota is not spoken for.
//! - **Credit lives one lease period.** What a lease funds may be spent for one lease
//!   period from its start (timed from when the lease was asked); what is left then goes
//!   back to the bucket with the next lease, and so does what a reservation did not use
//!   (a refund is not spent again locally: the bucket dated it when it funded it). What
//!   goes back returns to the process's share too.
//! - **A shared gate.** A 429 seen by any process (anything that calls
//!   [`Limiter::throttle`] on its local limiter) closes a gate key in Redis once per wave,
//!   empties the shared bucket, and is announced on a pub/sub channel: every other process
//!   pauses at once, and a lease refuses to grant until the pause ends. A process whose
//!   subscription is not up yet when a pause is announced (it has just started, or is
//!   reconnecting) learns of it at its next lease, or pauses at its own first 429.
//! - **Shared learning.** A lower rate or capacity that a process's limiter learns (from a
//!   provider's headers, or [`Limiter::set_limit`]) lowers the shared bucket for everyone;
//!   leases carry the shared limits back.
//! - **Failure.** A process that has never held a lease admits nothing on its own: its
//!   first grant waits for Redis. One that has falls back to a local share when Redis
//!   fails (a refused or broken connection, an error) or answers none of its calls for as
//!   long as a lease lives unrenewed (three lease periods; a call unanswered within
//!   [`SharedConfig::timeout`] is slow, not down, and meanwhile it spends what it holds):
//!   `1 / n` of every rate and capacity, `n` the larger of `expected_processes` and the
//!   processes that held a record at its last lease, funded locally; it keeps trying,
//!   and on its first lease back what it holds from the fallback is dropped.
//! - **Where Redis is.** [`SharedLimiter::connect`] takes any URL (`rediss://` for TLS, a
//!   managed Redis, a proxy); [`SharedLimiter::connect_tls`] trusts a private CA;
//!   [`SharedLimiter::connect_sentinel`] follows the primary Redis Sentinel names, asking
//!   again at every new connection; [`SharedLimiter::connect_cluster`] shares a quota on a
//!   Redis Cluster: its keys share one hash slot, so its scripts run on one node as on one
//!   server. A failover is an outage and a restart for the quota, with the bounds below.
//!
//! # Bounds
//!
//! With `R` a dimension's rate, `C` its capacity and `P` the lease period:
//!
//! **Theorem (one quota, any fleet).** Suppose Redis keeps the quota's state and runs each
//! script atomically, every process's clock runs at the rate of Redis's, and every
//! process that has held a lease has an answer from Redis within three lease periods of
//! its first call left unanswered. Then, for every window `[a, a + W)`, what the grants
//! every process's limiter makes in it use, summed over all processes, is at most
//! `C + R·(W + P)` in every dimension: whatever the number of processes and
//! `expected_processes`, whenever they start (all at once, in waves, while Redis is slow
//! to answer), and whenever they join, leave or are killed.
//!
//! *Proof.* (1) The script dates every grant at the instant it may be spent (the
//! script's `now`, or a booking's start), never before an earlier grant's, and takes it
//! from the bucket at that instant, the level refilled to then and capped at `C`: so
//! the dated grants are what one token bucket `(R, C)` admits, and those dated in any
//! window of `W` sum to at most `C + R·W`. A unit given back counts as never taken: the
//! level it returns to is capped at `C` and was lower meanwhile, so it only ever granted
//! less. (2) A process spends a grant no earlier than its date (it funds it when the
//! answer has come, a booking from its start timed from then) and no later than `P`
//! after it (its credit ends `P` after its start timed from when the lease was asked,
//! before the script read the clock; what is left then is withdrawn and given back, and
//! a refund is given back rather than spent again). A process without an answer spends
//! only such credit, and one that never held a lease has none. (3) So what grants in
//! `[a, a + W)` use was dated in `[a − P, a + W)`: at most `C + R·(W + P)`. ∎
//!
//! `ratebucket_redis::fleet` (feature `fleet`) runs the real drivers and scripts on a
//! virtual clock; a quickcheck property checks the theorem on fleets of up to a hundred
//! processes with random joins, leaves, kills, slow answers and a restart, and tests
//! check it for 48 processes started at once expecting 8, in waves, with Redis slow
//! while they start, and for a thousand processes.
//!
//! Beyond its assumptions:
//!
//! - **An outage.** While a process is on its fallback share it admits at most
//!   `C/n + R·W/n` (the fallback's `n`, above): never above the whole quota while at most
//!   `n` processes run, and a process that joins during the outage admits nothing. Over
//!   an outage of `D`, the fallback shares add at most `C + R·D` to the theorem's bound,
//!   on top of the credit held when Redis went away (its own `P` of it).
//! - **A restart that loses the data.** A process that knew the quota recreates it
//!   **empty**, adding nothing; a process that never saw it creates it full, adding `C`
//!   once. A booking made before the restart is owed by a quota that no longer knows it:
//!   a process drops its bookings when its subscription to the gate's channel ends (as
//!   it does when the server goes) or a lease fails, and asks again. A restart its
//!   subscription does not see (a cluster node other than the one it listens through)
//!   may add at most the bookings outstanding, `R·32P` at the worst.
//! - **Joins, leaves and kills add nothing**: a process joining is funded only by
//!   leases; one leaving returns what it holds unspent; one killed loses what it held,
//!   and its record only shrinks the others' shares until it expires.
//! - **Waiting.** With `n` processes wanting and every first waiter needing at most `u`
//!   of a dimension, a waiter is booked at its process's first lease after it arrives,
//!   and granted within `n·u/R` of that lease, plus a tick; a booking beyond the horizon
//!   of 32 lease periods is asked for again when it comes within it.
//!
//! ```no_run
//! use ratebucket_redis::{Limit, SharedConfig, SharedLimiter};
//!
//! # async fn run() -> Result<(), ratebucket_redis::Error> {
//! let config = SharedConfig::new(
//!     "openai-key-1",
//!     [Limit::per_minute(500).named("requests"), Limit::per_minute(30_000).named("tokens")],
//! )
//! .expected_processes(8);
//! let shared = SharedLimiter::connect("redis://127.0.0.1/", config).await?;
//! let reservation = shared.limiter().reserve(&[1, 700]).await?;
//! // ... send the request, then:
//! reservation.commit(&[1, 420])?;
//! shared.shutdown().await;
//! # Ok(()) }
//! ```

mod backend;
mod credit;
mod driver;
mod fallback;
#[cfg(feature = "fleet")]
pub mod fleet;
mod limits;
mod listener;
#[cfg(feature = "fleet")]
mod model;
mod script;
pub mod server;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ratebucket_tokio::core::{ArbiterConfig, Instant, InvalidLimit, TokenBucket};
use tokio::task::JoinHandle;

use crate::backend::Backend;

pub use ratebucket_tokio::core::Limit;
pub use ratebucket_tokio::core::TicketError;
pub use ratebucket_tokio::{Limiter, ReserveError};

/// Why a shared limiter could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// The configuration cannot work (an empty name, no limits, zero processes, ...).
    Config(String),
    /// A limit was invalid.
    Limit(InvalidLimit),
    /// The Redis URL was malformed.
    Redis(redis::RedisError),
    /// A reservation failed (for `?` in code that reserves).
    Reserve(ReserveError),
    /// A commit failed (for `?` in code that commits).
    Ticket(TicketError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Config(why) => write!(f, "shared limiter configuration: {why}"),
            Error::Limit(e) => write!(f, "invalid limit: {e}"),
            Error::Redis(e) => write!(f, "redis: {e}"),
            Error::Reserve(e) => write!(f, "reservation failed: {e}"),
            Error::Ticket(e) => write!(f, "commit failed: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(_) => None,
            Error::Limit(e) => Some(e),
            Error::Redis(e) => Some(e),
            Error::Reserve(e) => Some(e),
            Error::Ticket(e) => Some(e),
        }
    }
}

impl From<InvalidLimit> for Error {
    fn from(e: InvalidLimit) -> Error {
        Error::Limit(e)
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        Error::Redis(e)
    }
}

impl From<ReserveError> for Error {
    fn from(e: ReserveError) -> Error {
        Error::Reserve(e)
    }
}

impl From<TicketError> for Error {
    fn from(e: TicketError) -> Error {
        Error::Ticket(e)
    }
}

/// How a [`SharedLimiter`] shares its quota.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SharedConfig {
    /// The quota's name: processes with the same name (on the same Redis) share it.
    pub name: String,
    /// The whole quota, for all processes together, one limit per dimension.
    pub limits: Vec<Limit>,
    /// How many processes are expected to share it: a process on its fallback share
    /// (Redis out of reach) takes `1 / n` of every limit, `n` the larger of this and the
    /// processes it saw at its last lease. It bounds nothing while Redis answers.
    pub expected_processes: u32,
    /// How much demand a lease covers, and how often a busy process renews (1 s).
    pub lease_period: Duration,
    /// How long a Redis call may take before the process falls back (250 ms).
    pub timeout: Duration,
    /// How often the local side looks at its demand and its gate (10 ms).
    pub tick: Duration,
}

impl SharedConfig {
    /// A quota named `name` made of `limits`, expected to be shared by one process.
    pub fn new(name: impl Into<String>, limits: impl IntoIterator<Item = Limit>) -> SharedConfig {
        SharedConfig {
            name: name.into(),
            limits: limits.into_iter().collect(),
            expected_processes: 1,
            lease_period: Duration::from_secs(1),
            timeout: Duration::from_millis(250),
            tick: Duration::from_millis(10),
        }
    }

    /// Sets how many processes are expected (the fallback share's divisor).
    pub fn expected_processes(mut self, processes: u32) -> SharedConfig {
        self.expected_processes = processes;
        self
    }

    /// Sets the lease period.
    pub fn lease_period(mut self, period: Duration) -> SharedConfig {
        self.lease_period = period;
        self
    }

    /// Sets the Redis timeout.
    pub fn timeout(mut self, timeout: Duration) -> SharedConfig {
        self.timeout = timeout;
        self
    }

    fn validate(&self) -> Result<(), Error> {
        let bad = |why: &str| Err(Error::Config(why.to_owned()));
        if self.name.is_empty() || self.name.contains(['{', '}']) {
            return bad("the name must be non-empty and free of `{` and `}`");
        }
        if self.limits.is_empty() {
            return bad("at least one limit is needed");
        }
        if self.expected_processes == 0 {
            return bad("expected_processes must be at least 1");
        }
        if self.lease_period < Duration::from_millis(10) || self.tick.is_zero() {
            return bad("the lease period must be at least 10 ms and the tick above zero");
        }
        if self.timeout.is_zero() {
            return bad("the timeout must be above zero");
        }
        for limit in &self.limits {
            limit.rate()?;
        }
        Ok(())
    }
}

/// Counters of what a [`SharedLimiter`] did, for tests, dashboards and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SharedStats {
    /// Redis calls that answered (leases, pauses, lowered limits).
    pub round_trips: u64,
    /// Redis calls that failed or timed out.
    pub failures: u64,
    /// Leases that granted something.
    pub leases: u64,
    /// Permits received from leases, summed over dimensions.
    pub leased: u64,
    /// Pauses this process announced to the others.
    pub pauses_sent: u64,
    /// Pauses announced by another process that this one took.
    pub pauses_taken: u64,
    /// Times the quota was found missing and recreated empty (Redis lost it).
    pub recreated: u64,
    /// Times the process fell back to its local share.
    pub fallbacks: u64,
    /// Permits funded from the local share while Redis was unreachable.
    pub fallback_funded: u64,
}

/// State shared by the handle and its background tasks.
#[derive(Debug, Default)]
struct Shared {
    round_trips: AtomicU64,
    failures: AtomicU64,
    leases: AtomicU64,
    leased: AtomicU64,
    pauses_sent: AtomicU64,
    pauses_taken: AtomicU64,
    recreated: AtomicU64,
    fallbacks: AtomicU64,
    fallback_funded: AtomicU64,
    /// The newest shared gate epoch this process knows of.
    known_epoch: AtomicU64,
    degraded: AtomicBool,
    /// Times the listener's subscription ended (Redis restarted, or the connection broke):
    /// a booking made before may be owed by a quota that no longer knows it.
    lost_contact: AtomicU64,
    stop: tokio::sync::Notify,
    stopping: AtomicBool,
}

/// A [`Limiter`] whose quota is shared, through Redis, with every other process using the
/// same name (see the crate docs).
///
/// Use [`SharedLimiter::limiter`] as any limiter: reserve, commit, hand it to an HTTP or
/// OpenAI client. Call [`SharedLimiter::shutdown`] to return what it holds unspent.
pub struct SharedLimiter {
    limiter: Limiter,
    shared: Arc<Shared>,
    driver: Option<JoinHandle<()>>,
    listener: JoinHandle<()>,
}

impl SharedLimiter {
    /// Joins the quota `config.name` on the Redis at `url` (e.g. `redis://127.0.0.1/`, or
    /// `rediss://` for TLS with the `tls` feature, on by default). Any URL the `redis`
    /// crate reads works: a server, a managed Redis, a proxy, a Sentinel-managed primary's
    /// address. Call it inside a tokio runtime.
    ///
    /// A Redis that does not answer is not an error: the limiter admits nothing until its
    /// first lease (a process that never held one has no share of its own), then leases
    /// as usual. A malformed URL or configuration is.
    pub async fn connect(url: &str, config: SharedConfig) -> Result<SharedLimiter, Error> {
        config.validate()?;
        let client = redis::Client::open(url)?;
        SharedLimiter::join(Backend::Single(client), config)
    }

    /// [`SharedLimiter::connect`] to a `rediss://` URL whose server presents a certificate
    /// signed by `root_ca_pem` (PEM: one or more certificates) instead of a root the
    /// system trusts. A managed Redis with a public certificate needs only `connect` with
    /// its `rediss://` URL.
    #[cfg(feature = "tls")]
    pub async fn connect_tls(
        url: &str,
        root_ca_pem: &[u8],
        config: SharedConfig,
    ) -> Result<SharedLimiter, Error> {
        config.validate()?;
        let certificates =
            redis::TlsCertificates { client_tls: None, root_cert: Some(root_ca_pem.to_vec()) };
        let client = redis::Client::build_with_tls(url, certificates)?;
        SharedLimiter::join(Backend::Single(client), config)
    }

    /// Joins the quota `config.name` on the primary that the Redis Sentinels at `sentinels`
    /// (URLs of Sentinel nodes, e.g. `redis://10.0.0.5:26379/`) name for `service` (the
    /// name in their `sentinel monitor` line). Call it inside a tokio runtime.
    ///
    /// The primary is asked for at every new connection: after a failover, the first call
    /// to the old primary fails, the process runs on its fallback share for that moment,
    /// and the next lease goes to the new primary. A replica promoted before it received
    /// the last writes holds the quota as replication left it (ADR 0029).
    pub async fn connect_sentinel(
        sentinels: &[&str],
        service: &str,
        config: SharedConfig,
    ) -> Result<SharedLimiter, Error> {
        config.validate()?;
        if sentinels.is_empty() {
            return Err(Error::Config("Sentinel needs at least one Sentinel's URL".into()));
        }
        // A `String` suits the `redis` crate's signature with its rustls feature and without.
        #[allow(clippy::unnecessary_to_owned)]
        let client = redis::sentinel::SentinelClient::build(
            sentinels.to_vec(),
            service.to_owned(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )?;
        SharedLimiter::join(Backend::Sentinel(Arc::new(tokio::sync::Mutex::new(client))), config)
    }

    /// Joins the quota `config.name` on a Redis Cluster reached through `nodes` (some or
    /// all of its nodes, e.g. `redis://10.0.0.1:7000/`). Call it inside a tokio runtime.
    ///
    /// The quota's keys share one hash slot (`{name}`), so its scripts run on the node that
    /// owns that slot, atomically as on one server. When that node fails, the processes
    /// run on their fallback share (as with one Redis gone) until the cluster serves the
    /// slot again, from a promoted replica or the node restarted; a replica that had not
    /// received the last writes starts the quota afresh, as a restarted Redis does, and
    /// each process counts it in [`SharedStats::recreated`] (ADR 0029).
    pub async fn connect_cluster(
        nodes: &[&str],
        config: SharedConfig,
    ) -> Result<SharedLimiter, Error> {
        config.validate()?;
        if nodes.is_empty() {
            return Err(Error::Config("a cluster needs at least one node's URL".into()));
        }
        let servers =
            nodes.iter().map(|url| redis::Client::open(*url)).collect::<Result<Vec<_>, _>>()?;
        let client = redis::cluster::ClusterClient::new(nodes.to_vec())?;
        SharedLimiter::join(Backend::Cluster { client, nodes: servers }, config)
    }

    /// Starts the local limiter and the tasks that keep it in the quota on `backend`.
    fn join(backend: Backend, config: SharedConfig) -> Result<SharedLimiter, Error> {
        let buckets = config
            .limits
            .iter()
            .map(|limit| TokenBucket::funded(limit.rate()?, limit.capacity(), Instant::ZERO))
            .collect::<Result<Vec<_>, _>>()?;
        // Rates are the shared bucket's business: no local adaptation.
        let limiter =
            ratebucket_tokio::limiter_with(buckets, ArbiterConfig::default().with_adapt(None))?
                .with_name(config.name.clone());
        for (dimension, limit) in config.limits.iter().enumerate() {
            if let Some(name) = limit.name() {
                limiter.name_dimension(dimension, name)?;
            }
        }
        let shared = Arc::new(Shared::default());
        let id = listener::process_id();
        let listener = tokio::spawn(listener::listen(
            backend.clone(),
            script::Keys::new(&config.name),
            id.clone(),
            limiter.clone(),
            Arc::clone(&shared),
        ));
        let driver = driver::Driver::new(id, backend, config, limiter.clone(), Arc::clone(&shared));
        let driver = tokio::spawn(driver.run());
        Ok(SharedLimiter { limiter, shared, driver: Some(driver), listener })
    }

    /// The local limiter: reserve from it as from any [`Limiter`].
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Whether Redis is out of reach: the process is on its fallback share, or (never
    /// having held a lease, or Redis only slow so far) admits nothing beyond what it holds.
    pub fn is_degraded(&self) -> bool {
        self.shared.degraded.load(Ordering::Relaxed)
    }

    /// What it has done so far.
    pub fn stats(&self) -> SharedStats {
        let s = &self.shared;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SharedStats {
            round_trips: get(&s.round_trips),
            failures: get(&s.failures),
            leases: get(&s.leases),
            leased: get(&s.leased),
            pauses_sent: get(&s.pauses_sent),
            pauses_taken: get(&s.pauses_taken),
            recreated: get(&s.recreated),
            fallbacks: get(&s.fallbacks),
            fallback_funded: get(&s.fallback_funded),
        }
    }

    /// Stops leasing, returns what the process holds unspent to the shared bucket, and
    /// leaves the quota (its demand no longer counts). Reservations already granted stay
    /// valid; new ones wait for funds that no longer come.
    pub async fn shutdown(mut self) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        self.shared.stop.notify_one();
        if let Some(driver) = self.driver.take() {
            let _ = driver.await;
        }
    }
}

impl Drop for SharedLimiter {
    fn drop(&mut self) {
        // Without `shutdown`, what is held unspent lapses with the lease instead.
        if let Some(driver) = &self.driver {
            driver.abort();
        }
        self.listener.abort();
    }
}

impl fmt::Debug for SharedLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedLimiter")
            .field("limiter", &self.limiter)
            .field("stats", &self.stats())
            .field("degraded", &self.is_degraded())
            .finish()
    }
}

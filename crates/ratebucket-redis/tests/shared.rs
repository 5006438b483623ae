//! Shared limiters in one process against a real redis-server: leases, the shared gate,
//! shared learning, and falling back when Redis goes away.

use std::time::Duration;

use ratebucket_redis::server::RedisServer;
use ratebucket_redis::{Limit, SharedConfig, SharedLimiter};

fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (see the README's test section)")
}

fn config(name: &str) -> SharedConfig {
    // 50 requests/s with a burst of 10, 5,000 tokens/s with a burst of 1,000.
    SharedConfig::new(
        name,
        [
            Limit::per_second(50).with_capacity(10).named("requests"),
            Limit::per_second(5_000).with_capacity(1_000).named("tokens"),
        ],
    )
    .lease_period(Duration::from_millis(200))
}

async fn hget(url: &str, key: &str, field: &str) -> Option<String> {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    redis::cmd("HGET").arg(key).arg(field).query_async(&mut con).await.unwrap()
}

/// Waits (at most 5 s) until `listeners` processes listen on `channel` through the server
/// at `url`: a pause announced before a process subscribes reaches it only at its next
/// lease (or its own first 429), which these tests do not wait for.
async fn listening(url: &str, channel: &str, listeners: u64) {
    let client = redis::Client::open(url).unwrap();
    let mut con = client.get_multiplexed_async_connection().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, count): (String, u64) =
            redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query_async(&mut con).await.unwrap();
        if count >= listeners {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{count} of {listeners} listening on {channel}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `f` every 10 ms until it holds, for at most `limit`.
async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    f()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_funds_the_local_limiter_and_shutdown_returns_the_rest() {
    let redis = server();
    let shared = SharedLimiter::connect(&redis.url(), config("funds")).await.unwrap();
    let reservation =
        tokio::time::timeout(Duration::from_secs(5), shared.limiter().reserve(&[1, 300]))
            .await
            .expect("a lease funds the first reservation")
            .unwrap();
    reservation.commit(&[1, 100]).unwrap();
    let stats = shared.stats();
    assert!(stats.round_trips >= 1 && stats.leases >= 1, "{stats:?}");
    assert!(!shared.is_degraded());
    // The lease took the reservation's cost from the shared bucket (it starts full).
    let level: f64 =
        hget(&redis.url(), "ratebucket:{funds}:bucket", "l2").await.unwrap().parse().unwrap();
    assert!(level <= 1_000.0 - 300.0 + 5_000.0 * 0.5, "level {level}");
    shared.shutdown().await;
    // Shutting down returned what was held (the 200 refunded at least), and the process
    // left the record of demand.
    let after: f64 =
        hget(&redis.url(), "ratebucket:{funds}:bucket", "l2").await.unwrap().parse().unwrap();
    assert!(after >= 1_000.0 - 100.0 - 1.0, "after shutdown {after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_seen_by_one_process_pauses_every_other_once() {
    let redis = server();
    let a = SharedLimiter::connect(&redis.url(), config("gate")).await.unwrap();
    let b = SharedLimiter::connect(&redis.url(), config("gate")).await.unwrap();
    // Both are known to Redis before the pause, and listen for it.
    for limiter in [&a, &b] {
        let r = limiter.limiter().reserve(&[1, 10]).await.unwrap();
        r.commit(&[1, 10]).unwrap();
    }
    listening(&redis.url(), "ratebucket:{gate}:gate", 2).await;
    let sent = a.limiter().stamp_send();
    a.limiter().throttle(sent, Some(Duration::from_secs(3)));
    assert!(
        eventually(Duration::from_secs(2), || b.limiter().snapshot().paused_for.is_some()).await,
        "the other process paused"
    );
    assert_eq!(b.stats().pauses_taken, 1);
    assert!(eventually(Duration::from_secs(1), || a.stats().pauses_sent == 1).await);
    // The same wave announced twice pauses nobody twice.
    let sent = b.limiter().stamp_send();
    b.limiter().throttle(sent, Some(Duration::from_secs(3)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    eprintln!("A {:?}\nB {:?}", a.stats(), b.stats());
    assert_eq!(b.stats().pauses_sent, 0, "{:?}", b.stats());
    assert_eq!(a.stats().pauses_taken, 0, "{:?}", a.stats());
}

/// Eight processes resuming from one pause (a second long) are spread over the first lease
/// period after it, each at a point of its own, instead of every one asking for its share
/// (and sending) at the pause's first instant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_resuming_from_one_pause_are_spread_over_its_first_refill() {
    let redis = server();
    let period = Duration::from_secs(1);
    let mut fleet = Vec::new();
    for _ in 0..8 {
        let config = config("resume").lease_period(period);
        fleet.push(SharedLimiter::connect(&redis.url(), config).await.unwrap());
    }
    for process in &fleet {
        let r = process.limiter().reserve(&[1, 10]).await.unwrap();
        r.commit(&[1, 10]).unwrap();
    }
    listening(&redis.url(), "ratebucket:{resume}:gate", 8).await;
    let pause = Duration::from_secs(1);
    let first = fleet[0].limiter();
    first.throttle(first.stamp_send(), Some(pause));
    let paused_at = tokio::time::Instant::now();
    for process in &fleet {
        assert!(
            eventually(Duration::from_secs(1), || process
                .limiter()
                .snapshot()
                .paused_for
                .is_some())
            .await,
            "every process paused"
        );
    }
    // One call each, asked for during the pause.
    let calls: Vec<_> = fleet
        .iter()
        .map(|process| {
            let limiter = process.limiter().clone();
            tokio::spawn(async move {
                let r = limiter.reserve(&[1, 10]).await.unwrap();
                r.commit(&[1, 10]).unwrap();
                tokio::time::Instant::now()
            })
        })
        .collect();
    let mut resumed = Vec::new();
    for call in calls {
        resumed.push(call.await.unwrap());
    }
    let earliest = *resumed.iter().min().unwrap();
    let latest = *resumed.iter().max().unwrap();
    assert!(
        earliest >= paused_at + pause - Duration::from_millis(50),
        "none before the pause's end"
    );
    assert!(
        latest <= paused_at + pause + period + Duration::from_millis(500),
        "all within its first lease period"
    );
    // Eight points drawn over a second: all within a tenth of it has odds below one in a
    // million; every process at the first instant (as before) spreads over a few ticks.
    let spread = latest - earliest;
    assert!(spread >= period / 10, "resumed within {spread:?} of one another");
    for process in fleet {
        process.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lower_limit_learned_by_one_process_lowers_it_for_all() {
    let redis = server();
    let a = SharedLimiter::connect(&redis.url(), config("learn")).await.unwrap();
    let b = SharedLimiter::connect(&redis.url(), config("learn")).await.unwrap();
    let rate = ratebucket_tokio::core::Rate::per_second(2_000).unwrap();
    a.limiter().set_limit(1, Some(rate), Some(400)).unwrap();
    // B learns it from its next lease.
    let reserve = async {
        loop {
            let r = b.limiter().reserve(&[1, 50]).await.unwrap();
            r.commit(&[1, 50]).unwrap();
            if b.limiter().dimension(1).map(|v| v.state.capacity) == Some(400) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), reserve)
        .await
        .expect("the lower capacity reached the other process");
    assert_eq!(
        b.limiter().dimension(1).map(|v| v.state.rate).map(|r| r.per_second_f64()),
        Some(2_000.0)
    );
    assert_eq!(hget(&redis.url(), "ratebucket:{learn}:bucket", "c2").await.as_deref(), Some("400"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_redis_a_process_paces_on_its_fallback_share_and_rejoins() {
    let mut redis = server();
    let config = config("fallback").expected_processes(5).timeout(Duration::from_millis(100));
    let shared = SharedLimiter::connect(&redis.url(), config).await.unwrap();
    let r = shared.limiter().reserve(&[1, 10]).await.unwrap();
    r.commit(&[1, 10]).unwrap();
    redis.kill().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || shared.is_degraded()).await,
        "noticed Redis is gone"
    );
    // The fallback share is a fifth: 10 requests/s, a burst of 2. Count grants for 2 s.
    let start = tokio::time::Instant::now();
    let mut granted = 0u64;
    while start.elapsed() < Duration::from_secs(2) {
        if let Ok(Ok(r)) =
            tokio::time::timeout(Duration::from_millis(50), shared.limiter().reserve(&[1, 10]))
                .await
        {
            r.commit(&[1, 10]).unwrap();
            granted += 1;
        }
    }
    // What it held from its lease (at most a lease period of demand) plus the share.
    assert!(granted >= 10, "paced on, {granted} grants");
    assert!(granted <= 2 + 10 * 2 + 12, "{granted} grants in 2 s on a fifth of 50/s");
    redis.restart().unwrap();
    assert!(eventually(Duration::from_secs(5), || !shared.is_degraded()).await, "rejoined");
    let r = shared.limiter().reserve(&[1, 10]).await.unwrap();
    r.commit(&[1, 10]).unwrap();
    let stats = shared.stats();
    assert_eq!(stats.recreated, 1, "{stats:?}");
    assert!(stats.fallbacks >= 1 && stats.failures >= 1, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_configuration_is_refused_with_a_reason() {
    let bad = SharedConfig::new("", [Limit::per_second(1)]);
    let error = SharedLimiter::connect("redis://127.0.0.1:1/", bad).await.unwrap_err();
    assert!(error.to_string().contains("name"), "{error}");
    let none = SharedConfig::new("x", []);
    assert!(SharedLimiter::connect("redis://127.0.0.1:1/", none).await.is_err());
    let zero = SharedConfig::new("x", [Limit::per_second(1)]).expected_processes(0);
    assert!(SharedLimiter::connect("redis://127.0.0.1:1/", zero).await.is_err());
    let url =
        SharedLimiter::connect("not a url", SharedConfig::new("x", [Limit::per_second(1)])).await;
    assert!(url.is_err());
}

/// Grants `limiter`'s callers collect over `span`, 20 of them reserving in a loop.
async fn grants_over(limiter: &ratebucket_redis::Limiter, span: Duration) -> u64 {
    let granted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let callers: Vec<_> = (0..20)
        .map(|_| {
            let (limiter, granted) = (limiter.clone(), granted.clone());
            tokio::spawn(async move {
                loop {
                    let r = limiter.reserve(&[1, 10]).await.unwrap();
                    r.commit(&[1, 10]).unwrap();
                    granted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    tokio::time::sleep(span).await;
    for caller in callers {
        caller.abort();
    }
    granted.load(std::sync::atomic::Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_gone_quiet_stops_counting_after_one_lease_period() {
    let redis = server();
    // A lease period of two seconds: a stale record would count for three (six seconds).
    let config = || config("quiet").lease_period(Duration::from_secs(2));
    let a = SharedLimiter::connect(&redis.url(), config()).await.unwrap();
    let b = SharedLimiter::connect(&redis.url(), config()).await.unwrap();
    // Both want far more than the 50 requests/s there are.
    let (a_grants, b_grants) = tokio::join!(
        grants_over(a.limiter(), Duration::from_secs(2)),
        grants_over(b.limiter(), Duration::from_secs(2)),
    );
    eprintln!("sharing: {a_grants} and {b_grants} grants in 2 s");
    // A vanishes without leaving (a crash): its record, wanting more, stays until it expires.
    drop(a);
    // From one lease period on (plus a margin), B alone is counted and gets the whole rate.
    tokio::time::sleep(Duration::from_millis(2_400)).await;
    let span = Duration::from_millis(2_500);
    let alone = grants_over(b.limiter(), span).await;
    eprintln!("alone: {alone} grants in {span:?} (the whole rate is 50/s)");
    // Counted with a stale A, B's share would be half the rate: ~63 in 2.5 s.
    assert!(alone >= 110, "{alone} grants in {span:?}");
}

/// More processes than the quota has units in a lease period: a fair share is below one
/// request, yet each process's first waiter is granted in turn, and the quota is spent at
/// its rate (never faster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_processes_than_units_each_get_their_turn() {
    const PROCESSES: usize = 24;
    let redis = server();
    // 10 requests/s with a burst of 5; 1,000 tokens/s with a burst of 300. A fair share of
    // the requests is 5 / 24 of one.
    let config = SharedConfig::new(
        "crowd",
        [
            Limit::per_second(10).with_capacity(5).named("requests"),
            Limit::per_second(1_000).with_capacity(300).named("tokens"),
        ],
    )
    .lease_period(Duration::from_millis(200));
    let mut fleet = Vec::new();
    for _ in 0..PROCESSES {
        let shared = SharedLimiter::connect(&redis.url(), config.clone()).await.unwrap();
        fleet.push(shared);
    }
    let started = std::time::Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    for shared in &fleet {
        let limiter = shared.limiter().clone();
        calls.spawn(async move {
            limiter.acquire(&[1, 100]).await.expect("granted");
            started.elapsed()
        });
    }
    let mut last = Duration::ZERO;
    let all = async {
        while let Some(done) = calls.join_next().await {
            last = last.max(done.expect("no panic"));
        }
    };
    // Each share covers one request after 24 / 10 s, and one call's tokens as soon: every
    // process is granted within that and a lease period, plus room for a loaded machine.
    tokio::time::timeout(Duration::from_secs(10), all).await.expect("every process gets its turn");
    // 2,400 tokens from a bucket of 300 refilling 1,000 a second: 2.1 s at the least.
    assert!(last >= Duration::from_millis(2_000), "faster than the quota allows: {last:?}");
    // The stated wait: n·u/R = 24 requests at 10 a second (and 2,400 tokens at 1,000),
    // from each process's first lease, with a second of room for a loaded machine.
    assert!(last <= Duration::from_millis(2_400 + 1_000), "slower than the stated wait: {last:?}");
    let stats: Vec<_> = fleet.iter().map(|s| s.stats()).collect();
    let trips: u64 = stats.iter().map(|s| s.round_trips).sum();
    eprintln!("{PROCESSES} processes done in {last:?}, {trips} round trips for {PROCESSES} grants");
    // A waiter the quota cannot serve yet is booked for when it can: one round trip each.
    assert!(trips <= PROCESSES as u64, "{trips} round trips for {PROCESSES} grants");
    for shared in fleet {
        shared.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_on_a_cluster_lives_on_the_node_that_owns_its_slot() {
    use ratebucket_redis::server::{RedisCluster, command};
    let mut cluster = RedisCluster::start(3).expect("a local cluster of three masters");
    let urls = cluster.urls();
    let nodes: Vec<&str> = urls.iter().map(String::as_str).collect();
    let a = SharedLimiter::connect_cluster(&nodes, config("clustered")).await.unwrap();
    // Given one node only, the client finds the others.
    let b = SharedLimiter::connect_cluster(&nodes[2..], config("clustered")).await.unwrap();
    for shared in [&a, &b] {
        let reservation =
            tokio::time::timeout(Duration::from_secs(5), shared.limiter().reserve(&[1, 100]))
                .await
                .expect("a lease from the cluster funds the reservation")
                .unwrap();
        reservation.commit(&[1, 100]).unwrap();
        assert!(!shared.is_degraded());
    }
    let bucket = "ratebucket:{clustered}:bucket";
    let procs = "ratebucket:{clustered}:procs";
    let owner = cluster.owner_of(bucket).unwrap();
    assert_eq!(owner, cluster.owner_of(procs).unwrap(), "one slot");
    for (i, node) in cluster.nodes().iter().enumerate() {
        let held = command(node, &["EXISTS", bucket]);
        if i == owner {
            assert_eq!(held.unwrap(), "1", "the owner holds the quota");
        } else {
            // Any other node redirects: the key is not there.
            let why = held.unwrap_err().to_string();
            assert!(why.contains("MOVED"), "{why}");
        }
    }
    // Two processes were counted on that one node.
    let counted = command(&cluster.nodes()[owner], &["HLEN", procs]).unwrap();
    assert!(counted.parse::<u64>().unwrap() >= 2, "{counted}");
    // A pause announced on the slot's node reaches a process listening through another.
    listening(&urls[2], "ratebucket:{clustered}:gate", 1).await;
    let sent = a.limiter().stamp_send();
    a.limiter().throttle(sent, Some(Duration::from_secs(3)));
    assert!(
        eventually(Duration::from_secs(2), || b.limiter().snapshot().paused_for.is_some()).await,
        "the other process paused"
    );
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_over_tls_is_leased_from_a_server_whose_certificate_is_trusted() {
    use ratebucket_sim::tls::TestCertificate;
    let certificate = TestCertificate::generate().expect("a certificate");
    let dir = std::env::temp_dir().join(format!("ratebucket-redis-tls-{}", fastrand::u64(..)));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    std::fs::write(&cert, certificate.pem()).unwrap();
    std::fs::write(&key, certificate.key_pem()).unwrap();
    let redis = RedisServer::start_tls(&cert, &key).expect("redis-server speaking TLS");
    let trusted = SharedLimiter::connect_tls(
        &redis.tls_url(),
        certificate.pem().as_bytes(),
        config("over-tls").timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let reservation =
        tokio::time::timeout(Duration::from_secs(5), trusted.limiter().reserve(&[1, 100]))
            .await
            .expect("a lease over TLS funds the reservation")
            .unwrap();
    reservation.commit(&[1, 100]).unwrap();
    assert!(!trusted.is_degraded(), "{:?}", trusted.stats());
    assert!(trusted.stats().leases >= 1, "{:?}", trusted.stats());
    // Without the private CA the server's certificate is refused: no lease, the fallback.
    let untrusted = SharedLimiter::connect(
        &redis.tls_url(),
        config("over-tls").timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let _ =
        tokio::time::timeout(Duration::from_millis(500), untrusted.limiter().reserve(&[1, 100]))
            .await;
    assert!(
        eventually(Duration::from_secs(5), || untrusted.is_degraded()).await,
        "an untrusted certificate is not leased from: {:?}",
        untrusted.stats()
    );
    assert_eq!(untrusted.stats().leases, 0);
    trusted.shutdown().await;
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_behind_sentinel_is_leased_from_the_primary_it_names() {
    let primary = server();
    let sentinel = RedisServer::start_sentinel(&primary, "quota-primary").expect("a Sentinel");
    let shared = SharedLimiter::connect_sentinel(
        &[&sentinel.url()],
        "quota-primary",
        config("behind-sentinel"),
    )
    .await
    .unwrap();
    let reservation =
        tokio::time::timeout(Duration::from_secs(5), shared.limiter().reserve(&[1, 100]))
            .await
            .expect("a lease from the primary funds the reservation")
            .unwrap();
    reservation.commit(&[1, 100]).unwrap();
    assert!(!shared.is_degraded(), "{:?}", shared.stats());
    // The quota lives on the primary the Sentinel named.
    let level = hget(&primary.url(), "ratebucket:{behind-sentinel}:bucket", "l2").await;
    assert!(level.is_some(), "the primary holds the quota");
    // A service the Sentinels do not know is no primary: the process, which never held a
    // lease, stays out of reach and admits nothing.
    let unknown = SharedLimiter::connect_sentinel(
        &[&sentinel.url()],
        "no-such-service",
        config("behind-sentinel").timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let nothing =
        tokio::time::timeout(Duration::from_millis(800), unknown.limiter().reserve(&[1, 100]))
            .await;
    assert!(nothing.is_err(), "granted without a lease");
    assert!(
        eventually(Duration::from_secs(5), || unknown.is_degraded()).await,
        "{:?}",
        unknown.stats()
    );
    assert_eq!(unknown.stats().fallbacks, 0, "no fallback share before a first lease");
    shared.shutdown().await;
}

#[test]
fn a_restart_waits_out_a_moment_in_which_another_socket_holds_the_port() {
    let mut redis = server();
    redis.kill().unwrap();
    // Something else binds the port in the gap, as another process's socket can.
    let holder =
        std::net::TcpListener::bind(redis.addr()).expect("the port is free after the kill");
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(500));
        drop(holder);
    });
    redis.restart().expect("the server starts once the port is given back");
    release.join().unwrap();
    let client = redis::Client::open(redis.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
}

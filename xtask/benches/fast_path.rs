//! Criterion microbenchmarks of the limiter's hot paths, each beside governor's `check()`.
//!
//! `cargo xtask microbench` runs this and prints the side-by-side ratios from criterion's
//! estimates; `cargo bench -p xtask --bench fast_path` runs it alone.
//!
//! - `uncontended/*`: one reserve + commit over two dimensions against one `check()` on a
//!   fake and on the default clock: through the limiter's express lane on a virtual clock
//!   (`try_reserve`), through the tokio handle (`reserve().await`, the lane too), and the
//!   arbiter alone on the core's virtual clock (ticketed, no lane).
//! - `contended/*`: eight tasks on one limiter on a multi-threaded tokio runtime; the time
//!   per operation is the inverse of the pool's throughput.
//! - `queued/*`: the cost of one grant with N waiters behind it.
//! - `percall/*`: what `Fetcher` and `PaceLayer` add to a call whose limits never bind,
//!   over a transport (a tower service) that answers at once, called bare side by side.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ratebucket_core::{Arbiter, ArbiterConfig, Caller, Event, Instant, Rate, TokenBucket};
use ratebucket_rt::{BoxFuture, Limiter, Timer};

/// Tasks sharing one limiter in the contended figures.
const TASKS: u64 = 8;

/// Two dimensions roomy enough that every reservation is granted on arrival.
fn roomy_buckets() -> Vec<TokenBucket> {
    let requests =
        TokenBucket::new(Rate::per_second(1 << 40).expect("rate"), 1 << 40, Instant::ZERO);
    let tokens = TokenBucket::new(Rate::per_second(1 << 50).expect("rate"), 1 << 50, Instant::ZERO);
    vec![requests.expect("bucket"), tokens.expect("bucket")]
}

fn drain(arbiter: &mut Arbiter) -> usize {
    let mut granted = 0;
    while let Some(event) = arbiter.poll_event() {
        if matches!(event, Event::Granted { .. }) {
            granted += 1;
        }
        black_box(event);
    }
    granted
}

/// A virtual clock for a [`Limiter`]: it never moves, nothing sleeps and no driver runs
/// (every reservation here is granted on arrival).
struct Virtual(StdInstant);

impl Timer for Virtual {
    fn now(&self) -> StdInstant {
        self.0
    }
    fn sleep_until(&self, _deadline: StdInstant) -> BoxFuture {
        Box::pin(std::future::pending())
    }
    fn spawn(&self, task: BoxFuture) {
        drop(task);
    }
}

fn governor_default() -> governor::DefaultDirectRateLimiter {
    governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MAX))
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");
    group.bench_function("ratebucket_virtual", |b| {
        b.iter_custom(|iters| {
            let timer = Virtual(StdInstant::now());
            let limiter = Limiter::with_timer(roomy_buckets(), ArbiterConfig::default(), timer)
                .expect("limiter");
            let start = StdInstant::now();
            for _ in 0..iters {
                let reservation = limiter.try_reserve(black_box(&[1, 300])).expect("fits");
                reservation.commit(black_box(&[1, 120])).expect("granted");
            }
            start.elapsed()
        })
    });
    group.bench_function("arbiter_virtual", |b| {
        b.iter_custom(|iters| {
            let config = ArbiterConfig::default();
            let mut arbiter =
                Arbiter::new(roomy_buckets(), config, Instant::ZERO).expect("arbiter");
            let start = StdInstant::now();
            for i in 0..iters {
                let now = Instant::from_nanos(i * 100);
                let ticket = arbiter.reserve(black_box(&[1, 300]), now).expect("fits");
                drain(&mut arbiter);
                arbiter.commit(ticket, black_box(&[1, 120]), now).expect("granted");
                drain(&mut arbiter);
            }
            start.elapsed()
        })
    });
    group.bench_function("governor_fake_clock", |b| {
        b.iter_custom(|iters| {
            let quota = governor::Quota::per_second(NonZeroU32::MAX);
            let clock = governor::clock::FakeRelativeClock::default();
            let limiter = governor::RateLimiter::direct_with_clock(quota, clock.clone());
            let start = StdInstant::now();
            for _ in 0..iters {
                clock.advance(Duration::from_nanos(100));
                let _ = black_box(limiter.check());
            }
            start.elapsed()
        })
    });
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    group.bench_function("ratebucket_tokio", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let limiter = ratebucket_tokio::limiter(roomy_buckets()).expect("limiter");
                let start = StdInstant::now();
                for _ in 0..iters {
                    let reservation = limiter.reserve(black_box(&[1, 300])).await.expect("fits");
                    reservation.commit(black_box(&[1, 120])).expect("granted");
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("governor_default_clock", |b| {
        b.iter_custom(|iters| {
            let limiter = governor_default();
            let start = StdInstant::now();
            for _ in 0..iters {
                let _ = black_box(limiter.check());
            }
            start.elapsed()
        })
    });
    group.finish();
}

/// Runs `TASKS` tasks, each running `ops(shared, iters / TASKS)`, on a multi-threaded
/// runtime and returns the wall time for all of them.
fn on_pool<S, F, Fut>(
    runtime: &tokio::runtime::Runtime,
    iters: u64,
    shared: Arc<S>,
    ops: F,
) -> Duration
where
    S: Send + Sync + 'static,
    F: Fn(Arc<S>, u64) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let per_task = iters.div_ceil(TASKS);
    runtime.block_on(async move {
        let start = StdInstant::now();
        let tasks: Vec<_> =
            (0..TASKS).map(|_| tokio::spawn(ops(Arc::clone(&shared), per_task))).collect();
        for task in tasks {
            task.await.expect("task");
        }
        start.elapsed()
    })
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_time().build().expect("runtime");
    group.bench_function("ratebucket_tokio", |b| {
        b.iter_custom(|iters| {
            let limiter = runtime.block_on(async {
                Arc::new(ratebucket_tokio::limiter(roomy_buckets()).expect("limiter"))
            });
            on_pool(&runtime, iters, limiter, |limiter, ops| async move {
                for _ in 0..ops {
                    let reservation = limiter.reserve(black_box(&[1, 300])).await.expect("fits");
                    reservation.commit(black_box(&[1, 120])).expect("granted");
                }
            })
        })
    });
    group.bench_function("governor_default_clock", |b| {
        b.iter_custom(|iters| {
            on_pool(&runtime, iters, Arc::new(governor_default()), |limiter, ops| async move {
                for _ in 0..ops {
                    let _ = black_box(limiter.check());
                }
            })
        })
    });
    group.finish();
}

/// The tenants queued waiters take turns among (each its own fair share).
const TENANTS: u32 = 100;

/// Grants made, untimed, before a queue's grants are measured.
const WARM_GRANTS: u64 = 10_000;

/// One request per microsecond; the queue is filled to `queued` from 100 tenants in turn,
/// then every grant is followed by a new waiter, so each measured grant happens with
/// `queued` waiters behind.
fn queued(c: &mut Criterion) {
    let mut group = c.benchmark_group("queued");
    group.sample_size(10);
    for queued in [10usize, 10_000, 1_000_000] {
        group.bench_with_input(BenchmarkId::from_parameter(queued), &queued, |b, &queued| {
            b.iter_custom(|grants| {
                let requests =
                    TokenBucket::new(Rate::per_second(1_000_000).expect("rate"), 1, Instant::ZERO);
                let tokens = TokenBucket::new(
                    Rate::per_second(1 << 40).expect("rate"),
                    1 << 40,
                    Instant::ZERO,
                );
                let buckets = vec![requests.expect("bucket"), tokens.expect("bucket")];
                let config = ArbiterConfig::default();
                let mut arbiter = Arbiter::new(buckets, config, Instant::ZERO).expect("arbiter");
                let mut next = 0u32;
                let mut caller = move || {
                    next = next.wrapping_add(1);
                    Caller::tenant(next % TENANTS)
                };
                for _ in 0..queued {
                    arbiter.reserve_for(caller(), &[1, 10], None, Instant::ZERO).expect("fits");
                }
                drain(&mut arbiter);
                // The first grants after the queue is built meet memory written long
                // before (page faults, cold caches): a steady queue's grants are measured.
                let mut step = |arbiter: &mut Arbiter, grants: u64| {
                    let mut done = 0;
                    while done < grants {
                        let at = arbiter.poll_timeout().expect("someone waits");
                        arbiter.handle_timeout(at);
                        let granted = drain(arbiter);
                        for _ in 0..granted {
                            arbiter.reserve_for(caller(), &[1, 10], None, at).expect("fits");
                        }
                        done += granted as u64;
                    }
                };
                step(&mut arbiter, WARM_GRANTS);
                let start = StdInstant::now();
                step(&mut arbiter, grants);
                start.elapsed()
            })
        });
    }
    group.finish();
}

/// A transport that answers at once: 200, a small JSON body and a provider's rate-limit
/// headers (so the fold is measured too).
struct Instantly;

/// The answer [`Instantly`] gives.
fn answer() -> http::Response<http_body_util::Full<bytes::Bytes>> {
    http::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("x-ratelimit-limit-requests", "10000")
        .header("x-ratelimit-remaining-requests", "9999")
        .header("x-ratelimit-reset-requests", "6ms")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
        .expect("response")
}

impl ratebucket_http::Transport for Instantly {
    fn send(&self, _request: http::Request<bytes::Bytes>) -> ratebucket_http::SendFuture<'_> {
        Box::pin(async { Ok(answer().map(ratebucket_http::box_body)) })
    }
}

/// The same answer from a tower service, for `PaceLayer`.
#[derive(Clone, Copy)]
struct InstantService;

impl tower::Service<http::Request<http_body_util::Full<bytes::Bytes>>> for InstantService {
    type Response = http::Response<http_body_util::Full<bytes::Bytes>>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(
        &mut self,
        _request: http::Request<http_body_util::Full<bytes::Bytes>>,
    ) -> Self::Future {
        std::future::ready(Ok(answer()))
    }
}

fn service_request() -> http::Request<http_body_util::Full<bytes::Bytes>> {
    request().map(http_body_util::Full::new)
}

fn request() -> http::Request<bytes::Bytes> {
    http::Request::post("http://127.0.0.1:9/v1/chat/completions")
        .header("content-type", "application/json")
        .body(bytes::Bytes::from_static(b"{\"messages\":[]}"))
        .expect("request")
}

/// A limiter with one roomy dimension: a call costs one request, and is never held back.
fn one_roomy_limiter() -> Limiter {
    let mut buckets = roomy_buckets();
    buckets.truncate(1);
    ratebucket_tokio::limiter(buckets).expect("limiter")
}

/// One call of `service` (cloned, so the same service serves every call), body gathered.
async fn call<S>(service: &S) -> bytes::Bytes
where
    S: tower::Service<
            http::Request<http_body_util::Full<bytes::Bytes>>,
            Response = http::Response<http_body_util::Full<bytes::Bytes>>,
        > + Clone,
    S::Error: std::fmt::Debug,
{
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let response = service.clone().oneshot(service_request()).await.expect("answers");
    let body = response.into_body().collect().await.expect("body");
    body.to_bytes()
}

fn percall(c: &mut Criterion) {
    use http_body_util::BodyExt;
    use ratebucket_http::{FetchConfig, Fetcher, Transport};
    let mut group = c.benchmark_group("percall");
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    group.bench_function("bare_transport", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let start = StdInstant::now();
                for _ in 0..iters {
                    let response = Instantly.send(request()).await.expect("answers");
                    let body = response.into_body().collect().await.expect("body");
                    black_box(body.to_bytes());
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("fetcher", |b| {
        b.iter_custom(|iters| {
            runtime.block_on(async {
                let fetcher = Fetcher::new(Instantly, one_roomy_limiter(), FetchConfig::default());
                let start = StdInstant::now();
                for _ in 0..iters {
                    black_box(fetcher.fetch(request()).await.expect("answers"));
                }
                start.elapsed()
            })
        })
    });
    // The same pair for a tower service: bare, then through `PaceLayer`.
    let paced = {
        use tower::Layer;
        // The limiter's driver is spawned on the runtime that makes it.
        let _guard = runtime.enter();
        let layer =
            ratebucket_http::tower::PaceLayer::new(one_roomy_limiter(), FetchConfig::default());
        layer.layer(InstantService)
    };
    for (name, paced) in [("bare_service", None), ("pace_layer", Some(&paced))] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = StdInstant::now();
                    for _ in 0..iters {
                        match paced {
                            Some(paced) => black_box(call(paced).await),
                            None => black_box(call(&InstantService).await),
                        };
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = uncontended, contended, queued, percall
}
criterion_main!(benches);

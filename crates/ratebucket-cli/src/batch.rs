//! The batch run: a queue of request lines, workers sending each through one paced
//! fetcher, every request journaled before it leaves, and the two-stage Ctrl-C.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use ratebucket_http::{
    Departure, FetchConfig, Fetcher, HyperTransport, SendFuture, Transport, TransportError, Vendor,
};
use ratebucket_rt::Limiter;
use ratebucket_rt::core::{
    Caller, FailureKind, Instant as CoreInstant, InvalidLimit, Limit, Priority, RetryPolicy,
    Tenant, TokenBucket,
};
use tokio::sync::watch;

use crate::api::{Api, BatchVendor, Quota};
use crate::input::{Line, Target};
use crate::outcome::{Outcome, failed};
use crate::store::Store;

/// How a batch is run.
pub(crate) struct Settings {
    /// The input's format: which API, and how results are written.
    pub(crate) api: Api,
    pub(crate) target: Target,
    pub(crate) key: Option<String>,
    pub(crate) limits: Quota,
    pub(crate) concurrency: usize,
    pub(crate) retry_ambiguous: bool,
    pub(crate) default_max_tokens: u64,
    pub(crate) read_timeout: Duration,
    /// A PEM file of roots to trust beside the default ones (a private CA).
    pub(crate) ca_cert: Option<std::path::PathBuf>,
    /// How long the provider may stay unreachable (no answer of any kind) before the run
    /// stops, keeping everything for the next.
    pub(crate) give_up_after: Duration,
    /// What previous runs sent lately: how long ago, and its cost per dimension (one
    /// request, then its tokens). The limiter starts where those sends left the buckets.
    pub(crate) recent: Vec<(Duration, Vec<u64>)>,
    /// The provider's dialect, if named (`--dialect`; OpenAI's API only).
    pub(crate) dialect: Option<&'static ratebucket_http::dialect::Dialect>,
    /// The class of the lines that name none (`--priority`).
    pub(crate) priority: Priority,
    /// Tenants' weights (`--weight TENANT=WEIGHT`).
    pub(crate) weights: Vec<(u32, u32)>,
    /// Tenants' caps (`--cap TENANT=SHARE`).
    pub(crate) caps: Vec<(u32, f64)>,
    /// A budget in money (`--budget`, `--prices`), after the API's own dimensions.
    pub(crate) budget: Option<crate::spend::Budgeted>,
}

/// The buckets of `limits`, each at the level the `recent` sends left it at now: the
/// previous runs' sends replayed through a full bucket from the first of them, each taken
/// when it left (refunds aside, the level those runs' own limiter had). Without recent
/// sends, full.
fn seeded(
    limits: &[Limit],
    recent: &[(Duration, Vec<u64>)],
) -> Result<Vec<TokenBucket>, InvalidLimit> {
    let start = CoreInstant::ZERO;
    let span = recent.iter().map(|&(ago, _)| ago).max().unwrap_or_default();
    let now = start + span;
    limits
        .iter()
        .enumerate()
        .map(|(d, limit)| {
            let mut bucket = limit.bucket(start)?;
            if recent.is_empty() {
                return Ok(bucket);
            }
            let mut replay = limit.bucket(start)?;
            let mut sends: Vec<_> = recent
                .iter()
                .map(|(ago, cost)| (*ago, cost.get(d).copied().unwrap_or(0)))
                .collect();
            sends.sort_by_key(|&(ago, _)| std::cmp::Reverse(ago));
            for (ago, cost) in sends {
                replay.take(cost, start + (span - ago));
            }
            let level = replay.level_at(now).floor();
            // Saturating: a level below what an i64 holds is a debt as long as any.
            bucket.lower_to(level as i64, start);
            Ok(bucket)
        })
        .collect()
}

/// Where the run stands: 0 running, 1 stopping (send nothing more, finish what is in
/// flight), 2 abandoning (stop waiting for what is in flight).
pub(crate) type Stop = watch::Receiver<u8>;

/// Counters shared by the workers, the transport and the progress display.
#[derive(Default)]
pub(crate) struct Stats {
    /// Lines this run has recorded an outcome for.
    pub(crate) done: AtomicU64,
    /// Lines handed to a worker.
    pub(crate) dispatched: AtomicU64,
    /// 429 answers.
    pub(crate) throttled: AtomicU64,
    /// 429 answers by the limit they named (its dimension's name), where one did.
    pub(crate) throttled_on: Mutex<BTreeMap<Arc<str>, u64>>,
    /// Tokens the provider reported using.
    pub(crate) tokens: AtomicU64,
    /// Tokens charged for the lines done (reported, or reserved when not reported), per
    /// token dimension (tokens; or input tokens, output tokens and both together).
    pub(crate) charged: [AtomicU64; 3],
    /// Outcomes recorded, by kind: `ok`, or a problem's code.
    pub(crate) outcomes: Mutex<BTreeMap<&'static str, u64>>,
    /// Lines left for the next run after an outage (no answer, or retries exhausted), by
    /// the problem's code: not recorded, sent again by a re-run.
    pub(crate) unfinished: Mutex<BTreeMap<&'static str, u64>>,
    /// When the provider last answered anything (any status).
    last_answer: Mutex<Option<Instant>>,
}

impl Stats {
    /// The provider answered (any status): an outage, if any, is over.
    fn answered(&self) {
        *self.last_answer.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    fn count(&self, outcome: &'static str) {
        count(&self.outcomes, outcome);
    }

    /// The tokens charged so far, for the first `dimensions` token dimensions.
    pub(crate) fn charged(&self, dimensions: usize) -> Vec<u64> {
        self.charged.iter().take(dimensions).map(|c| c.load(Ordering::Relaxed)).collect()
    }

    /// Lines recorded with an error, and lines left for a re-run.
    pub(crate) fn failed(&self) -> (u64, u64) {
        let total = |map: &Mutex<BTreeMap<&'static str, u64>>, skip: &str| {
            map.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|(kind, _)| **kind != skip)
                .map(|(_, n)| n)
                .sum()
        };
        (total(&self.outcomes, "ok"), total(&self.unfinished, ""))
    }
}

fn count(map: &Mutex<BTreeMap<&'static str, u64>>, kind: &'static str) {
    *map.lock().unwrap_or_else(PoisonError::into_inner).entry(kind).or_default() += 1;
}

/// What ended the run early, if anything did.
#[derive(Debug)]
pub(crate) enum Halt {
    /// Ctrl-C.
    Interrupted,
    /// The provider refused the account, or the configuration is wrong: what was said.
    Fatal(String),
    /// The output or journal could not be written.
    Store(std::io::Error),
    /// The provider answered nothing for longer than the run is told to wait.
    Outage(Duration),
}

/// The outcome of a run.
pub(crate) struct Report {
    pub(crate) makespan: Duration,
    pub(crate) halt: Option<Halt>,
}

/// The tag a request carries to the transport: which line, and whether it has left.
#[derive(Clone)]
struct Tag {
    id: Arc<str>,
    sent: Arc<AtomicBool>,
}

/// The transport every request leaves through: refuses to send once the run is stopping,
/// and writes the request's `sent` mark to disk before it leaves.
struct Journaled {
    inner: HyperTransport,
    store: Arc<Store>,
    stop: Stop,
    stats: Arc<Stats>,
    /// Which limit a 429 names, read in the API's dialect and named as the limiter names
    /// its dimensions.
    namer: (BatchVendor, Limiter),
}

impl Journaled {
    /// Counts a 429, and the limit its headers name, if they name one.
    fn count_throttle(&self, response: &http::Response<ratebucket_http::ResponseBody>) {
        self.stats.throttled.fetch_add(1, Ordering::Relaxed);
        let (vendor, limiter) = &self.namer;
        let signals = ratebucket_http::Signals::from_headers(
            response.headers(),
            std::time::SystemTime::now(),
        );
        let head = ratebucket_http::ResponseHead {
            status: response.status(),
            headers: response.headers(),
            signals: &signals,
            fold_dimension: Some(0),
            body: None,
        };
        if let Some(hit) = ratebucket_http::LimitHit::of(&vendor.reports(&head), limiter) {
            let mut on = self.stats.throttled_on.lock().unwrap_or_else(PoisonError::into_inner);
            *on.entry(hit.name).or_default() += 1;
        }
    }
}

impl Transport for Journaled {
    fn send(&self, request: Request<Bytes>) -> SendFuture<'_> {
        self.send_departing(request, Departure::new())
    }

    /// Journaled as sent before it may leave (a crash after this mark leaves it ambiguous);
    /// counted as left by the limiter only once hyper writes it, so a call cancelled while
    /// its connection is made is returned.
    fn send_departing(&self, request: Request<Bytes>, departure: Departure) -> SendFuture<'_> {
        Box::pin(async move {
            let tag = request.extensions().get::<Tag>().cloned();
            if *self.stop.borrow() > 0 {
                let stopping = std::io::Error::other("the batch is stopping: not sent");
                return Err(TransportError::with_kind(FailureKind::ConnectRefused, stopping));
            }
            if let Some(tag) = &tag {
                tag.sent.store(true, Ordering::SeqCst);
                if let Err(e) = self.store.sent(&tag.id).await {
                    // Never send what the journal does not know left.
                    return Err(TransportError::with_kind(FailureKind::ConnectRefused, e));
                }
            }
            let response = self.inner.send_departing(request, departure).await?;
            self.stats.answered();
            if response.status() == http::StatusCode::TOO_MANY_REQUESTS {
                self.count_throttle(&response);
                // The provider did not take it: a crash before it is sent again leaves it
                // safe to send, not ambiguous.
                if let Some(tag) = &tag {
                    let _ = self.store.released(&tag.id).await;
                }
            }
            Ok(response)
        })
    }

    fn check(&self, uri: &http::Uri) -> Result<(), String> {
        self.inner.check(uri)
    }
}

/// The shared parts of a run.
pub(crate) struct Runner {
    fetcher: Fetcher<Journaled, BatchVendor>,
    store: Arc<Store>,
    stats: Arc<Stats>,
    settings: Settings,
    /// When the runner was made: the origin of `Stats::answered_ms`.
    started: Instant,
}

impl Runner {
    /// A runner over `store`; call inside a tokio runtime.
    pub(crate) fn new(
        settings: Settings,
        store: Arc<Store>,
        stats: Arc<Stats>,
        stop: Stop,
    ) -> Result<Runner, String> {
        let mut limits = settings.limits.per_dimension();
        debug_assert_eq!(limits.len(), settings.api.dimensions());
        if let Some(budget) = &settings.budget {
            limits.push(budget.spend.limit()?);
        }
        let buckets =
            seeded(&limits, &settings.recent).map_err(|e| format!("invalid limits: {e}"))?;
        let limiter = Limiter::with_timer(
            buckets,
            // The builder's settings: the first request alone, so its reply tells what the
            // provider books per request before a burst leaves.
            ratebucket_openai::arbiter_config(),
            ratebucket_tokio::TokioTimer::current(),
        )
        .map_err(|e| format!("invalid limits: {e}"))?
        .with_name("batch");
        for (d, limit) in limits.iter().enumerate() {
            if let Some(name) = limit.name() {
                limiter.name_dimension(d, name).map_err(|e| format!("invalid limits: {e}"))?;
            }
        }
        if let Some(budget) = &settings.budget {
            crate::spend::apply(&limiter, budget)?;
        }
        for &(tenant, weight) in &settings.weights {
            limiter
                .set_weight(Tenant(tenant), weight)
                .map_err(|e| format!("--weight {tenant}={weight}: {e}"))?;
        }
        for &(tenant, share) in &settings.caps {
            limiter
                .set_cap(Tenant(tenant), Some(share))
                .map_err(|e| format!("--cap {tenant}={share}: {e}"))?;
        }
        let mut retry = RetryPolicy::default();
        retry.retry_ambiguous = settings.retry_ambiguous;
        let config = FetchConfig::default().retry(retry).read_timeout(settings.read_timeout);
        let inner = match &settings.ca_cert {
            Some(path) => HyperTransport::with_tls(
                Duration::from_secs(10),
                ratebucket_http::tls::adding_pem_file(path)
                    .map_err(|e| format!("--ca-cert: {e}"))?,
            ),
            None => HyperTransport::default(),
        };
        let transport = Journaled {
            inner,
            store: Arc::clone(&store),
            stop,
            stats: Arc::clone(&stats),
            namer: (settings.limits.vendor(settings.dialect), limiter.clone()),
        };
        let prices = settings.budget.as_ref().map(|b| b.spend.prices.clone());
        let vendor = settings.limits.vendor(settings.dialect).prices(prices);
        Ok(Runner {
            fetcher: Fetcher::with_vendor(transport, limiter, config, vendor),
            store,
            stats,
            settings,
            started: Instant::now(),
        })
    }

    /// The counters the run keeps.
    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The format the run reads and writes.
    pub(crate) fn api(&self) -> Api {
        self.settings.api
    }

    /// The limiter the run is paced by.
    pub(crate) fn limiter(&self) -> &Limiter {
        self.fetcher.limiter()
    }

    /// Runs `lines` (those not yet finished) until done or stopped.
    pub(crate) async fn run(self: Arc<Self>, lines: Vec<Line>, stop: Stop) -> Report {
        let started = Instant::now();
        let (queue, work) = async_channel::bounded::<Line>(self.settings.concurrency);
        let halt: Arc<Mutex<Option<Halt>>> = Arc::default();
        let producer = {
            let mut stop = stop.clone();
            tokio::spawn(async move {
                for line in lines {
                    tokio::select! {
                        sent = queue.send(line) => if sent.is_err() { break },
                        _ = stop.wait_for(|level| *level > 0) => break,
                    }
                }
            })
        };
        let workers: Vec<_> = (0..self.settings.concurrency)
            .map(|_| {
                let runner = Arc::clone(&self);
                let work = work.clone();
                let stop = stop.clone();
                let halt = Arc::clone(&halt);
                tokio::spawn(async move {
                    while let Ok(line) = work.recv().await {
                        if *stop.borrow() > 0 {
                            break;
                        }
                        runner.stats.dispatched.fetch_add(1, Ordering::Relaxed);
                        let outcome = runner.send(&line, stop.clone()).await;
                        if let Err(stopped) = runner.settle(&line, outcome).await {
                            halt.lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .get_or_insert(stopped);
                            work.close();
                            break;
                        }
                    }
                })
            })
            .collect();
        for worker in workers {
            let _ = worker.await;
        }
        producer.abort();
        let mut halt = halt.lock().unwrap_or_else(PoisonError::into_inner).take();
        if halt.is_none() && *stop.borrow() > 0 {
            halt = Some(Halt::Interrupted);
        }
        Report { makespan: started.elapsed(), halt }
    }

    /// Sends one line; gives up on it if the run stops before it left, and abandons it if
    /// the run is abandoned while it is in flight.
    async fn send(&self, line: &Line, mut stop: Stop) -> Outcome {
        let tag = Tag { id: Arc::from(line.custom_id.as_str()), sent: Arc::default() };
        let caller =
            Caller::tenant(line.tenant).priority(line.priority.unwrap_or(self.settings.priority));
        let url = self.settings.target.url(&line.url);
        let headers = self.settings.target.headers(self.settings.key.as_deref());
        let build = |_attempt: u32| {
            let mut request = Request::post(&url)
                .header("content-type", "application/json")
                .body(line.body.clone())
                .unwrap_or_else(|_| Request::new(line.body.clone()));
            for (name, value) in &headers {
                if let Ok(mut value) = http::HeaderValue::from_str(value) {
                    value.set_sensitive(*name != "anthropic-version");
                    request.headers_mut().insert(*name, value);
                }
            }
            request.extensions_mut().insert(tag.clone());
            request.extensions_mut().insert(caller);
            request
        };
        let api = self.settings.api;
        let mut cost = line.cost(api, self.settings.default_max_tokens);
        if let Some(budget) = &self.settings.budget {
            // Every line's model was priced before the run began.
            let price = crate::spend::price_of(line, &budget.spend.prices)
                .map_or(0, |p| crate::spend::most(line, p, self.settings.default_max_tokens));
            cost.push(price);
        }
        let cost = capped(cost, self.limiter());
        let reserved = cost[1..].to_vec();
        let fetch = self.fetcher.fetch_costed(&cost, build);
        tokio::pin!(fetch);
        let result = loop {
            tokio::select! {
                result = &mut fetch => break result,
                _ = stop.changed() => {
                    let level = *stop.borrow_and_update();
                    let sent = tag.sent.load(Ordering::SeqCst);
                    if level >= 2 && sent {
                        return Outcome::Record {
                            record: api.error_record(
                                &line.custom_id,
                                "ambiguous",
                                "abandoned in flight by a second Ctrl-C: it may have been executed",
                            ),
                            ambiguous: true,
                            kind: "ambiguous",
                            tokens: None,
                            charged: reserved,
                        };
                    }
                    if level >= 1 && !sent {
                        return Outcome::Pending { sent: false, fatal: None, unfinished: None };
                    }
                }
            }
        };
        let sent = tag.sent.load(Ordering::SeqCst);
        match result {
            Ok(fetched) => {
                let tokens =
                    api.reported_usage(fetched.response.body()).map(|usage| usage.iter().sum());
                let charged =
                    fetched.charged.as_ref().map_or_else(|| reserved.clone(), |a| a[1..].to_vec());
                Outcome::Record {
                    record: api.answer_record(&line.custom_id, &fetched.response),
                    ambiguous: false,
                    kind: "ok",
                    tokens,
                    charged,
                }
            }
            Err(error) => failed(api, line, error, sent, reserved),
        }
    }

    /// How long since the provider last answered anything (or since the run began).
    pub(crate) fn since_answer(&self) -> Duration {
        let last = *self.stats.last_answer.lock().unwrap_or_else(PoisonError::into_inner);
        last.unwrap_or(self.started).elapsed()
    }

    /// Makes a line's outcome durable and counts it; `Err` stops the run.
    async fn settle(&self, line: &Line, outcome: Outcome) -> Result<(), Halt> {
        match outcome {
            Outcome::Record { record, ambiguous, kind, tokens, charged } => {
                self.store.finish(&line.custom_id, record, ambiguous).await.map_err(Halt::Store)?;
                self.stats.count(kind);
                self.stats.done.fetch_add(1, Ordering::Relaxed);
                self.stats.tokens.fetch_add(tokens.unwrap_or(0), Ordering::Relaxed);
                for (total, charged) in self.stats.charged.iter().zip(charged) {
                    total.fetch_add(charged, Ordering::Relaxed);
                }
                Ok(())
            }
            Outcome::Pending { sent, fatal, unfinished } => {
                if sent {
                    self.store.released(&line.custom_id).await.map_err(Halt::Store)?;
                }
                if let Some(message) = fatal {
                    return Err(Halt::Fatal(message));
                }
                if let Some(kind) = unfinished {
                    count(&self.stats.unfinished, kind);
                    let since = self.since_answer();
                    if since > self.settings.give_up_after {
                        return Err(Halt::Outage(since));
                    }
                }
                Ok(())
            }
        }
    }
}

/// `cost` with each dimension capped at its bucket's capacity: a request larger than the
/// burst still goes when the bucket is full; the excess is owed.
fn capped(mut cost: Vec<u64>, limiter: &Limiter) -> Vec<u64> {
    for (d, amount) in cost.iter_mut().enumerate() {
        if let Some(dimension) = limiter.dimension(d) {
            *amount = (*amount).min(dimension.state.capacity);
        }
    }
    cost
}

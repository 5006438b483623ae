//! The four engines: ratebucket, the openai-cookbook parallel processor's algorithm,
//! governor + backon, and two leaky-bucket limiters with Retry-After retries.

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use ratebucket_http::{FetchConfig, HyperTransport, Transport};
use ratebucket_openai::{Auth, Client, Endpoint, Limits, OpenAiConfig};

use super::{Outcome, Scenario};
use crate::counted::{Counted, Polls};

/// A huge limit standing in for "no limit" where an engine insists on one.
pub(crate) const UNLIMITED: u64 = 1 << 40;

#[derive(Clone, Copy, Debug)]
pub(crate) enum Engine {
    Ratebucket,
    Cookbook,
    GovernorBackon,
    LeakyBucket,
}

impl Engine {
    pub(crate) const ALL: [Engine; 4] =
        [Engine::Ratebucket, Engine::Cookbook, Engine::GovernorBackon, Engine::LeakyBucket];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Ratebucket => "ratebucket",
            Engine::Cookbook => "openai-cookbook",
            Engine::GovernorBackon => "governor + backon",
            Engine::LeakyBucket => "leaky-bucket x2",
        }
    }

    pub(crate) async fn run(self, scenario: &Scenario, base_url: &str) -> Result<Outcome, String> {
        let url = format!("{base_url}{}", scenario.path());
        match self {
            Engine::Ratebucket if scenario.is_anthropic() => {
                ratebucket_anthropic(scenario, base_url).await
            }
            Engine::Ratebucket => ratebucket(scenario, base_url).await,
            Engine::Cookbook => cookbook(scenario, &url).await,
            Engine::GovernorBackon => governor_backon(scenario, &url).await,
            Engine::LeakyBucket => leaky_bucket(scenario, &url).await,
        }
    }
}

/// ratebucket's OpenAI adapter with its default settings, told the scenario's limits.
async fn ratebucket(scenario: &Scenario, base_url: &str) -> Result<Outcome, String> {
    let limits = Limits {
        requests_per_minute: scenario.told_rpm,
        tokens_per_minute: scenario.told_tpm.or(if scenario.told_rpm.is_none() {
            None
        } else {
            Some(UNLIMITED)
        }),
        window: scenario.window,
        ..Limits::default()
    };
    let buckets = limits.buckets(ratebucket_core::Instant::ZERO).map_err(|e| e.to_string())?;
    // The settings a client builder gives its own limiter.
    let arbiter = ratebucket_openai::arbiter_config().with_max_in_flight(scenario.told_concurrency);
    let limiter = ratebucket_tokio::limiter_with(buckets, arbiter).map_err(|e| e.to_string())?;
    if let Some(slope) = scenario.told_ramp {
        let ramp =
            ratebucket_core::Ramp::new(slope, Duration::from_secs(1)).map_err(|e| e.to_string())?;
        limiter.change(0, ratebucket_core::Change::Ramp(Some(ramp))).map_err(|e| e.to_string())?;
    }
    let config =
        OpenAiConfig::new(Endpoint::OpenAi(base_url.to_owned()), Auth::Bearer("sk-bench".into()))
            .fetch(FetchConfig::default().read_timeout(scenario.read_timeout))
            .dialect(scenario.dialect());
    let client = Client::new(HyperTransport::default(), limiter.clone(), limits, config);
    let bodies = scenario.bodies();
    let expected: u64 = bodies.iter().map(|b| scenario.expected_charge(b)).sum();
    let eta =
        limiter.estimate_drain(&[bodies.len() as u64, expected]).map_err(|e| e.to_string())?
            + scenario.latency;
    let start = Instant::now();
    let tasks: Vec<_> = bodies
        .into_iter()
        .map(|request| {
            let client = client.clone();
            tokio::spawn(async move { client.complete(request).await.is_ok() })
        })
        .collect();
    let mut outcome = tally(tasks).await?;
    outcome.makespan = start.elapsed();
    let stats = limiter.stats();
    outcome.polls = Some((stats.reserve_polls, stats.reservations));
    outcome.eta = Some(eta);
    Ok(outcome)
}

/// ratebucket's Anthropic client with its default settings, told the scenario's three
/// limits.
async fn ratebucket_anthropic(scenario: &Scenario, base_url: &str) -> Result<Outcome, String> {
    use ratebucket_anthropic::{Client, Limits};
    let (input, combined) = if scenario.combined_tokens {
        (None, scenario.told_tpm)
    } else {
        (scenario.told_tpm, None)
    };
    let limits = Limits {
        requests_per_minute: scenario.told_rpm,
        input_tokens_per_minute: input,
        output_tokens_per_minute: scenario.told_otpm,
        tokens_per_minute: combined,
        window: scenario.window,
        ..Limits::default()
    };
    let client = Client::builder(base_url)
        .api_key("sk-bench")
        .limits(limits)
        .configure(|c| c.fetch(FetchConfig::default().read_timeout(scenario.read_timeout)))
        .build()
        .map_err(|e| e.to_string())?;
    let bodies = scenario.bodies();
    let start = Instant::now();
    let tasks: Vec<_> = bodies
        .iter()
        .map(|request| {
            let (client, message) = (client.clone(), scenario.message(request));
            tokio::spawn(async move { client.complete(message).await.is_ok() })
        })
        .collect();
    let mut outcome = tally(tasks).await?;
    outcome.makespan = start.elapsed();
    let stats = client.limiter().stats();
    outcome.polls = Some((stats.reserve_polls, stats.reservations));
    Ok(outcome)
}

/// One POST; `Err` for a transport failure or a timeout.
pub(crate) async fn post(
    transport: &HyperTransport,
    url: &str,
    body: Bytes,
    timeout: Duration,
) -> Result<(StatusCode, HeaderMap, Bytes), String> {
    let request = Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .header("anthropic-version", ratebucket_anthropic::API_VERSION)
        .body(body)
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let response = transport.send(request).await.map_err(|e| e.to_string())?;
        let (parts, body) = response.into_parts();
        let bytes = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok((parts.status, parts.headers, bytes))
    };
    tokio::time::timeout(timeout, exchange).await.map_err(|_| "timed out".to_owned())?
}

/// The openai-cookbook `api_request_parallel_processor.py` loop, re-implemented
/// faithfully: both capacities start full with a window's worth, refill linearly, a
/// request goes only if it fits both (its estimate: prompt + max_tokens), every error is
/// retried (5 attempts), and after a rate-limit error the whole loop pauses for 15 s
/// (scaled to a quarter window) keyed on the time of the *last* rate-limit error.
async fn cookbook(scenario: &Scenario, url: &str) -> Result<Outcome, String> {
    struct Job {
        body: Bytes,
        tokens: u64,
        attempts_left: u32,
    }
    struct Tracker {
        in_progress: AtomicUsize,
        completed: AtomicUsize,
        failed: AtomicUsize,
        last_rate_limit_error: Mutex<Option<Instant>>,
        retries: Mutex<VecDeque<Job>>,
    }
    let window = scenario.window.as_secs_f64();
    let pause = scenario.window.mul_f64(15.0 / 60.0);
    let max_requests = scenario.told_rpm.unwrap_or(UNLIMITED) as f64;
    let max_tokens = scenario.told_tpm.unwrap_or(UNLIMITED) as f64;
    let transport = Arc::new(HyperTransport::default());
    let tracker = Arc::new(Tracker {
        in_progress: AtomicUsize::new(0),
        completed: AtomicUsize::new(0),
        failed: AtomicUsize::new(0),
        last_rate_limit_error: Mutex::new(None),
        retries: Mutex::new(VecDeque::new()),
    });
    let mut requests = scenario.bodies().into_iter();
    let (mut available_requests, mut available_tokens) = (max_requests, max_tokens);
    let mut last_update = Instant::now();
    let mut next: Option<Job> = None;
    let mut read_all = false;
    let start = Instant::now();
    loop {
        if next.is_none() {
            if let Some(job) = tracker.retries.lock().expect("lock").pop_front() {
                next = Some(job);
            } else if let Some(request) = requests.next() {
                tracker.in_progress.fetch_add(1, Ordering::SeqCst);
                next = Some(Job {
                    tokens: scenario.estimate(&request),
                    body: scenario.wire(&request),
                    attempts_left: 5,
                });
            } else {
                read_all = true;
            }
        }
        let now = Instant::now();
        let elapsed = (now - last_update).as_secs_f64();
        available_requests =
            (available_requests + max_requests * elapsed / window).min(max_requests);
        available_tokens = (available_tokens + max_tokens * elapsed / window).min(max_tokens);
        last_update = now;
        if let Some(job) = next.take() {
            if available_requests >= 1.0 && available_tokens >= job.tokens as f64 {
                available_requests -= 1.0;
                available_tokens -= job.tokens as f64;
                let (transport, tracker, url) =
                    (Arc::clone(&transport), Arc::clone(&tracker), url.to_owned());
                let timeout = scenario.read_timeout;
                tokio::spawn(async move {
                    let mut job = job;
                    job.attempts_left -= 1;
                    let result = post(&transport, &url, job.body.clone(), timeout).await;
                    let error = match &result {
                        Ok((status, _, body))
                            if status.is_success() && !contains(body, b"\"error\"") =>
                        {
                            None
                        }
                        Ok((_, _, body)) => Some(String::from_utf8_lossy(body).into_owned()),
                        Err(e) => Some(e.clone()),
                    };
                    match error {
                        None => {
                            tracker.completed.fetch_add(1, Ordering::SeqCst);
                            tracker.in_progress.fetch_sub(1, Ordering::SeqCst);
                        }
                        Some(message) => {
                            if message.contains("Rate limit") {
                                *tracker.last_rate_limit_error.lock().expect("lock") =
                                    Some(Instant::now());
                            }
                            if job.attempts_left > 0 {
                                tracker.retries.lock().expect("lock").push_back(job);
                            } else {
                                tracker.failed.fetch_add(1, Ordering::SeqCst);
                                tracker.in_progress.fetch_sub(1, Ordering::SeqCst);
                            }
                        }
                    }
                });
            } else {
                next = Some(job);
            }
        }
        if read_all && next.is_none() && tracker.in_progress.load(Ordering::SeqCst) == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        let last_error = *tracker.last_rate_limit_error.lock().expect("lock");
        if let Some(at) = last_error {
            let since = at.elapsed();
            if since < pause {
                tokio::time::sleep(pause - since).await;
            }
        }
    }
    Ok(Outcome {
        makespan: start.elapsed(),
        completed: tracker.completed.load(Ordering::SeqCst),
        failed: tracker.failed.load(Ordering::SeqCst),
        polls: None,
        eta: None,
    })
}

/// Waits for every call's task: how many completed and how many failed.
async fn tally(tasks: Vec<tokio::task::JoinHandle<bool>>) -> Result<Outcome, String> {
    let mut outcome = Outcome::default();
    for t in tasks {
        if t.await.map_err(|e| e.to_string())? {
            outcome.completed += 1;
        } else {
            outcome.failed += 1;
        }
    }
    Ok(outcome)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// What most Rust users write: a governor limiter per dimension (`until_ready`, a
/// window's worth of burst) and backon's default exponential retry around each call.
async fn governor_backon(scenario: &Scenario, url: &str) -> Result<Outcome, String> {
    use backon::{ExponentialBuilder, Retryable};
    use governor::{Quota, RateLimiter};

    let quota = |limit: u64| -> Result<Quota, String> {
        let burst = NonZeroU32::new(u32::try_from(limit).map_err(|e| e.to_string())?)
            .ok_or("zero limit")?;
        Quota::with_period(scenario.window / burst.get())
            .map(|q| q.allow_burst(burst))
            .ok_or_else(|| "zero period".to_owned())
    };
    let requests =
        Arc::new(RateLimiter::direct(quota(scenario.told_rpm.unwrap_or(UNLIMITED >> 20))?));
    let tokens = match scenario.told_tpm {
        Some(tpm) => Some(Arc::new(RateLimiter::direct(quota(tpm)?))),
        None => None,
    };
    let transport = Arc::new(HyperTransport::default());
    let counters = Arc::new(Polls::default());
    let start = Instant::now();
    let tasks: Vec<_> = scenario
        .bodies()
        .into_iter()
        .map(|request| {
            let (requests, tokens, transport, counters) = (
                Arc::clone(&requests),
                tokens.clone(),
                Arc::clone(&transport),
                Arc::clone(&counters),
            );
            let estimate =
                NonZeroU32::new(scenario.estimate(&request) as u32).unwrap_or(NonZeroU32::MIN);
            let (url, timeout, body) =
                (url.to_owned(), scenario.read_timeout, scenario.wire(&request));
            tokio::spawn(async move {
                let attempt = || async {
                    Counted::new(requests.until_ready(), &counters).await;
                    if let Some(tokens) = &tokens {
                        Counted::new(tokens.until_n_ready(estimate), &counters)
                            .await
                            .map_err(|_| Failure::Permanent)?;
                    }
                    match post(&transport, &url, body.clone(), timeout).await {
                        Ok((status, _, _)) if status.is_success() => Ok(()),
                        Ok((status, _, _)) if status == 429 || status.is_server_error() => {
                            Err(Failure::Retryable)
                        }
                        Ok(_) => Err(Failure::Permanent),
                        Err(_) => Err(Failure::Retryable),
                    }
                };
                attempt
                    .retry(ExponentialBuilder::default())
                    .when(|e| *e == Failure::Retryable)
                    .await
                    .is_ok()
            })
        })
        .collect();
    let mut outcome = tally(tasks).await?;
    outcome.makespan = start.elapsed();
    outcome.polls = Some(counters.get());
    Ok(outcome)
}

#[derive(Debug, PartialEq, Eq)]
enum Failure {
    Retryable,
    Permanent,
}

/// The strongest a Rust user can assemble today: two leaky-bucket limiters (requests and
/// estimated tokens, a window's worth each) and per-request retries that honour
/// `retry-after-ms` / `retry-after`, with exponential backoff otherwise (10 retries).
async fn leaky_bucket(scenario: &Scenario, url: &str) -> Result<Outcome, String> {
    let steps = 25;
    let limiter = |limit: u64| {
        let limit = usize::try_from(limit).unwrap_or(usize::MAX);
        Arc::new(
            leaky_bucket::RateLimiter::builder()
                .max(limit)
                .initial(limit)
                .refill((limit / steps).max(1))
                .interval(scenario.window / steps as u32)
                .build(),
        )
    };
    let requests = limiter(scenario.told_rpm.unwrap_or(UNLIMITED >> 20));
    let tokens = scenario.told_tpm.map(limiter);
    let transport = Arc::new(HyperTransport::default());
    let counters = Arc::new(Polls::default());
    let start = Instant::now();
    let tasks: Vec<_> = scenario
        .bodies()
        .into_iter()
        .map(|request| {
            let (requests, tokens, transport, counters) = (
                Arc::clone(&requests),
                tokens.clone(),
                Arc::clone(&transport),
                Arc::clone(&counters),
            );
            let estimate = scenario.estimate(&request) as usize;
            let (url, timeout, body) =
                (url.to_owned(), scenario.read_timeout, scenario.wire(&request));
            tokio::spawn(async move {
                for retry in 0..=10u32 {
                    Counted::new(requests.acquire_one(), &counters).await;
                    if let Some(tokens) = &tokens {
                        Counted::new(tokens.acquire(estimate), &counters).await;
                    }
                    let backoff = Duration::from_millis(100 * 2u64.pow(retry.min(5)));
                    let wait = match post(&transport, &url, body.clone(), timeout).await {
                        Ok((status, _, _)) if status.is_success() => return true,
                        Ok((status, headers, _)) if status == 429 || status.is_server_error() => {
                            retry_after(&headers).unwrap_or(backoff)
                        }
                        Ok(_) => return false,
                        Err(_) => backoff,
                    };
                    tokio::time::sleep(wait).await;
                }
                false
            })
        })
        .collect();
    let mut outcome = tally(tasks).await?;
    outcome.makespan = start.elapsed();
    outcome.polls = Some(counters.get());
    Ok(outcome)
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<f64>().ok();
    get("retry-after-ms")
        .map(|ms| ms / 1000.0)
        .or_else(|| get("retry-after"))
        .filter(|s| s.is_finite() && *s > 0.0)
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
}

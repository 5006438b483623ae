//! `cargo xtask prove`: the headline invariants walked live, each beside the naive
//! mechanism it replaces, first on a virtual clock (the core alone, exact), then against
//! the fake provider on 127.0.0.1 (the whole stack, real sockets and timers).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::future::Future;
use std::time::{Duration, Instant as StdInstant};

use ratebucket_core::{
    Action, Arbiter, ArbiterConfig, Event, FailureKind, Gate, GateConfig, Instant, Outcome, Rate,
    Retry, RetryPolicy, ThrottleOutcome, Ticket, TokenBucket,
};
use ratebucket_http::{FetchConfig, HyperTransport};
use ratebucket_openai::{Auth, ChatRequest, Client, Endpoint, Limits, Message, OpenAiConfig};
use ratebucket_sim::{
    Charging, Fault, Latency, LimitSpec, LogEntry, Sim, SimConfig, SimHandle, Trigger,
};

use crate::bench::{body, post};

/// One line of the report: an invariant measured in one setting, for both mechanisms.
struct Row {
    invariant: &'static str,
    setting: &'static str,
    measure: String,
    ours: String,
    naive: String,
    /// Whether ratebucket kept the invariant.
    holds: bool,
}

/// Runs every proof and prints the table; fails if ratebucket broke an invariant.
pub(crate) fn run() -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let rows = [
        window_bound_virtual(),
        runtime.block_on(window_bound_provider())?,
        one_pause_virtual(),
        runtime.block_on(one_pause_provider())?,
        reconcile_virtual(),
        runtime.block_on(reconcile_provider())?,
        backfill_virtual(),
        runtime.block_on(backfill_provider())?,
        no_duplicate_virtual(),
        runtime.block_on(no_duplicate_provider())?,
    ];
    println!("| invariant | where | measure | ratebucket | naive mechanism | holds |");
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} | {} | {} | {} | {} | {} |",
            row.invariant,
            row.setting,
            row.measure,
            row.ours,
            row.naive,
            if row.holds { "yes" } else { "**NO**" }
        );
    }
    let broken: Vec<_> = rows.iter().filter(|r| !r.holds).collect();
    if broken.is_empty() {
        println!("\nprove: every invariant held");
        Ok(())
    } else {
        Err(format!(
            "prove: {} invariant(s) broken: {}",
            broken.len(),
            broken
                .iter()
                .map(|r| format!("{} ({})", r.invariant, r.setting))
                .collect::<Vec<_>>()
                .join(", ")
        ))
    }
}

const VIRTUAL: &str = "virtual clock";
const PROVIDER: &str = "fake provider";

fn ms(n: u64) -> Instant {
    Instant::from_millis(n)
}

fn bucket(per_second: u64, capacity: u64) -> TokenBucket {
    TokenBucket::new(Rate::per_second(per_second).expect("rate"), capacity, Instant::ZERO)
        .expect("bucket")
}

/// The most any window of `window` holds, given `(time, amount)` events sorted by time.
fn busiest_window(events: &[(Instant, u64)], window: Duration) -> u64 {
    let (mut best, mut sum, mut start) = (0, 0, 0);
    for &(at, amount) in events {
        sum += amount;
        while events[start].0 + window <= at {
            sum -= events[start].1;
            start += 1;
        }
        best = best.max(sum);
    }
    best
}

// ---------------------------------------------------------------------------------------
// 1. The window bound.

const WINDOW_INVARIANT: &str = "requests sent in any window <= capacity + rate x window";

/// A token-bound phase of expensive calls, then a run of cheap ones: 10 requests and 1,000
/// tokens per second, at most 10 and 1,000 at once.
fn window_schedule() -> Vec<u64> {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut costs: Vec<u64> = (0..40).map(|_| rng.u64(250..=350)).collect();
    costs.extend((0..80).map(|_| rng.u64(5..=15)));
    costs
}

fn window_bound_virtual() -> Row {
    let costs = window_schedule();
    let window = Duration::from_secs(1);
    let bound = 10 + 10;
    // ratebucket: one arbiter grants both dimensions at once; a call is sent when granted.
    let mut arbiter = Arbiter::new(
        vec![bucket(10, 10), bucket(1_000, 1_000)],
        ArbiterConfig::default(),
        Instant::ZERO,
    )
    .expect("arbiter");
    for &tokens in &costs {
        arbiter.reserve(&[1, tokens], Instant::ZERO).expect("fits");
    }
    let mut sends = Vec::new();
    let mut now = Instant::ZERO;
    loop {
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                sends.push((now, 1));
                arbiter.commit(ticket, &[1, 0], now).ok();
            }
        }
        match arbiter.poll_timeout() {
            Some(at) => {
                now = at;
                arbiter.handle_timeout(at);
            }
            None => break,
        }
    }
    let ours = busiest_window(&sends, window);
    // Naive: a requests limiter, then a tokens limiter, each with its own queue. A call
    // holds its request permit while it waits for tokens and is sent when it has both.
    let (mut requests, mut tokens) = (bucket(10, 10), bucket(1_000, 1_000));
    let (mut requests_free, mut tokens_free) = (Instant::ZERO, Instant::ZERO);
    let mut naive_sends = Vec::new();
    for &cost in &costs {
        let wait = requests.time_until(1, requests_free).unwrap_or_default();
        let got_request = requests_free + wait;
        requests.take(1, got_request);
        requests_free = got_request;
        let from = got_request.max(tokens_free);
        let wait = tokens.time_until(cost, from).unwrap_or_default();
        let sent = from + wait;
        tokens.take(cost, sent);
        tokens_free = sent;
        naive_sends.push((sent, 1));
    }
    naive_sends.sort();
    let naive = busiest_window(&naive_sends, window);
    Row {
        invariant: WINDOW_INVARIANT,
        setting: VIRTUAL,
        measure: format!("most requests sent in 1 s (bound {bound})"),
        ours: ours.to_string(),
        naive: format!("{naive} (independent limiters in turn)"),
        holds: ours <= bound,
    }
}

async fn window_bound_provider() -> Result<Row, String> {
    let window = Duration::from_secs(1);
    let (rpm, tpm) = (20, 2_000);
    let config = SimConfig::default()
        .rpm(LimitSpec::per_minute(rpm).window(window))
        .tpm(LimitSpec::per_minute(tpm).window(window))
        .charging(Charging::ReserveMaxTokens)
        .latency(Latency::Fixed(Duration::from_millis(5)));
    let limits = Limits::per_minute(rpm, tpm).window(window);
    let prompts = || -> Vec<ChatRequest> {
        let mut costs: Vec<u64> = (0..20).map(|_| 300).collect();
        costs.extend(std::iter::repeat_n(5, 80));
        costs.into_iter().enumerate().map(|(i, max)| chat(i, max)).collect()
    };
    // ratebucket.
    let sim = start(config.clone())?;
    let client = client(&sim, limits)?;
    all(prompts(), |request| {
        let client = client.clone();
        async move { client.complete(request).await.is_ok() }
    })
    .await?;
    let ours = refused(&sim.log());
    // Naive: the same two buckets as two independent limiters, taken one after the other.
    let sim = start(config)?;
    let mut buckets = limits.buckets(Instant::ZERO).map_err(|e| e.to_string())?;
    let tokens = ratebucket_tokio::limiter(vec![buckets.pop().expect("tokens")])
        .map_err(|e| e.to_string())?;
    let requests = ratebucket_tokio::limiter(buckets).map_err(|e| e.to_string())?;
    let transport = HyperTransport::default();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    all(prompts(), |request| {
        let (requests, tokens, transport, url) =
            (requests.clone(), tokens.clone(), transport.clone(), url.clone());
        async move {
            let estimate = estimate(&request);
            let Ok(r) = requests.reserve(&[1]).await else {
                return false;
            };
            let Ok(t) = tokens.reserve(&[estimate]).await else {
                return false;
            };
            let sent = post(&transport, &url, body(&request), Duration::from_secs(5)).await;
            r.commit(&[1]).ok();
            t.commit(&[estimate]).ok();
            sent.is_ok_and(|(status, _, _)| status.is_success())
        }
    })
    .await?;
    let naive = refused(&sim.log());
    Ok(Row {
        invariant: WINDOW_INVARIANT,
        setting: PROVIDER,
        measure: "requests the provider refused (429)".into(),
        ours: ours.to_string(),
        naive: format!("{naive} (independent limiters in turn)"),
        holds: ours == 0,
    })
}

// ---------------------------------------------------------------------------------------
// 2. A wave of 429s makes one pause.

const PAUSE_INVARIANT: &str = "fifty concurrent 429s make one pause, honoured";

fn one_pause_virtual() -> Row {
    let pause = Duration::from_secs(1);
    let mut rng = fastrand::Rng::with_seed(11);
    // Fifty requests sent at 0 come back 429 between 5 and 50 ms, each asking for 1 s.
    let replies: Vec<Instant> = (0..50).map(|_| ms(rng.u64(5..=50))).collect();
    let first = *replies.iter().min().expect("fifty");
    let closed_until = first + pause;
    // ratebucket: every reply goes to the gate; retries wait for it to reopen.
    let mut gate = Gate::new(GateConfig::default());
    let wave = gate.epoch();
    let mut sorted = replies.clone();
    sorted.sort();
    let pauses = sorted
        .iter()
        .filter(|&&at| {
            matches!(gate.throttle(wave, Some(pause), at), ThrottleOutcome::Closed { .. })
        })
        .count();
    // Every retry waits for the gate: all fifty leave when it reopens.
    let reopens = gate.reopens_at(first).unwrap_or(first);
    let ours_into = if reopens < closed_until { replies.len() } else { 0 };
    // Naive: each caller backs off on its own (full jitter, 100 ms doubling), and the
    // provider keeps refusing until the pause it asked for has passed.
    let mut naive_into = 0;
    let mut naive_429s = 0;
    for &reply in &replies {
        let mut at = reply;
        for attempt in 0..10 {
            let ceiling = 100u64 << attempt;
            at = at + Duration::from_millis(rng.u64(0..=ceiling));
            if at >= closed_until {
                break;
            }
            naive_into += 1;
            naive_429s += 1;
            at = at + Duration::from_millis(20);
        }
    }
    Row {
        invariant: PAUSE_INVARIANT,
        setting: VIRTUAL,
        measure: "pauses taken / retries sent into the pause".into(),
        ours: format!("{pauses} / {ours_into}"),
        naive: format!("{naive_429s} more 429s / {naive_into} (fifty backoffs)"),
        holds: pauses == 1 && ours_into == 0,
    }
}

async fn one_pause_provider() -> Result<Row, String> {
    let pause = Duration::from_millis(500);
    let config = SimConfig::default()
        .fault(Fault::RateLimited { retry_after: pause }, Trigger::FirstArrivals)
        .latency(Latency::Fixed(Duration::from_millis(5)))
        // Every answer, the 429s too, takes 100 ms: all fifty are out before the first
        // 429 is back, on a loaded machine too, so they are one wave. (A request still
        // queued when the gate closed is sent after it reopens; its 429 is a second wave,
        // and a second pause is then right.)
        .decision_delay(Duration::from_millis(100));
    let prompts = || (0..50).map(|i| chat(i, 50)).collect::<Vec<_>>();
    // The retries the provider saw before the pause it asked for had passed.
    let into_pause = |log: &[LogEntry]| {
        let first = log.iter().filter(|e| e.status == Some(429)).filter_map(|e| e.finished).min();
        first.map_or(0, |first| {
            log.iter().filter(|e| e.status == Some(200) && e.arrived < first + pause).count()
        })
    };
    let sim = start(config.clone())?;
    let client = client(&sim, Limits::per_minute(6_000, 600_000).window(Duration::from_secs(1)))?;
    all(prompts(), |request| {
        let client = client.clone();
        async move { client.complete(request).await.is_ok() }
    })
    .await?;
    let ours = into_pause(&sim.log());
    let pauses = client.limiter().snapshot().pauses;
    // Naive: every caller retries its own 429 after a jittered exponential backoff.
    let sim = start(config)?;
    let transport = HyperTransport::default();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    all(prompts(), |request| {
        let (transport, url) = (transport.clone(), url.clone());
        async move {
            let mut rng = fastrand::Rng::new();
            for attempt in 0..6 {
                match post(&transport, &url, body(&request), Duration::from_secs(5)).await {
                    Ok((status, _, _)) if status.is_success() => return true,
                    _ => {
                        let ceiling = 50u64 << attempt;
                        tokio::time::sleep(Duration::from_millis(rng.u64(0..=ceiling))).await;
                    }
                }
            }
            false
        }
    })
    .await?;
    let naive = into_pause(&sim.log());
    Ok(Row {
        invariant: PAUSE_INVARIANT,
        setting: PROVIDER,
        measure: "pauses taken / retries sent into the 500 ms pause".into(),
        ours: format!("{pauses} / {ours}"),
        naive: format!("- / {naive} (fifty backoffs)"),
        holds: ours == 0 && pauses == 1,
    })
}

// ---------------------------------------------------------------------------------------
// 3. Reserve the bound, reconcile to usage.

const RECONCILE_INVARIANT: &str = "reserve the bound, commit the usage";

fn reconcile_virtual() -> Row {
    let run = |reconcile: bool| -> Duration {
        let mut rng = fastrand::Rng::with_seed(3);
        let mut arbiter = Arbiter::new(
            vec![bucket(1_000, 1_000), bucket(2_000, 2_000)],
            ArbiterConfig::default(),
            Instant::ZERO,
        )
        .expect("arbiter");
        // 300 calls of a 20-token prompt with max_tokens 200; answers of 20 to 60 tokens,
        // 100 ms after the grant.
        let mut used = HashMap::new();
        for _ in 0..300 {
            let ticket = arbiter.reserve(&[1, 220], Instant::ZERO).expect("fits");
            used.insert(ticket, 20 + rng.u64(20..=60));
        }
        drive_with_latency(&mut arbiter, Duration::from_millis(100), |ticket| {
            if reconcile { [1, used[&ticket]] } else { [1, 220] }
        })
    };
    let (ours, naive) = (run(true), run(false));
    Row {
        invariant: RECONCILE_INVARIANT,
        setting: VIRTUAL,
        measure: "makespan, 300 calls, 2,000 tokens/s".into(),
        ours: format!("{:.2} s", ours.as_secs_f64()),
        naive: format!("{:.2} s (max_tokens kept)", naive.as_secs_f64()),
        holds: ours < naive,
    }
}

/// Runs `arbiter` until its queue is empty: each grant completes `latency` later and is
/// committed at `actual(ticket)`. Returns the time of the last grant.
fn drive_with_latency(
    arbiter: &mut Arbiter,
    latency: Duration,
    actual: impl Fn(Ticket) -> [u64; 2],
) -> Duration {
    let mut now = Instant::ZERO;
    let mut last = Instant::ZERO;
    let mut running: BinaryHeap<Reverse<(Instant, Ticket)>> = BinaryHeap::new();
    loop {
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                last = now;
                running.push(Reverse((now + latency, ticket)));
            }
        }
        let next_done = running.peek().map(|Reverse((at, _))| *at);
        match (arbiter.poll_timeout(), next_done) {
            (Some(grant), Some(done)) if grant < done => {
                now = grant;
                arbiter.handle_timeout(now);
            }
            (_, Some(done)) => {
                now = done;
                let Some(Reverse((_, ticket))) = running.pop() else {
                    break;
                };
                arbiter.commit(ticket, &actual(ticket), now).ok();
            }
            (Some(grant), None) => {
                now = grant;
                arbiter.handle_timeout(now);
            }
            (None, None) => break,
        }
    }
    last.since_origin()
}

async fn reconcile_provider() -> Result<Row, String> {
    let window = Duration::from_secs(1);
    let config = SimConfig::default()
        .rpm(LimitSpec::per_minute(1_000).window(window))
        .tpm(LimitSpec::per_minute(8_000).window(window))
        .charging(Charging::ActualUsage)
        .completion_tokens(20, 60)
        .latency(Latency::Fixed(Duration::from_millis(20)));
    // The conservative burst, so that reconciling is the only difference (a client that
    // syncs to the provider's reported remaining reconciles through the headers too).
    let limits = Limits::per_minute(1_000, 8_000)
        .window(window)
        .burst(ratebucket_openai::Burst::Conservative);
    let mut makespans = Vec::new();
    for reconcile in [true, false] {
        let sim = start(config.clone())?;
        let base = openai_config(&sim).reconcile(reconcile);
        let limiter =
            ratebucket_tokio::limiter(limits.buckets(Instant::ZERO).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        let client = Client::new(HyperTransport::default(), limiter, limits, base);
        let started = StdInstant::now();
        all((0..150).map(|i| chat(i, 160)).collect(), |request| {
            let client = client.clone();
            async move { client.complete(request).await.is_ok() }
        })
        .await?;
        makespans.push(started.elapsed());
    }
    let (ours, naive) = (makespans[0], makespans[1]);
    Ok(Row {
        invariant: RECONCILE_INVARIANT,
        setting: PROVIDER,
        measure: "makespan, 150 calls, 8,000 tokens/s".into(),
        ours: format!("{:.2} s", ours.as_secs_f64()),
        naive: format!("{:.2} s (max_tokens kept)", naive.as_secs_f64()),
        holds: ours < naive,
    })
}

// ---------------------------------------------------------------------------------------
// 4. Backfilling never delays the head.

const BACKFILL_INVARIANT: &str = "backfilling never delays the head";

/// The head needs the whole token bucket (due at 1 s from empty); behind it, every 20 ms a
/// small call arrives: half need only a request, half also 10 tokens.
fn backfill_arrivals() -> Vec<(Instant, [u64; 2])> {
    (0..40).map(|i| (ms(10 + 20 * i), [1, if i % 2 == 0 { 0 } else { 10 }])).collect()
}

fn backfill_virtual() -> Row {
    let empty = || {
        let mut tokens = bucket(100, 100);
        tokens.take(100, Instant::ZERO);
        vec![bucket(1_000, 1_000), tokens]
    };
    // ratebucket with conservative backfilling.
    let mut arbiter =
        Arbiter::new(empty(), ArbiterConfig::default().with_backfill(true), Instant::ZERO)
            .expect("arbiter");
    let head = arbiter.reserve(&[1, 100], Instant::ZERO).expect("fits");
    let mut head_at = None;
    let mut early = 0;
    let mut now = Instant::ZERO;
    let mut arrivals = backfill_arrivals().into_iter().peekable();
    loop {
        while let Some(event) = arbiter.poll_event() {
            if let Event::Granted { ticket, .. } = event {
                if ticket == head {
                    head_at = Some(now);
                } else if head_at.is_none() {
                    early += 1;
                }
            }
        }
        let next_arrival = arrivals.peek().map(|(at, _)| *at);
        match (arbiter.poll_timeout(), next_arrival) {
            (Some(at), Some(arrival)) if at < arrival => {
                now = at;
                arbiter.handle_timeout(at);
            }
            (_, Some(_)) => {
                let (at, cost) = arrivals.next().expect("peeked");
                now = at;
                arbiter.reserve(&cost, at).expect("fits");
            }
            (Some(at), None) => {
                now = at;
                arbiter.handle_timeout(at);
            }
            (None, None) => break,
        }
    }
    let ours = head_at.expect("granted").since_origin();
    // Naive, greedy: every millisecond, any waiter that fits both buckets goes.
    let mut buckets = empty();
    let mut waiting: Vec<[u64; 2]> = vec![[1, 100]];
    let mut arrivals = backfill_arrivals().into_iter().peekable();
    let mut greedy_head = None;
    for t in 0..10_000 {
        let now = ms(t);
        while arrivals.peek().is_some_and(|(at, _)| *at <= now) {
            waiting.push(arrivals.next().expect("peeked").1);
        }
        let mut i = 0;
        while i < waiting.len() {
            let cost = waiting[i];
            if buckets[0].fits(cost[0], now) && buckets[1].fits(cost[1], now) {
                buckets[0].take(cost[0], now);
                buckets[1].take(cost[1], now);
                if cost[1] == 100 {
                    greedy_head = Some(now);
                }
                waiting.remove(i);
            } else {
                i += 1;
            }
        }
        if greedy_head.is_some() {
            break;
        }
    }
    let naive = greedy_head.map(Instant::since_origin);
    Row {
        invariant: BACKFILL_INVARIANT,
        setting: VIRTUAL,
        measure: "head granted at (due at 1.000 s alone) / small calls sent before it".into(),
        ours: format!("{:.3} s / {early}", ours.as_secs_f64()),
        naive: format!(
            "{} (greedy: whoever fits goes)",
            naive.map_or("never".into(), |d| format!("{:.3} s", d.as_secs_f64()))
        ),
        holds: ours == Duration::from_secs(1) && early > 0,
    }
}

async fn backfill_provider() -> Result<Row, String> {
    // The same shape through the async limiter: the head's wait in real time, with
    // conservative backfilling and with greedy polling.
    let empty = || {
        let mut tokens = bucket(100, 100);
        tokens.take(100, Instant::ZERO);
        vec![bucket(1_000, 1_000), tokens]
    };
    let sim = start(SimConfig::default().latency(Latency::Fixed(Duration::from_millis(2))))?;
    let url = format!("{}/v1/chat/completions", sim.base_url());
    let transport = HyperTransport::default();
    let limiter =
        ratebucket_tokio::limiter_with(empty(), ArbiterConfig::default().with_backfill(true))
            .map_err(|e| e.to_string())?;
    let started = StdInstant::now();
    let head = {
        let (limiter, transport, url) = (limiter.clone(), transport.clone(), url.clone());
        tokio::spawn(async move {
            let reservation = limiter.reserve(&[1, 100]).await.map_err(|e| e.to_string())?;
            let granted = started.elapsed();
            post(&transport, &url, body(&chat(0, 100)), Duration::from_secs(5)).await?;
            reservation.commit(&[1, 100]).ok();
            Ok::<_, String>(granted)
        })
    };
    let smalls: Vec<_> = backfill_arrivals()
        .into_iter()
        .enumerate()
        .map(|(i, (at, cost))| {
            let (limiter, transport, url) = (limiter.clone(), transport.clone(), url.clone());
            tokio::spawn(async move {
                tokio::time::sleep(at.since_origin()).await;
                let Ok(reservation) = limiter.reserve(&cost).await else {
                    return;
                };
                post(&transport, &url, body(&chat(i + 1, 10)), Duration::from_secs(5)).await.ok();
                reservation.commit(&cost).ok();
            })
        })
        .collect();
    let ours = head.await.map_err(|e| e.to_string())??;
    for small in smalls {
        small.await.map_err(|e| e.to_string())?;
    }
    // Greedy: each waiter polls the buckets every millisecond and goes if it fits.
    let buckets = std::sync::Arc::new(std::sync::Mutex::new(empty()));
    let origin = StdInstant::now();
    let now = move || Instant::from_duration(origin.elapsed());
    let greedy = |cost: [u64; 2], after: Duration| {
        let buckets = std::sync::Arc::clone(&buckets);
        async move {
            tokio::time::sleep(after).await;
            loop {
                {
                    let mut b = buckets.lock().expect("buckets");
                    let t = now();
                    if b[0].fits(cost[0], t) && b[1].fits(cost[1], t) {
                        b[0].take(cost[0], t);
                        b[1].take(cost[1], t);
                        return origin.elapsed();
                    }
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    let head = tokio::spawn(greedy([1, 100], Duration::ZERO));
    let smalls: Vec<_> = backfill_arrivals()
        .into_iter()
        .map(|(at, cost)| tokio::spawn(greedy(cost, at.since_origin())))
        .collect();
    let naive = head.await.map_err(|e| e.to_string())?;
    for small in smalls {
        small.await.map_err(|e| e.to_string())?;
    }
    // A timer fires a little late, never early: the head is due at 1 s.
    let slack = Duration::from_millis(100);
    Ok(Row {
        invariant: BACKFILL_INVARIANT,
        setting: PROVIDER,
        measure: "head granted at (due at 1.000 s alone)".into(),
        ours: format!("{:.3} s", ours.as_secs_f64()),
        naive: format!("{:.3} s (greedy polling)", naive.as_secs_f64()),
        holds: ours < Duration::from_secs(1) + slack,
    })
}

// ---------------------------------------------------------------------------------------
// 5. No ambiguous request re-sent.

const DUPLICATE_INVARIANT: &str = "no ambiguous request re-sent";

fn no_duplicate_virtual() -> Row {
    let mut rng = fastrand::Rng::with_seed(5);
    let kinds = [FailureKind::ResetAfterSend, FailureKind::ReadTimeout, FailureKind::BodyCut];
    let (mut ours, mut naive, mut ambiguous) = (0, 0, 0);
    for _ in 0..1_000 {
        // 3% of the requests reach the provider, are executed, and their reply is lost.
        if rng.f64() >= 0.03 {
            continue;
        }
        ambiguous += 1;
        let outcome = Outcome::failure(kinds[rng.usize(..kinds.len())]);
        let mut retry = Retry::new(RetryPolicy::default());
        if !matches!(
            retry.decide(&outcome, Instant::ZERO, &mut rng),
            Action::Fail(_) | Action::Abort(_)
        ) {
            ours += 1;
        }
        // Retry-everything sends it again.
        naive += 1;
    }
    Row {
        invariant: DUPLICATE_INVARIANT,
        setting: VIRTUAL,
        measure: format!("requests executed twice ({ambiguous} replies lost)"),
        ours: ours.to_string(),
        naive: format!("{naive} (retry everything)"),
        holds: ours == 0,
    }
}

async fn no_duplicate_provider() -> Result<Row, String> {
    let config = SimConfig::default()
        .fault(Fault::ResetBeforeResponse, Trigger::Rate(0.05))
        .latency(Latency::Fixed(Duration::from_millis(2)))
        .seed(9);
    let prompts = || (0..200).map(|i| chat(i, 20)).collect::<Vec<_>>();
    let duplicates = |log: &[LogEntry]| {
        let mut seen: HashMap<Option<String>, u32> = HashMap::new();
        for entry in log {
            *seen.entry(entry.user.clone()).or_default() += 1;
        }
        seen.values().filter(|&&n| n > 1).count()
    };
    let sim = start(config.clone())?;
    let client = client(&sim, Limits::per_minute(60_000, 6_000_000))?;
    all(prompts(), |request| {
        let client = client.clone();
        async move { client.complete(request).await.is_ok() }
    })
    .await?;
    let ours = duplicates(&sim.log());
    let sim = start(config)?;
    let transport = HyperTransport::default();
    let url = format!("{}/v1/chat/completions", sim.base_url());
    all(prompts(), |request| {
        let (transport, url) = (transport.clone(), url.clone());
        async move {
            for _ in 0..3 {
                if post(&transport, &url, body(&request), Duration::from_secs(5))
                    .await
                    .is_ok_and(|(status, _, _)| status.is_success())
                {
                    return true;
                }
            }
            false
        }
    })
    .await?;
    let naive = duplicates(&sim.log());
    Ok(Row {
        invariant: DUPLICATE_INVARIANT,
        setting: PROVIDER,
        measure: "prompts the provider saw twice (5% of connections reset)".into(),
        ours: ours.to_string(),
        naive: format!("{naive} (retry everything)"),
        holds: ours == 0,
    })
}

// ---------------------------------------------------------------------------------------
// Helpers for the provider legs.

fn start(config: SimConfig) -> Result<SimHandle, String> {
    Sim::start(config).map_err(|e| e.to_string())
}

fn chat(i: usize, max_tokens: u64) -> ChatRequest {
    let mut request =
        ChatRequest::new("sim-model", vec![Message::user(format!("Prove invariant, prompt {i}."))])
            .max_tokens(max_tokens);
    request.user = Some(i.to_string());
    request
}

fn estimate(request: &ChatRequest) -> u64 {
    use ratebucket_openai::TokenEstimator;
    ratebucket_openai::CharsPerToken.prompt_tokens(request) + request.max_tokens.unwrap_or(0)
}

fn openai_config(sim: &SimHandle) -> OpenAiConfig {
    OpenAiConfig::new(Endpoint::OpenAi(sim.base_url()), Auth::Bearer("sk-prove".into()))
        .fetch(FetchConfig::default().read_timeout(Duration::from_secs(2)))
}

fn client(sim: &SimHandle, limits: Limits) -> Result<Client<HyperTransport>, String> {
    let buckets = limits.buckets(Instant::ZERO).map_err(|e| e.to_string())?;
    let limiter = ratebucket_tokio::limiter(buckets).map_err(|e| e.to_string())?;
    Ok(Client::new(HyperTransport::default(), limiter, limits, openai_config(sim)))
}

/// Runs `call` on every request at once and waits for all of them.
async fn all<F, Fut>(requests: Vec<ChatRequest>, call: F) -> Result<usize, String>
where
    F: Fn(ChatRequest) -> Fut,
    Fut: Future<Output = bool> + Send + 'static,
{
    let tasks: Vec<_> = requests.into_iter().map(|r| tokio::spawn(call(r))).collect();
    let mut ok = 0;
    for task in tasks {
        ok += usize::from(task.await.map_err(|e| e.to_string())?);
    }
    Ok(ok)
}

fn refused(log: &[LogEntry]) -> usize {
    log.iter().filter(|e| e.refusal.is_some()).count()
}

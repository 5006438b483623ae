//! What a run says about itself: the estimate `--dry-run` prints, and the summary at the
//! end (outcomes, makespan against the lower bound the limits imply, 429s and tokens).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::api::{Api, Quota};
use crate::batch::{Report, Runner, Stats};
use crate::input::Line;
use crate::progress::human;
use crate::store::journal_path;

/// The time a provider with these limits needs for `used` against `limit` per `window`,
/// starting with a full window's worth.
fn time_for(used: u64, limit: u64, window: Duration) -> Duration {
    let windows = used.saturating_sub(limit) as f64 / limit.max(1) as f64;
    Duration::try_from_secs_f64(window.as_secs_f64() * windows).unwrap_or(Duration::MAX)
}

pub(crate) fn dry_run(api: Api, lines: &[Line], limits: &Quota, default_max_tokens: u64) {
    let requests = lines.len() as u64;
    let prompt: u64 = lines.iter().map(|l| l.prompt_tokens).sum();
    let upper: u64 = lines.iter().map(|l| l.upper_bound(default_max_tokens)).sum();
    let output: u64 = lines.iter().map(|l| l.max_tokens.unwrap_or(default_max_tokens)).sum();
    // Per dimension: what the lines likely use, and at most.
    let (used, upto) = match api {
        Api::OpenAi => {
            println!(
                "{requests} requests; tokens: about {prompt} in prompts (four characters a token), up to {upper} with every completion at its limit"
            );
            (vec![requests, prompt], vec![requests, upper])
        }
        Api::Anthropic => {
            println!(
                "{requests} requests; about {prompt} input tokens (four characters a token), up to {output} output tokens with every answer at its max_tokens"
            );
            (vec![requests, prompt, 0], vec![requests, prompt, output])
        }
    };
    let window = limits.window();
    let given = limits.given();
    if given.iter().all(Option::is_none) {
        println!(
            "limits not given: they are learned from the provider's headers; give them (--rpm and {}) for a time estimate",
            match api {
                Api::OpenAi => "--tpm",
                Api::Anthropic => "--itpm, --otpm",
            }
        );
    } else {
        let longest = |used: &[u64], time: &dyn Fn(u64, u64) -> Duration| {
            used.iter()
                .zip(&given)
                .filter_map(|(&used, limit)| limit.map(|l| time(used, l)))
                .max()
                .unwrap_or_default()
        };
        let sustained = |used: u64, limit: u64| {
            let secs = window.as_secs_f64() * used as f64 / limit as f64;
            Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX)
        };
        let burst = |used: u64, limit: u64| time_for(used, limit, window);
        let shown = |limit: Option<u64>| limit.map_or("unlimited".into(), |l| l.to_string());
        let told = match api {
            Api::OpenAi => format!("{} requests and {} tokens", shown(given[0]), shown(given[1])),
            Api::Anthropic => format!(
                "{} requests, {} input and {} output tokens",
                shown(given[0]),
                shown(given[1]),
                shown(given[2])
            ),
        };
        println!(
            "at {told} per {}: {} at the sustained rate ({} if every completion reaches its limit); as little as {} against a provider that starts with a full window's worth",
            human(window),
            human(longest(&used, &sustained)),
            human(longest(&upto, &sustained)),
            human(longest(&used, &burst)),
        );
    }
    println!("nothing was sent (--dry-run)");
}

pub(crate) fn summary(
    lines: &[Line],
    skipped: usize,
    output: &Path,
    report: &Report,
    runner: &Runner,
    stats: &Stats,
    window: Duration,
) {
    let api = runner.api();
    let by_kind = |map: &std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>| {
        let map = map.lock().unwrap_or_else(|e| e.into_inner());
        let kinds: Vec<String> = map.iter().map(|(k, n)| format!("{n} {k}")).collect();
        (map.values().sum::<u64>(), kinds.join(", "))
    };
    let (_, recorded) = by_kind(&stats.outcomes);
    let (unfinished, left) = by_kind(&stats.unfinished);
    let done = stats.done.load(Ordering::Relaxed);
    println!(
        "ratebucket batch: {} lines; this run recorded {done} ({}), {skipped} already recorded",
        lines.len(),
        if recorded.is_empty() { "none" } else { &recorded },
    );
    if unfinished > 0 {
        println!("left for the next run: {unfinished} ({left}), not recorded");
    }
    // The bound at the limits in force at the end (given, or learned): a provider that
    // starts with a full window's worth of each.
    let snapshot = runner.limiter().snapshot();
    let used: Vec<u64> = std::iter::once(done).chain(stats.charged(api.dimensions() - 1)).collect();
    let bound = snapshot
        .dimensions
        .iter()
        .zip(used.iter().copied())
        .map(|(dim, used)| {
            let per_window = (dim.state.rate.per_second_f64() * window.as_secs_f64()) as u64;
            time_for(used, per_window, window)
        })
        .max()
        .unwrap_or_default();
    // A resumed run meets a provider that is not full (the previous run spent its
    // window), so its bound is the sustained rate for the lines it sent.
    let sustained = snapshot
        .dimensions
        .iter()
        .zip(used.iter().copied())
        .map(|(dim, used)| {
            let per_second = dim.state.rate.per_second_f64();
            Duration::try_from_secs_f64(used as f64 / per_second).unwrap_or(Duration::MAX)
        })
        .max()
        .unwrap_or_default();
    let (bound, basis) = if skipped > 0 {
        (sustained, "at the sustained rate of the limits in force (a resumed run)")
    } else {
        (bound, "at the limits in force")
    };
    let makespan = report.makespan;
    let ratio = if bound.is_zero() {
        " (within one window's burst)".to_owned()
    } else {
        format!(" ({:.2}x)", makespan.as_secs_f64() / bound.as_secs_f64())
    };
    // Which limit the 429s named, where their headers named one.
    let on: Vec<String> = stats
        .throttled_on
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .map(|(name, n)| format!("{n} on {name}"))
        .collect();
    let named = if on.is_empty() { String::new() } else { format!(" ({})", on.join(", ")) };
    println!(
        "makespan {}; lower bound {} {basis}{ratio}; 429s {}{named}; tokens {}",
        human(makespan),
        human(bound),
        stats.throttled.load(Ordering::Relaxed),
        stats.tokens.load(Ordering::Relaxed),
    );
    println!("output {} (journal {})", output.display(), journal_path(output).display());
}

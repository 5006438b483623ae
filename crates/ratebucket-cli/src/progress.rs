//! Progress: a live bar on a terminal, a plain line every few seconds otherwise, nothing
//! with `--quiet`; the loop that feeds it from the run's counters and the limiter's ETA;
//! and its last line at the end.

use std::io::IsTerminal;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::watch;

use crate::batch::Runner;

/// How progress is shown.
pub(crate) enum Progress {
    /// An indicatif bar on stderr.
    Bar(ProgressBar),
    /// A line on stderr every few seconds (stdout or stderr is not a terminal).
    Lines { total: u64, last: Mutex<Option<Instant>> },
    /// Nothing.
    Quiet,
}

/// How often a plain progress line is written.
const LINE_EVERY: Duration = Duration::from_secs(2);

impl Progress {
    /// The display for a run of `total` lines; `logging`: log lines go to stderr too, so
    /// plain progress lines are written instead of a bar they would break.
    pub(crate) fn new(total: u64, quiet: bool, logging: bool) -> Progress {
        if quiet {
            return Progress::Quiet;
        }
        // A bar only in an interactive terminal; logs and pipes get plain lines.
        if logging || !std::io::stdout().is_terminal() || !std::io::stderr().is_terminal() {
            return Progress::Lines { total, last: Mutex::new(None) };
        }
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template(
            "{spinner:.green} {elapsed_precise} [{bar:40.cyan/blue}] {pos}/{len} {msg}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        Progress::Bar(bar)
    }

    /// Shows `done` lines, the 429s and tokens so far, and the limiter's ETA (or why there
    /// is none).
    pub(crate) fn update(&self, done: u64, throttled: u64, tokens: u64, eta: Eta) {
        let eta = match eta {
            Eta::In(eta) => format!("eta {}", human(eta)),
            Eta::Unknown => "eta -".to_owned(),
            Eta::NoAnswerFor(silent) => format!("eta - (no answer for {})", human(silent)),
        };
        match self {
            Progress::Bar(bar) => {
                bar.set_position(done);
                bar.set_message(format!("| 429s {throttled} | tokens {tokens} | {eta}"));
            }
            Progress::Lines { total, last } => {
                let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
                if last.is_some_and(|at| at.elapsed() < LINE_EVERY) {
                    return;
                }
                *last = Some(Instant::now());
                eprintln!(
                    "progress: {done}/{total} done, {throttled} 429s, {tokens} tokens, {eta}"
                );
            }
            Progress::Quiet => {}
        }
    }

    /// Ends the display with the run's final counts, on a line of its own (the bar is
    /// cleared first), so whatever is printed next starts on a fresh line.
    pub(crate) fn finish(&self, done: u64, throttled: u64, tokens: u64) {
        let total = match self {
            Progress::Bar(bar) => {
                bar.finish_and_clear();
                bar.length().unwrap_or(done)
            }
            Progress::Lines { total, .. } => *total,
            Progress::Quiet => return,
        };
        eprintln!("progress: {done}/{total} done, {throttled} 429s, {tokens} tokens");
    }
}

/// What the display says of the time left.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Eta {
    /// The limiter's estimate.
    In(Duration),
    /// None yet (limits still to be learned).
    Unknown,
    /// The provider has answered nothing for this long: no estimate holds.
    NoAnswerFor(Duration),
}

/// `1.2 s`, `3 min 05 s`, `2 h 04 min`.
pub(crate) fn human(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else if secs < 3600.0 {
        let whole = duration.as_secs();
        format!("{} min {:02} s", whole / 60, whole % 60)
    } else {
        let whole = duration.as_secs();
        format!("{} h {:02} min", whole / 3600, (whole % 3600) / 60)
    }
}

/// Shows the run's progress until `stop_showing` is set.
pub(crate) async fn show(
    progress: Progress,
    runner: Arc<Runner>,
    total: u64,
    mean_upper: Vec<u64>,
    limits_known: bool,
    mut stop_showing: watch::Receiver<bool>,
) -> Progress {
    let mut tick = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tick.tick() => {},
            _ = stop_showing.changed() => break,
        }
        let stats = runner.stats();
        let done = stats.done.load(Ordering::Relaxed);
        let dispatched = stats.dispatched.load(Ordering::Relaxed);
        // The honest ETA: what the limiter says the rest takes at the rates in force, each
        // line charged the mean charge so far (the upper bound before anything is known).
        let waiting = total.saturating_sub(dispatched);
        let left: Vec<u64> = std::iter::once(waiting)
            .chain(stats.charged(mean_upper.len()).into_iter().zip(&mean_upper).map(
                |(charged, &upper)| {
                    waiting.saturating_mul(charged.checked_div(done).unwrap_or(upper))
                },
            ))
            .collect();
        // Limits to be learned from the first replies' headers give no ETA until one came.
        let learned = limits_known || done > 0 || stats.throttled.load(Ordering::Relaxed) > 0;
        let silent = runner.since_answer();
        let eta = match learned.then(|| runner.limiter().estimate_drain(&left).ok()).flatten() {
            // Every request failing, nothing answering: the limiter's estimate is no
            // estimate of the run.
            _ if dispatched > 0 && silent > NO_ANSWER_ETA => Eta::NoAnswerFor(silent),
            Some(eta) => Eta::In(eta),
            None => Eta::Unknown,
        };
        progress.update(
            done,
            stats.throttled.load(Ordering::Relaxed),
            stats.tokens.load(Ordering::Relaxed),
            eta,
        );
    }
    progress.finish(
        runner.stats().done.load(Ordering::Relaxed),
        runner.stats().throttled.load(Ordering::Relaxed),
        runner.stats().tokens.load(Ordering::Relaxed),
    );
    progress
}

/// How long the provider may answer nothing before the display stops quoting an ETA.
const NO_ANSWER_ETA: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_a_person_would_say_them() {
        assert_eq!(human(Duration::from_millis(1_250)), "1.2 s");
        assert_eq!(human(Duration::from_secs(185)), "3 min 05 s");
        assert_eq!(human(Duration::from_secs(7_440)), "2 h 04 min");
    }
}

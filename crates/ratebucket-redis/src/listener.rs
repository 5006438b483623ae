//! What each process runs beside its driver: the listener for pauses other processes
//! announce on the gate's channel, and the process's id.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ratebucket_tokio::Limiter;

use crate::Shared;
use crate::backend::Backend;
use crate::driver::RETRY;
use crate::script::Keys;

/// Takes a pause another process announced, once per shared epoch.
pub(crate) fn take_pause(limiter: &Limiter, shared: &Shared, epoch: u64, pause_us: u64) {
    if shared.known_epoch.fetch_max(epoch, Ordering::Relaxed) >= epoch {
        return;
    }
    let pause = Duration::from_micros(pause_us);
    let outcome = limiter.throttle(limiter.stamp_send(), Some(pause));
    if matches!(outcome, ratebucket_tokio::core::ThrottleOutcome::Closed { .. }) {
        shared.pauses_taken.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(target: "ratebucket", epoch, ?pause, "pause announced by another process");
    }
}

/// Listens on the gate's channel for pauses other processes announce; reconnects (through
/// the next node on a cluster, the current primary with Sentinel) until the limiter shuts
/// down.
pub(crate) async fn listen(
    backend: Backend,
    keys: Keys,
    id: String,
    limiter: Limiter,
    shared: Arc<Shared>,
) {
    for attempt in 0.. {
        if shared.stopping.load(Ordering::Relaxed) {
            return;
        }
        let connected =
            tokio::time::timeout(Duration::from_secs(1), backend.subscribe(attempt, &keys.channel))
                .await;
        if let Ok(Ok(mut messages)) = connected {
            // Ended below: whatever ends a subscription may have lost the quota's state.
            let _lost = LostContact(&shared);
            while let Some(payload) = messages.next().await {
                let Ok(payload) = String::from_utf8(payload) else {
                    continue;
                };
                let mut fields = payload.split(' ');
                let mut number = || fields.next().and_then(|f| f.parse::<u64>().ok());
                let (epoch, pause_us) = (number(), number());
                let own = fields.next() == Some(id.as_str());
                if let (Some(epoch), Some(pause_us), false) = (epoch, pause_us, own) {
                    take_pause(&limiter, &shared, epoch, pause_us);
                }
            }
        }
        tokio::time::sleep(RETRY).await;
    }
}

/// Counts a subscription's end (also when its task is cancelled mid-read).
struct LostContact<'a>(&'a Shared);

impl Drop for LostContact<'_> {
    fn drop(&mut self) {
        self.0.lost_contact.fetch_add(1, Ordering::Relaxed);
    }
}

/// A process id unique across hosts and restarts.
pub(crate) fn process_id() -> String {
    format!("{}-{}-{:016x}", hostname(), std::process::id(), fastrand::u64(..))
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}

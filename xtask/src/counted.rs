//! Counting the polls of acquisition futures, to measure wakeups per grant.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

/// Polls of the wrapped futures, and how many of them completed.
#[derive(Debug, Default)]
pub(crate) struct Polls {
    polls: AtomicU64,
    completed: AtomicU64,
}

impl Polls {
    /// (polls, completions) so far.
    pub(crate) fn get(&self) -> (u64, u64) {
        (self.polls.load(Ordering::Relaxed), self.completed.load(Ordering::Relaxed))
    }
}

/// A future that counts its polls (and its completion) in a [`Polls`].
pub(crate) struct Counted<'a, F> {
    inner: Pin<Box<F>>,
    polls: &'a Polls,
}

impl<'a, F> Counted<'a, F> {
    pub(crate) fn new(inner: F, polls: &'a Polls) -> Self {
        Counted { inner: Box::pin(inner), polls }
    }
}

impl<F: Future> Future for Counted<'_, F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.polls.polls.fetch_add(1, Ordering::Relaxed);
        let out = self.inner.as_mut().poll(cx);
        if out.is_ready() {
            self.polls.completed.fetch_add(1, Ordering::Relaxed);
        }
        out
    }
}

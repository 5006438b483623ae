//! The handles reservations hold on their limiter, striped by thread: a reservation made
//! and ended on one thread touches a reference count no other thread touches.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::shared::Shared;

/// The most stripes a limiter keeps: beyond the cores that contend, more only cost memory.
const MOST: usize = 8;

/// One handle on the limiter's shared state, in a cache line of its own: cloning and
/// dropping it (as a reservation is made and ended) writes only its own count.
#[repr(align(64))]
pub(crate) struct Stripe {
    pub(crate) shared: Arc<Shared>,
}

/// A limiter's stripes, one per core that may contend (at most [`MOST`]).
pub(crate) struct Stripes(Box<[Arc<Stripe>]>);

/// Numbers threads as they first make a reservation.
static THREADS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's number, given at its first reservation.
    static THREAD: Cell<Option<usize>> = const { Cell::new(None) };
}

impl Stripes {
    /// Stripes over `shared`: as many as the cores, at most [`MOST`].
    pub(crate) fn new(shared: &Arc<Shared>) -> Stripes {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let count = cores.clamp(1, MOST);
        Stripes((0..count).map(|_| Arc::new(Stripe { shared: Arc::clone(shared) })).collect())
    }

    /// The stripe of the calling thread.
    #[inline]
    pub(crate) fn here(&self) -> &Arc<Stripe> {
        let thread = THREAD.with(|thread| {
            thread.get().unwrap_or_else(|| {
                let n = THREADS.fetch_add(1, Ordering::Relaxed);
                thread.set(Some(n));
                n
            })
        });
        &self.0[thread % self.0.len()]
    }

    /// Whether no reservation holds any stripe.
    pub(crate) fn unheld(&self) -> bool {
        self.0.iter().all(|stripe| Arc::strong_count(stripe) == 1)
    }

    /// How many there are.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

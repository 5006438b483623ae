//! `cargo xtask microbench`: the core state machine's costs, side by side with governor.
//!
//! The timings come from the criterion benchmarks in `xtask/benches/fast_path.rs`
//! (uncontended reserve+commit against governor's `check()` on a virtual clock and through
//! the tokio handle, eight tasks contending for one limiter, the cost of one grant with N
//! waiters queued); this task runs them, reads criterion's medians and prints the ratios
//! side by side. The heap bytes each queued waiter costs are measured here, in process.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicIsize, Ordering};

use ratebucket_core::{Arbiter, ArbiterConfig, Caller, Instant, Rate, TokenBucket};

/// Counts live heap bytes, for the memory-per-waiter figure.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: delegates to the system allocator and only adds bookkeeping.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The figures `run` prints: (criterion id, label).
const FIGURES: &[(&str, &str)] = &[
    ("uncontended/ratebucket_virtual", "ratebucket reserve+commit, 2 dims, virtual clock (lane)"),
    ("uncontended/arbiter_virtual", "the arbiter alone (ticketed, no lane), virtual clock"),
    ("uncontended/governor_fake_clock", "governor check(), 1 dim, fake clock"),
    ("uncontended/ratebucket_tokio", "ratebucket reserve+commit, 2 dims, tokio handle"),
    ("uncontended/governor_default_clock", "governor check(), 1 dim, default clock"),
    ("contended/ratebucket_tokio", "ratebucket, 8 tasks, tokio handle"),
    ("contended/governor_default_clock", "governor, 8 tasks"),
    ("percall/bare_transport", "a call on a transport that answers at once"),
    ("percall/fetcher", "the same call through Fetcher (limits never bind)"),
    ("percall/bare_service", "a call on a tower service that answers at once"),
    ("percall/pace_layer", "the same call through PaceLayer (limits never bind)"),
    ("queued/10", "one grant, 10 waiters queued"),
    ("queued/10000", "one grant, 10,000 waiters queued"),
    ("queued/1000000", "one grant, 1,000,000 waiters queued"),
];

/// The side-by-side ratios: (label, ours, theirs).
const RATIOS: &[(&str, &str, &str)] = &[
    (
        "uncontended, virtual clock",
        "uncontended/ratebucket_virtual",
        "uncontended/governor_fake_clock",
    ),
    (
        "uncontended, through the tokio handle",
        "uncontended/ratebucket_tokio",
        "uncontended/governor_default_clock",
    ),
    ("contended, 8 tasks", "contended/ratebucket_tokio", "contended/governor_default_clock"),
    (
        "the arbiter alone, virtual clock",
        "uncontended/arbiter_virtual",
        "uncontended/governor_fake_clock",
    ),
    ("grant, 1,000,000 queued vs 10", "queued/1000000", "queued/10"),
];

pub(crate) fn run() -> Result<(), String> {
    if cfg!(debug_assertions) {
        // The memory figure below is taken in this process: run it optimised, like the
        // benchmarks.
        return crate::cargo(
            &["run", "--release", "--quiet", "-p", "xtask", "--", "microbench"],
            &[],
        );
    }
    crate::cargo(&["bench", "-p", "xtask", "--bench", "fast_path", "--", "--noplot"], &[])?;
    let root = criterion_dir()?;
    let median = |id: &str| median_ns(&root.join(id).join("new/estimates.json"));
    println!();
    println!("medians per operation (criterion, `cargo bench -p xtask --bench fast_path`)");
    for (id, label) in FIGURES {
        println!("  {label:<52} {:>9.1} ns", median(id)?);
    }
    println!();
    println!("ratios, ours / theirs, from this one run");
    for (label, ours, theirs) in RATIOS {
        println!("  {label:<52} {:>9.2}x", median(ours)? / median(theirs)?);
    }
    let added = median("percall/fetcher")? - median("percall/bare_transport")?;
    println!("  {:<52} {:>9.0} ns", "added per call by Fetcher (limits never bind)", added);
    let added = median("percall/pace_layer")? - median("percall/bare_service")?;
    println!("  {:<52} {:>9.0} ns", "added per call by PaceLayer (limits never bind)", added);
    println!();
    let bytes = bytes_per_waiter(1_000_000);
    println!(
        "memory: {bytes:.1} bytes of heap per queued waiter (1,000,000 queued from 100 tenants, 2 dimensions)"
    );
    Ok(())
}

/// Where criterion wrote its estimates: `<target dir>/criterion`.
fn criterion_dir() -> Result<PathBuf, String> {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"),
    };
    Ok(target.join("criterion"))
}

/// The median estimate, in nanoseconds, from one of criterion's `estimates.json` files.
fn median_ns(path: &Path) -> Result<f64, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("could not read {}: {e}", path.display()))?;
    let estimates: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| format!("{} is not criterion's JSON: {e}", path.display()))?;
    estimates["median"]["point_estimate"]
        .as_f64()
        .ok_or_else(|| format!("{} has no median", path.display()))
}

fn bytes_per_waiter(queued: usize) -> f64 {
    let requests = TokenBucket::new(Rate::per_second(1).expect("rate"), 1, Instant::ZERO);
    let tokens = TokenBucket::new(Rate::per_second(1).expect("rate"), 1, Instant::ZERO);
    let before = LIVE.load(Ordering::Relaxed);
    let mut arbiter = Arbiter::new(
        vec![requests.expect("bucket"), tokens.expect("bucket")],
        ArbiterConfig::default(),
        Instant::ZERO,
    )
    .expect("arbiter");
    // From 100 tenants in turn: each tenant's fair share is kept.
    for i in 0..queued {
        let caller = Caller::tenant((i % 100) as u32);
        arbiter.reserve_for(caller, &[1, 1], None, Instant::ZERO).expect("fits");
    }
    while let Some(event) = arbiter.poll_event() {
        black_box(event);
    }
    let after = LIVE.load(Ordering::Relaxed);
    black_box(&arbiter);
    (after - before) as f64 / queued as f64
}

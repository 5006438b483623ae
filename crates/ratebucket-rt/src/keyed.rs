//! One limiter per key (a model, an API key, a tenant), made on first use and dropped when
//! dropping it loses nothing.

use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use ratebucket_core::InvalidLimit;

use crate::Limiter;

/// Why a key's limiter could not be had.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum KeyedError {
    /// Making the key's limiter failed: its limits are invalid.
    InvalidLimit(InvalidLimit),
    /// `max_keys` limiters are alive and every one is in use or still recovering its
    /// quota: none can be dropped without forgetting what it has granted.
    TooManyKeys {
        /// The bound that was reached.
        max_keys: usize,
    },
}

impl fmt::Display for KeyedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyedError::InvalidLimit(e) => write!(f, "cannot make the key's limiter: {e}"),
            KeyedError::TooManyKeys { max_keys } => write!(
                f,
                "{max_keys} keys have live limiters and none is idle: raise max_keys or retry \
                 once some quota has refilled"
            ),
        }
    }
}

impl std::error::Error for KeyedError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            KeyedError::InvalidLimit(e) => Some(e),
            KeyedError::TooManyKeys { .. } => None,
        }
    }
}

type Make<K> = dyn Fn(&K) -> Result<Limiter, InvalidLimit> + Send + Sync;

/// A limiter per key, each with its own buckets and its own 429 gate (a throttle on one
/// model pauses that model's callers only), made lazily by a function of the key.
///
/// Memory is bounded: at most `max_keys` limiters live at once (10,000 by default). A
/// key's limiter is dropped only when that loses nothing — no handle or reservation of it
/// is held, no one waits on it, its gate is open and every bucket has refilled to
/// capacity — so a key that comes back gets exactly the limiter it would have had. Dormant
/// limiters are swept when a new key would exceed the bound, or by
/// [`KeyedLimiter::evict_dormant`]. When every live limiter is busy, a new key is refused
/// with [`KeyedError::TooManyKeys`] rather than forgetting anyone's quota.
///
/// ```
/// use ratebucket_rt::core::{ArbiterConfig, Limit};
/// use ratebucket_rt::{KeyedLimiter, Limiter, Timer};
///
/// // Per-model limits, on whatever runtime `timer` belongs to: a bigger model gets fewer
/// // requests.
/// fn per_model<T: Timer + Clone>(timer: T) -> KeyedLimiter<String> {
///     KeyedLimiter::new(move |model: &String| {
///         let rpm = if model.contains("mini") { 5_000 } else { 500 };
///         Limiter::from_limits([Limit::per_minute(rpm)], ArbiterConfig::default(), timer.clone())
///     })
/// }
///
/// async fn call(models: &KeyedLimiter<String>) -> Result<(), Box<dyn std::error::Error>> {
///     models.get(&"gpt-4o-mini".to_owned())?.acquire(&[1]).await?;
///     // ... send the request ...
///     Ok(())
/// }
/// ```
pub struct KeyedLimiter<K> {
    make: Box<Make<K>>,
    limiters: Mutex<HashMap<K, Limiter>>,
    max_keys: usize,
}

impl<K: Hash + Eq + Clone> KeyedLimiter<K> {
    /// Limiters made by `make` for each key on first use.
    pub fn new(
        make: impl Fn(&K) -> Result<Limiter, InvalidLimit> + Send + Sync + 'static,
    ) -> KeyedLimiter<K> {
        KeyedLimiter {
            make: Box::new(make),
            limiters: Mutex::new(HashMap::new()),
            max_keys: 10_000,
        }
    }

    /// Keeps at most `max_keys` limiters alive (at least 1).
    pub fn max_keys(mut self, max_keys: usize) -> KeyedLimiter<K> {
        self.max_keys = max_keys.max(1);
        self
    }

    /// The limiter of `key`, made now if it has none.
    pub fn get(&self, key: &K) -> Result<Limiter, KeyedError> {
        let mut limiters = self.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(limiter) = limiters.get(key) {
            return Ok(limiter.clone());
        }
        if limiters.len() >= self.max_keys {
            limiters.retain(|_, limiter| !limiter.is_dormant());
            if limiters.len() >= self.max_keys {
                return Err(KeyedError::TooManyKeys { max_keys: self.max_keys });
            }
        }
        let limiter = (self.make)(key).map_err(KeyedError::InvalidLimit)?;
        limiters.insert(key.clone(), limiter.clone());
        Ok(limiter)
    }

    /// Drops every limiter whose loss changes nothing (see the type's docs) and returns
    /// how many went.
    pub fn evict_dormant(&self) -> usize {
        let mut limiters = self.limiters.lock().unwrap_or_else(PoisonError::into_inner);
        let before = limiters.len();
        limiters.retain(|_, limiter| !limiter.is_dormant());
        before - limiters.len()
    }

    /// Keys with a live limiter.
    pub fn len(&self) -> usize {
        self.limiters.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// Whether no key has a live limiter.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl<K> fmt::Debug for KeyedLimiter<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.limiters.lock().unwrap_or_else(PoisonError::into_inner).len();
        f.debug_struct("KeyedLimiter")
            .field("keys", &keys)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

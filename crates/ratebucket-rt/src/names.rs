//! What a limiter and its dimensions are called, in spans, metrics, snapshots and errors.

use std::sync::Arc;

use ratebucket_core::LearnedQuota;

/// The names a limiter reports itself by in spans, metrics, snapshots and errors.
#[derive(Clone, Debug)]
pub(crate) struct Names {
    /// The limiter's name (`"openai/gpt-4o-mini"`); `"limiter"` unless set.
    pub(crate) limiter: Arc<str>,
    /// One per dimension (`"requests"`, `"tokens"`); the index unless named.
    pub(crate) dimensions: Vec<Arc<str>>,
}

impl Names {
    /// Default names: `"limiter"`, and each dimension's `given` name or its index.
    pub(crate) fn new(given: impl IntoIterator<Item = Option<&'static str>>) -> Names {
        Names {
            limiter: Arc::from("limiter"),
            dimensions: given
                .into_iter()
                .enumerate()
                .map(|(d, name)| name.map_or_else(|| Arc::from(d.to_string()), Arc::from))
                .collect(),
        }
    }

    /// `dimension`'s name, or its index if there is no such dimension.
    pub(crate) fn dimension(&self, dimension: usize) -> Arc<str> {
        self.dimensions.get(dimension).cloned().unwrap_or_else(|| Arc::from(dimension.to_string()))
    }

    /// Tells the log what `dimension` learned from a report, if that changed anything.
    pub(crate) fn trace_learned(
        &self,
        dimension: usize,
        before: Option<LearnedQuota>,
        after: Option<LearnedQuota>,
    ) {
        if let (Some(before), Some(after)) = (before, after)
            && before != after
        {
            tracing::debug!(
                target: "ratebucket",
                limiter = %self.limiter,
                dimension = %self.dimension(dimension),
                limit = ?after.limit,
                model = ?after.model,
                provider_burst = after.provider_burst,
                guarded = after.guarded,
                "learned from the provider's reports"
            );
        }
    }
}

//! Why a reservation through the async layer did not produce a grant: the core's
//! [`ReserveError`], one type for both layers.

pub use ratebucket_core::ReserveError;

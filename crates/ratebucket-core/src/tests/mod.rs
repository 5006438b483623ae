//! Tests that drive the arbiter through inputs only the crate itself makes (learning's
//! direct inputs: `sync_level`, `adopt_remaining`, `observe_remaining`, `observe_limit`,
//! `stop_sync`), beside the public ones, with the same harness as the integration tests.

#[path = "../../tests/support/mod.rs"]
mod support;

mod arbiter;
mod first_alone;
mod funded;
mod inspect;
mod pause;
mod refusals;
mod reply;
mod sync;
mod usage;

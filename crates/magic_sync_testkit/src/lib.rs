//! What magic_sync's tests and benchmarks share: the shop schema every
//! strategy is declared over, the model of what each replica should hold,
//! a fleet of real SQLite replicas behind the real relay, a gate that holds
//! a replica's messages, and the benchmarks' fleet and figures. A crate of
//! its own, so each test binary and benchmark uses it as it uses any other.

// Fleets of connections, threads and files, for tests: nothing a Debug
// print would help with.
#![allow(missing_debug_implementations)]

pub mod apart;
pub mod bench;
pub mod counter;
pub mod fleet;
pub mod gate;
pub mod nats;
pub mod pgbench;
pub mod shop;
pub mod walk;
pub mod wanted;
pub mod wire;

use std::time::{Duration, Instant};

/// Asks `check` every 20 ms until it holds, failing the test with `what`
/// after a minute: for what the code under test makes true with no event
/// to wait on.
pub async fn until(what: &str, check: impl AsyncFnMut() -> bool) {
    until_within(what, Duration::from_secs(60), check).await;
}

/// [`until`], failing after `deadline`.
pub async fn until_within(what: &str, deadline: Duration, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + deadline;
    while !check().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

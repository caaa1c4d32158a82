//! What the crate's process tests share: waiting on a condition, and
//! whether a process is alive.

use std::path::Path;
use std::time::{Duration, Instant};

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(50);

/// Polls `done` until it holds, failing the test at `deadline`.
pub fn wait_until(deadline: Instant, mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    while !done() {
        assert!(Instant::now() < deadline, "timed out: {}", what());
        std::thread::sleep(POLL);
    }
}

/// Whether `pid` is a live process; a zombie (exited, not yet reaped by its
/// adoptive parent) counts as gone.
pub fn process_alive(pid: u32) -> bool {
    let status = Path::new("/proc").join(pid.to_string()).join("status");
    match std::fs::read_to_string(status) {
        Ok(text) => !text
            .lines()
            .filter_map(|line| line.strip_prefix("State:"))
            .any(|state| state.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

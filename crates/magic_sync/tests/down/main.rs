//! The down path end to end: a real PostgreSQL server, the relay, the
//! in-process network, and replicas on real SQLite files. One binary, so the
//! throwaway cluster starts once.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

use magic_sync_testkit::{fleet, gate, shop, wire};

mod deploy;

mod batches;
mod by_rule;
mod cohorts;
mod cost;
mod deployments;
mod described;
mod digests;
mod hostile;
mod isolation;
mod keys;
mod outbox;
mod quarantine;
mod relay;
mod scenarios;
mod signing;
mod snapshot;
mod up;
mod wake;
mod walk;

//! A server database with the test shop, the relay on a connection holding
//! its lock, and replicas on real SQLite files behind the in-process network.
//! [`Fleet::sync`] runs passes until nothing moves; [`Fleet::check`] is the
//! invariant every down-path test ends with.
//!
//! Its parts: `start` (the fleet made and its replicas added), `deploy`
//! (new builds and settings), `faults` (sessions lost, files restored,
//! replicas cut off), `steps` (passes, snapshots, deliveries, uploads),
//! `check` (the fleet against the reference) and `rows` (rows read as they
//! are compared).

mod check;
mod deploy;
mod faults;
mod rows;
mod start;
mod steps;

pub use rows::{replica_rows, rows_in, server_rows};
pub use steps::{Step, BATCHED_FROM};

use magic_sync::catalog::Catalog;
use magic_sync::relay::{Relay, ReplicaInfo, Settings};
use magic_sync::replica::Replica;
use magic_sync::run::memory::Network;
use magic_sync::Engine;
use std::collections::BTreeMap;
use tokio_postgres::Client;

/// A replica of the fleet.
pub struct Unit {
    pub info: ReplicaInfo,
    pub replica: Replica,
    /// Cut off by the network: sends fail, its messages wait in the outbox.
    pub cut: bool,
    /// Its SQLite file.
    pub path: std::path::PathBuf,
}

pub struct Fleet {
    pub db: magic_sync_testdb::TestDb,
    /// The relay's connection, holding the lock.
    pub client: Client,
    /// The connection snapshots stream on.
    pub snapshots: Client,
    /// The host's connection, for its writes.
    pub writer: Client,
    pub engine: Engine,
    pub catalog: Catalog,
    pub relay: Relay,
    /// The server's key, as a replica is given it when it is enrolled.
    pub key: magic_sync::sign::ServerKey,
    pub network: Network,
    pub dir: tempfile::TempDir,
    pub units: BTreeMap<String, Unit>,
    /// Snapshots recorded so far, over every step: how often a replica
    /// was provisioned from scratch.
    pub provisionings: usize,
    /// Replicas passes found past their outbox's bound, or whose
    /// snapshot's end was lost, over every pass: each provisioned again.
    pub dropped: usize,
    /// What publishing remembers between calls, as a runner keeps it: the
    /// cohorts' messages sent each member, sent again only once
    /// `RESEND_AFTER` passed, like the outbox's; a replica a send failed
    /// to, passed over while the network cuts it off. A relay started
    /// again forgets it.
    pub away: magic_sync::relay::Away,
}

/// What publishing remembers, as a relay starting with `settings` knows it.
fn fresh_memory(settings: &Settings) -> magic_sync::relay::Away {
    let wait = magic_sync::relay::RESEND_AFTER;
    magic_sync::relay::Away::new(wait, wait).by_rule(settings.record_by_rule)
}

/// Messages of at most this many bytes: small, so plans span several messages.
pub const MAX_MESSAGE: usize = 4096;

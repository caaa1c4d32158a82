//! The broker transport against a real `nats-server` (started by each test,
//! as PostgreSQL is) and a real relay: what replicas may reach, and the
//! random walk through the broker across its restart, TLS to it, and what
//! the broker says it holds for a replica.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

mod access;
mod bounds;
mod order;
mod standing;
mod tls;
mod walk;

use magic_sync::run::server::Reports;
use magic_sync::run::Report;
use magic_sync::ReplicaId;
use magic_sync_nats::broker::Broker;
use std::time::Duration;

/// Waits until `reports` holds something; gives up after 20 s.
pub(crate) async fn heard(broker: &Broker) -> Vec<(ReplicaId, Report)> {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let drained = broker.drain();
            if !drained.is_empty() {
                return drained;
            }
            broker.wait().await;
        }
    })
    .await
    .expect("the server hears the replica")
}

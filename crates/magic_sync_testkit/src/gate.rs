//! A transport in front of the in-process network that can hold one
//! replica's sends at a chosen point: a snapshot then stands still in the
//! middle of its stream, its view of the database taken, while a test
//! writes, commits, runs passes or cuts the network, and goes on when the
//! test lets it. Conditions, never timings.

use magic_sync::relay::{SendError, Transport};
use magic_sync::run::memory::Network;
use magic_sync::ReplicaId;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// Holds the sends to one replica from its `after`-th on, until released.
#[derive(Clone)]
pub struct Gate {
    network: Network,
    replica: String,
    after: usize,
    sent: Arc<AtomicUsize>,
    reached: Arc<Notify>,
    release: Arc<Notify>,
}

impl Gate {
    /// A gate on `replica`: its first `after` messages pass, the next waits.
    pub fn new(network: &Network, replica: &str, after: usize) -> Gate {
        Gate {
            network: network.clone(),
            replica: replica.to_string(),
            after,
            sent: Arc::default(),
            reached: Arc::default(),
            release: Arc::default(),
        }
    }

    /// Resolves once a send waits at the gate.
    pub async fn reached(&self) {
        self.reached.notified().await;
    }

    /// Lets the waiting send, and every one after it, through.
    pub fn open(&self) {
        self.release.notify_one();
    }
}

impl Transport for Gate {
    fn max_message_bytes(&self) -> usize {
        self.network.max_message_bytes()
    }

    async fn send(&self, replica: &ReplicaId, id: &str, message: Vec<u8>) -> Result<(), SendError> {
        if *replica == self.replica && self.sent.fetch_add(1, Ordering::SeqCst) == self.after {
            self.reached.notify_one();
            self.release.notified().await;
        }
        self.network.send(replica, id, message).await
    }

    fn reachable(&self, replica: &ReplicaId) -> Option<bool> {
        self.network.reachable(replica)
    }
}

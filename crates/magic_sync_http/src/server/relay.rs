//! The hub as the relay sees it: a [`Transport`] that sends each replica
//! its messages within what it has not acknowledged yet (waiting for room
//! as long as a frame may take), and the [`Reports`] of what replicas said.

use super::hub::{Hub, Inner, Out};
use crate::logbook::Kind;
use magic_sync::envelope::Filed;
use magic_sync::relay::{SendError, Transport};
use magic_sync::run::server::Reports;
use magic_sync::run::Report;
use magic_sync::ReplicaId;
use std::sync::Arc;
use tokio::sync::Notify;

impl Inner {
    /// Sends `frame` down `replica`'s connection if what it has not
    /// acknowledged leaves room; else returns what wakes a wait for room.
    fn offer(
        &self,
        replica: &str,
        number: u64,
        frame: &axum::body::Bytes,
    ) -> Result<Option<Arc<Notify>>, SendError> {
        let mut peers = self.peers();
        let peer = peers
            .get_mut(replica)
            .ok_or_else(|| Inner::not_connected(replica))?;
        let resumes = peer
            .lost_at
            .is_some_and(|at| at.elapsed() < self.settings.resume_window);
        if peer.conn.is_none() && !resumes {
            return Err(Inner::not_connected(replica));
        }
        let max = self.settings.max_unacked_bytes;
        if peer.unacked_bytes > 0 && peer.unacked_bytes + frame.len() > max {
            return Ok(Some(peer.room.clone()));
        }
        if let Some(conn) = &peer.conn {
            if conn.tx.send(Out::Frame(frame.clone())).is_err() {
                // The connection ended and is not detached yet: lost just
                // now, so the message waits for the replica to be back, as
                // it would a moment later (sending it as not connected
                // failed a snapshot whose replica was only reconnecting).
                peer.conn = None;
                peer.lost_at = Some(std::time::Instant::now());
            }
        }
        peer.unacked_bytes += frame.len();
        peer.unacked.push_back((number, frame.clone()));
        Ok(None)
    }

    fn not_connected(replica: &str) -> SendError {
        SendError::unreachable(format!("replica `{replica}` is not connected"))
    }
}

impl Transport for Hub {
    fn max_message_bytes(&self) -> usize {
        self.inner.settings.max_message_bytes
    }

    /// Connected, or lost within the window in which it may resume.
    fn reachable(&self, replica: &ReplicaId) -> Option<bool> {
        let peers = self.inner.peers();
        Some(peers.get(replica.as_str()).is_some_and(|peer| {
            peer.conn.is_some()
                || peer
                    .lost_at
                    .is_some_and(|at| at.elapsed() < self.inner.settings.resume_window)
        }))
    }

    async fn send(&self, replica: &ReplicaId, id: &str, message: Vec<u8>) -> Result<(), SendError> {
        // The id is `epoch-number-nonce`: the number is what the replica's
        // acknowledgements name.
        let number = id
            .split('-')
            .nth(1)
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        let frame = axum::body::Bytes::from(magic_sync::run::message_frame(message));
        // A replica slower than the server waits to take more: the send
        // waits for room, as long as a frame may take to be taken.
        let deadline = tokio::time::Instant::now() + self.inner.settings.write_timeout;
        loop {
            let room = match self.inner.offer(replica, number, &frame)? {
                None => return Ok(()),
                Some(room) => room,
            };
            let notified = room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Room made before the wait was enabled counts.
            if self.inner.offer(replica, number, &frame)?.is_none() {
                return Ok(());
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let unacked = self
                    .inner
                    .peers()
                    .get(replica.as_str())
                    .map_or(0, |p| p.unacked_bytes);
                // A replica slow to take: the rest waits for it.
                return Err(SendError::unreachable(format!(
                    "replica `{replica}` has {unacked} bytes of messages unacknowledged (at most \
                     {}) and took none for {:?}; the rest waits",
                    self.inner.settings.max_unacked_bytes, self.inner.settings.write_timeout
                )));
            }
        }
    }

    async fn answer(&self, replica: &ReplicaId, filed: Filed) -> Result<(), SendError> {
        let frame = axum::body::Bytes::from(magic_sync::run::filed_frame(filed));
        let peers = self.inner.peers();
        let conn = peers
            .get(replica.as_str())
            .and_then(|p| p.conn.as_ref())
            .ok_or_else(|| Inner::not_connected(replica))?;
        conn.tx
            .send(Out::Frame(frame))
            .map_err(|_| Inner::not_connected(replica))
    }

    fn misbehaved(&self, replica: &ReplicaId, why: &str) {
        self.inner.log(
            Kind::Misbehaved,
            |more| tracing::warn!(replica = %replica, "{why}; its connection is closed{more}"),
        );
        self.disconnect(replica, why);
    }
}

impl Reports for Hub {
    fn drain(&self) -> Vec<(ReplicaId, Report)> {
        let taken = {
            let mut queue = self
                .inner
                .reports
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            queue.bytes.clear();
            queue.total = 0;
            queue.reports.drain(..).collect()
        };
        self.inner.taken.notify_waiters();
        taken
    }

    async fn wait(&self) {
        let notified = self.inner.reported.notified();
        if !self
            .inner
            .reports
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .reports
            .is_empty()
        {
            return;
        }
        notified.await;
    }
}

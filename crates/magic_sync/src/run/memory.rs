//! An in-process network: the server's transport and every replica's inbox
//! in one process, for tests and examples. Each replica's messages queue in
//! order; what replicas report queues for the server, under the name of the
//! inbox it came from (never a name inside the message).
//!
//! A replica can be cut off ([`Network::cut`]): sends to it fail, as with a
//! replica out of reach, and its messages wait in the server's outbox.

pub use super::Delivery;
use super::Report;
use crate::envelope::Filed;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

#[derive(Debug, Default)]
struct State {
    /// Replicas whose host wrote something since they last looked.
    nudged: HashSet<String>,
    inboxes: HashMap<String, VecDeque<Vec<u8>>>,
    /// Per replica, the answers to its uploads, oldest first.
    answers: HashMap<String, VecDeque<Filed>>,
    /// Per replica, what wakes it when a message arrives: only the replica
    /// a message is for wakes.
    bells: HashMap<String, Arc<Condvar>>,
    cut: HashSet<String>,
    reports: VecDeque<(crate::ReplicaId, Report)>,
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    state: Mutex<State>,
    /// Wakes the server waiting for a report.
    #[cfg(feature = "postgres")]
    reported: tokio::sync::Notify,
}

/// The network. Clones share it.
#[derive(Debug, Clone)]
pub struct Network {
    shared: Arc<Shared>,
    max_message_bytes: usize,
}

impl Network {
    /// A network whose messages may be up to `max_message_bytes` long.
    pub fn new(max_message_bytes: usize) -> Self {
        Network {
            shared: Arc::default(),
            max_message_bytes,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain queues behind: still usable.
        self.shared
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The most bytes one message may have.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Hands a message to `replica`'s inbox; fails while it is cut off.
    pub fn deliver(&self, replica: &str, message: Vec<u8>) -> Result<(), String> {
        let mut state = self.state();
        if state.cut.contains(replica) {
            return Err(format!("replica `{replica}` is out of reach"));
        }
        state
            .inboxes
            .entry(replica.to_string())
            .or_default()
            .push_back(message);
        if let Some(bell) = state.bells.get(replica) {
            bell.notify_one();
        }
        Ok(())
    }

    /// Cuts `replica` off (`true`) or brings it back (`false`).
    pub fn cut(&self, replica: &str, cut: bool) {
        let mut state = self.state();
        if cut {
            state.cut.insert(replica.to_string());
        } else {
            state.cut.remove(replica);
        }
    }

    /// Whether `replica` is cut off.
    pub fn is_cut(&self, replica: &str) -> bool {
        self.state().cut.contains(replica)
    }

    /// Every message waiting in `replica`'s inbox, oldest first.
    pub fn take(&self, replica: &str) -> Vec<Vec<u8>> {
        self.state()
            .inboxes
            .get_mut(replica)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// Waits for the next message for `replica`; `None` once the network is closed.
    pub fn next(&self, replica: &str) -> Option<Vec<u8>> {
        let mut state = self.state();
        let bell = state.bells.entry(replica.to_string()).or_default().clone();
        loop {
            if let Some(m) = state.inboxes.get_mut(replica).and_then(VecDeque::pop_front) {
                return Some(m);
            }
            if state.closed {
                return None;
            }
            state = bell
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    /// Waits up to `timeout` for what comes to `replica` next: an answer to
    /// one of its uploads first, then a message.
    pub fn next_for(&self, replica: &str, timeout: Duration) -> Delivery {
        let mut state = self.state();
        let bell = state.bells.entry(replica.to_string()).or_default().clone();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(f) = state.answers.get_mut(replica).and_then(VecDeque::pop_front) {
                return Delivery::Filed(f);
            }
            if let Some(m) = state.inboxes.get_mut(replica).and_then(VecDeque::pop_front) {
                return Delivery::Message(m);
            }
            if state.closed {
                return Delivery::Closed;
            }
            if state.nudged.remove(replica) {
                return Delivery::Quiet;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Delivery::Quiet;
            }
            state = bell
                .wait_timeout(state, left)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }

    /// Messages delivered to `replica` and not taken by its loop yet: how
    /// far behind what the server sent it is, as this network sees it.
    pub fn queued(&self, replica: &str) -> usize {
        self.state().inboxes.get(replica).map_or(0, VecDeque::len)
    }

    /// Tells `replica`'s loop that its host wrote something: it looks for
    /// what to send up now rather than after its quiet spell.
    pub fn nudge(&self, replica: &str) {
        let mut state = self.state();
        state.nudged.insert(replica.to_string());
        if let Some(bell) = state.bells.get(replica) {
            bell.notify_one();
        }
    }

    /// Hands `replica` the answer to one of its uploads; fails while it is
    /// cut off.
    pub fn answer(&self, replica: &str, filed: Filed) -> Result<(), String> {
        let mut state = self.state();
        if state.cut.contains(replica) {
            return Err(format!("replica `{replica}` is out of reach"));
        }
        state
            .answers
            .entry(replica.to_string())
            .or_default()
            .push_back(filed);
        if let Some(bell) = state.bells.get(replica) {
            bell.notify_one();
        }
        Ok(())
    }

    /// Every answer waiting for `replica`, oldest first.
    pub fn take_answers(&self, replica: &str) -> Vec<Filed> {
        self.state()
            .answers
            .get_mut(replica)
            .map(|q| q.drain(..).collect())
            .unwrap_or_default()
    }

    /// Queues what `replica` says for the server.
    pub fn report(&self, replica: &str, report: Report) {
        self.state().reports.push_back((replica.into(), report));
        #[cfg(feature = "postgres")]
        self.shared.reported.notify_one();
    }

    /// Takes every report queued, oldest first.
    pub fn reports(&self) -> Vec<(crate::ReplicaId, Report)> {
        self.state().reports.drain(..).collect()
    }

    /// Waits until a report is queued (returns at once if one is).
    #[cfg(feature = "postgres")]
    pub async fn reported(&self) {
        if !self.state().reports.is_empty() {
            return;
        }
        self.shared.reported.notified().await;
    }

    /// Closes the network: replicas waiting in [`next`](Self::next) stop.
    pub fn close(&self) {
        let mut state = self.state();
        state.closed = true;
        for bell in state.bells.values() {
            bell.notify_all();
        }
    }
}

/// One replica's end of the network ([`Network::link`]).
#[cfg(feature = "sqlite")]
#[derive(Debug, Clone)]
pub struct Endpoint {
    network: Network,
    replica: String,
}

#[cfg(feature = "sqlite")]
impl Network {
    /// `replica`'s end of the network, for its loop
    /// ([`super::replica::replica`]).
    pub fn link(&self, replica: &str) -> Endpoint {
        Endpoint {
            network: self.clone(),
            replica: replica.to_string(),
        }
    }
}

#[cfg(feature = "sqlite")]
impl super::replica::Link for Endpoint {
    fn max_message_bytes(&self) -> usize {
        self.network.max_message_bytes
    }

    fn next(&self, timeout: Duration) -> Delivery {
        self.network.next_for(&self.replica, timeout)
    }

    fn report(&self, report: Report) {
        self.network.report(&self.replica, report);
    }

    /// A replica cut off cannot reach the server; an upload larger than a
    /// message may be is refused for good.
    fn upload(&self, up: &crate::envelope::Up) -> Result<(), magic_sync_replica::UplinkError> {
        use magic_sync_replica::UplinkError;
        if self.network.is_cut(&self.replica) {
            return Err(UplinkError::unreachable(format!(
                "replica `{}` is out of reach",
                self.replica
            )));
        }
        let bytes = prost::Message::encoded_len(up);
        if bytes > self.network.max_message_bytes {
            return Err(UplinkError::refused(format!(
                "an upload of {bytes} bytes, more than a message may have ({})",
                self.network.max_message_bytes
            )));
        }
        self.network
            .report(&self.replica, Report::Upload(up.clone()));
        Ok(())
    }
}

#[cfg(feature = "postgres")]
impl magic_sync_server::relay::Transport for Network {
    fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    fn reachable(&self, replica: &crate::ReplicaId) -> Option<bool> {
        Some(!self.is_cut(replica))
    }

    async fn send(
        &self,
        replica: &crate::ReplicaId,
        _id: &str,
        message: Vec<u8>,
    ) -> Result<(), magic_sync_server::relay::SendError> {
        // A replica cut off is out of reach: its messages wait.
        self.deliver(replica, message)
            .map_err(magic_sync_server::relay::SendError::unreachable)
    }

    async fn answer(
        &self,
        replica: &crate::ReplicaId,
        filed: Filed,
    ) -> Result<(), magic_sync_server::relay::SendError> {
        Network::answer(self, replica, filed)
            .map_err(magic_sync_server::relay::SendError::unreachable)
    }
}

#[cfg(feature = "postgres")]
impl super::server::Reports for Network {
    fn drain(&self) -> Vec<(crate::ReplicaId, Report)> {
        self.reports()
    }

    async fn wait(&self) {
        self.reported().await;
    }
}

#[cfg(test)]
mod tests {
    use super::{Delivery, Network};
    use std::time::Duration;

    #[test]
    fn queued_counts_what_was_delivered_and_not_taken() {
        let network = Network::new(1024);
        assert_eq!(network.queued("u1"), 0);
        network.deliver("u1", vec![1]).unwrap();
        network.deliver("u1", vec![2]).unwrap();
        network.deliver("u2", vec![3]).unwrap();
        assert_eq!((network.queued("u1"), network.queued("u2")), (2, 1));
        assert!(matches!(
            network.next_for("u1", Duration::ZERO),
            Delivery::Message(m) if m == [1]
        ));
        assert_eq!(network.queued("u1"), 1);
    }
}

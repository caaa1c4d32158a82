//! What the host gives the relay to reach its replicas: the list of them
//! ([`Replicas`], asked before every pass) and the way bytes get to them
//! ([`Transport`]), which moves whole messages and never looks inside.

use super::ReplicaId;
use crate::error::Result;
use magic_sync_core::link::LinkError;
use std::future::Future;

/// A replica as the host describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// Its id: what rules compare a replica column with.
    pub id: ReplicaId,
    /// Whether it takes part now. A replica that is not live holds nothing
    /// as far as the server records, and is sent nothing.
    pub live: bool,
    /// Its partition: what partition rules compare with.
    pub partition: Option<String>,
}

impl ReplicaInfo {
    /// A live replica.
    pub fn live(id: impl Into<ReplicaId>, partition: Option<&str>) -> Self {
        ReplicaInfo {
            id: id.into(),
            live: true,
            partition: partition.map(str::to_string),
        }
    }
}

/// Where the replicas are: the host says, before every pass.
pub trait Replicas: Send + Sync {
    /// Every replica the host knows, live or not.
    fn replicas(&self) -> impl Future<Output = Result<Vec<ReplicaInfo>>> + Send;
}

/// A fixed fleet: the host's list as it was when the relay started, for a
/// host whose replicas do not change while it runs.
impl Replicas for Vec<ReplicaInfo> {
    fn replicas(&self) -> impl Future<Output = Result<Vec<ReplicaInfo>>> + Send {
        let list = self.clone();
        async move { Ok(list) }
    }
}

/// A send the transport could not make; the message stays in the outbox.
/// Its kind decides what the relay does ([`Error::Send`]): a replica out of
/// reach ([`Unreachable`]) is tried again after a backoff; a transport that
/// refuses a message the relay made within its own limit ([`Refused`]), or
/// that refuses the relay ([`Misconfigured`]: credentials, a setting),
/// stops the runner with what it said, rather than being tried for ever.
///
/// [`Error::Send`]: crate::Error::Send
/// [`Unreachable`]: magic_sync_core::link::LinkErrorKind::Unreachable
/// [`Refused`]: magic_sync_core::link::LinkErrorKind::Refused
/// [`Misconfigured`]: magic_sync_core::link::LinkErrorKind::Misconfigured
pub type SendError = LinkError;

/// How bytes reach replicas. The transport moves bytes and never looks inside.
pub trait Transport: Send + Sync {
    /// The most bytes one message may have.
    fn max_message_bytes(&self) -> usize;
    /// Hands `message` (a whole `ToReplica`) to the replica `replica`. `id`
    /// names the message for de-duplication: it is the same however often
    /// the message goes. Ok means the transport took it.
    fn send(
        &self,
        replica: &ReplicaId,
        id: &str,
        message: Vec<u8>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;
    /// Hands `replica` the answer to an upload it sent, once filed. A
    /// transport that carries none (the default) fails: the replica sends
    /// the upload again after a while, and filing it again changes nothing.
    fn answer(
        &self,
        replica: &ReplicaId,
        filed: crate::envelope::Filed,
    ) -> impl Future<Output = Result<(), SendError>> + Send {
        let _ = filed;
        let replica = replica.to_string();
        async move {
            Err(SendError::refused(format!(
                "this transport carries no answers to uploads (replica `{replica}`)"
            )))
        }
    }
    /// Whether `replica` can be sent to now, as far as the transport knows
    /// (connected, say); `None`, the default, when it cannot tell. A
    /// replica a send failed to is passed over by publishing until its
    /// wait is over ([`Away`](crate::relay::Away)), unless the transport says it is back.
    fn reachable(&self, replica: &ReplicaId) -> Option<bool> {
        let _ = replica;
        None
    }
    /// `replica` said what it had no business saying: an acknowledgement
    /// whose seal is not of a message sent to it, or an upload larger than
    /// a message may be. Nothing of it was recorded or filed. A transport
    /// that holds connections closes this one, saying `why`; the default
    /// does nothing.
    fn misbehaved(&self, replica: &ReplicaId, why: &str) {
        let _ = (replica, why);
    }
}

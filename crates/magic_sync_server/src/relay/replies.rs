//! What replicas say back: the last message each applied, and the gaps
//! they wait in. The replica is always the one the transport authenticated,
//! never one a message names.
//!
//! **Nothing one replica says moves another.** What a replica reports can
//! change only what is that replica's: its acknowledgement, its own
//! provisioning. The one thing done for the whole fleet, a new epoch with
//! every replica provisioned again, follows only from what the server can
//! check was its own: a seal it made (an acknowledgement of a message
//! beyond its record, or of an epoch after its own) or a receipt it made
//! (an answer beyond its record). A number a replica merely claims
//! (`Ack::answered` without a receipt, a gap's number, a digest) has at
//! most that replica provisioned again, at the pace its own asking earns
//! (`store::snapshots::begin`).

use super::outbox::Epoch;
use super::Acknowledged;
use crate::envelope::{Ack, Gap, Receipt};
use crate::error::{Error, Result};
use crate::seal;
use crate::store;
use magic_sync_core::{EpochId, MessageNo, ReplicaId};
use std::collections::HashMap;
use tokio_postgres::Client;

/// Acknowledgements, each with the replica that sent it as the transport
/// authenticated it (never as the message says): one outcome per
/// acknowledgement, in order. A seal that does not verify, checked before
/// anything else the acknowledgement says counts, is refused with an error
/// of its own ([`Error::Forged`]), changes nothing and holds back no
/// other. An acknowledgement of another epoch, or behind what the replica
/// said before (it was restored from an older copy), has the replica
/// provisioned again; so has one saying it was answered an upload newer
/// than any the server records answering it (`sync.uploads_answered`)
/// with no receipt to show for it. The server's database was restored
/// from an older copy when an acknowledgement shows, under the server's
/// own seal, a message beyond any the server records sending a replica it
/// keeps up, or a message of an epoch this installation began after the
/// one it is in; or shows, under the server's own receipt, an answer
/// beyond its record: a new epoch begins, and every replica is
/// provisioned again (and sends up again what it wrote, which the copy
/// may have forgotten).
///
/// Needs no lock: acknowledgements live in `sync.acks`, which passes write
/// only to forget a replica the host no longer lists, so they are recorded
/// on a connection of their own while the relay records. While a replica's
/// snapshot streams, what was sent it is not recorded until the snapshot
/// ends: any number the server has drawn counts as sent.
pub async fn acknowledge_all(
    client: &Client,
    acks: &[(ReplicaId, Ack)],
) -> Result<Vec<Result<Acknowledged>>> {
    Ok(acknowledge(client, None, acks).await?.outcomes)
}

/// Acknowledgements judged: one outcome each, and how many replicas they
/// newly marked to be provisioned again (every live one, when a new epoch
/// began).
pub(crate) struct Judged {
    pub outcomes: Vec<Result<Acknowledged>>,
    pub marked: u64,
}

/// [`acknowledge_all`], in `epoch` when the caller read it already, else
/// reading it beside the replicas' chains (one round trip).
pub(crate) async fn acknowledge(
    client: &Client,
    epoch: Option<&Epoch>,
    acks: &[(ReplicaId, Ack)],
) -> Result<Judged> {
    if acks.is_empty() {
        return Ok(Judged {
            outcomes: Vec::new(),
            marked: 0,
        });
    }
    let read;
    let (epoch, known) = match epoch {
        Some(epoch) => (epoch, chains(client, acks).await?),
        None => {
            let (epoch, known) = tokio::try_join!(Epoch::read(client), chains(client, acks))?;
            read = epoch;
            (&read, known)
        }
    };
    judge_all(client, epoch, acks, known).await
}

/// Judges `acks` against the chains `known`, then records what counted and
/// acts on it.
async fn judge_all(
    client: &Client,
    epoch: &Epoch,
    acks: &[(ReplicaId, Ack)],
    mut known: HashMap<ReplicaId, Chain>,
) -> Result<Judged> {
    let mut again: Vec<&str> = Vec::new();
    let mut restored: Vec<&str> = Vec::new();
    // The newest generation of an epoch this installation began and its
    // database forgot: the next epoch comes after it.
    let mut seen: Option<u64> = None;
    let mut outcomes = Vec::with_capacity(acks.len());
    for (replica, ack) in acks {
        let outcome = match known.get_mut(replica) {
            None => Ok(Acknowledged::Unknown),
            Some(chain) => judge(epoch, replica, ack, chain),
        };
        match outcome {
            Ok(Acknowledged::Provisioning) => again.push(replica.as_str()),
            Ok(Acknowledged::Restored) => {
                again.push(replica.as_str());
                restored.push(replica.as_str());
            }
            Ok(Acknowledged::ServerRestored) if ack.epoch != epoch.id => {
                seen = seen.max(EpochId::from(ack.epoch.as_slice()).generation());
            }
            _ => {}
        }
        outcomes.push(outcome);
    }
    let restarted = outcomes
        .iter()
        .any(|o| matches!(o, Ok(Acknowledged::ServerRestored)));
    if restarted {
        new_epoch(client, epoch, seen).await?;
    }
    // Each replica once, at the newest number it acknowledged.
    let mut said = store::acks::Said::default();
    for (replica, chain) in known.iter().filter(|(_, chain)| chain.recorded) {
        said.replicas.push(replica.as_str());
        said.numbers.push(chain.acked);
        said.nonces.push(chain.acked_nonce.as_slice());
        said.reads_batches.push(chain.reads_batches);
    }
    let marked = store::acks::record(client, &said, &again, &restored).await?;
    Ok(Judged {
        outcomes,
        marked: marked + u64::from(restarted),
    })
}

/// Per live replica among those acknowledging: the last number the server
/// sent it (any number drawn, while its snapshot streams), the last it
/// acknowledged, whether it is kept up, and the newest upload the server
/// answered it, in one round trip.
async fn chains(client: &Client, acks: &[(ReplicaId, Ack)]) -> Result<HashMap<ReplicaId, Chain>> {
    // Each once, however often it said where it stands.
    let ids: std::collections::BTreeSet<&str> = acks.iter().map(|(r, _)| r.as_str()).collect();
    let ids: Vec<&str> = ids.into_iter().collect();
    let rows = store::acks::chains(client, &ids).await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let chain = Chain {
                last: r.last,
                acked: r.acked,
                kept_up: r.kept_up,
                answered: u64::try_from(r.answered).unwrap_or(0),
                recorded: false,
                acked_nonce: Vec::new(),
                reads_batches: false,
            };
            (ReplicaId::from(r.id), chain)
        })
        .collect())
}

/// What the server records of a replica's chain, for judging what it says.
#[derive(Debug, Clone)]
struct Chain {
    /// The last number sent it.
    last: i64,
    /// The last number it acknowledged.
    acked: i64,
    /// Whether it is kept up (not waiting for, or streaming, a snapshot).
    kept_up: bool,
    /// The newest upload of its the server answered as filed.
    answered: u64,
    /// An acknowledgement of it was recorded: `acked` is to be written.
    recorded: bool,
    /// The nonce of the message the recorded acknowledgement names.
    acked_nonce: Vec<u8>,
    /// What the newest recorded acknowledgement said of batches.
    reads_batches: bool,
}

/// What one acknowledgement by `replica` comes to, against its chain (the
/// last number sent, the last acknowledged), which a recorded one moves.
fn judge(epoch: &Epoch, replica: &ReplicaId, ack: &Ack, chain: &mut Chain) -> Result<Acknowledged> {
    if ack.epoch != epoch.id {
        return Ok(of_another_epoch(epoch, replica, ack));
    }
    let forged = || Error::Forged {
        replica: replica.clone(),
        number: ack.number,
    };
    // A number the server sealed is one it drew, so it fits; one that does
    // not was never sealed by it.
    let number = MessageNo::from_wire(ack.number).map_err(|_| forged())?;
    // The seal first: nothing else an acknowledgement says counts before it
    // is shown to be the server's own.
    if !seal::verify(
        &epoch.secret,
        replica,
        &epoch.id,
        number,
        &ack.nonce,
        &ack.seal,
    ) {
        return Err(forged());
    }
    let number = number.store();
    if number < chain.acked {
        // Sealed by this server, but behind what the replica said before:
        // the replica was restored from an older copy.
        return Ok(Acknowledged::Restored);
    }
    if number > chain.last {
        // Sealed by this server, but beyond the chain it records. For a
        // replica waiting for a snapshot, that is one an attempt that
        // failed sent it; for one kept up, the server's database was
        // restored from an older copy.
        return Ok(match chain.kept_up {
            true => Acknowledged::ServerRestored,
            false => Acknowledged::Provisioning,
        });
    }
    match &ack.receipt {
        // It was answered an upload this server records no answer to, and
        // shows the server's own receipt for it: the server answered it,
        // then its database went back to a copy from before, and forgot
        // the filing.
        Some(receipt) if forgot(epoch, replica, receipt, chain.answered) => {
            return Ok(Acknowledged::ServerRestored);
        }
        Some(_) => {}
        // A replica of an earlier build says it was answered more than the
        // record holds, with nothing to show for it: provisioned again, it
        // sends up what it wrote; nobody else is.
        None if ack.answered > chain.answered => return Ok(Acknowledged::Provisioning),
        None => {}
    }
    chain.acked = number;
    chain.acked_nonce.clone_from(&ack.nonce);
    chain.recorded = true;
    // What it can verify changes only how its own messages are signed.
    chain.reads_batches = ack.reads_batches;
    Ok(Acknowledged::Recorded)
}

/// An acknowledgement of an epoch other than the server's: the replica is
/// provisioned again. Unless the epoch is one this installation began
/// after the one it is in, which a seal made under that epoch's secret
/// shows: the database went back to a copy from before it began that
/// epoch, and the server was restored.
fn of_another_epoch(epoch: &Epoch, replica: &str, ack: &Ack) -> Acknowledged {
    let theirs = EpochId::from(ack.epoch.as_slice());
    let sealed = epoch.id.precedes(&theirs)
        && MessageNo::from_wire(ack.number).is_ok_and(|number| {
            epoch.secret_of(&theirs).is_some_and(|secret| {
                seal::verify(&secret, replica, &theirs, number, &ack.nonce, &ack.seal)
            })
        });
    match sealed {
        true => Acknowledged::ServerRestored,
        false => Acknowledged::Provisioning,
    }
}

/// Whether `receipt`, which `replica` gave back, is one this server made in
/// this epoch for an upload newer than any it records answering it.
fn forgot(epoch: &Epoch, replica: &str, receipt: &Receipt, answered: u64) -> bool {
    receipt.epoch == epoch.id.as_bytes()
        && receipt.sequence > answered
        && seal::verify_receipt(
            &epoch.secret,
            replica,
            &epoch.id,
            receipt.sequence,
            &receipt.seal,
        )
}

/// The server's database was restored from an older copy: what it records
/// of every replica is older than what the replicas hold. A new epoch
/// begins (a new id and secret, so no message sealed before it is believed
/// again; of a generation after `seen`, the newest the replicas showed)
/// and every live replica is provisioned again, at once.
async fn new_epoch(client: &Client, epoch: &Epoch, seen: Option<u64>) -> Result<()> {
    let began = store::epoch::begin_new(client, epoch, seen).await?;
    tracing::error!(
        epoch = %began,
        "a replica showed, under the server's own seal or receipt, what this server has no \
         record of: its database was restored from an older copy; a new epoch begins and every \
         replica is provisioned again"
    );
    metrics::counter!("magic_sync_server_restores_total").increment(1);
    Ok(())
}

/// The replica `replica` could not follow a message and waits for a
/// snapshot: it is provisioned again, unless a snapshot that began after
/// that message is already on its way. Returns whether it will be.
pub async fn gap(client: &Client, replica: &str, gap: &Gap) -> Result<bool> {
    let said = [(ReplicaId::from(replica), gap.clone())];
    Ok(!gaps(client, &said).await?.is_empty())
}

/// [`gap`] for many replicas in one statement, each once (the caller keeps
/// the newest gap of each): what a flood of gaps costs is one round trip,
/// however many came. Returns the replicas that will be provisioned again.
pub(crate) async fn gaps(client: &Client, gaps: &[(ReplicaId, Gap)]) -> Result<Vec<String>> {
    if gaps.is_empty() {
        return Ok(Vec::new());
    }
    let mut ids = Vec::with_capacity(gaps.len());
    let mut epochs = Vec::with_capacity(gaps.len());
    let mut numbers = Vec::with_capacity(gaps.len());
    for (replica, gap) in gaps {
        ids.push(replica.as_str());
        epochs.push(gap.epoch.as_slice());
        // Beyond any number drawn: no snapshot began after it.
        numbers.push(MessageNo::from_wire(gap.number).map_or(i64::MAX, MessageNo::store));
    }
    store::replicas::provision_after_gaps(client, &ids, &epochs, &numbers).await
}

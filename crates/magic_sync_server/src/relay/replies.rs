//! What replicas say back: the last message each applied, and the gaps
//! they wait in. The replica is always the one the transport authenticated,
//! never one a message names.

use super::outbox::Epoch;
use super::Acknowledged;
use crate::envelope::{Ack, Gap};
use crate::error::{Error, Result};
use crate::seal;
use crate::store;
use magic_sync_core::{MessageNo, ReplicaId};
use std::collections::HashMap;
use tokio_postgres::Client;

/// Acknowledgements, each with the replica that sent it as the transport
/// authenticated it (never as the message says): one outcome per
/// acknowledgement, in order. A seal that does not verify, checked before
/// anything else the acknowledgement says counts, is refused with an error
/// of its own ([`Error::Forged`]), changes nothing and holds back no
/// other. An acknowledgement of another epoch, or behind what the replica
/// said before (it was restored from an older copy), has the replica
/// provisioned again. One of a message beyond any the server records
/// sending a replica it keeps up, or saying it was answered an upload
/// newer than any the server records answering it
/// (`sync.uploads_answered`), means the server's database was restored
/// from an older copy: a new epoch begins, and every replica is
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
    if acks.is_empty() {
        return Ok(Vec::new());
    }
    let (epoch, mut known) = chains(client, acks).await?;
    let mut again: Vec<&str> = Vec::new();
    let mut restored: Vec<&str> = Vec::new();
    let mut outcomes = Vec::with_capacity(acks.len());
    for (replica, ack) in acks {
        let outcome = match known.get_mut(replica) {
            None => Ok(Acknowledged::Unknown),
            Some(chain) => judge(&epoch, replica, ack, chain),
        };
        if matches!(
            outcome,
            Ok(Acknowledged::Provisioning | Acknowledged::Restored)
        ) {
            again.push(replica.as_str());
        }
        if matches!(outcome, Ok(Acknowledged::Restored)) {
            restored.push(replica.as_str());
        }
        outcomes.push(outcome);
    }
    if outcomes
        .iter()
        .any(|o| matches!(o, Ok(Acknowledged::ServerRestored)))
    {
        new_epoch(client).await?;
    }
    let (recorded, numbers): (Vec<&str>, Vec<i64>) = acks
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| matches!(o, Ok(Acknowledged::Recorded)))
        .map(|((r, _), _)| (r.as_str(), known[r].acked))
        .unzip();
    store::acks::record(client, &recorded, &numbers, &again, &restored).await?;
    Ok(outcomes)
}

/// Per live replica among those acknowledging: the last number the server
/// sent it (any number drawn, while its snapshot streams), the last it
/// acknowledged, whether it is kept up, and the newest upload the server
/// answered it; with the epoch, in one round trip.
async fn chains(
    client: &Client,
    acks: &[(ReplicaId, Ack)],
) -> Result<(Epoch, HashMap<ReplicaId, Chain>)> {
    let ids: Vec<&str> = acks.iter().map(|(r, _)| r.as_str()).collect();
    let (epoch, rows) = tokio::try_join!(Epoch::read(client), store::acks::chains(client, &ids))?;
    let known = rows
        .into_iter()
        .map(|r| {
            let chain = Chain {
                last: r.last,
                acked: r.acked,
                kept_up: r.kept_up,
                answered: u64::try_from(r.answered).unwrap_or(0),
            };
            (ReplicaId::from(r.id), chain)
        })
        .collect();
    Ok((epoch, known))
}

/// What the server records of a replica's chain, for judging what it says.
#[derive(Debug, Clone, Copy)]
struct Chain {
    /// The last number sent it.
    last: i64,
    /// The last number it acknowledged.
    acked: i64,
    /// Whether it is kept up (not waiting for, or streaming, a snapshot).
    kept_up: bool,
    /// The newest upload of its the server answered as filed.
    answered: u64,
}

/// What one acknowledgement by `replica` comes to, against its chain (the
/// last number sent, the last acknowledged), which a recorded one moves.
fn judge(epoch: &Epoch, replica: &ReplicaId, ack: &Ack, chain: &mut Chain) -> Result<Acknowledged> {
    let Chain {
        last,
        acked,
        kept_up,
        answered,
    } = chain;
    if ack.epoch != epoch.id {
        return Ok(Acknowledged::Provisioning);
    }
    let forged = || Error::Forged {
        replica: replica.clone(),
        number: ack.number,
    };
    // The seal first: nothing else an acknowledgement says counts before it
    // is shown to be the server's own.
    if !seal::verify(
        &epoch.secret,
        replica,
        &epoch.id,
        ack.number,
        &ack.nonce,
        &ack.seal,
    ) {
        return Err(forged());
    }
    // A number the server sealed is one it drew, so it fits; one that does
    // not was never sealed by it.
    let number = MessageNo::from_wire(ack.number)
        .map_err(|_| forged())?
        .store();
    if number < *acked {
        // Sealed by this server, but behind what the replica said before:
        // the replica was restored from an older copy.
        return Ok(Acknowledged::Restored);
    }
    if number > *last {
        // Sealed by this server, but beyond the chain it records. For a
        // replica waiting for a snapshot, that is one an attempt that
        // failed sent it; for one kept up, the server's database was
        // restored from an older copy.
        return Ok(match kept_up {
            true => Acknowledged::ServerRestored,
            false => Acknowledged::Provisioning,
        });
    }
    if ack.answered > *answered {
        // It was answered an upload this server records no answer to: the
        // server answered it, then its database went back to a copy from
        // before, and forgot the filing.
        return Ok(Acknowledged::ServerRestored);
    }
    *acked = number;
    Ok(Acknowledged::Recorded)
}

/// The server's database was restored from an older copy: what it records
/// of every replica is older than what the replicas hold. A new epoch
/// begins (a new id and secret, so no message sealed before it is believed
/// again) and every live replica is provisioned again, at once.
async fn new_epoch(client: &Client) -> Result<()> {
    store::epoch::begin_new(client).await?;
    tracing::error!(
        "a replica applied a message this server has no record of sending: its database was \
         restored from an older copy; a new epoch begins and every replica is provisioned again"
    );
    metrics::counter!("magic_sync_server_restores_total").increment(1);
    Ok(())
}

/// The replica `replica` could not follow a message and waits for a
/// snapshot: it is provisioned again, unless a snapshot that began after
/// that message is already on its way. Returns whether it will be.
pub async fn gap(client: &Client, replica: &str, gap: &Gap) -> Result<bool> {
    let epoch = Epoch::read(client).await?;
    // Beyond any number drawn: no snapshot began after it.
    let number = MessageNo::from_wire(gap.number).map_or(i64::MAX, MessageNo::store);
    let same_epoch = gap.epoch == epoch.id;
    store::replicas::provision_after_gap(client, replica, same_epoch, number).await
}

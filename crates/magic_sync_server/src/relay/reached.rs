//! Reading one's own writes: the uploads (`sync.checkpoints`) a pass tells
//! their replicas it has done everything for.
//!
//! A checkpoint is recorded once its upload's filing committed and before
//! the upload is answered (`crate::file::checkpoint`). A pass whose snapshot
//! sees it therefore sees every note committed before the answer, the
//! filing's own included, and plans them all for the replicas it keeps up.
//! So after everything the pass wrote for a replica, one `Reached` message
//! naming its checkpoints tells it that applying up to there reads its own
//! writes. The message goes through the outbox like any other: sent again
//! until acknowledged, and let go of (with its checkpoints) once it was.
//!
//! A replica waiting for a snapshot, or streaming one, is not kept up by
//! the passes, and changes kept for it are planned only after its snapshot:
//! its checkpoints wait, and one already answered by a message its lost
//! outbox held is answered again after the snapshot.

use super::observe::Observation;
use super::outbox::Writer;
use super::pack::Packed;
use crate::envelope::{to_replica::Body, Reached};
use crate::error::Result;
use crate::store;
use std::collections::{BTreeMap, HashMap};
use tokio_postgres::Transaction;

/// Per replica kept up, the send ids of its uploads to say it reached.
pub(crate) type Due = BTreeMap<String, Vec<Vec<u8>>>;

/// Lets go of checkpoints whose message the replica acknowledged, takes
/// back those of replicas being provisioned, and returns those due to the
/// replicas this pass keeps up.
pub(crate) async fn due(tx: &Transaction<'_>, observed: &Observation) -> Result<Due> {
    let provisioned = observed.waiting.iter().chain(&observed.streaming);
    let kept = observed.kept.iter().map(|k| k.id.as_str());
    store::checkpoints::due(tx, provisioned.map(String::as_str), kept).await
}

/// Writes each replica in `due` its `Reached` message, after everything
/// the pass wrote for it; returns the statement recording which message
/// answered which checkpoint, for the pass's closing.
pub(crate) async fn write(
    tx: &Transaction<'_>,
    writer: &mut Writer<'_>,
    due: Due,
) -> Result<String> {
    if due.is_empty() {
        return Ok(String::new());
    }
    let packed = due
        .iter()
        .map(|(replica, send_ids)| {
            let mut body = Vec::new();
            Body::Reached(Reached {
                send_ids: send_ids.clone(),
            })
            .encode(&mut body);
            Packed {
                replica: replica.clone(),
                body,
                last: false,
            }
        })
        .collect();
    writer.write(tx, packed).await?;
    let numbers: HashMap<&str, i64> = writer.last_numbers();
    let (replicas, messages): (Vec<&str>, Vec<i64>) = due
        .keys()
        .map(|r| (r.as_str(), numbers[r.as_str()]))
        .unzip();
    Ok(store::checkpoints::answered(replicas, messages))
}

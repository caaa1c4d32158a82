//! Observing the replicas: what became of each since the last pass, against
//! what the host lists now.
//!
//! A replica is in one of three states (`sync.replicas`):
//!
//! - *waiting* for a snapshot (`provision`): new, live again, moved to
//!   another partition, or found out of step (a gap, a restore, an outbox
//!   past its bound). Passes leave it alone; a snapshot worker takes it up
//!   (`super::snapshot`).
//! - *streaming*: a snapshot of it is under way (`snapshot_attempt`).
//!   Passes leave it alone too, but keep for it the rows their notes
//!   changed (`sync.deferred`).
//! - *kept up* by the passes.
//!
//! One that stopped being live, or that the host no longer lists, is
//! forgotten: nothing recorded as held by it, nothing owed to it.

use super::outbox::Chain;
use super::ReplicaInfo;
use crate::error::{Error, Result};
use std::collections::{HashMap, HashSet};
use tokio_postgres::Transaction;

/// A replica the passes keep up, as this pass sees it.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub id: String,
    pub partition: Option<String>,
    /// Where its chain of messages stands.
    pub last_number: i64,
    pub last_nonce: Vec<u8>,
}

impl Kept {
    pub fn chain(&self) -> Chain {
        Chain {
            last_number: self.last_number,
            last_nonce: self.last_nonce.clone(),
            begins_snapshot: false,
            snapshot_number: None,
        }
    }
}

/// What a pass observed.
#[derive(Debug, Default)]
pub(crate) struct Observation {
    /// Replicas the pass keeps up, by id.
    pub kept: Vec<Kept>,
    /// Replicas waiting for a snapshot, by id.
    pub waiting: Vec<String>,
    /// Replicas whose snapshot streams.
    pub streaming: Vec<String>,
    /// Replicas forgotten by this pass (no longer live, or gone).
    pub forgotten: Vec<String>,
}

/// Compares the replicas the host lists with what the relay saw last: a
/// replica that became live or moved partition waits for a snapshot (one of
/// its that streams is ended); one no longer live, or gone, is forgotten.
pub(crate) async fn observe(tx: &Transaction<'_>, replicas: &[ReplicaInfo]) -> Result<Observation> {
    let mut seen = HashSet::new();
    for r in replicas {
        if r.id.is_empty() {
            return Err(Error::Invalid(
                "the host lists a replica with an empty id".into(),
            ));
        }
        if !seen.insert(r.id.as_str()) {
            return Err(Error::Invalid(format!(
                "the host lists replica `{}` twice",
                r.id
            )));
        }
    }
    let known: HashMap<String, (bool, Option<String>)> = tx
        .query("SELECT id, live, partition_id FROM sync.replicas", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let mut forget: Vec<String> = Vec::new();
    let mut provision: Vec<(&str, Option<&str>)> = Vec::new();
    let mut quiet: Vec<&str> = Vec::new();
    for r in replicas {
        let before = known.get(&r.id);
        match (r.live, before) {
            (true, Some((true, part))) if *part == r.partition => {}
            (true, _) => provision.push((r.id.as_str(), r.partition.as_deref())),
            (false, Some((true, _))) => {
                forget.push(r.id.clone());
                quiet.push(&r.id);
            }
            (false, Some((false, _))) => {}
            (false, None) => quiet.push(&r.id),
        }
    }
    let gone: Vec<String> = known
        .keys()
        .filter(|id| !seen.contains(id.as_str()))
        .cloned()
        .collect();
    forget.extend(gone.iter().cloned());
    // Waiting now; a snapshot of the replica that streams (for a partition
    // it left) is ended: its worker will find its attempt gone.
    for (id, part) in &provision {
        tx.execute(
            "INSERT INTO sync.replicas (id, live, partition_id, provision) VALUES ($1, true, $2, true)
             ON CONFLICT (id) DO UPDATE SET live = true, partition_id = $2, provision = true,
                 snapshot = NULL, snapshot_attempt = NULL, snapshot_began_at = NULL,
                 observed_at = now()",
            &[id, part],
        )
        .await?;
    }
    for id in &quiet {
        tx.execute(
            "INSERT INTO sync.replicas (id, live, provision) VALUES ($1, false, true)
             ON CONFLICT (id) DO UPDATE SET live = false, provision = true,
                 snapshot = NULL, snapshot_attempt = NULL, snapshot_began_at = NULL,
                 observed_at = now()",
            &[id],
        )
        .await?;
    }
    if !gone.is_empty() {
        tx.execute("DELETE FROM sync.replicas WHERE id = ANY($1)", &[&gone])
            .await?;
    }
    if !forget.is_empty() {
        // Nothing recorded as held by it, nothing owed to it.
        tx.batch_execute(&format!(
            "DELETE FROM sync.held WHERE replica = ANY({ids});
             DELETE FROM sync.outbox WHERE replica = ANY({ids});
             DELETE FROM sync.deferred WHERE replica = ANY({ids});
             DELETE FROM sync.backlogs WHERE replica = ANY({ids});
             DELETE FROM sync.filed WHERE replica = ANY({ids});
             DELETE FROM sync.checkpoints WHERE replica = ANY({ids});",
            ids = crate::sql::text_array(forget.iter().map(String::as_str))
        ))
        .await?;
    }
    let mut observation = Observation {
        forgotten: forget,
        ..Observation::default()
    };
    for row in tx
        .query(
            "SELECT id, partition_id, provision, snapshot_attempt IS NOT NULL, last_number, last_nonce
             FROM sync.replicas WHERE live ORDER BY id",
            &[],
        )
        .await?
    {
        let id: String = row.get(0);
        match (row.get::<_, bool>(2), row.get::<_, bool>(3)) {
            (_, true) => observation.streaming.push(id),
            (true, false) => observation.waiting.push(id),
            (false, false) => observation.kept.push(Kept {
                id,
                partition: row.get(1),
                last_number: row.get(4),
                last_nonce: row.get(5),
            }),
        }
    }
    Ok(observation)
}

//! The figures a metrics endpoint exports, of one moment: the replicas per
//! state and each one's figures (as [`overview`](super::overview) reads
//! them), what its outbox weighs, the provisionings, the pending notes and
//! the refused rows.
//!
//! It costs what the overview costs, plus one pass over `sync.outbox` (the
//! messages waiting, never what the replicas hold): a body's size is read
//! from its header, not its bytes.

use super::health::{pending_notes, PendingNotes};
use super::overview::{summaries, StateCounts, TableFigures};
use super::state::ReplicaSummary;
use super::{begin, check_scope, Result, Scope, BLOCKED, IN_SCOPE};
use crate::store::cohorts::OWED;
use crate::store::outbox::HEAD_AND_SEAL;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::HashMap;

/// One live replica's figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplicaGauges {
    /// What the overview reads of it.
    #[serde(flatten)]
    pub summary: ReplicaSummary,
    /// What the messages waiting in its outbox weigh, in bytes: each one's
    /// head, seal and body (a body shared by several replicas' messages
    /// counts in each).
    pub outbox_bytes: i64,
}

/// Replicas being provisioned, by where their snapshot is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Provisionings {
    /// Waiting for their snapshot to begin (or to begin again).
    pub waiting: i64,
    /// Streaming their snapshot.
    pub streaming: i64,
}

/// The figures a metrics endpoint exports, over a scope (pending notes are
/// the whole database's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gauges {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// How many replicas are in each state.
    pub states: StateCounts,
    /// Every live replica in scope, by id.
    pub replicas: Vec<ReplicaGauges>,
    /// Per table with anything not where it should be, by name.
    pub tables: Vec<TableFigures>,
    /// Replicas being provisioned.
    pub provisionings: Provisionings,
    /// Notes pending.
    pub pending: PendingNotes,
    /// When the oldest pending note's transaction committed, when
    /// PostgreSQL tracks commit times (`track_commit_timestamp`).
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Per table, rows in quarantine (the whole database's), by name.
    pub quarantined: Vec<(String, i64)>,
    /// Rows of the replicas in scope held back for pointing at one.
    pub held_back: i64,
    /// The last deployment, table by table (see [`super::Overview::deployment`]).
    pub deployment: Vec<crate::store::deployment::Progress>,
}

/// The figures of `scope` a metrics endpoint exports.
pub async fn gauges(client: &mut tokio_postgres::Client, scope: &Scope) -> Result<Gauges> {
    let (tx, now) = begin(client).await?;
    check_scope(&tx, scope).await?;
    let (ids, partition) = (scope.ids(), scope.partition());
    let (summaries, tables) = summaries(&tx, scope, None, None).await?;
    let (pending, oldest_pending_at) = pending_notes(&tx).await?;
    let weights = tx
        .query(
            &format!(
                "SELECT r.id, sum(o.bytes)::int8 FROM (
                     SELECT o.replica,
                            octet_length(o.head) + octet_length(o.seal) + octet_length(b.bytes) AS bytes
                     FROM sync.outbox o JOIN sync.bodies b ON b.id = o.body
                     UNION ALL
                     SELECT w.replica, {HEAD_AND_SEAL} + octet_length(b.bytes)
                     FROM ({OWED}) w JOIN sync.bodies b ON b.id = w.body) o
                 JOIN sync.replicas r ON r.id = o.replica
                 WHERE {IN_SCOPE} GROUP BY 1"
            ),
            &[&ids, &partition],
        )
        .await?;
    let quarantined = tx
        .query(
            "SELECT table_name, count(*) FROM sync.quarantine GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let held_back: i64 = tx
        .query_one(
            &format!(
                "SELECT count(*) FROM {BLOCKED} b JOIN sync.replicas r ON r.id = b.replica
                 WHERE {IN_SCOPE}"
            ),
            &[&ids, &partition],
        )
        .await?
        .get(0);
    let snapshots = tx
        .query_one(
            &format!(
                "SELECT count(*) FILTER (WHERE r.snapshot_attempt IS NULL AND r.provision),
                        count(*) FILTER (WHERE r.snapshot_attempt IS NOT NULL)
                 FROM sync.replicas r WHERE {IN_SCOPE}"
            ),
            &[&ids, &partition],
        )
        .await?;
    let deployment = crate::store::deployment::progress(&tx).await?;
    tx.commit().await?;
    let weights: HashMap<String, i64> = weights.iter().map(|r| (r.get(0), r.get(1))).collect();
    let mut states = StateCounts::default();
    let replicas = summaries
        .into_iter()
        .map(|summary| {
            states.add(summary.state);
            ReplicaGauges {
                outbox_bytes: weights.get(&summary.id).copied().unwrap_or(0),
                summary,
            }
        })
        .collect();
    Ok(Gauges {
        now,
        states,
        replicas,
        tables: tables.into_values().collect(),
        provisionings: Provisionings {
            waiting: snapshots.get(0),
            streaming: snapshots.get(1),
        },
        pending,
        oldest_pending_at,
        quarantined,
        held_back,
        deployment,
    })
}

//! What the engine waits on. Each thing it waits on means one of two
//! things to an operator: wait (the infrastructure is down or busy, and
//! it gets through by itself once it is back), or deploy a fix (the data
//! or the code failed, and retrying unchanged fails the same way). Never
//! "go and fix the data". When nothing waits for a fix, the engine is
//! healthy: that is the normal state, with replicas out of reach listed
//! and waited for.

use super::{begin, check_scope, Result, Scope, BLOCKED, IN_SCOPE};
use crate::store::cohorts::OWED;
use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Transaction;

/// What an operator does about an item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Deploy a fix: it fails the same way until the code (or the
    /// declarations, or the schema) change.
    DeployFix,
    /// Wait: it gets through once the infrastructure is back, or the work
    /// is done.
    Wait,
}

/// One thing the engine waits on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Concern {
    /// Notes no pass has planned yet: the relay's work in hand (or a relay
    /// that is not running).
    NotesPending {
        /// Notes pending.
        notes: i64,
        /// Rows they are about.
        rows: i64,
        /// When the oldest one's transaction committed, when PostgreSQL
        /// tracks commit times (`track_commit_timestamp`); `None` otherwise.
        oldest_at: Option<DateTime<Utc>>,
    },
    /// Changes kept for a replica while its snapshot streams: planned for
    /// it by the first pass after the snapshot ends.
    ChangesKept {
        /// The replica.
        replica: String,
        /// Rows kept.
        rows: i64,
    },
    /// Rows of uploads the server refused for one kind of reason (a
    /// SQLSTATE of PostgreSQL's, or one of the engine's reasons), in one
    /// table, kept in `sync.inbox` until a fix is deployed.
    Refused {
        /// The table the rows name.
        table: String,
        /// Why they were refused: one of their reasons (the least, by
        /// text), which may quote its own row.
        reason: String,
        /// Rows refused.
        rows: i64,
        /// Replicas they came from.
        replicas: i64,
        /// When the first of them was refused.
        since: DateTime<Utc>,
    },
    /// A row that cannot go down (its codec refuses it, or it is larger
    /// than any message), set aside: no replica is sent it, or anything
    /// that points at it, until it changes or a build that can send it
    /// starts.
    Quarantined {
        /// The table.
        table: String,
        /// The row's key, as it travels (a JSON array).
        key: String,
        /// Why it cannot go.
        reason: String,
        /// Since when.
        since: DateTime<Utc>,
        /// Rows of the replicas in scope held back because they point at
        /// it (or at a row that does).
        blocked: i64,
    },
    /// Notes the planner cannot plan (their key no longer fits the
    /// table's columns), parked: the changes they are about go nowhere
    /// until a build that can plan them starts.
    Parked {
        /// The table.
        table: String,
        /// Notes parked.
        notes: i64,
        /// Why.
        reason: String,
        /// When the first was parked.
        since: DateTime<Utc>,
    },
    /// A replica whose digest of what it holds differed from what the
    /// server records it holding, in the last day: it was provisioned again
    /// (and holds what it should once that ends), but something let it
    /// drift.
    DigestDiffered {
        /// The replica.
        replica: String,
        /// How the last one differed, per table.
        said: String,
        /// When.
        at: DateTime<Utc>,
        /// How many of its digests have differed, ever.
        times: i32,
    },
    /// A replica the last send (of a message or of its snapshot) failed to.
    SendFailing {
        /// The replica.
        replica: String,
        /// What the transport (or the snapshot) said.
        error: String,
        /// Messages waiting for it.
        outbox: i64,
    },
    /// A replica whose outbox outgrew its bound and was dropped: it is
    /// provisioned again when it is back.
    OutboxDropped {
        /// The replica.
        replica: String,
        /// By how much, as the relay said it.
        alarm: String,
        /// When.
        at: Option<DateTime<Utc>>,
    },
}

impl Concern {
    /// What an operator does about it. Refused rows are the only ones that
    /// need a fix: a failing send is the transport's (a send failure the
    /// code causes, such as a snapshot the transport refuses as too large,
    /// shows here too, and says so in its error).
    pub fn action(&self) -> Action {
        match self {
            Concern::Refused { .. } | Concern::Quarantined { .. } | Concern::Parked { .. } => {
                Action::DeployFix
            }
            Concern::NotesPending { .. }
            | Concern::ChangesKept { .. }
            | Concern::DigestDiffered { .. }
            | Concern::SendFailing { .. }
            | Concern::OutboxDropped { .. } => Action::Wait,
        }
    }
}

/// One thing the engine waits on, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Item {
    /// What to do.
    pub action: Action,
    /// What it is.
    #[serde(flatten)]
    pub concern: Concern,
}

/// Notes pending in the whole database.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PendingNotes {
    /// Notes.
    pub notes: i64,
    /// Rows they are about.
    pub rows: i64,
}

/// What the engine waits on, over a scope (pending notes are the whole
/// database's: a note is no replica's until planned).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Health {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// Whether nothing waits for a fix.
    pub healthy: bool,
    /// Notes pending.
    pub pending: PendingNotes,
    /// Everything waited on: fixes first, then by kind and name.
    pub items: Vec<Item>,
}

/// What the engine waits on over `scope`.
pub async fn health(client: &mut tokio_postgres::Client, scope: &Scope) -> Result<Health> {
    let (tx, now) = begin(client).await?;
    check_scope(&tx, scope).await?;
    let (ids, partition) = (scope.ids(), scope.partition());
    let mut concerns = Vec::new();
    let (pending, oldest_at) = pending_notes(&tx).await?;
    if pending.notes > 0 {
        concerns.push(Concern::NotesPending {
            notes: pending.notes,
            rows: pending.rows,
            oldest_at,
        });
    }
    // By table and kind of refusal, with one of its reasons: rows that
    // differ only in what the reason quotes of them are one item.
    let declared = crate::store::tables::declared("i.table_name");
    let refused = tx
        .query(
            &format!(
                "SELECT {}, CASE WHEN {declared} THEN {} ELSE '' END,
                        min(CASE WHEN {declared} THEN i.reason
                                 ELSE 'the server declares no such table' END),
                        count(*), count(DISTINCT i.replica), min(i.at)
                 FROM sync.inbox i JOIN sync.replicas r ON r.id = i.replica
                 WHERE {IN_SCOPE} GROUP BY 1, 2 ORDER BY 1, 2",
                crate::store::tables::shown("i.table_name"),
                crate::store::filing::refusal_kind("i.reason"),
            ),
            &[&ids, &partition],
        )
        .await?;
    let quarantined = tx
        .query(
            &format!(
                "SELECT z.table_name, z.key, z.reason, z.at,
                        (SELECT count(*) FROM {BLOCKED} b JOIN sync.replicas r ON r.id = b.replica
                         WHERE b.root_table = z.table_name AND b.root_key = z.key AND {IN_SCOPE})
                 FROM sync.quarantine z ORDER BY 1, 2"
            ),
            &[&ids, &partition],
        )
        .await?;
    for row in &quarantined {
        let key: &str = row.get(1);
        concerns.push(Concern::Quarantined {
            table: row.get(0),
            // As it travels: compact.
            key: serde_json::from_str::<serde_json::Value>(key)
                .map_or_else(|_| key.to_string(), |k| k.to_string()),
            reason: row.get(2),
            since: row.get(3),
            blocked: row.get(4),
        });
    }
    let parked = tx
        .query(
            "SELECT table_name, count(*), min(reason), min(at) FROM sync.parked
             GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await?;
    concerns.extend(parked.iter().map(|row| Concern::Parked {
        table: row.get(0),
        notes: row.get(1),
        reason: row.get(2),
        since: row.get(3),
    }));
    concerns.extend(refused.iter().map(|row| Concern::Refused {
        table: row.get(0),
        reason: row.get(2),
        rows: row.get(3),
        replicas: row.get(4),
        since: row.get(5),
    }));
    let replicas = tx
        .query(
            &format!(
                "SELECT r.id, r.last_error, r.alarm, r.alarm_at,
                        (SELECT count(*) FROM sync.outbox o WHERE o.replica = r.id)
                          + (SELECT count(*) FROM ({OWED}) w WHERE w.replica = r.id),
                        (SELECT count(*) FROM sync.deferred d WHERE d.replica = r.id),
                        r.digest_said, r.digest_differed_at, r.digest_mismatches
                 FROM sync.replicas r
                 WHERE {IN_SCOPE} AND (r.last_error IS NOT NULL OR r.alarm IS NOT NULL
                       OR r.digest_differed_at > now() - interval '1 day'
                       OR EXISTS (SELECT 1 FROM sync.deferred d WHERE d.replica = r.id))
                 ORDER BY r.id"
            ),
            &[&ids, &partition],
        )
        .await?;
    tx.commit().await?;
    for row in &replicas {
        let replica: String = row.get(0);
        if let Some(error) = row.get::<_, Option<String>>(1) {
            concerns.push(Concern::SendFailing {
                replica: replica.clone(),
                error,
                outbox: row.get(4),
            });
        }
        if let Some(alarm) = row.get::<_, Option<String>>(2) {
            concerns.push(Concern::OutboxDropped {
                replica: replica.clone(),
                alarm,
                at: row.get(3),
            });
        }
        let differed_at: Option<DateTime<Utc>> = row.get(7);
        if let (Some(said), Some(at)) = (row.get::<_, Option<String>>(6), differed_at) {
            if at > now - chrono::Duration::days(1) {
                concerns.push(Concern::DigestDiffered {
                    replica: replica.clone(),
                    said,
                    at,
                    times: row.get(8),
                });
            }
        }
        let kept: i64 = row.get(5);
        if kept > 0 {
            concerns.push(Concern::ChangesKept {
                replica,
                rows: kept,
            });
        }
    }
    let mut items: Vec<Item> = concerns
        .into_iter()
        .map(|concern| Item {
            action: concern.action(),
            concern,
        })
        .collect();
    // Stable: fixes first, each kind in the order it was read.
    items.sort_by_key(|i| i.action);
    Ok(Health {
        now,
        healthy: items.iter().all(|i| i.action != Action::DeployFix),
        pending,
        items,
    })
}

/// Notes pending in the whole database, and when the oldest one's
/// transaction committed when PostgreSQL tracks commit times
/// (`track_commit_timestamp`).
pub(super) async fn pending_notes(
    tx: &Transaction<'_>,
) -> Result<(PendingNotes, Option<DateTime<Utc>>)> {
    let tracked: bool = tx
        .query_one(
            "SELECT current_setting('track_commit_timestamp') = 'on'",
            &[],
        )
        .await?
        .get(0);
    let oldest_at = if tracked {
        "pg_xact_commit_timestamp(xid((SELECT xid FROM sync.notes ORDER BY seq LIMIT 1)))"
    } else {
        "NULL::timestamptz"
    };
    let notes = tx
        .query_one(
            &format!(
                "SELECT count(*), count(DISTINCT (table_name, key)), {oldest_at} FROM sync.notes"
            ),
            &[],
        )
        .await?;
    let pending = PendingNotes {
        notes: notes.get(0),
        rows: notes.get(1),
    };
    Ok((pending, notes.get(2)))
}

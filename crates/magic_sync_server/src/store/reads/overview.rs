//! Is everything where it should be: one state per replica, counted, the
//! worst listed, and per table what is still on its way; and every replica
//! of a scope, a page at a time.
//!
//! Neither counts the rows a replica should hold. They read the replicas'
//! rows (`sync.replicas`, `sync.acks`), count the messages waiting per
//! replica (`sync.outbox`), and count rows only where something is on its
//! way: the held rows of a replica that has not acknowledged its last
//! message (counted per message as `sync.held` is written, in
//! `sync.held_carried`), the held rows a
//! pending note changed (found from the notes through `sync.held`'s key),
//! refused rows and changes kept. A fleet that is caught up costs a few
//! rows per replica, however much it holds.

use super::state::{decide, Facts, ReplicaState, ReplicaSummary};
use super::{begin, check_scope, Error, Result, Scope, IN_SCOPE};
use crate::store::cohorts::OWED;
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;
use tokio_postgres::Transaction;

/// How many replicas are in each state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct StateCounts {
    /// Nothing on its way.
    pub caught_up: i64,
    /// Kept up, something on its way.
    pub on_its_way: i64,
    /// Provisioned from scratch.
    pub provisioning: i64,
    /// The last send to it failed.
    pub out_of_reach: i64,
    /// Something of it waits for a fix.
    pub waiting_on_fix: i64,
}

impl StateCounts {
    pub(super) fn add(&mut self, state: ReplicaState) {
        let count = match state {
            ReplicaState::CaughtUp => &mut self.caught_up,
            ReplicaState::OnItsWay => &mut self.on_its_way,
            ReplicaState::Provisioning => &mut self.provisioning,
            ReplicaState::OutOfReach => &mut self.out_of_reach,
            ReplicaState::WaitingOnFix => &mut self.waiting_on_fix,
        };
        *count += 1;
    }
}

/// One table over the scope's replicas: what is not where it should be yet.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableFigures {
    /// The table, as the engine names it.
    pub table: String,
    /// Replicas with a row of it on its way, outdated or refused.
    pub replicas: i64,
    /// Rows of it sent in messages not acknowledged yet, over the replicas.
    pub rows_on_their_way: i64,
    /// Rows of it held (acknowledged) that a pending note changed since.
    pub rows_outdated: i64,
    /// Rows of it from uploads the server refused.
    pub rows_refused: i64,
}

/// Whether everything is where it should be, over a scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overview {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// Live replicas in the scope.
    pub replicas: i64,
    /// How many are in each state.
    pub states: StateCounts,
    /// The worst replicas, up to the limit asked for, worst first
    /// ([`ReplicaSummary::worst_first`]); caught-up replicas are never
    /// listed.
    pub worst: Vec<ReplicaSummary>,
    /// Per table with anything not where it should be, by name.
    pub tables: Vec<TableFigures>,
    /// Notes pending in the whole database (not planned by a pass yet):
    /// a note is not any one replica's until it is planned.
    pub pending_notes: i64,
    /// The last deployment of changed declarations, table by table, with
    /// how far each got (`crate::deploy`); empty when no build changed
    /// any since the sync began.
    pub deployment: Vec<crate::store::deployment::Progress>,
}

impl Overview {
    /// Whether anything in the scope waits for a fix to be deployed.
    pub fn waits_for_fix(&self) -> bool {
        self.states.waiting_on_fix > 0
    }
}

/// Every live replica of a scope, a page at a time, by id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// This page's replicas, by id.
    pub replicas: Vec<ReplicaSummary>,
    /// The id to ask for the next page after; `None` on the last page.
    pub next: Option<String>,
}

/// Whether everything in `scope` is where it should be: the replicas
/// counted per state, the `worst` few listed, and the tables with anything
/// on its way.
pub async fn overview(
    client: &mut tokio_postgres::Client,
    scope: &Scope,
    worst: usize,
) -> Result<Overview> {
    let (tx, now) = begin(client).await?;
    check_scope(&tx, scope).await?;
    let (mut replicas, tables) = summaries(&tx, scope, None, None).await?;
    let pending_notes: i64 = tx
        .query_one("SELECT count(*) FROM sync.notes", &[])
        .await?
        .get(0);
    let deployment = crate::store::deployment::progress(&tx).await?;
    tx.commit().await?;
    let mut states = StateCounts::default();
    for r in &replicas {
        states.add(r.state);
    }
    let count = replicas.len() as i64;
    replicas.retain(|r| r.state != ReplicaState::CaughtUp);
    replicas.sort_by(ReplicaSummary::worst_first);
    replicas.truncate(worst);
    Ok(Overview {
        now,
        replicas: count,
        states,
        worst: replicas,
        tables: tables.into_values().collect(),
        pending_notes,
        deployment,
    })
}

/// The live replicas of `scope` with ids after `after`, `limit` of them
/// (at least one), by id.
pub async fn listing(
    client: &mut tokio_postgres::Client,
    scope: &Scope,
    after: Option<&str>,
    limit: usize,
) -> Result<Listing> {
    if limit == 0 {
        return Err(Error::Invalid("a page of no replicas"));
    }
    let (tx, now) = begin(client).await?;
    check_scope(&tx, scope).await?;
    // One more than asked: whether a next page exists.
    let asked = i64::try_from(limit).unwrap_or(i64::MAX - 1) + 1;
    let (mut replicas, _) = summaries(&tx, scope, after, Some(asked)).await?;
    tx.commit().await?;
    let next = if replicas.len() > limit {
        replicas.truncate(limit);
        replicas.last().map(|r| r.id.clone())
    } else {
        None
    };
    Ok(Listing {
        now,
        replicas,
        next,
    })
}

/// The replicas of `scope` after `after`, up to `limit`, by id; and per
/// table, the figures over them.
pub(super) async fn summaries(
    tx: &Transaction<'_>,
    scope: &Scope,
    after: Option<&str>,
    limit: Option<i64>,
) -> Result<(Vec<ReplicaSummary>, BTreeMap<String, TableFigures>)> {
    let head = crate::store::cohorts::head("r");
    let rows = tx
        .query(
            &format!(
                "WITH r AS (
                     SELECT r.id, r.partition_id, r.provision OR r.snapshot_attempt IS NOT NULL AS p,
                            r.snapshot_began_at, {head} AS last_number, coalesce(a.number, 0) AS acked,
                            a.at AS acked_at, r.last_error, r.alarm
                     FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                     WHERE {IN_SCOPE} AND ($3::text IS NULL OR r.id > $3)
                     ORDER BY r.id LIMIT $4)
                 SELECT r.id, r.partition_id, r.p, r.snapshot_began_at, r.last_number, r.acked,
                        r.acked_at, r.last_error, r.alarm,
                        (SELECT count(*) FROM sync.outbox o WHERE o.replica = r.id)
                          + (SELECT count(*) FROM ({OWED}) w WHERE w.replica = r.id),
                        (SELECT count(*) FROM sync.deferred d WHERE d.replica = r.id),
                        -- A cohort's name without the character no
                        -- replica's id begins with.
                        ARRAY(SELECT substr(m.cohort, 2) FROM sync.members m
                              WHERE m.replica = r.id ORDER BY 1)
                 FROM r ORDER BY r.id"
            ),
            &[&scope.ids(), &scope.partition(), &after, &limit],
        )
        .await?;
    let ids: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let per_table = figures(tx, &ids).await?;
    let mut tables: BTreeMap<String, TableFigures> = BTreeMap::new();
    let mut by_replica: BTreeMap<&str, (i64, i64, i64)> = BTreeMap::new();
    for f in &per_table {
        let t = tables
            .entry(f.table.clone())
            .or_insert_with(|| TableFigures {
                table: f.table.clone(),
                ..TableFigures::default()
            });
        t.replicas += 1;
        t.rows_on_their_way += f.on_their_way;
        t.rows_outdated += f.outdated;
        t.rows_refused += f.refused;
        let r = by_replica.entry(f.replica.as_str()).or_default();
        r.0 += f.on_their_way;
        r.1 += f.outdated;
        r.2 += f.refused;
    }
    let summaries = rows
        .iter()
        .map(|row| {
            let id: String = row.get(0);
            let (on_their_way, outdated, refused) =
                by_replica.get(id.as_str()).copied().unwrap_or_default();
            let (last_message, acknowledged): (i64, i64) = (row.get(4), row.get(5));
            let last_error: Option<String> = row.get(7);
            let facts = Facts {
                provisioning: row.get(2),
                failing: last_error.is_some(),
                refused,
                unacknowledged: last_message > acknowledged,
                outbox: row.get(9),
                on_their_way,
                outdated,
                kept: row.get(10),
            };
            ReplicaSummary {
                id,
                partition: row.get(1),
                state: decide(facts),
                last_message,
                acknowledged,
                acknowledged_at: row.get(6),
                outbox: facts.outbox,
                rows_on_their_way: on_their_way,
                rows_outdated: outdated,
                rows_refused: refused,
                changes_kept: facts.kept,
                provisioning: facts.provisioning,
                snapshot_began_at: row.get(3),
                last_error,
                alarm: row.get(8),
                cohorts: row.get(11),
            }
        })
        .collect();
    Ok((summaries, tables))
}

/// The branch of [`figures`] that takes back what a cohort counted on its
/// way of a row its member holds itself too: read table by table of
/// `tables` (the cohorts'), by the record's key, only when a member is
/// behind; nothing without a cohort.
fn on_their_way_both(tables: &[String]) -> String {
    if tables.is_empty() {
        return String::new();
    }
    let names: Vec<String> = tables.iter().map(|t| crate::sql::literal(t)).collect();
    format!(
        "SELECT o.replica, o.table_name, -count(*), 0, 0
         -- The members' own rows of those tables first, on their own
         -- (fenced): never every member crossed with the cohort's rows.
         FROM (SELECT h.replica, h.table_name, h.key, m.cohort, m.since
               FROM sync.held h JOIN sync.members m ON m.replica = h.replica
               WHERE h.table_name IN ({})
                 AND EXISTS (SELECT 1 FROM r WHERE r.last_number > r.acked)
               OFFSET 0) o
         JOIN r ON r.id = o.replica AND r.last_number > r.acked
         JOIN sync.held c ON c.replica = o.cohort AND c.table_name = o.table_name
          AND c.key = o.key
         WHERE greatest(c.message, o.since) > r.acked
         GROUP BY 1, 2
         UNION ALL",
        names.join(", ")
    )
}

/// One replica's figures for one table.
#[derive(Debug)]
struct Figures {
    replica: String,
    table: String,
    on_their_way: i64,
    outdated: i64,
    refused: i64,
}

/// Per replica of `ids` and table: rows on their way (held, carried by a
/// message after the one it acknowledged), rows outdated (held and
/// acknowledged, with a pending note newer than the version held), rows
/// refused (`sync.inbox`). Rows on their way are summed from the counts
/// kept per message (`sync.held_carried`), only for a replica that has not
/// acknowledged its last message; rows outdated go from the notes, through
/// `sync.held`'s key, and for rows held by their rule alone through the
/// rule the note's row was given by ([`super::ruled::outdated`]). A member of a cohort counts the cohort's rows as its
/// own.
async fn figures(tx: &Transaction<'_>, ids: &[String]) -> Result<Vec<Figures>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    // The tables the cohorts hold rows of, named in the statement: the
    // planner then knows how many rows each has, where a table read from
    // another relation would be guessed at a share of `sync.held`.
    let cohort_tables: Vec<String> = tx
        .query(
            "SELECT DISTINCT k.table_name FROM sync.held_carried k
             WHERE k.replica IN (SELECT cohort FROM sync.members)",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    // Rows held by their rule alone that a pending note changed, only
    // while the record leaves rows to their rule.
    let ruled = match super::ruled::thinned(tx).await? {
        true => format!(
            "SELECT replica, table_name, 0, outdated, 0 FROM ({}) o
             UNION ALL",
            super::ruled::outdated("r")
        ),
        false => String::new(),
    };
    let head = crate::store::cohorts::head("r");
    let rows = tx
        .query(
            &format!(
                "WITH r AS (
                 SELECT r.id, {head} AS last_number, coalesce(a.number, 0) AS acked
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                 WHERE r.id = ANY ($1)),
             n AS (
                 SELECT table_name, key::text COLLATE \"C\" AS key, max(seq) AS seq
                 FROM sync.notes WHERE format = 1 GROUP BY 1, 2)
             SELECT replica, table_name, sum(w)::int8, sum(o)::int8, sum(x)::int8 FROM (
                 SELECT c.replica, c.table_name, sum(c.rows) AS w, 0 AS o, 0 AS x
                 FROM r JOIN sync.held_carried c ON c.replica = r.id AND c.message > r.acked
                 WHERE r.last_number > r.acked
                 GROUP BY 1, 2
                 UNION ALL
                 SELECT h.replica, h.table_name, 0, count(*), 0
                 FROM n JOIN sync.held h ON h.table_name = n.table_name AND h.key = n.key
                 JOIN r ON r.id = h.replica
                 WHERE h.message <= r.acked AND h.version < n.seq
                 GROUP BY 1, 2
                 UNION ALL
                 -- What a member holds through its cohort, carried by the
                 -- later of the cohort's message and the one it joined at.
                 SELECT m.replica, c.table_name, sum(c.rows), 0, 0
                 FROM r JOIN sync.members m ON m.replica = r.id
                 JOIN sync.held_carried c
                   ON c.replica = m.cohort AND greatest(c.message, m.since) > r.acked
                 WHERE r.last_number > r.acked
                 GROUP BY 1, 2
                 UNION ALL
                 SELECT m.replica, h.table_name, 0, count(*), 0
                 FROM n JOIN sync.held h ON h.table_name = n.table_name AND h.key = n.key
                 JOIN sync.members m ON m.cohort = h.replica
                 JOIN r ON r.id = m.replica
                 WHERE greatest(h.message, m.since) <= r.acked AND h.version < n.seq
                 GROUP BY 1, 2
                 UNION ALL
                 -- A row a member holds itself and through its cohort
                 -- counts as its own: what the cohort's counted of it, not.
                 -- On its way (`on_their_way_both`), and outdated, from
                 -- the pending notes.
                 {shared}
                 SELECT m.replica, h.table_name, 0, -count(*), 0
                 FROM n JOIN sync.held c ON c.table_name = n.table_name AND c.key = n.key
                 JOIN sync.members m ON m.cohort = c.replica
                 JOIN r ON r.id = m.replica
                 JOIN sync.held h ON h.table_name = c.table_name AND h.key = c.key
                  AND h.replica = m.replica
                 WHERE greatest(c.message, m.since) <= r.acked AND c.version < n.seq
                 GROUP BY 1, 2
                 UNION ALL
                 {ruled}
                 SELECT i.replica, {}, 0, 0, count(*)
                 FROM sync.inbox i JOIN r ON r.id = i.replica
                 GROUP BY 1, 2) f
             GROUP BY 1, 2
             -- Nothing left once a member's rows are counted once.
             HAVING sum(w) <> 0 OR sum(o) <> 0 OR sum(x) <> 0
             ORDER BY 1, 2",
                crate::store::tables::shown("i.table_name"),
                shared = on_their_way_both(&cohort_tables),
            ),
            &[&ids],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| Figures {
            replica: row.get(0),
            table: row.get(1),
            on_their_way: row.get(2),
            outdated: row.get(3),
            refused: row.get(4),
        })
        .collect())
}

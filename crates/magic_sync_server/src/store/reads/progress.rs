//! How far along one replica is, per table: its progress bar,
//! `holds − outdated` of `should`, the way a music library shows "40 of
//! 500 songs on this tablet". It cannot run ahead of the replica: nothing
//! counts as held until the replica said it applied the message that
//! carried it.

use super::overview::summaries;
use super::state::ReplicaSummary;
use super::{begin, check_scope, Result, Scope};
use chrono::{DateTime, Utc};
use serde::Serialize;
use std::collections::BTreeMap;

/// One table of one replica. Every figure is as the engine records it:
///
/// - `should`: rows recorded in `sync.held` for the replica, and rows it
///   holds by its rule alone with no record row (summed as the record
///   moves, `sync.left_to_rule`): what the passes (and its snapshot)
///   decided it holds once every message written for it is applied.
///   Changes no pass has planned yet (pending notes) are not in it: a
///   pending note is no replica's until planned.
/// - `holds`: of those, the rows not carried by a message the replica has
///   not acknowledged (`message > sync.acks.number`, counted per message in
///   `sync.held_carried` whether recorded or not).
/// - `outdated`: of `holds`, the rows with a pending note newer than the
///   version held (`sync.notes.seq > sync.held.version`, or, for a row held
///   by its rule alone, any pending note that says the rule gave it the
///   row as it was): the replica has a copy, and the next pass sends it the
///   new one or takes it back.
/// - `on_its_way`: `should − holds`, the rows sent (or waiting in the
///   outbox) in messages it has not acknowledged.
/// - `set_aside`: rows of the replica's uploads of this table the server
///   refused, kept in `sync.inbox` until a fix is deployed.
/// - `up`: what the replica last said it has of this table that the server
///   has not filed (`sync.backlogs`), or `None` when it said nothing of it.
///
/// While the replica is provisioned, nothing is recorded as held: its
/// snapshot records its whole set when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableProgress {
    /// The table, as the engine names it.
    pub table: String,
    /// Rows it is to hold once every message written for it is applied.
    pub should: i64,
    /// Rows it holds: carried by a message it acknowledged.
    pub holds: i64,
    /// Rows it holds an older version of than the database's.
    pub outdated: i64,
    /// Rows in messages it has not acknowledged.
    pub on_its_way: i64,
    /// Rows of its uploads refused, waiting for a fix.
    pub set_aside: i64,
    /// Its own writes not filed by the server yet.
    pub up: Option<UpBacklog>,
}

impl TableProgress {
    /// The bar: rows held as they are now, of the rows it should hold.
    pub fn bar(&self) -> (i64, i64) {
        (self.holds - self.outdated, self.should)
    }
}

/// What a replica last said of a table it writes: rows not sent yet, and
/// rows sent that the server has not filed yet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct UpBacklog {
    /// Rows written and not sent (or written again since).
    pub unsent: i64,
    /// Rows sent and not filed yet.
    pub unfiled: i64,
}

/// How far along one replica is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Progress {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// The replica, as [`listing`](super::listing) shows it.
    pub replica: ReplicaSummary,
    /// Per table it holds, writes, or had refused, by name.
    pub tables: Vec<TableProgress>,
    /// When the replica last said what it has not had filed.
    pub backlog_at: Option<DateTime<Utc>>,
}

/// How far along `replica` (known and live) is, per table.
pub async fn progress(client: &mut tokio_postgres::Client, replica: &str) -> Result<Progress> {
    let (tx, now) = begin(client).await?;
    let scope = Scope::Replicas(vec![replica.to_string()]);
    check_scope(&tx, &scope).await?;
    let (summaries, _) = summaries(&tx, &scope, None, None).await?;
    let summary = summaries
        .into_iter()
        .next()
        .ok_or_else(|| super::Error::UnknownReplica(replica.to_string()))?;
    let mut tables: BTreeMap<String, TableProgress> = BTreeMap::new();
    let held = tx
        .query(
            "WITH n AS (
                 SELECT table_name, key::text COLLATE \"C\" AS key, max(seq) AS seq
                 FROM sync.notes WHERE format = 1 GROUP BY 1, 2)
             SELECT h.table_name, count(*),
                    count(*) FILTER (WHERE h.message <= $2),
                    count(*) FILTER (WHERE h.message <= $2 AND n.seq > h.version)
             FROM (SELECT table_name, key, version, message FROM sync.held WHERE replica = $1
                   UNION ALL
                   -- What it holds through its cohort, from when it joined.
                   SELECT h.table_name, h.key, h.version, greatest(h.message, m.since)
                   FROM sync.members m JOIN sync.held h ON h.replica = m.cohort
                   WHERE m.replica = $1
                     -- A row it holds itself too is counted as its own.
                     AND NOT EXISTS (SELECT 1 FROM sync.held o
                                     WHERE o.table_name = h.table_name AND o.key = h.key
                                       AND o.replica = $1)) h
             LEFT JOIN n ON n.table_name = h.table_name AND n.key = h.key
             GROUP BY 1",
            &[&replica, &summary.acknowledged],
        )
        .await?;
    for row in held {
        let t = entry(&mut tables, row.get(0));
        t.should = row.get(1);
        t.holds = row.get(2);
        t.outdated = row.get(3);
        t.on_its_way = t.should - t.holds;
    }
    // What it holds by its rule alone, which has no record row (decision
    // 177): summed per holder and table as the record moves, and on its
    // way as long as a message it has not acknowledged carried it (the
    // counts of what each message carried, less the record's rows that
    // say so). Nothing while every row is recorded: then it is not read,
    // as it would read the replica's record a second time for nothing.
    let by_rule = super::ruled::thinned(&tx).await?;
    let ruled = match by_rule {
        false => Vec::new(),
        true => {
            tx.query(
                "SELECT table_name, sum(rows)::int8, sum(moving)::int8 FROM (
                 SELECT table_name, rows, 0 AS moving FROM sync.left_to_rule WHERE replica = $1
                 UNION ALL
                 SELECT l.table_name, l.rows, 0 FROM sync.members m
                 JOIN sync.left_to_rule l ON l.replica = m.cohort
                 WHERE m.replica = $1
                 UNION ALL
                 -- A row it holds itself that its cohort holds by the rule
                 -- alone is counted as its own.
                 SELECT o.table_name, -count(*), 0 FROM sync.members m
                 JOIN sync.left_to_rule l ON l.replica = m.cohort AND l.rows > 0
                 JOIN sync.held o ON o.replica = m.replica AND o.table_name = l.table_name
                 WHERE m.replica = $1
                   AND NOT EXISTS (SELECT 1 FROM sync.held c
                                   WHERE c.table_name = o.table_name AND c.key = o.key
                                     AND c.replica = m.cohort)
                 GROUP BY 1
                 UNION ALL
                 SELECT table_name, 0, rows FROM sync.held_carried
                 WHERE replica = $1 AND message > $2
                 UNION ALL
                 SELECT table_name, 0, -count(*) FROM sync.held
                 WHERE replica = $1 AND message > $2 GROUP BY 1
                 UNION ALL
                 SELECT c.table_name, 0, c.rows FROM sync.members m
                 JOIN sync.held_carried c
                   ON c.replica = m.cohort AND greatest(c.message, m.since) > $2
                 WHERE m.replica = $1
                 UNION ALL
                 SELECT h.table_name, 0, -count(*) FROM sync.members m
                 JOIN sync.held h ON h.replica = m.cohort AND greatest(h.message, m.since) > $2
                 WHERE m.replica = $1 GROUP BY 1) f
             GROUP BY 1
             HAVING sum(rows) <> 0 OR sum(moving) <> 0",
                &[&replica, &summary.acknowledged],
            )
            .await?
        }
    };
    for row in ruled {
        let t = entry(&mut tables, row.get(0));
        let (rows, moving): (i64, i64) = (row.get(1), row.get(2));
        t.should += rows;
        t.on_its_way += moving;
        t.holds = t.should - t.on_its_way;
    }
    if by_rule {
        let outdated = tx
            .query(
                &format!(
                    "WITH r AS (SELECT $1::text AS id, $2::int8 AS acked)
                     SELECT table_name, outdated FROM ({}) o",
                    super::ruled::outdated("r")
                ),
                &[&replica, &summary.acknowledged],
            )
            .await?;
        for row in outdated {
            let count: i64 = row.get(1);
            entry(&mut tables, row.get(0)).outdated += count;
        }
    }
    let refused = tx
        .query(
            "SELECT table_name, count(*) FROM sync.inbox WHERE replica = $1 GROUP BY 1",
            &[&replica],
        )
        .await?;
    for row in refused {
        entry(&mut tables, row.get(0)).set_aside = row.get(1);
    }
    let backlog = tx
        .query(
            "SELECT b.name, coalesce((b.t ->> 'unsent')::int8, 0),
                    coalesce((b.t ->> 'unfiled')::int8, 0)
             FROM sync.backlogs s CROSS JOIN LATERAL jsonb_each(s.tables) AS b (name, t)
             WHERE s.replica = $1",
            &[&replica],
        )
        .await?;
    for row in backlog {
        entry(&mut tables, row.get(0)).up = Some(UpBacklog {
            unsent: row.get(1),
            unfiled: row.get(2),
        });
    }
    let backlog_at: Option<DateTime<Utc>> = tx
        .query_opt(
            "SELECT at FROM sync.backlogs WHERE replica = $1",
            &[&replica],
        )
        .await?
        .map(|r| r.get(0));
    tx.commit().await?;
    Ok(Progress {
        now,
        replica: summary,
        tables: tables.into_values().collect(),
        backlog_at,
    })
}

/// The table's entry, made when it is first met.
fn entry(tables: &mut BTreeMap<String, TableProgress>, name: String) -> &mut TableProgress {
    tables.entry(name.clone()).or_insert_with(|| TableProgress {
        table: name,
        ..TableProgress::default()
    })
}

//! The rows a replica holds by its rule alone, which have no record row
//! (decisions 176, 177), as the reads count them: still from the `sync`
//! schema alone. How many there are is summed as the record moves
//! (`sync.left_to_rule`); which of them a pending note changed is read from
//! the note itself, which carries what its row was: its rule's column and
//! its links (`sync.notes.parents`), read against the rule the build
//! recorded for the table (`sync.tables.definition`).

use super::Result;
use crate::sql::{ident, qualified};
use crate::store::by_rule::{recorded_whole, ruled_out, OldRule};
use crate::store::notes::Op;
use tokio_postgres::Transaction;

/// Whether the record leaves rows to their rule (`sync.record_form`):
/// while it does not, every held row has a record row and nothing here
/// needs reading.
pub(super) async fn thinned(tx: &Transaction<'_>) -> Result<bool> {
    Ok(tx
        .query_opt("SELECT by_rule FROM sync.record_form", &[])
        .await?
        .is_some_and(|r| r.get(0)))
}

/// `SELECT replica, table_name, count(*)`: per replica of `r` (a relation
/// with `id` and `acked`, the message it acknowledged) kept up, and per
/// table, the rows it holds by its rule alone, acknowledged, that a
/// pending note changed: as many as a record of every row would count
/// outdated.
///
/// A key's notes say what the row was before them when each says what
/// happened (no note of an earlier build) and the first is not an insert:
/// the `parents` of its first note that is not an insert. A key first
/// inserted was not there, or its notes cannot say what was (two rows
/// sharing it under a deferrable key): either way a holder holds no copy
/// of it by its rule alone, as its holders stay recorded. Whom the row was
/// given to is the table's rule read on that: `all` its full replicas and
/// the `all` cohort's members (from when they joined), `replica(c)` the
/// replica named by `c`, `partition(c)` the replicas of the partition
/// named. Not counted, as the reading counts them not held by the rule
/// alone: a key the holder has a record row of (its own, for a member
/// too), rows set aside, blocked for the holder, seen by its snapshot's
/// view, or read by their record (parked notes, a table recorded whole or
/// planned again). Still on its way, not held: a row let go while its
/// message was unacknowledged (`sync.let_go`), and otherwise a row of a
/// snapshot whose last message is unacknowledged.
pub(super) fn outdated(r: &str) -> String {
    let i = Op::Insert.literal();
    format!(
        "SELECT h.replica, p.table_name, count(*) AS outdated
         FROM (SELECT n.table_name, n.key,
                      (array_agg(n.parents ORDER BY n.seq)
                         FILTER (WHERE n.op <> {i} AND n.parents IS NOT NULL))[1] AS before
               FROM sync.notes n WHERE n.format = 1
               GROUP BY 1, 2
               HAVING bool_and(n.op IS NOT NULL) AND (array_agg(n.op ORDER BY n.seq))[1] <> {i}) p
         JOIN (SELECT name,
                      CASE WHEN rule = 'all' THEN 'all'
                           WHEN rule LIKE 'replica(%)' THEN 'replica'
                           WHEN rule LIKE 'partition(%)' THEN 'partition' END AS rule,
                      substring(rule FROM '^[a-z]+\\((.*)\\)$') AS col
               FROM (SELECT name, definition ->> 'rule' AS rule FROM sync.tables) d) t
           ON t.name = p.table_name AND t.rule IS NOT NULL
         JOIN (-- Each replica as a holder, and each member through its cohort.
               SELECT x.id AS replica, x.id AS holder, x.partition_id AS part, x.acked,
                      CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = x.id)
                           THEN 'own' ELSE 'full' END AS kind,
                      x.snapshot_last AS carried
               FROM (SELECT s.*, r.acked FROM {r} r JOIN sync.replicas s ON s.id = r.id) x
               WHERE x.live AND NOT x.provision AND x.snapshot_attempt IS NULL
               UNION ALL
               SELECT x.id, c.id, NULL, r.acked, c.kind, m.since
               FROM {r} r JOIN sync.replicas x ON x.id = r.id
               JOIN sync.members m ON m.replica = x.id
               JOIN sync.cohorts c ON c.id = m.cohort
               WHERE x.live AND NOT x.provision AND x.snapshot_attempt IS NULL) h
           ON CASE t.rule
                WHEN 'all' THEN h.kind <> 'own'
                WHEN 'replica' THEN h.kind <> 'all' AND p.before ->> t.col = h.holder
                ELSE h.kind <> 'all' AND p.before ->> t.col = h.part
              END
         WHERE NOT EXISTS (SELECT 1 FROM sync.held o
                           WHERE o.table_name = p.table_name AND o.key = p.key::text COLLATE \"C\"
                             AND o.replica IN (h.holder, h.replica))
           AND greatest(coalesce((SELECT l.message FROM sync.let_go l
                                  WHERE l.replica = h.holder AND l.table_name = p.table_name
                                    AND l.key = p.key::text COLLATE \"C\"),
                                 0),
                        h.carried) <= h.acked
           AND NOT EXISTS (SELECT 1 FROM sync.quarantine q
                           WHERE q.table_name = p.table_name AND q.key = p.key::text COLLATE \"C\")
           AND NOT EXISTS (SELECT 1 FROM sync.blocked b
                           WHERE b.replica = h.holder AND b.table_name = p.table_name
                             AND b.key = p.key::text COLLATE \"C\")
           AND NOT EXISTS (SELECT 1 FROM sync.deferred d
                           WHERE d.replica = h.holder AND d.table_name = p.table_name
                             AND d.key = p.key)
           AND NOT {out}
           AND NOT {whole}
         GROUP BY 1, 2",
        out = ruled_out("p.table_name", "p.key"),
        whole = recorded_whole("p.table_name"),
    )
}

/// Whom a row's rule gave it to at their positions, as [`given`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Given {
    /// No one by the rule alone: the table's rule does not read the row's
    /// own columns, the row was not there, its notes cannot say what it
    /// was, or it is read by its record alone for now.
    Nobody,
    /// Every full replica, and the `all` cohort's members.
    All,
    /// The replica of this id.
    Replica(String),
    /// The replicas of this partition.
    Partition(String),
}

/// Whom the rule of `table` gave the row keyed `key` (as the record keeps
/// keys) to at their positions: as it was before its first pending note
/// that is not an insert, read from that note, or as the row is now when
/// none is pending, read from the host's table by its key. This is the one
/// read of the operator's that reads a host table, one row by its key
/// (decision 177): a row held by its rule alone has no record row to say
/// so. The table's schema and rule are the ones the running build
/// recorded (`sync.tables.definition`).
pub(super) async fn given(tx: &Transaction<'_>, table: &str, key: &str) -> Result<Given> {
    let Some(row) = tx
        .query_opt(
            &format!(
                "SELECT definition, {whole} OR {out}
                 FROM sync.tables WHERE name = $1",
                whole = recorded_whole("$1"),
                out = ruled_out("$1", "$2::text::jsonb"),
            ),
            &[&table, &key],
        )
        .await?
    else {
        return Ok(Given::Nobody);
    };
    let (definition, by_record): (Option<serde_json::Value>, bool) = (row.get(0), row.get(1));
    let Some(definition) = definition.filter(|_| !by_record) else {
        return Ok(Given::Nobody);
    };
    let Some(rule) = definition["rule"].as_str().and_then(OldRule::parse) else {
        return Ok(Given::Nobody);
    };
    let notes = tx
        .query_one(
            &format!(
                "SELECT count(*), bool_and(op IS NOT NULL), (array_agg(op ORDER BY seq))[1] = {i},
                        ((array_agg(parents ORDER BY seq)
                            FILTER (WHERE op <> {i} AND parents IS NOT NULL))[1])::text
                 FROM sync.notes WHERE format = 1 AND table_name = $1 AND key = $2::text::jsonb",
                i = Op::Insert.literal(),
            ),
            &[&table, &key],
        )
        .await?;
    let value: Option<Option<String>> = match notes.get::<_, i64>(0) {
        0 => now(tx, &definition, table, key, rule.column()).await?,
        _ => {
            let (known, inserted): (bool, bool) = (notes.get(1), notes.get(2));
            let before: Option<serde_json::Value> = notes
                .get::<_, Option<String>>(3)
                .and_then(|t| serde_json::from_str(&t).ok());
            match (known && !inserted, before) {
                (true, Some(before)) => Some(rule.column().and_then(|c| match &before[c] {
                    serde_json::Value::String(s) => Some(s.clone()),
                    serde_json::Value::Null => None,
                    other => Some(other.to_string()),
                })),
                _ => None,
            }
        }
    };
    Ok(match (value, rule) {
        (None, _) => Given::Nobody,
        (Some(_), OldRule::All) => Given::All,
        (Some(Some(v)), OldRule::Replica(_)) => Given::Replica(v),
        (Some(Some(v)), OldRule::Partition(_)) => Given::Partition(v),
        (Some(None), _) => Given::Nobody,
    })
}

/// The row of `table` keyed `key` as it is now: `None` when there is none
/// (or the build that recorded the table did not say its schema), else its
/// rule's `column` as text (`None` for NULL, or no column).
async fn now(
    tx: &Transaction<'_>,
    definition: &serde_json::Value,
    table: &str,
    key: &str,
    column: Option<&str>,
) -> Result<Option<Option<String>>> {
    let Some(schema) = definition["schema"].as_str() else {
        return Ok(None);
    };
    let columns: Vec<String> = definition["key"]
        .as_array()
        .map(|k| {
            k.iter()
                .filter_map(|c| c[0].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let relation = qualified(schema, table);
    // Each key column compared as its own type, so that the table's key
    // index finds the row.
    let types = tx
        .query(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
             FROM pg_attribute a
             WHERE a.attrelid = to_regclass($1) AND a.attname = ANY ($2) AND NOT a.attisdropped",
            &[&relation, &columns],
        )
        .await?;
    if columns.is_empty() || types.len() != columns.len() {
        return Ok(None);
    }
    let matches: Vec<String> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let ty: String = types
                .iter()
                .find(|r| r.get::<_, String>(0) == *c)
                .map(|r| r.get(1))
                .unwrap_or_default();
            format!("{} = ($1::text::jsonb ->> {i})::{ty}", ident(c))
        })
        .collect();
    let value = column.map_or("NULL::text".to_string(), |c| format!("{}::text", ident(c)));
    let row = tx
        .query_opt(
            &format!(
                "SELECT {value} FROM {relation} WHERE {}",
                matches.join(" AND ")
            ),
            &[&key],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

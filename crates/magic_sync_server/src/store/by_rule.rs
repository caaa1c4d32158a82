//! The rows a holder's own rule gives it at its position, read from the
//! host's rows and the pending notes alone, with no record (decision 176):
//! a row with no pending note as it is now; a row with pending notes as it
//! was before the first of them.
//!
//! Whether a key was there before its pending notes is whether it is there
//! now, less the inserts its notes say, plus the deletes (`sync.notes.op`).
//! The order of the notes cannot say it: in one transaction, a key inserted
//! then updated notes (insert, update), and a key another row's key change
//! took under a deferrable unique key, then deleted, notes (insert,
//! delete). What the row was is the `parents` of its first pending note
//! that is not an insert: the columns that point at other tables and the
//! one its rule reads, read into a row of the table's type.
//!
//! Today the record keeps every row held, so this reading is not what
//! plans; [`audit`] checks it against the record at any moment, notes
//! pending or not, which is the check decision 176 must pass before a
//! planner reads rows by their rule instead of by their record.

use super::notes::Op;
use crate::error::Result;
use crate::graph::{key_json, key_match, rule, Graph, Shape};
use crate::row::Rule;
use crate::sql::literal;
use tokio_postgres::Client;

/// The holders read: every live replica kept up (not waiting for a
/// snapshot nor streaming one) and every cohort, as the planner lists them
/// (`r`, `part`, `kind`).
const HOLDERS: &str = "SELECT id AS r, partition_id AS part,
            CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = id)
                 THEN 'own' ELSE 'full' END AS kind
     FROM sync.replicas WHERE live AND NOT provision AND snapshot_attempt IS NULL
     UNION ALL
     SELECT id, NULL, kind FROM sync.cohorts";

/// Whether the rows of `shape` can be read by their rule from the notes: a
/// rule of its own that reads the row's columns. A group's rows are given
/// by rows of other tables, with no note on the row, and stay recorded.
pub(crate) fn readable(shape: &Shape) -> bool {
    matches!(
        shape.table.rule,
        Rule::All | Rule::Replica(_) | Rule::Partition(_)
    )
}

/// Per key of `shape` with pending notes: whether every note says what it
/// is (`known`; a note function of an earlier build does not), whether the
/// key was there before them (`was`), and the row's columns then
/// (`before`, the `parents` of its first note that is not an insert).
fn pending(shape: &Shape) -> String {
    format!(
        "SELECT n.key, bool_and(n.op IS NOT NULL) AS known,
                (EXISTS (SELECT 1 FROM {rel} a WHERE {now}))::int
                  - sum(CASE n.op WHEN {i} THEN 1 WHEN {d} THEN -1 ELSE 0 END) = 1 AS was,
                (array_agg(n.parents ORDER BY n.seq)
                   FILTER (WHERE n.op <> {i} AND n.parents IS NOT NULL))[1] AS before
         FROM sync.notes n WHERE n.table_name = {t}
         GROUP BY n.key",
        rel = shape.relation,
        now = key_match("a", shape, "n.key"),
        i = Op::Insert.literal(),
        d = Op::Delete.literal(),
        t = literal(shape.table.name),
    )
}

/// The rows of `shape` each holder of `holders` (`r`, `part`, `kind`)
/// holds by its own rule at its position, as (`r`, `k`, `ptrs`): its key
/// and what that version points at, as the record writes them. A key whose
/// notes do not all say what they are is read as not given.
fn given(graph: &Graph, shape: &Shape, holders: &str) -> Option<String> {
    let now = rule(shape.table, "a", "h")?;
    let then = rule(shape.table, "p", "h")?;
    Some(format!(
        "WITH h AS ({holders}), n AS ({pending})
         SELECT h.r, {key_now} AS k, {ptrs_now} AS ptrs
         FROM {rel} a CROSS JOIN h
         WHERE {now} AND NOT EXISTS (SELECT 1 FROM n WHERE n.key = {key_now})
         UNION ALL
         SELECT h.r, n.key, {ptrs_then}
         FROM n CROSS JOIN LATERAL jsonb_populate_record(NULL::{rel}, n.before) p
         CROSS JOIN h
         WHERE n.known AND n.was AND {then}",
        pending = pending(shape),
        key_now = key_json("a", shape.table),
        ptrs_now = graph.pointers("a", shape.table.name),
        ptrs_then = graph.pointers("p", shape.table.name),
        rel = shape.relation,
    ))
}

/// Checks, for every holder kept up and every table whose rows its rule
/// can give by their columns, that the rows the record says it holds by
/// its rule are the rows [`given`] reads at its position, pointing at the
/// same parents. Rows held back (set aside or blocked), rows a snapshot
/// saw notes of (`sync.deferred`), rows with a parked note and rows with a
/// note of an earlier build are left out: each is recorded apart, and
/// decision 176 keeps recording them. So is a table a deployment is still
/// planning again: its keys past the deployment's cursor are held by its
/// old rule. Returns one line per disagreement.
pub(crate) async fn audit(client: &Client, graph: &Graph) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    for shape in graph.shapes.iter().filter(|s| readable(s)) {
        let Some(given) = given(graph, shape, HOLDERS) else {
            continue;
        };
        let sql = format!(
            "WITH g AS ({given}),
             rec AS (SELECT replica AS r, key::jsonb AS k, ptrs FROM sync.held
                     WHERE table_name = {t} AND ruled
                       AND replica IN (SELECT r FROM ({HOLDERS}) h)),
             n AS ({pending})
             SELECT coalesce(g.r, rec.r), coalesce(g.k, rec.k)::text,
                    g.k IS NOT NULL, rec.k IS NOT NULL, g.ptrs::text, rec.ptrs::text
             FROM g FULL JOIN rec ON rec.r = g.r AND rec.k = g.k
             WHERE (g.k IS NULL OR rec.k IS NULL OR g.ptrs IS DISTINCT FROM rec.ptrs)
               AND NOT EXISTS (SELECT 1 FROM sync.quarantine q
                               WHERE q.table_name = {t} AND q.key::jsonb = coalesce(g.k, rec.k))
               AND NOT EXISTS (SELECT 1 FROM sync.blocked b
                               WHERE b.replica = coalesce(g.r, rec.r) AND b.table_name = {t}
                                 AND b.key::jsonb = coalesce(g.k, rec.k))
               AND NOT EXISTS (SELECT 1 FROM sync.deferred d
                               WHERE d.replica = coalesce(g.r, rec.r) AND d.table_name = {t}
                                 AND d.key = coalesce(g.k, rec.k))
               AND NOT EXISTS (SELECT 1 FROM sync.parked x
                               WHERE x.table_name = {t} AND x.key = coalesce(g.k, rec.k))
               AND NOT EXISTS (SELECT 1 FROM n WHERE n.key = coalesce(g.k, rec.k) AND NOT n.known)
               AND NOT EXISTS (SELECT 1 FROM sync.deployment x
                               WHERE x.table_name = {t} AND x.done_at IS NULL AND x.work <> 'resend')
             ORDER BY 1, 2",
            t = literal(shape.table.name),
            pending = pending(shape),
        );
        for row in client.query(&sql, &[]).await? {
            let (r, k, given, recorded): (String, String, bool, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let table = shape.table.name;
            problems.push(match (given, recorded) {
                (true, false) => format!(
                    "{r}'s rule gives it {table} {k} at its position, but the record does not say it holds it by its rule"
                ),
                (false, _) => format!(
                    "{r} is recorded holding {table} {k} by its rule, which does not give it at its position"
                ),
                (true, true) => {
                    let (at, rec): (Option<String>, Option<String>) = (row.get(4), row.get(5));
                    format!(
                        "{r} holds {table} {k} by its rule pointing at {}, but at its position it points at {}",
                        rec.as_deref().unwrap_or("nothing"),
                        at.as_deref().unwrap_or("nothing")
                    )
                }
            });
        }
    }
    Ok(problems)
}

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
//! one its rule reads. A key whose notes cannot say it is read as not
//! known, and its holders stay recorded (see [`pending`]).
//!
//! Today the record keeps every row held, so this reading is not what
//! plans; [`audit`] checks it against the record at any moment, notes
//! pending or not, which is the check decision 176 must pass before a
//! planner reads rows by their rule instead of by their record.

use super::held::Ruled;
use super::notes::Op;
use crate::error::Result;
use crate::graph::{key_json, key_match, rule, Graph, Shape};
use crate::row::Rule;
use crate::sql::{ident, literal};
use tokio_postgres::Client;

/// The holders read: every live replica kept up (not waiting for a
/// snapshot nor streaming one) and every cohort, as the planner lists them
/// (`r`, `part`, `kind`).
pub(crate) const HOLDERS: &str = "SELECT id AS r, partition_id AS part,
            CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = id)
                 THEN 'own' ELSE 'full' END AS kind
     FROM sync.replicas WHERE live AND NOT provision AND snapshot_attempt IS NULL
     UNION ALL
     SELECT id, NULL, kind FROM sync.cohorts";

/// Whether the table `t` (an SQL literal) is recorded whole for now, as
/// SQL: a deployment is changing its rule, and what the old rule gave each
/// holder was recorded before it changed (`sync.recorded_whole`); or a
/// deployment plans it again and has not finished (a table new to the sync
/// holds nothing until its deployment sends it, whatever its rule says).
/// Either way no rule, old or new, says what its holders hold until the
/// deployment of the table is done. Evaluated once per statement.
pub(crate) fn recorded_whole(t: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM sync.recorded_whole w WHERE w.table_name = {t})
          OR EXISTS (SELECT 1 FROM sync.deployment w
                     WHERE w.table_name = {t} AND w.done_at IS NULL AND w.work <> 'resend'))"
    )
}

/// `EXISTS`: the key `k` (a JSON array) of the table `t` (expressions) is
/// read by its record alone (`sync.ruled_out`): a note of it is parked, or
/// was moved back and is not planned yet.
pub(crate) fn ruled_out(t: &str, k: &str) -> String {
    format!("EXISTS (SELECT 1 FROM sync.ruled_out o WHERE o.table_name = {t} AND o.key = {k})")
}

/// Whether the rows of `shape` can be read by their rule from the notes: a
/// rule of its own that reads the row's columns. A group's rows are given
/// by rows of other tables, with no note on the row, and stay recorded.
pub(crate) fn readable(shape: &Shape) -> bool {
    matches!(
        shape.table.rule,
        Rule::All | Rule::Replica(_) | Rule::Partition(_)
    )
}

/// The tables of `graph` whose rows [`readable`] can give, as SQL
/// literals.
pub(crate) fn readable_tables(graph: &Graph) -> Vec<String> {
    graph
        .shapes
        .iter()
        .filter(|s| readable(s))
        .map(|s| literal(s.table.name))
        .collect()
}

/// Per key of `shape` with pending notes: whether the reading can say
/// what the key was before them (`known`), whether it was there (`was`),
/// the row's columns then (`before`, the `parents` of its first note
/// that is not an insert), and, where its notes fit the table, every
/// `parents` they carry (`candidates`: one of them is what the key was,
/// when it was there).
///
/// A key is not known when a note of an earlier build (no kind) is among
/// them; when the key, or the parents a note names, no longer fit the
/// table's columns (a note written before the table changed, not parked
/// yet); and when its first
/// note is an insert although it was there. That last one happens only
/// under a deferrable unique key, where two rows share the key for a while
/// inside one transaction, and the notes cannot say which row's values
/// were there: a swap of keys notes (insert, delete) and the delete is the
/// row that was there, but another row taking the key and being updated
/// there before the first leaves notes (insert, update, delete), and a row
/// taking the key and leaving it again notes (insert, delete) of its own
/// values while the row that was there is untouched.
fn pending(graph: &Graph, shape: &Shape) -> String {
    pending_among(
        graph,
        shape,
        &format!("n.table_name = {}", literal(shape.table.name)),
    )
}

/// [`pending`], over the notes of `sync.notes n` that `notes` picks (of
/// `shape`'s table): a pass reads the ones it planned.
pub(crate) fn pending_among(graph: &Graph, shape: &Shape, notes: &str) -> String {
    let parents_fit: Vec<String> = before_columns(graph, shape)
        .iter()
        .map(|(c, ty)| {
            format!(
                "bool_and(n.parents IS NULL OR sync.castable(n.parents->>{}, {}))",
                literal(c),
                literal(ty)
            )
        })
        .chain(std::iter::once("true".to_string()))
        .collect();
    // Each key's notes summed up once (`x`), whether the key fits worked
    // out once (`g`, fenced so that it is not worked out again where it is
    // read), then whether the key was there (`w`).
    format!(
        "SELECT key, known, was, before,
                CASE WHEN fit AND NOT known THEN parents END AS candidates, fit
         FROM (SELECT g.key, g.fit, w.was, g.before, g.parents,
                      g.kinds AND g.fit AND NOT (g.first = {i} AND w.was) AS known
               FROM (SELECT x.*, {fits} AND x.parents_fit AS fit
                     FROM (SELECT n.key, bool_and(n.op IS NOT NULL) AS kinds,
                                  {parents_fit} AS parents_fit,
                                  sum(CASE n.op WHEN {i} THEN -1 WHEN {d} THEN 1 ELSE 0 END) AS net,
                                  (array_agg(n.op ORDER BY n.seq))[1] AS first,
                                  (array_agg(n.parents ORDER BY n.seq)
                                     FILTER (WHERE n.op <> {i} AND n.parents IS NOT NULL))[1] AS before,
                                  jsonb_agg(n.parents) FILTER (WHERE n.parents IS NOT NULL) AS parents
                           FROM sync.notes n WHERE {notes}
                           GROUP BY n.key) x
                     OFFSET 0) g
               CROSS JOIN LATERAL (
                   SELECT CASE WHEN g.fit
                               THEN (EXISTS (SELECT 1 FROM {rel} a WHERE {now}))::int + g.net = 1
                          END AS was) w) n",
        fits = super::parked::key_fits(shape, "x.key").join(" AND "),
        parents_fit = parents_fit.join(" AND "),
        rel = shape.relation,
        now = key_match("a", shape, "g.key"),
        i = Op::Insert.literal(),
        d = Op::Delete.literal(),
    )
}

/// `jsonb_to_record(...) AS {alias} (...)`: the row of `shape` a note's
/// `parents` (`json`) says it was, read as far as the reading needs it
/// (its links' columns and its rule's; see [`before_columns`]).
pub(crate) fn before_row(graph: &Graph, shape: &Shape, json: &str, alias: &str) -> String {
    record_of(&before_columns(graph, shape), json, alias)
}

/// `jsonb_to_record(...) AS {alias} (...)` over `read` (name, type).
fn record_of(read: &[(String, String)], json: &str, alias: &str) -> String {
    // `jsonb_to_record` needs a column: an `all` table with no link reads
    // none.
    let columns = if read.is_empty() {
        "_ms_none text".to_string()
    } else {
        read.iter()
            .map(|(c, ty)| format!("{} {ty}", ident(c)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("jsonb_to_record({json}) AS {alias} ({columns})")
}

/// The columns [`before_row`] reads, as a select list over `alias`, a row
/// of `shape`'s table as it is now: the same names and types, so that a
/// row as it is and a row as a note says it was read alike.
pub(crate) fn now_row(graph: &Graph, shape: &Shape, alias: &str) -> String {
    let read = before_columns(graph, shape);
    if read.is_empty() {
        return "NULL::text AS _ms_none".into();
    }
    read.iter()
        .map(|(c, ty)| format!("{alias}.{c}::{ty} AS {c}", c = ident(c)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The columns a note keeps in `parents` that the reading reads, with the
/// types `jsonb_to_record` reads them as: those of the links out of `shape`,
/// as the child has them, and the column its rule reads, as its base type
/// (the rule compares its text, which for `char(n)` or a timestamp is not
/// the text a note's JSON keeps). Only these: the table's other columns
/// may be of a domain that refuses the NULL they would be read as.
fn before_columns(graph: &Graph, shape: &Shape) -> Vec<(String, String)> {
    let mut columns: Vec<(String, String)> = Vec::new();
    for link in graph
        .links
        .iter()
        .filter(|l| l.child.name == shape.table.name)
    {
        for (c, ty) in link.columns.iter().zip(&link.types) {
            if !columns.iter().any(|(x, _)| x == c) {
                columns.push((c.clone(), ty.clone()));
            }
        }
    }
    if let Rule::Replica(c) | Rule::Partition(c) = shape.table.rule {
        if !columns.iter().any(|(x, _)| x == c) {
            let ty = shape.rule_type.clone().unwrap_or_else(|| "text".into());
            columns.push((c.to_string(), ty));
        }
    }
    columns
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
         FROM n CROSS JOIN LATERAL {before}
         CROSS JOIN h
         WHERE n.known AND n.was AND {then}",
        pending = pending(graph, shape),
        key_now = key_json("a", shape.table),
        ptrs_now = graph.pointers("a", shape.table.name),
        ptrs_then = graph.pointers("p", shape.table.name),
        rel = shape.relation,
        before = before_row(graph, shape, "CASE WHEN n.known THEN n.before END", "p"),
    ))
}

/// The rows of `shape` each holder of `holders` (`r`, `part`, `kind`)
/// holds by its rule alone at its position, as (`r`, `k`, `ptrs`): what [`given`]
/// reads, less the rows held back from it (set aside, or blocked for it)
/// and the rows a change was kept for while its snapshot streamed, whose
/// record says what it holds until that change is planned. `None` for a
/// table whose rows no rule of their own gives.
pub(crate) fn held(graph: &Graph, shape: &Shape, holders: &str) -> Option<String> {
    if !readable(shape) {
        return None;
    }
    Some(format!(
        "SELECT g.r, g.k, g.ptrs FROM ({given}) g
         WHERE NOT {whole} AND {not_held_back}",
        given = given(graph, shape, holders)?,
        not_held_back = not_held_back(&literal(shape.table.name), "g.k", "g.r"),
        whole = recorded_whole(&literal(shape.table.name)),
    ))
}

/// The holders (`r`, `part`, `kind`) through which the replica `replica`
/// (an SQL expression of its id) holds rows: itself, kept up (not waiting
/// for a snapshot nor streaming one: its record is being written), and
/// the cohorts it is a member of.
fn replica_and_cohorts(replica: &str) -> String {
    format!(
        "SELECT id AS r, partition_id AS part,
                CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = id)
                     THEN 'own' ELSE 'full' END AS kind
         FROM sync.replicas
         WHERE id = {replica} AND live AND NOT provision AND snapshot_attempt IS NULL
         UNION ALL
         SELECT c.id, NULL, c.kind FROM sync.cohorts c
         WHERE c.id IN (SELECT m.cohort FROM sync.members m WHERE m.replica = {replica})"
    )
}

/// The keys of `shape` the replica `replica` (an SQL expression of its id)
/// holds by its rule alone at its position, itself or through its cohorts,
/// as `(k)`: [`held`], for one replica. `None` for a table whose rows no
/// rule of their own gives.
pub(crate) fn keys_held(graph: &Graph, shape: &Shape, replica: &str) -> Option<String> {
    Some(format!(
        "SELECT g.k FROM ({}) g",
        held(graph, shape, &replica_and_cohorts(replica))?
    ))
}

/// `EXISTS`: the replica `replica` (an SQL expression of its id), or the
/// cohort it is a member of, holds the row of `shape` keyed `key` (a JSON
/// array) by its rule alone at its position: what [`held`] reads, looked up
/// by the key, for one row. `None` for a table whose rows no rule of their
/// own gives. A replica waiting for a snapshot or streaming one holds
/// nothing by its rule: its record is being written.
pub(crate) fn holds_key(graph: &Graph, shape: &Shape, replica: &str, key: &str) -> Option<String> {
    if !readable(shape) {
        return None;
    }
    let now = rule(shape.table, "a", "h")?;
    let then = rule(shape.table, "p", "h")?;
    let t = literal(shape.table.name);
    Some(format!(
        "EXISTS (
             WITH h AS ({holders}),
             n AS ({pending}),
             g AS (
                 SELECT h.r FROM {rel} a CROSS JOIN h
                 WHERE {keyed} AND {now} AND NOT EXISTS (SELECT 1 FROM n)
                 UNION ALL
                 SELECT h.r FROM n CROSS JOIN LATERAL {before} CROSS JOIN h
                 WHERE n.known AND n.was AND {then})
             SELECT 1 FROM g
             WHERE NOT {whole}
               AND {not_held_back})",
        not_held_back = not_held_back(&t, key, "g.r"),
        pending = pending_among(
            graph,
            shape,
            &format!("n.table_name = {t} AND n.key = {key}")
        ),
        holders = replica_and_cohorts(replica),
        whole = recorded_whole(&t),
        rel = shape.relation,
        keyed = key_match("a", shape, key),
        before = before_row(graph, shape, "n.before", "p"),
    ))
}

/// The holders kept up (`r`) that hold the row of `shape` keyed `key` (an
/// SQL expression of a JSON array, which may name an outer query's
/// column) by their rule alone at their position: given it, with no record
/// row of it, and nothing holding it back from them. What the sums of the
/// rows held by the rule alone (`sync.left_to_rule`) count of the key.
/// `None` for a table whose rows no rule of their own gives.
fn holders_of_key(graph: &Graph, shape: &Shape, key: &str) -> Option<String> {
    if !readable(shape) {
        return None;
    }
    let now = rule(shape.table, "a", "h")?;
    let then = rule(shape.table, "p", "h")?;
    let t = literal(shape.table.name);
    let pending = pending_among(
        graph,
        shape,
        &format!("n.table_name = {t} AND n.key = {key}"),
    );
    Some(format!(
        "SELECT g.r FROM (
             SELECT h.r FROM {rel} a CROSS JOIN ({HOLDERS}) h
             WHERE {keyed} AND {now} AND NOT EXISTS (SELECT 1 FROM ({pending}) n)
             UNION ALL
             SELECT h.r FROM ({pending}) n CROSS JOIN LATERAL {before} CROSS JOIN ({HOLDERS}) h
             WHERE n.known AND n.was AND {then}) g
         WHERE NOT {whole}
           AND NOT EXISTS (SELECT 1 FROM sync.held x
                           WHERE x.table_name = {t} AND x.key = ({key})::text AND x.replica = g.r)
           AND {not_held_back}",
        not_held_back = not_held_back(&t, key, "g.r"),
        whole = recorded_whole(&t),
        rel = shape.relation,
        keyed = key_match("a", shape, key),
        before = before_row(graph, shape, "n.before", "p"),
    ))
}

/// The statements that move the sums of the rows held by the rule alone
/// (`sync.left_to_rule`) by `sign` (`1` or `-1`) for each holder
/// [`holders_of_key`] names of each row `rows` lists, as `(t, k, r)`
/// (`k` a JSON array; `r` one holder, or NULL for every holder): to run
/// before a row is set aside or blocked (`-1`: the reading no longer
/// counts it), or after it is let go (`1`: it does again). Empty when no
/// table's rule reads its rows' columns.
pub(crate) fn moved_with(graph: &Graph, rows: &str, sign: i32) -> String {
    let mut sql = String::new();
    for shape in &graph.shapes {
        let Some(holders) = holders_of_key(graph, shape, "mv.k") else {
            continue;
        };
        let t = literal(shape.table.name);
        sql.push_str(&super::held::left_to_rule(&format!(
            "SELECT y.r, {t}, {sign} * count(*) FROM (
                 SELECT DISTINCT g.r, mv.k FROM ({rows}) mv (t, k, r)
                 CROSS JOIN LATERAL ({holders}) g
                 WHERE mv.t = {t} AND (mv.r IS NULL OR mv.r = g.r)) y
             GROUP BY 1"
        )));
    }
    sql
}

/// For a pass's closing, after its notes are done (the view then reads
/// every row as it is now): the sums of the rows held by the rule alone
/// made again, from the reading, for each holder and table the pass put a
/// key in question for, sent or took back, whose notes could not say what
/// it was (a key two
/// rows shared under a deferrable key). Whether such a holder held the key
/// before is what nothing says, so its moves cannot be summed; the
/// reading after the pass can. Such keys are rare, and only their holders'
/// rows of their tables are read. Empty when the pass read no such key.
pub(crate) fn recounted_where_not_known(
    graph: &Graph,
    filled: &crate::store::plan::scratch::Filled,
) -> String {
    use crate::store::plan::scratch::Scratch;
    if !filled.any_not_known() {
        return String::new();
    }
    let planned: Vec<&str> = [Scratch::Questioned, Scratch::Send, Scratch::Delete]
        .into_iter()
        .filter(|s| filled.has(*s))
        .map(|s| s.name())
        .collect();
    if planned.is_empty() {
        return String::new();
    }
    let planned: Vec<String> = planned
        .iter()
        .map(|t| format!("SELECT r, t, k FROM {t}"))
        .collect();
    let pairs = format!(
        "SELECT DISTINCT q.r, q.t FROM ({}) q
         JOIN _ms_before b ON b.t = q.t AND b.k = q.k AND NOT b.known",
        planned.join(" UNION ALL ")
    );
    let mut sql = String::new();
    for shape in &graph.shapes {
        let t = literal(shape.table.name);
        let Some(held) = held(
            graph,
            shape,
            &format!(
                "SELECT * FROM ({HOLDERS}) h0
                 WHERE h0.r IN (SELECT p.r FROM ({pairs}) p WHERE p.t = {t})"
            ),
        ) else {
            continue;
        };
        sql.push_str(&format!(
            "WITH p AS (SELECT p.r FROM ({pairs}) p WHERE p.t = {t}),
             c AS (SELECT g.r, count(*) AS n FROM ({held}) g
                   WHERE NOT EXISTS (SELECT 1 FROM sync.held x WHERE x.replica = g.r
                                     AND x.table_name = {t} AND x.key = g.k::text)
                   GROUP BY 1)
             INSERT INTO sync.left_to_rule AS l (replica, table_name, rows)
             SELECT p.r, {t}, coalesce(c.n, 0) FROM p LEFT JOIN c ON c.r = p.r
             ON CONFLICT (replica, table_name) DO UPDATE SET rows = excluded.rows;"
        ));
    }
    sql
}

/// `AND`-able SQL: the row of the plan's table aliased `a` (`r`, `t`, `k`)
/// without a record row would be counted by the sums of the rows held by
/// the rule alone: of a table a rule reads, with nothing holding it back
/// from `a.r` (the reading's exclusions but the notes). A row held back has
/// no holder by the rule; the sums moved when it was held back.
pub(crate) fn counted(graph: &Graph, a: &str) -> Option<String> {
    let readable = readable_tables(graph);
    (!readable.is_empty()).then(|| {
        format!(
            "{a}.t IN ({tables}) AND {not_held_back} AND NOT {whole}",
            tables = readable.join(", "),
            not_held_back = not_held_back(&format!("{a}.t"), &format!("{a}.k"), &format!("{a}.r")),
            whole = recorded_whole(&format!("{a}.t")),
        )
    })
}

/// That the row of the table `t` keyed `k` (a JSON array) is not held back
/// from the holder `r` (SQL expressions), as SQL: not set aside, not
/// blocked for it, not kept for it while its snapshot streamed, and not
/// read by its record alone. No rule says a holder holds a row held back.
fn not_held_back(t: &str, k: &str, r: &str) -> String {
    format!(
        "NOT EXISTS (SELECT 1 FROM sync.quarantine hb_q
                     WHERE hb_q.table_name = {t} AND hb_q.key = ({k})::text)
         AND NOT EXISTS (SELECT 1 FROM sync.blocked hb_b
                         WHERE hb_b.replica = {r} AND hb_b.table_name = {t}
                           AND hb_b.key = ({k})::text)
         AND NOT EXISTS (SELECT 1 FROM sync.deferred hb_d
                         WHERE hb_d.replica = {r} AND hb_d.table_name = {t} AND hb_d.key = {k})
         AND NOT {out}",
        out = ruled_out(t, k),
    )
}

/// The keys `holder` (a replica or a cohort) holds of `table` by its own
/// record and, with the rows a rule gives left to it ([`Ruled::ByRule`]),
/// by its rule at its position, as JSON arrays, each once. Not a member's
/// cohort's rows: those are the cohort's.
pub(crate) async fn holds(
    client: &Client,
    graph: &Graph,
    ruled: Ruled,
    holder: &str,
    table: &str,
) -> Result<Vec<serde_json::Value>> {
    let recorded = "SELECT key::jsonb FROM sync.held WHERE replica = $1 AND table_name = $2";
    let by_rule = match ruled {
        Ruled::Recorded => None,
        Ruled::ByRule => graph
            .shapes
            .iter()
            .find(|s| s.table.name == table)
            .and_then(|shape| {
                held(
                    graph,
                    shape,
                    "SELECT id AS r, partition_id AS part,
                            CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = id)
                                 THEN 'own' ELSE 'full' END AS kind
                     FROM sync.replicas WHERE id = $1
                     UNION ALL
                     SELECT id, NULL, kind FROM sync.cohorts WHERE id = $1",
                )
            }),
    };
    let sql = match by_rule {
        None => recorded.to_string(),
        Some(held) => format!("{recorded} UNION SELECT k FROM ({held}) g"),
    };
    Ok(client
        .query(&sql, &[&holder, &table])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Checks, for every holder kept up and every table whose rows its rule
/// can give by their columns, that the rows the record says it holds by
/// its rule are the rows [`given`] reads at its position, pointing at the
/// same parents. Rows held back (set aside or blocked), rows a snapshot
/// saw notes of (`sync.deferred`), rows with a parked note and rows with a
/// note of an earlier build are left out: each is recorded apart, and
/// decision 176 keeps recording them. So is a table a deployment is still
/// planning again: its keys past the deployment's cursor are held by its
/// old rule. With the record of such rows thinned ([`Ruled::ByRule`]), a
/// row the rule gives with no record row is what is expected, and only the
/// record rows there are checked. Returns one line per disagreement.
pub(crate) async fn audit(client: &Client, graph: &Graph, ruled: Ruled) -> Result<Vec<String>> {
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
               AND NOT {out}
               AND NOT EXISTS (SELECT 1 FROM n WHERE n.key = coalesce(g.k, rec.k) AND NOT n.known)
               AND NOT EXISTS (SELECT 1 FROM sync.deployment x
                               WHERE x.table_name = {t} AND x.done_at IS NULL AND x.work <> 'resend')
               AND NOT {whole}
             ORDER BY 1, 2",
            whole = recorded_whole(&literal(shape.table.name)),
            out = ruled_out(&literal(shape.table.name), "coalesce(g.k, rec.k)"),
            t = literal(shape.table.name),
            pending = pending(graph, shape),
        );
        for row in client.query(&sql, &[]).await? {
            let (r, k, given, recorded): (String, String, bool, bool) =
                (row.get(0), row.get(1), row.get(2), row.get(3));
            let table = shape.table.name;
            problems.push(match (given, recorded) {
                (true, false) if ruled == Ruled::ByRule => continue,
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

/// A rule a table was declared with, as `sync.tables.definition` keeps it
/// (`all`, `replica(c)`, `partition(c)`), when it reads the row's own
/// columns: what a deployment that changes it records before it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OldRule {
    All,
    Replica(String),
    Partition(String),
}

impl OldRule {
    /// The rule `text` names (`magic_sync_core::schema`'s words), if it
    /// reads the row's own columns.
    pub(crate) fn parse(text: &str) -> Option<OldRule> {
        let column = |prefix: &str| {
            text.strip_prefix(prefix)
                .and_then(|rest| rest.strip_suffix(')'))
                .map(str::to_string)
        };
        match text {
            "all" => Some(OldRule::All),
            _ => column("replica(")
                .map(OldRule::Replica)
                .or_else(|| column("partition(").map(OldRule::Partition)),
        }
    }

    /// The column it reads, if any.
    pub(crate) fn column(&self) -> Option<&str> {
        match self {
            OldRule::All => None,
            OldRule::Replica(c) | OldRule::Partition(c) => Some(c),
        }
    }

    /// Whether the holder `h` (`r`, `part`, `kind`) is given the row whose
    /// rule column, as text, is `value`; as [`crate::graph::rule_for`]
    /// guards a holder's kind.
    fn gives(&self, value: &str, h: &str) -> String {
        match self {
            OldRule::All => format!("{h}.kind <> 'own'"),
            OldRule::Replica(_) => format!("({h}.kind <> 'all' AND {value} = {h}.r)"),
            OldRule::Partition(_) => format!("({h}.kind <> 'all' AND {value} = {h}.part)"),
        }
    }
}

/// What [`record_whole`] came to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Whole {
    /// What the old rule gave each holder kept up is recorded: this many
    /// rows written.
    Recorded(u64),
    /// The old rule cannot be read at every holder's position (its column
    /// is gone, or a pending key's notes cannot say what it was): every
    /// replica is provisioned again instead, these.
    ProvisionedAgain(Vec<String>),
}

/// Before the rule of `shape`'s table changes from `old`, with the record
/// of the rows a rule gives thinned: records for every holder kept up the
/// rows `old` gives it at its position (the row as it is, or as its first
/// pending note says it was), and marks the table recorded whole
/// (`sync.recorded_whole`), so that no relay thins it or reads it by a
/// rule until the deployment of the table is done; the deployment then
/// plans it against a whole record, as it always did. `old_type` is the
/// type the old rule's column is read as, `None` when the table no longer
/// has it. Snapshots under way begin again (they may have thinned by the
/// old rule unseen). Serialises with the passes (`sync.replicas` locked),
/// in the caller's transaction, which the notes must be read in whole: the
/// table locked against writes, or its triggers noting the old rule's
/// column still.
pub(crate) async fn record_whole(
    tx: &impl tokio_postgres::GenericClient,
    graph: &Graph,
    shape: &Shape,
    old: &OldRule,
    old_type: Option<&str>,
) -> Result<Whole> {
    let t = literal(shape.table.name);
    tx.batch_execute(&format!(
        "LOCK TABLE sync.replicas IN SHARE ROW EXCLUSIVE MODE;
         INSERT INTO sync.recorded_whole (table_name) VALUES ({t}) ON CONFLICT DO NOTHING;
         -- Every row its holders hold by the rule is recorded below, or
         -- they are provisioned again.
         DELETE FROM sync.left_to_rule WHERE table_name = {t};"
    ))
    .await?;
    super::snapshots::orphaned(tx).await?;
    let mut columns = before_columns(graph, shape);
    let (now, then) = match (old.column(), old_type) {
        (None, _) => ("NULL::text".to_string(), "NULL::text".to_string()),
        (Some(c), Some(ty)) => {
            columns.retain(|(x, _)| x != c);
            columns.push((c.to_string(), ty.to_string()));
            (
                format!("a.{}::text", ident(c)),
                format!("p.{}::text", ident(c)),
            )
        }
        (Some(_), None) => {
            return Ok(Whole::ProvisionedAgain(
                super::replicas::provision_again(tx, None).await?,
            ))
        }
    };
    let pending = pending(graph, shape);
    // A note written once the old rule's column was no longer noted cannot
    // say what the row was to the old rule.
    let lacks = match old.column() {
        Some(c) => format!(" OR (n.was AND NOT n.before ? {})", literal(c)),
        None => String::new(),
    };
    let unknown: bool = tx
        .query_one(
            &format!("SELECT EXISTS (SELECT 1 FROM ({pending}) n WHERE NOT n.known{lacks})"),
            &[],
        )
        .await?
        .get(0);
    if unknown {
        return Ok(Whole::ProvisionedAgain(
            super::replicas::provision_again(tx, None).await?,
        ));
    }
    let written = tx
        .execute(
            &format!(
                "WITH h AS ({HOLDERS}), n AS ({pending}),
                 x AS (
                     SELECT {key_now} AS k, {ptrs_now} AS ptrs, {now} AS v FROM {rel} a
                     WHERE NOT EXISTS (SELECT 1 FROM n WHERE n.key = {key_now})
                     UNION ALL
                     SELECT n.key, {ptrs_then}, {then}
                     FROM n CROSS JOIN LATERAL {before}
                     WHERE n.was)
                 INSERT INTO sync.held (replica, table_name, key, version, message, ruled, ptrs, refs)
                 SELECT h.r, {t}, x.k::text, 0, 0, true, x.ptrs, 0
                 FROM x JOIN h ON {gives}
                 WHERE NOT EXISTS (SELECT 1 FROM sync.quarantine q
                                   WHERE q.table_name = {t} AND q.key = x.k::text)
                   AND NOT EXISTS (SELECT 1 FROM sync.blocked b
                                   WHERE b.replica = h.r AND b.table_name = {t} AND b.key = x.k::text)
                   AND NOT EXISTS (SELECT 1 FROM sync.deferred d
                                   WHERE d.replica = h.r AND d.table_name = {t} AND d.key = x.k)
                   AND NOT {out}
                 ON CONFLICT (table_name, key, replica) DO NOTHING",
                out = ruled_out(&t, "x.k"),
                key_now = key_json("a", shape.table),
                ptrs_now = graph.pointers("a", shape.table.name),
                ptrs_then = graph.pointers("p", shape.table.name),
                rel = shape.relation,
                before = record_of(&columns, "n.before", "p"),
                gives = old.gives("x.v", "h"),
            ),
            &[],
        )
        .await?;
    Ok(Whole::Recorded(written))
}

/// The tables recorded whole for now (`sync.recorded_whole`).
pub(crate) async fn marked_whole(
    client: &impl tokio_postgres::GenericClient,
) -> Result<std::collections::BTreeSet<String>> {
    Ok(client
        .query("SELECT table_name FROM sync.recorded_whole", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Lets the tables no unfinished deployment plans again be read by their
/// rule again: their record was whole while their rule changed.
pub(crate) const NO_LONGER_WHOLE: &str = "DELETE FROM sync.recorded_whole w
     WHERE NOT EXISTS (SELECT 1 FROM sync.deployment d
                       WHERE d.table_name = w.table_name AND d.done_at IS NULL
                         AND d.work <> 'resend');";

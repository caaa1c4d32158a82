//! The record of what each replica holds (`sync.held`), and why: per row,
//! the newest note the recording pass saw of it, the message that carried
//! it, whether its table's own rule sends it to the replica (`ruled`), what
//! the version it holds points at (`ptrs`, by link), and how many rows the
//! replica holds point at it (`refs`).
//!
//! The planner reads the record to plan a change around its own rows; a
//! pass writes it, in its closing batch, from what the plan sends and takes
//! back. `refs` moves with every row sent or taken back: each sent row adds
//! one to each parent it points at now and takes one from each parent its
//! previous version pointed at; each row taken back takes one from each
//! parent it pointed at. A replica provisioned from scratch has its counts
//! made from its whole set.

use crate::error::Result;
use crate::graph::Graph;
use crate::sql::{int8_array, literal, text_array};
use crate::store::plan::scratch::{Filled, Scratch};
use crate::store::plan::Batch;
use crate::store::plan::{HASH_ONLY, JOINS_AS_THEY_WERE, LOOPS_AS_THEY_WERE, LOOPS_ONLY};
use std::collections::HashMap;
use tokio_postgres::Client;

/// The statements recording what each replica holds after the plan: rows
/// taken back are no longer held; rows sent are held at the version the plan
/// saw, for the reasons it saw, carried by the replica's last message of the
/// pass (`last`); the parents of both have their counts moved. A statement
/// over a planner table this pass left empty is left out.
///
/// A snapshot's rows go in by hashing (`HASH_ONLY`). Every other join
/// with `sync.held` goes through its key, row by row from the planner's
/// side, whatever PostgreSQL's statistics of either say: hash and merge
/// joins are off for those statements.
pub(crate) fn closing(
    graph: &Graph,
    last: &HashMap<String, i64>,
    filled: &Filled,
    ruled: Ruled,
) -> Batch {
    let has = |table: Scratch| filled.has(table);
    let mut batch = Batch::default();
    // Each replica written to, with its last message of the pass.
    let messages = (!last.is_empty()).then(|| {
        let (ids, numbers): (Vec<&str>, Vec<i64>) =
            last.iter().map(|(r, n)| (r.as_str(), *n)).unzip();
        last_messages(ids, numbers)
    });
    if let (true, Some(messages)) = (has(Scratch::Fresh), &messages) {
        batch.push(provisioned(graph, messages, ruled));
    }
    if !has(Scratch::Delete) && !has(Scratch::Send) {
        return batch;
    }
    // The last messages in a table of their own, for the statements below
    // to read them with the same text every pass.
    let messages = messages.map(|m| {
        batch.push(format!(
            "INSERT INTO {} (r, number) SELECT * FROM {m};",
            Scratch::Last
        ));
        format!("{} m", Scratch::Last)
    });
    batch.push(LOOPS_ONLY);
    let moves = moves(graph, has(Scratch::Send), has(Scratch::Delete));
    if ruled == Ruled::ByRule {
        batch.keep(carried_by_snapshot(moves.as_deref()));
        if let (true, Some(_), Some(stays)) = (has(Scratch::Send), &messages, stays_by_rule(graph))
        {
            // Asked once, before the record moves, for the three
            // statements below that tell these rows apart.
            batch.keep(format!("UPDATE _ms_send s SET stays = true WHERE {stays}"));
        }
        batch.keep(recorded_or_taken_back(graph, filled, messages.is_some()));
    }
    if has(Scratch::Delete) {
        batch.keep(
            "DELETE FROM sync.held h USING _ms_del d
             WHERE h.table_name = d.t AND h.key = d.k::text AND h.replica = d.r",
        );
        // Which upload of the replica's a row's own columns were last taken
        // from matters only while it holds the row: taken back, it may edit
        // it no more, and an upload of the row once it holds it again is
        // newer than any before. Without this, `sync.filed` grew by every
        // row a replica ever edited.
        let owning: Vec<String> = graph
            .shapes
            .iter()
            .filter(|s| !s.table.owned.is_empty())
            .map(|s| crate::sql::literal(s.table.name))
            .collect();
        if !owning.is_empty() {
            let tables = owning.join(", ");
            batch.keep(format!(
                "DELETE FROM sync.filed f USING _ms_del d
                 WHERE d.t IN ({tables}) AND f.table_name = d.t AND f.key = d.k::text AND f.replica = d.r
                   AND NOT (EXISTS (SELECT 1 FROM _ms_r o WHERE o.r = d.r AND o.kind = 'own')
                            AND {cohort_keeps})",
                cohort_keeps = keeps(&literal(crate::store::cohorts::ALL)),
            ));
            batch.keep(format!(
                "DELETE FROM sync.filed f USING _ms_del d, _ms_r o
                 WHERE d.r = {all} AND o.kind = 'own' AND d.t IN ({tables})
                   AND f.table_name = d.t AND f.key = d.k::text AND f.replica = o.r
                   AND NOT {member_keeps}",
                all = literal(crate::store::cohorts::ALL),
                member_keeps = keeps("o.r"),
            ));
        }
    }
    if let (true, Some(messages)) = (has(Scratch::Send), &messages) {
        for statement in sent(messages, ruled) {
            batch.keep(statement);
        }
        if ruled == Ruled::ByRule {
            batch.keep(sent_by_rule(graph, filled, messages));
        }
    }
    if let Some(moves) = &moves {
        batch.keep(moved_refs(moves));
        if ruled == Ruled::ByRule {
            batch.keep(pointed_at_by_rule(graph, moves, messages.as_deref()));
        }
    }
    if ruled == Ruled::ByRule {
        batch.keep(arrived_elsewhere(has(Scratch::Delete), moves.as_deref()));
        batch.keep(said_by_rule(graph, has(Scratch::Send), moves.as_deref()));
    }
    batch.push(LOOPS_AS_THEY_WERE);
    batch
}

/// With the rows a rule gives left to it, before the record moves: each
/// row the pass sends again, takes back or counts a row pointing at, that
/// its holder holds by its rule alone from a snapshot it has not
/// acknowledged, is known to be on its way in that snapshot's last
/// message (`sync.let_go`), as one let go of is: the snapshot counted
/// it there ([`provisioned_left_to_rule`]) with no row of its own. So is
/// a cohort's row it holds so, at message 0, where its provisioning
/// counted it (no message carries a cohort's provisioning). The
/// statements below then move it from that count as they move any row
/// let go of on its way. Without this, a row of a snapshot sent again
/// before the replica acknowledged the snapshot was counted on its way
/// in both messages.
fn carried_by_snapshot(moves: Option<&str>) -> String {
    // Each branch is read only when some holder the pass wrote to has
    // such rows (`p`, as a rule empty): a pass of many rows to replicas
    // kept up reads nothing more than the holders it wrote to.
    let mut rows = vec![
        "SELECT s.r, s.t, s.k, p.at FROM _ms_send s JOIN p ON p.id = s.r WHERE s.held".to_string(),
        "SELECT d.r, d.t, d.k, p.at FROM _ms_del d JOIN p ON p.id = d.r".to_string(),
    ];
    if let Some(moves) = moves {
        // A parent the pass sends is known by `_ms_send` alone: held
        // before or not.
        rows.push(format!(
            "SELECT a.r, a.t, a.k, p.at FROM ({moves}) a JOIN p ON p.id = a.r
             WHERE a.n > 0 AND NOT EXISTS (SELECT 1 FROM _ms_send s
                                           WHERE s.r = a.r AND s.t = a.t AND s.k = a.k)"
        ));
    }
    // The holders the pass wrote to with a snapshot on its way (as a rule
    // none; each looked up by its id, not every replica read), and the
    // cohorts among them, whose provisioning no message carries (counted
    // at 0).
    format!(
        "WITH w AS (SELECT r FROM _ms_send UNION SELECT r FROM _ms_del),
         p AS MATERIALIZED (
             SELECT p.id, p.snapshot_last AS at FROM w
             CROSS JOIN LATERAL (SELECT p.id, p.snapshot_last FROM sync.replicas p
                                 WHERE p.id = w.r OFFSET 0) p
             WHERE p.snapshot_last > {acked}
             UNION ALL
             SELECT id, 0 FROM sync.cohorts WHERE id IN (SELECT r FROM w))
         INSERT INTO sync.let_go (replica, table_name, key, message)
         SELECT x.r, x.t, x.k::text, x.at FROM ({}) x
         WHERE EXISTS (SELECT 1 FROM p)
           AND NOT EXISTS (SELECT 1 FROM sync.held h
                           WHERE h.table_name = x.t AND h.key = x.k::text AND h.replica = x.r)
         ON CONFLICT (replica, table_name, key) DO NOTHING",
        rows.join(" UNION "),
        acked = acked("p.id"),
    )
}

/// The condition under which the record row `h` says only what its
/// holder's rule says, and may go: ruled, nothing counted pointing at it,
/// of a table whose rule reads its rows' own columns, and its row neither
/// held back, kept for a snapshot, parked, nor in a table an unfinished
/// deployment plans again (its keys past the cursor are held by the old
/// rule). `None` when no table's rule reads its rows' own columns.
fn only_the_rule(graph: &Graph) -> Option<String> {
    left_to_the_rule(graph, "h.replica", "h.table_name", "h.key")
        .map(|left| format!("h.ruled AND h.refs = 0 AND {left}"))
}

/// The condition under which the row `t`, `k` (`k` its key as text) of
/// holder `r` may be held by its rule alone: of a table whose rule reads
/// its rows' own columns, and its row neither held back, kept for a
/// snapshot, parked, nor in a table an unfinished deployment plans again.
/// `None` when no table's rule reads its rows' own columns.
fn left_to_the_rule(graph: &Graph, r: &str, t: &str, k: &str) -> Option<String> {
    let readable = crate::store::by_rule::readable_tables(graph);
    // The lookups are asked in one scalar subquery, per row let go: as
    // anti-joins beside the statement's own, they cost the planner a
    // millisecond a statement to order, more than the rows they read.
    (!readable.is_empty()).then(|| {
        format!(
            "{t} IN ({}) AND (SELECT
             NOT EXISTS (SELECT 1 FROM sync.deferred x
                             WHERE x.replica = {r} AND x.table_name = {t}
                               AND x.key = ({k})::jsonb)
             AND NOT EXISTS (SELECT 1 FROM sync.blocked x
                             WHERE x.table_name = {t} AND x.key = {k})
             AND NOT EXISTS (SELECT 1 FROM sync.quarantine x
                             WHERE x.table_name = {t} AND x.key = {k})
             AND NOT EXISTS (SELECT 1 FROM sync.parked x
                             WHERE x.table_name = {t} AND x.key = ({k})::jsonb)
             AND NOT {out}
             AND NOT EXISTS (SELECT 1 FROM sync.deployment x
                             WHERE x.table_name = {t} AND x.done_at IS NULL
                               AND x.work <> 'resend')
             AND NOT EXISTS (SELECT 1 FROM sync.recorded_whole x
                             WHERE x.table_name = {t}))",
            readable.join(", "),
            out = crate::store::by_rule::ruled_out(t, &format!("({k})::jsonb")),
        )
    })
}

/// With the rows a rule gives left to it: the row `s` of `_ms_send` goes
/// to a holder that holds it, and goes on holding it, by its rule alone:
/// ruled, with no record row, and left to the rule (see
/// [`left_to_the_rule`]); not a cohort's (whose rows stay recorded until
/// no message carries them). Such a row is written nowhere in the record
/// ([`sent_by_rule`]); were rows to come to point at it in the same pass,
/// it gets its record row as any row held by its rule alone does
/// ([`pointed_at_by_rule`]). Each lookup is a scalar subquery, asked by
/// the record's key: as an anti-join, the record was scanned once per row
/// sent (measured: 47 ms for 50 rows). Asked once a pass, before the
/// record moves, into `_ms_send.stays`, which the closing's statements
/// read: asked in each of three, it made a one-row pass cost a fifth more.
fn stays_by_rule(graph: &Graph) -> Option<String> {
    left_to_the_rule(graph, "s.r", "s.t", "s.k::text").map(|left| {
        format!(
            "(s.ruled AND {left}
              AND (SELECT NOT EXISTS (SELECT 1 FROM sync.held x
                                      WHERE x.table_name = s.t AND x.key = s.k::text
                                        AND x.replica = s.r))
              AND s.r NOT IN (SELECT id FROM sync.cohorts))"
        )
    })
}

/// With the rows a rule gives left to it: the rows sent that stay held by
/// their rule alone ([`stays_by_rule`]). Written as the record would have
/// had them inserted and then let go again, with none of those writes:
/// the message that carries each is kept (`sync.let_go`, its count moved
/// from the message that carried it before, if any, to this one), and the
/// holder's sum of such rows gains the rows it did not hold before (nor
/// had let go of holding back this pass: those the sums count already).
fn sent_by_rule(graph: &Graph, filled: &Filled, messages: &str) -> String {
    if stays_by_rule(graph).is_none() {
        return String::new();
    }
    let [emptied, fewer] = carried_less("before");
    format!(
        "WITH d AS MATERIALIZED (
             SELECT s.r, s.t, s.k::text AS k, m.number,
                    NOT s.held AND NOT {released} AS new,
                    m.number > {acked} AS on_its_way
             FROM _ms_send s JOIN {messages} ON m.r = s.r
             WHERE s.stays),
         before AS (
             SELECT l.replica, l.message, l.table_name, count(*) AS n
             FROM d JOIN sync.let_go l
               ON l.replica = d.r AND l.table_name = d.t AND l.key = d.k AND l.message <> d.number
             GROUP BY 1, 2, 3),
         emptied AS ({emptied}),
         fewer AS ({fewer}),
         arrived AS (
             DELETE FROM sync.let_go l USING d
             WHERE NOT d.on_its_way AND l.replica = d.r AND l.table_name = d.t AND l.key = d.k),
         moving AS (
             INSERT INTO sync.let_go AS l (replica, table_name, key, message)
             SELECT r, t, k, number FROM d WHERE on_its_way
             ON CONFLICT (replica, table_name, key) DO UPDATE SET message = excluded.message),
         ruled AS ({})
         INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
         SELECT r, number, t, count(*) FROM d WHERE on_its_way GROUP BY 1, 2, 3
         ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows",
        left_to_rule_values("SELECT r, t, count(*) FILTER (WHERE new) FROM d GROUP BY 1, 2"),
        released = released(filled, "s"),
        acked = acked("s.r"),
    )
}

/// With the rows a rule gives left to it ([`Ruled::ByRule`]): the record
/// rows of the rows the pass sent, and of the parents whose counts it
/// moved, that say only what their holder's rule says, deleted. The pass
/// planned every note its view holds, so none is pending for them at its
/// position: the rule on the row as it is says what they said.
fn said_by_rule(graph: &Graph, sends: bool, moves: Option<&str>) -> String {
    let Some(only) = only_the_rule(graph) else {
        return String::new();
    };
    // The rows sent and the parents whose counts fell, in one statement.
    let mut rows = Vec::new();
    if sends {
        rows.push("SELECT r, t, k FROM _ms_send".to_string());
    }
    if let Some(moves) = moves {
        rows.push(format!("SELECT r, t, k FROM ({moves}) a WHERE n < 0"));
    }
    if rows.is_empty() {
        return String::new();
    }
    // Each row let go is held by its rule alone from then on. One on its
    // way (its message not acknowledged) still counts there, and which
    // message that is stays known until it arrives (`sync.let_go`): sent
    // again or taken back meanwhile, it moves from that count, as a record
    // row would. A cohort's rows are let go only once no message carries
    // them: its members acknowledge its messages each for itself.
    format!(
        "WITH gone AS (
             DELETE FROM sync.held h USING ({}) x
             WHERE h.table_name = x.t AND h.key = x.k::text AND h.replica = x.r AND {only}
               AND (h.message = 0 OR h.replica NOT IN (SELECT id FROM sync.cohorts))
             RETURNING h.replica, h.table_name, h.key, h.message,
                       h.message > {acked} AS on_its_way),
         ruled AS ({}),
         moving AS (
             INSERT INTO sync.let_go AS l (replica, table_name, key, message)
             SELECT replica, table_name, key, message FROM gone WHERE on_its_way
             ON CONFLICT (replica, table_name, key) DO UPDATE SET message = excluded.message)
         INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
         SELECT replica, message, table_name, count(*) FROM gone WHERE on_its_way GROUP BY 1, 2, 3
         ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows;",
        rows.join(" UNION "),
        left_to_rule_values("SELECT replica, table_name, count(*) FROM gone GROUP BY 1, 2"),
        acked = acked("h.replica"),
    )
}

/// The number `r` (an SQL expression naming a holder) acknowledged, or 0.
fn acked(r: &str) -> String {
    format!("coalesce((SELECT a.number FROM sync.acks a WHERE a.replica = {r}), 0)")
}

/// The two statements that take `by.n` rows off the count of what message
/// `by.message` of holder `by.replica` carried of `by.table_name`: the
/// count deleted when that is all of it, lessened otherwise.
fn carried_less(by: &str) -> [String; 2] {
    let same = format!(
        "c.replica = {by}.replica AND c.message = {by}.message AND c.table_name = {by}.table_name"
    );
    [
        format!("DELETE FROM sync.held_carried c USING {by} WHERE {same} AND c.rows <= {by}.n"),
        format!(
            "UPDATE sync.held_carried c SET rows = c.rows - {by}.n FROM {by} WHERE {same} AND c.rows > {by}.n"
        ),
    ]
}

/// `EXISTS`: the row of the plan's table aliased `a` (`r`, `t`, `k`) was
/// set aside or held back from its holder until this pass let it go
/// (`_ms_released`).
fn released(filled: &Filled, a: &str) -> String {
    match filled.has(Scratch::Released) {
        true => format!(
            "EXISTS (SELECT 1 FROM _ms_released x
                     WHERE x.t = {a}.t AND x.k = {a}.k AND (x.r IS NULL OR x.r = {a}.r))"
        ),
        false => "false".into(),
    }
}

/// A row let go while its message was on its way (`sync.let_go`) that has
/// a record row again (sent again, or pointed at), or that the pass took
/// back (`takes_back`: `_ms_del` filled): the message it was let go from no
/// longer carries it, and its count there loses it, as a record row's
/// would (a record row counts it where it is now). Only rows the pass
/// sent, took back or counted a row pointing at can be such rows: those
/// are looked up in `sync.let_go`, each by its key, and then in the
/// record.
fn arrived_elsewhere(takes_back: bool, moves: Option<&str>) -> String {
    let [emptied, fewer] = carried_less("m");
    // Only the rows the pass touched can have come to a record row, or
    // been taken back, in it: their `sync.let_go` rows are looked up by
    // key. Read whole, `sync.let_go` (every row let go on its way, kept
    // until the figures forget it) cost a TPC-B pass 39 ms.
    let mut touched = vec!["SELECT r, t, k FROM _ms_send".to_string()];
    let taken = match takes_back {
        true => {
            touched.push("SELECT r, t, k FROM _ms_del".into());
            " OR EXISTS (SELECT 1 FROM _ms_del d
                         WHERE d.r = x.replica AND d.t = x.table_name AND d.k::text = x.key)"
        }
        false => "",
    };
    if let Some(moves) = moves {
        touched.push(format!("SELECT r, t, k FROM ({moves}) a WHERE n > 0"));
    }
    format!(
        "WITH c AS MATERIALIZED (SELECT DISTINCT r, t, k::text AS k FROM ({}) c),
         l AS (
             DELETE FROM sync.let_go x USING c
             WHERE x.replica = c.r AND x.table_name = c.t AND x.key = c.k
               AND (EXISTS (SELECT 1 FROM sync.held h WHERE h.table_name = x.table_name
                            AND h.key = x.key AND h.replica = x.replica){taken})
             RETURNING x.replica, x.message, x.table_name),
         m AS (SELECT replica, message, table_name, count(*) AS n FROM l GROUP BY 1, 2, 3),
         gone AS ({emptied})
         {fewer};",
        touched.join(" UNION ALL ")
    )
}

/// With the rows a rule gives left to it, before the record takes in the
/// plan: the sums of the rows held by the rule alone lose each row the
/// plan takes back (`_ms_del`) or sends (`_ms_send`, only when a message
/// is written: `sends`) that the holder held with no record row, unless
/// something held it back (a row set aside is taken back from the holders
/// its rule gives it to, who may not have it). A row sent counts so when
/// the plan held it, or when this pass let go of holding it back, as the
/// sums count it from then on whatever the plan says it held. Empty when
/// neither table was filled, or no table's rule reads its rows' columns.
fn recorded_or_taken_back(graph: &Graph, filled: &Filled, sends: bool) -> String {
    let mut parts = Vec::new();
    if filled.has(Scratch::Delete) {
        if let Some(counted) = crate::store::by_rule::counted(graph, "d") {
            parts.push(format!(
                "SELECT d.r, d.t FROM _ms_del d
                 WHERE NOT EXISTS (SELECT 1 FROM sync.held x
                                   WHERE x.table_name = d.t AND x.key = d.k::text AND x.replica = d.r)
                   AND {counted}"
            ));
        }
    }
    if filled.has(Scratch::Send) && sends {
        if let Some(counted) = crate::store::by_rule::counted(graph, "s") {
            parts.push(format!(
                "SELECT s.r, s.t FROM _ms_send s
                 WHERE (s.held OR (s.ruled AND {released}))
                   AND NOT EXISTS (SELECT 1 FROM sync.held x
                                   WHERE x.table_name = s.t AND x.key = s.k::text
                                     AND x.replica = s.r)
                   AND {counted} AND NOT s.stays",
                released = released(filled, "s"),
            ));
        }
    }
    if parts.is_empty() {
        return String::new();
    }
    left_to_rule(&format!(
        "SELECT r, t, -count(*) FROM ({}) a GROUP BY 1, 2",
        parts.join(" UNION ALL ")
    ))
}

/// Moves the sums of the rows each holder holds by its rule alone
/// (`sync.left_to_rule`) by `moves`, a query of `(holder, table, n)`.
pub(crate) fn left_to_rule(moves: &str) -> String {
    format!("{};", left_to_rule_values(moves))
}

/// [`left_to_rule`] without its closing semicolon, for a `WITH` clause.
fn left_to_rule_values(moves: &str) -> String {
    format!(
        "INSERT INTO sync.left_to_rule AS l (replica, table_name, rows)
         SELECT * FROM ({moves}) m (replica, table_name, n) WHERE n <> 0
         ON CONFLICT (replica, table_name) DO UPDATE SET rows = l.rows + excluded.rows"
    )
}

/// With the rows a rule gives left to it ([`Ruled::ByRule`]), after a
/// provisioning from scratch (`_ms_f`) recorded its rows: how many of each
/// holder's set of each table it left to the rule, from the set and the
/// holder's record, which held nothing before. They are summed
/// (`sync.left_to_rule`) and counted as carried by the holder's last
/// message of the provisioning (`messages`, see [`last_messages`]), as a
/// recorded row is.
pub(crate) fn provisioned_left_to_rule(messages: &str) -> String {
    format!(
        "WITH f AS (SELECT r, t, count(*) AS n FROM _ms_f GROUP BY 1, 2),
         h AS (SELECT replica AS r, table_name AS t, count(*) AS n FROM sync.held
               WHERE replica IN (SELECT DISTINCT r FROM f) GROUP BY 1, 2),
         x AS MATERIALIZED (SELECT f.r, f.t, f.n - coalesce(h.n, 0) AS n
                            FROM f LEFT JOIN h ON h.r = f.r AND h.t = f.t
                            WHERE f.n > coalesce(h.n, 0)),
         ruled AS ({})
         INSERT INTO sync.held_carried AS c (replica, message, table_name, rows)
         SELECT x.r, m.number, x.t, x.n FROM x JOIN {messages} ON m.r = x.r
         ON CONFLICT (replica, message, table_name) DO UPDATE SET rows = c.rows + excluded.rows;",
        left_to_rule_values("SELECT r, t, n FROM x")
    )
}

/// With the rows a rule gives left to it ([`Ruled::ByRule`]): a parent
/// held by its rule alone that rows now point at gets its record row, to
/// count them (`refs`), pointing at what it points at now (the pass
/// planned every note its view holds, so the holder has it as it is).
fn pointed_at_by_rule(graph: &Graph, moves: &str, messages: Option<&str>) -> String {
    // One statement over every such table: planned and counted once.
    let mut parts = Vec::new();
    for shape in graph
        .shapes
        .iter()
        .filter(|s| crate::store::by_rule::readable(s))
        .filter(|s| graph.tracked().any(|l| l.parent.name == s.table.name))
    {
        // A row let go on its way is still in the message it was let go
        // from.
        let message = match messages {
            Some(messages) => format!(
                "coalesce((SELECT l.message FROM sync.let_go l
                           WHERE l.replica = x.r AND l.table_name = x.t AND l.key = x.k::text),
                          (SELECT m.number FROM {messages} WHERE m.r = x.r), 0)"
            ),
            None => "coalesce((SELECT l.message FROM sync.let_go l
                               WHERE l.replica = x.r AND l.table_name = x.t AND l.key = x.k::text), 0)"
                .into(),
        };
        parts.push(format!(
            "SELECT x.r, x.t, x.k::text, 0, {message}, true, {ptrs}, x.n
             FROM (SELECT r, t, k, sum(n)::int AS n FROM moved
                   WHERE t = {t} GROUP BY r, t, k HAVING sum(n) > 0) x
             CROSS JOIN LATERAL (SELECT * FROM {rel} p WHERE {key} OFFSET 0) p
             WHERE NOT EXISTS (SELECT 1 FROM sync.held h
                               WHERE h.table_name = x.t AND h.key = x.k::text AND h.replica = x.r)",
            ptrs = graph.pointers("p", shape.table.name),
            t = literal(shape.table.name),
            rel = shape.relation,
            key = crate::graph::key_match("p", shape, "x.k"),
        ));
    }
    if parts.is_empty() {
        return String::new();
    }
    // Each recorded was held by its rule alone.
    format!(
        "WITH moved AS MATERIALIZED ({moves}),
         recorded AS (
             INSERT INTO sync.held (replica, table_name, key, version, message, ruled, ptrs, refs)
             {}
             ON CONFLICT DO NOTHING
             RETURNING replica, table_name)
         {};",
        parts.join(" UNION ALL "),
        left_to_rule_values("SELECT replica, table_name, -count(*) FROM recorded GROUP BY 1, 2")
    )
}

/// Whether the record keeps a row for each row its holder's own rule gives
/// it (`Settings::record_ruled_rows`, decision 176).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ruled {
    /// Every row held has a record row.
    Recorded,
    /// A provisioning records no row that says only what the holder's rule
    /// says: a row its rule gives (round 0), of a table whose rule reads
    /// the row's own columns (`all`, `replica`, `partition`), that no row
    /// of its set points at through a tracked link (`refs` 0), with no
    /// note in the provisioning's view and none kept for its holder since
    /// (`sync.deferred`). Such a row is held as the host had it at the
    /// holder's position, which the pending notes say (`store::by_rule`).
    ByRule,
}

impl Ruled {
    /// As the settings say.
    pub(crate) fn of(settings: &crate::relay::Settings) -> Ruled {
        if settings.record_ruled_rows {
            Ruled::Recorded
        } else {
            Ruled::ByRule
        }
    }

    /// The form the record is in (`sync.record_form`), which whoever reads
    /// the record beside the relay (filing, the operator's reads) reads it
    /// by: [`Ruled::ByRule`] once a relay was told to leave rows to their
    /// rule, until one records every row again.
    pub(crate) async fn stored(client: &impl tokio_postgres::GenericClient) -> Result<Ruled> {
        let row = client
            .query_opt("SELECT by_rule FROM sync.record_form", &[])
            .await?;
        Ok(match row.is_some_and(|r| r.get(0)) {
            true => Ruled::ByRule,
            false => Ruled::Recorded,
        })
    }
}

/// What [`settle_form`] settled: the form to record in now, and the
/// replicas it provisioned again.
#[derive(Debug)]
pub(crate) struct Settled {
    /// The form the relay records in until it settles again: the form
    /// wanted, or [`Ruled::Recorded`] while leaving rows to their rule
    /// waits for the notes of the build before to be planned.
    pub ruled: Ruled,
    /// The replicas provisioned again.
    pub again: Vec<String>,
}

/// Brings the record to the form `wanted`, in the transaction `tx`, before
/// a relay's pass. Leaving rows to their rule needs nothing but the mark (a
/// whole record is a thinned one that has not shed its rows yet), once a
/// reading by rule can read every pending note: none written by an earlier
/// build's note functions (with no kind, `sync.notes.op`), pending or
/// parked, and every transaction in progress when this build's functions
/// replaced those (`sync.record_form.replaced`) ended. Until then every row
/// is recorded, and the relay settles again at its next pass. The other
/// way, the rows left to their rule have no record row a relay recording
/// every row would question, so every replica is provisioned again, and
/// the cohort made again, from a record written whole.
pub(crate) async fn settle_form(
    tx: &tokio_postgres::Transaction<'_>,
    wanted: Ruled,
) -> Result<Settled> {
    let row = tx
        .query_one(
            &format!(
                "SELECT by_rule,
                    NOT EXISTS (SELECT 1 FROM sync.notes WHERE op IS NULL)
                    AND NOT EXISTS (SELECT 1 FROM sync.parked WHERE op IS NULL)
                    AND (replaced IS NULL
                         OR NOT EXISTS (SELECT 1 FROM pg_snapshot_xip(replaced) x
                                        WHERE pg_xact_status(x) = 'in progress'
                                          AND NOT EXISTS ({ELSEWHERE})))
             FROM sync.record_form FOR UPDATE"
            ),
            &[],
        )
        .await?;
    let (stored, readable): (bool, bool) = (row.get(0), row.get(1));
    let settled = |ruled| Settled {
        ruled,
        again: Vec::new(),
    };
    let again = match (stored, wanted) {
        (true, Ruled::Recorded) => super::replicas::provision_again(tx, None).await?,
        (false, Ruled::Recorded) | (true, Ruled::ByRule) => return Ok(settled(wanted)),
        (false, Ruled::ByRule) if !readable => return Ok(settled(Ruled::Recorded)),
        (false, Ruled::ByRule) => Vec::new(),
    };
    tx.execute(
        "UPDATE sync.record_form SET by_rule = $1, replaced = NULL",
        &[&(wanted == Ruled::ByRule)],
    )
    .await?;
    Ok(Settled {
        ruled: wanted,
        again,
    })
}

/// `EXISTS`: the transaction `x` (an `xid8`) is one a session of another
/// database runs, as far as this session may see: its notes go elsewhere.
/// (A session this role may not see is not ruled out.)
const ELSEWHERE: &str = "SELECT 1 FROM pg_stat_activity a
     WHERE a.backend_xid::text = (x::text::numeric % 4294967296)::text
       AND a.datname IS DISTINCT FROM current_database()";

/// Marks this build's note functions as having replaced an earlier
/// build's now (see [`settle_form`]): the transactions in progress may
/// still commit notes those wrote.
pub(crate) async fn note_functions_replaced(
    client: &impl tokio_postgres::GenericClient,
) -> Result<()> {
    client
        .execute(
            "UPDATE sync.record_form SET replaced = pg_current_snapshot()",
            &[],
        )
        .await?;
    Ok(())
}

/// Whether holder `h` holds the row `d` of `_ms_del` once the pass's
/// take-backs are recorded: still recorded holding it (a member and its
/// cohort may both hold a row), or sent it.
fn keeps(h: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM sync.held x
                  WHERE x.table_name = d.t AND x.key = d.k::text AND x.replica = {h})
          OR EXISTS (SELECT 1 FROM _ms_send x WHERE x.r = {h} AND x.t = d.t AND x.k = d.k))"
    )
}

/// Each replica written to and its last message, as a relation `m (r,
/// number)`.
fn last_messages<'a>(
    ids: impl IntoIterator<Item = &'a str>,
    numbers: impl IntoIterator<Item = i64>,
) -> String {
    format!(
        "unnest({}, {}) AS m (r, number)",
        text_array(ids),
        int8_array(numbers)
    )
}

/// A replica provisioned from scratch held nothing: its rows (`_ms_f`) go
/// in plainly, each with how many of its rows point at it. In bulk, so
/// hashed.
fn provisioned(graph: &Graph, messages: &str, ruled: Ruled) -> String {
    let left = match ruled {
        Ruled::ByRule => provisioned_left_to_rule(messages),
        Ruled::Recorded => String::new(),
    };
    format!(
        "{HASH_ONLY}
         INSERT INTO sync.held (replica, table_name, key, version, message, ruled, ptrs, refs)
         {};
         {left}
         {JOINS_AS_THEY_WERE}",
        provisioned_rows(graph, messages, ruled)
    )
}

/// The rows a replica provisioned from scratch holds, in `sync.held`'s
/// columns (from `replica` to `refs`): every row of its set, or, by rule,
/// those that say more than its rule (see [`Ruled::ByRule`]).
fn provisioned_rows(graph: &Graph, messages: &str, ruled: Ruled) -> String {
    let refs = match graph.tracked_values() {
        Some(links) => format!(
            "LEFT JOIN (SELECT f.r, l.p AS t, f.ptrs -> l.name AS k, count(*)::int AS n
                        FROM _ms_f f JOIN {links} ON l.c = f.t
                        WHERE f.ptrs ? l.name GROUP BY 1, 2, 3) c
               ON c.r = f.r AND c.t = f.t AND c.k = f.k"
        ),
        None => "LEFT JOIN (SELECT NULL::text AS r, 0 AS n) c ON false".into(),
    };
    let readable = crate::store::by_rule::readable_tables(graph);
    let said_by_rule = match ruled {
        Ruled::ByRule if !readable.is_empty() => format!(
            "WHERE NOT (f.round = 0 AND f.t IN ({readable}) AND coalesce(c.n, 0) = 0
                        AND ch.last_seq IS NULL
                        AND NOT EXISTS (SELECT 1 FROM sync.deferred d
                                        WHERE d.replica = f.r AND d.table_name = f.t
                                          AND d.key = f.k)
                        AND NOT EXISTS (SELECT 1 FROM pending p
                                        WHERE p.table_name = f.t AND p.key = f.k)
                        AND NOT EXISTS (SELECT 1 FROM sync.parked x
                                        WHERE x.table_name = f.t AND x.key = f.k)
                        AND NOT {out}
                        AND NOT EXISTS (SELECT 1 FROM sync.deployment x
                                        WHERE x.table_name = f.t AND x.done_at IS NULL
                                          AND x.work <> 'resend')
                        AND NOT EXISTS (SELECT 1 FROM sync.recorded_whole x
                                        WHERE x.table_name = f.t))",
            readable = readable.join(", "),
            out = crate::store::by_rule::ruled_out("f.t", "f.k"),
        ),
        _ => String::new(),
    };
    // The notes pending now, in the statement's view, beside the changes
    // kept for the holder: a pass that began while the snapshot streamed
    // and keeps a change for it either committed (its `sync.deferred` row
    // is seen) or did not (its notes are still seen), whichever this
    // statement's view says, so a row it kept a change of is recorded. The
    // notes have no index: read once, hashed.
    let pending = match said_by_rule.is_empty() {
        true => String::new(),
        false => "WITH pending AS MATERIALIZED (SELECT DISTINCT table_name, key FROM sync.notes)"
            .to_string(),
    };
    format!(
        "{pending}
         SELECT f.r AS replica, f.t AS table_name, f.k::text AS key,
                coalesce(ch.last_seq, 0) AS version, m.number AS message, f.round = 0 AS ruled,
                f.ptrs, coalesce(c.n, 0) AS refs
         FROM _ms_f f JOIN {messages} ON m.r = f.r
         LEFT JOIN _ms_changed ch ON ch.t = f.t AND ch.k = f.k
         {refs}
         {said_by_rule}"
    )
}

/// A snapshot's record made ready to go into `sync.held` a chunk at a
/// time, so that a snapshot that yields to the passes can wait between
/// chunks: the rows of `replica`, whose snapshot ended with message
/// `last`, in a table of the transaction's own (`_ms_held`, dropped at its
/// end), in `sync.held`'s columns.
pub(crate) struct Staged {
    /// Rows staged.
    pub rows: u64,
    /// Pages they fill.
    pub pages: u64,
}

impl Staged {
    /// Stages the record (see [`Staged`]).
    pub(crate) async fn stage(
        tx: &tokio_postgres::Transaction<'_>,
        graph: &Graph,
        replica: &str,
        last: i64,
        ruled: Ruled,
    ) -> Result<Staged> {
        let messages = last_messages([replica], [last]);
        tx.batch_execute(HASH_ONLY).await?;
        let rows = tx
            .execute(
                &format!(
                    "CREATE TEMP TABLE _ms_held ON COMMIT DROP AS {}",
                    provisioned_rows(graph, &messages, ruled)
                ),
                &[],
            )
            .await?;
        tx.batch_execute(JOINS_AS_THEY_WERE).await?;
        let pages: i64 = tx
            .query_one(
                "SELECT pg_relation_size('_ms_held') / current_setting('block_size')::bigint",
                &[],
            )
            .await?
            .get(0);
        Ok(Staged {
            rows,
            pages: pages.max(0) as u64,
        })
    }

    /// With the rows a rule gives left to it, once every staged row is
    /// recorded: what the snapshot of `replica`, ended by message `last`,
    /// left to the rule (see [`provisioned_left_to_rule`]).
    pub(crate) async fn left_to_rule(
        tx: &tokio_postgres::Transaction<'_>,
        replica: &str,
        last: i64,
        ruled: Ruled,
    ) -> Result<()> {
        if ruled == Ruled::ByRule {
            let messages = last_messages([replica], [last]);
            tx.batch_execute(&provisioned_left_to_rule(&messages))
                .await?;
        }
        Ok(())
    }

    /// Records the staged rows on pages `from..to` as held (read by their
    /// place: each page once, whichever chunk it falls in).
    pub(crate) async fn record(
        tx: &tokio_postgres::Transaction<'_>,
        from: u64,
        to: u64,
    ) -> Result<u64> {
        let rows = tx
            .execute(
                &format!(
                    "INSERT INTO sync.held (replica, table_name, key, version, message, ruled, ptrs, refs)
                     SELECT * FROM _ms_held WHERE ctid >= '({from},0)'::tid AND ctid < '({to},0)'::tid"
                ),
                &[],
            )
            .await?;
        Ok(rows)
    }
}

/// Rows sent (`_ms_send`) the replica held already: a new version, in
/// place; then the rows it lacked, and, with the rows a rule gives left to
/// it ([`Ruled::ByRule`]), the rows it held by its rule alone (those that
/// still say only what the rule says are deleted again by
/// [`said_by_rule`]).
fn sent(messages: &str, ruled: Ruled) -> [String; 2] {
    let lacked = match ruled {
        Ruled::Recorded => "NOT s.held".to_string(),
        Ruled::ByRule => "(NOT s.held OR NOT EXISTS (SELECT 1 FROM sync.held x
                                        WHERE x.table_name = s.t AND x.key = s.k::text
                                          AND x.replica = s.r))
             AND NOT s.stays"
            .to_string(),
    };
    [
        format!(
            "UPDATE sync.held h SET version = s.version, message = m.number, ruled = s.ruled, ptrs = s.ptrs
             FROM _ms_send s JOIN {messages} ON m.r = s.r
             WHERE s.held AND h.table_name = s.t AND h.key = s.k::text AND h.replica = s.r"
        ),
        format!(
            "INSERT INTO sync.held (replica, table_name, key, version, message, ruled, ptrs)
         SELECT s.r, s.t, s.k::text, s.version, m.number, s.ruled, s.ptrs
         FROM _ms_send s JOIN {messages} ON m.r = s.r
         WHERE {lacked}
         ON CONFLICT (replica, table_name, key)
         DO UPDATE SET version = EXCLUDED.version, message = EXCLUDED.message,
                       ruled = EXCLUDED.ruled, ptrs = EXCLUDED.ptrs"
        ),
    ]
}

/// The moves of the counts of what points at each parent, as rows (`r`,
/// `t`, `k`, `n`), by the rows sent (to what they point at now, from what
/// the held version pointed at) and the rows let go of; `None` with no
/// tracked link or nothing sent or let go of.
fn moves(graph: &Graph, sends: bool, deletes: bool) -> Option<String> {
    let links = graph.tracked_values()?;
    let mut moves = Vec::new();
    if sends {
        moves.push(format!(
            "SELECT s.r, l.p AS t, s.ptrs -> l.name AS k, 1 AS n
             FROM _ms_send s JOIN {links} ON l.c = s.t WHERE s.ptrs ? l.name
             UNION ALL
             SELECT s.r, l.p, s.hptrs -> l.name, -1
             FROM _ms_send s JOIN {links} ON l.c = s.t WHERE s.held AND s.hptrs ? l.name"
        ));
    }
    if deletes {
        moves.push(format!(
            "SELECT d.r, l.p AS t, d.hptrs -> l.name AS k, -1 AS n
             FROM _ms_del d JOIN {links} ON l.c = d.t WHERE d.hptrs ? l.name"
        ));
    }
    (!moves.is_empty()).then(|| moves.join(" UNION ALL "))
}

/// The counts of what points at each parent, moved by [`moves`].
fn moved_refs(moves: &str) -> String {
    format!(
        "UPDATE sync.held h SET refs = h.refs + x.n
         FROM (SELECT r, t, k, sum(n)::int AS n FROM ({moves}) a
               GROUP BY r, t, k HAVING sum(n) <> 0) x
         WHERE h.table_name = x.t AND h.key = x.k::text AND h.replica = x.r;"
    )
}

/// With the rows a rule gives left to it ([`Ruled::ByRule`]), keeps for
/// `holder` (an SQL expression), as a pass keeps a change for a replica
/// whose snapshot streams (`sync.deferred`), each key of a table a rule
/// reads with notes pending that a provisioning from a view of its own saw
/// (`seen`, a condition on the note `n`), at the newest such note. A
/// reading by rule puts a holder before every pending note, which for such
/// a holder is before its view: a row the view saw deleted, or moved away
/// from it, would read as held, be taken back and counted out of its
/// parents once more. With the key kept, the record alone says what it
/// holds until the next pass plans those notes and lets the keys go. `None`
/// with every row recorded, or no such table.
pub(crate) fn kept_as_seen(
    graph: &Graph,
    holder: &str,
    seen: &str,
    ruled: Ruled,
) -> Option<String> {
    let readable = crate::store::by_rule::readable_tables(graph);
    if ruled == Ruled::Recorded || readable.is_empty() {
        return None;
    }
    Some(format!(
        "INSERT INTO sync.deferred (replica, table_name, key, seq, xid)
         SELECT DISTINCT ON (n.table_name, n.key) {holder}, n.table_name, n.key, n.seq, n.xid
         FROM sync.notes n
         WHERE n.format = 1 AND n.table_name IN ({readable}) AND {seen}
         ORDER BY n.table_name, n.key, n.seq DESC
         ON CONFLICT (replica, table_name, key) DO UPDATE
         SET seq = EXCLUDED.seq, xid = EXCLUDED.xid
         WHERE sync.deferred.seq < EXCLUDED.seq;",
        readable = readable.join(", ")
    ))
}

/// The statements that close a pass's notes: every note it planned is
/// done; for each replica whose snapshot streams (`streaming`), the rows
/// they changed are kept, at the newest note and its transaction
/// (`sync.deferred`), since the snapshot may not see them; the changes kept
/// for replicas this pass planned are done too; with the rows a rule gives
/// left to it, keys ruled out while a note of theirs was parked are read by
/// their rule again once it is planned. A statement over a planner table
/// this pass left empty is left out.
pub(crate) fn kept_and_done(streaming: &[String], filled: &Filled, ruled: Ruled) -> String {
    let has = |table: Scratch| filled.has(table);
    let mut sql = String::new();
    if has(Scratch::Notes) {
        if !streaming.is_empty() {
            sql.push_str(&format!(
                "INSERT INTO sync.deferred (replica, table_name, key, seq, xid)
                 SELECT DISTINCT ON (s.id, n.t, n.k) s.id, n.t, n.k, n.seq, n.xid
                 FROM _ms_notes n CROSS JOIN unnest({}) AS s (id)
                 ORDER BY s.id, n.t, n.k, n.seq DESC
                 ON CONFLICT (replica, table_name, key) DO UPDATE
                 SET seq = EXCLUDED.seq, xid = EXCLUDED.xid
                 WHERE sync.deferred.seq < EXCLUDED.seq;",
                text_array(streaming.iter().map(String::as_str))
            ));
        }
        sql.push_str("DELETE FROM sync.notes WHERE ctid = ANY (ARRAY (SELECT at FROM _ms_notes));");
        // A key read by its record alone while a note of it was parked is
        // read by its rule again once its notes are planned and none is
        // parked. The keys are few: read from their side. (A relay
        // recording every row reads no key by its rule.)
        if ruled == Ruled::ByRule {
            sql.push_str(
                "DELETE FROM sync.ruled_out o
             WHERE EXISTS (SELECT 1 FROM _ms_notes n WHERE n.t = o.table_name AND n.k = o.key)
               AND NOT EXISTS (SELECT 1 FROM sync.parked p
                               WHERE p.table_name = o.table_name AND p.key = o.key);",
            );
        }
    }
    if has(Scratch::Deferred) {
        sql.push_str(
            "DELETE FROM sync.deferred WHERE ctid = ANY (ARRAY (SELECT at FROM _ms_deferred));",
        );
    }
    sql
}

/// Checks the record against itself and the database: every row a live
/// replica or a cohort is recorded holding exists, is recorded as its rule sends it or
/// not, as pointing at what it points at now, and with as many rows of the
/// replica pointing at it as do. Returns one line per disagreement.
///
/// It reads the whole record, so it is for tests and for an operator in
/// doubt, not for every pass; and it is exact only when no note is pending
/// (a pending note is a change the record has not caught up with yet).
pub(crate) async fn audit(client: &Client, graph: &Graph, ruled: Ruled) -> Result<Vec<String>> {
    let mut problems = Vec::new();
    if let Some(links) = graph.tracked_values() {
        // The rows held: recorded, and, where the record leaves them to
        // the rule, those the holders' rules give them.
        let mut held = vec!["SELECT replica, table_name, ptrs FROM sync.held".to_string()];
        if ruled == Ruled::ByRule {
            for shape in &graph.shapes {
                let t = literal(shape.table.name);
                if let Some(by_rule) =
                    crate::store::by_rule::held(graph, shape, crate::store::by_rule::HOLDERS)
                {
                    held.push(format!(
                        "SELECT g.r, {t}, g.ptrs FROM ({by_rule}) g
                         WHERE NOT EXISTS (SELECT 1 FROM sync.held x WHERE x.replica = g.r
                                           AND x.table_name = {t} AND x.key = g.k::text)"
                    ));
                }
            }
        }
        let sql = format!(
            "WITH pointing AS (
                 SELECT h.replica AS r, l.p AS t, (h.ptrs -> l.name)::text AS k, count(*) AS n
                 FROM ({held}) h (replica, table_name, ptrs) JOIN {links} ON l.c = h.table_name
                 WHERE h.ptrs ? l.name GROUP BY 1, 2, 3)
             SELECT coalesce(h.replica, p.r), coalesce(h.table_name, p.t),
                    coalesce(h.key, p.k), coalesce(h.refs, 0), coalesce(p.n, 0)
             FROM (SELECT * FROM sync.held WHERE refs <> 0) h
             FULL JOIN pointing p ON p.r = h.replica AND p.t = h.table_name AND p.k = h.key
             WHERE coalesce(h.refs, 0) <> coalesce(p.n, 0)
             ORDER BY 1, 2, 3",
            held = held.join(" UNION ALL ")
        );
        for row in client.query(&sql, &[]).await? {
            let (r, t, k, refs, n): (String, String, String, i32, i64) =
                (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
            problems.push(format!(
                "{r} holds {t} {k} with refs {refs}, but {n} of its held rows point at it"
            ));
        }
    }
    if ruled == Ruled::ByRule {
        problems.extend(audit_left_to_rule(client, graph).await?);
    }
    for shape in &graph.shapes {
        let t = literal(shape.table.name);
        let ruled = match crate::graph::rule(shape.table, "a", "r") {
            Some(cond) => format!("coalesce({cond}, false)"),
            None => "false".into(),
        };
        let sql = format!(
            "SELECT h.replica, h.key, a.{k0} IS NOT NULL, h.ruled, {ruled}, h.ptrs::text, {ptrs}::text
             FROM sync.held h
             JOIN (SELECT id AS r, partition_id AS part,
                          CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = id)
                               THEN 'own' ELSE 'full' END AS kind
                   FROM sync.replicas WHERE live
                   UNION ALL
                   SELECT id, NULL, kind FROM sync.cohorts) r ON r.r = h.replica
             LEFT JOIN {rel} a ON {m}
             WHERE h.table_name = {t}
               AND (a.{k0} IS NULL OR h.ruled <> {ruled} OR h.ptrs IS DISTINCT FROM {ptrs})
             ORDER BY 1, 2",
            k0 = crate::sql::ident(shape.table.key[0]),
            ptrs = graph.pointers("a", shape.table.name),
            rel = shape.relation,
            m = crate::graph::key_match("a", shape, "h.key::jsonb"),
        );
        for row in client.query(&sql, &[]).await? {
            let (r, k, exists): (String, String, bool) = (row.get(0), row.get(1), row.get(2));
            if !exists {
                problems.push(format!(
                    "{r} is recorded holding {} {k}, which the database does not have",
                    shape.table.name
                ));
                continue;
            }
            let (held_ruled, now_ruled): (bool, bool) = (row.get(3), row.get(4));
            if held_ruled != now_ruled {
                problems.push(format!(
                    "{r} holds {} {k} recorded as ruled {held_ruled}, but its rule says {now_ruled}",
                    shape.table.name
                ));
            }
            let (held_ptrs, now_ptrs): (Option<String>, Option<String>) = (row.get(5), row.get(6));
            if held_ptrs != now_ptrs {
                problems.push(format!(
                    "{r} holds {} {k} recorded pointing at {}, but it points at {}",
                    shape.table.name,
                    held_ptrs.as_deref().unwrap_or("nothing"),
                    now_ptrs.as_deref().unwrap_or("nothing")
                ));
            }
        }
    }
    Ok(problems)
}

/// Checks the sums of the rows each holder kept up holds by its rule alone
/// (`sync.left_to_rule`) against the rows its rule gives it at its position
/// that it has no record row of. A table recorded whole for now (a
/// deployment changing it) is left out: no rule says what its holders hold
/// until it is done.
async fn audit_left_to_rule(client: &Client, graph: &Graph) -> Result<Vec<String>> {
    use crate::store::by_rule;
    let mut problems = Vec::new();
    for shape in &graph.shapes {
        let t = literal(shape.table.name);
        let counted = match by_rule::held(graph, shape, by_rule::HOLDERS) {
            Some(held) => format!(
                "SELECT g.r, count(*) AS n FROM ({held}) g
                 WHERE NOT EXISTS (SELECT 1 FROM sync.held x WHERE x.replica = g.r
                                   AND x.table_name = {t} AND x.key = g.k::text)
                 GROUP BY 1"
            ),
            None => "SELECT NULL::text AS r, 0::int8 AS n WHERE false".into(),
        };
        let sql = format!(
            "SELECT coalesce(g.r, l.replica), coalesce(l.rows, 0), coalesce(g.n, 0)
             FROM ({counted}) g
             FULL JOIN (SELECT replica, rows FROM sync.left_to_rule
                        WHERE table_name = {t} AND rows <> 0
                          AND replica IN (SELECT r FROM ({holders}) h)) l ON l.replica = g.r
             WHERE coalesce(l.rows, 0) <> coalesce(g.n, 0) AND NOT {whole}
             ORDER BY 1",
            holders = by_rule::HOLDERS,
            whole = by_rule::recorded_whole(&t),
        );
        for row in client.query(&sql, &[]).await? {
            let (r, summed, given): (String, i64, i64) = (row.get(0), row.get(1), row.get(2));
            problems.push(format!(
                "{r} is summed holding {summed} rows of {} by its rule alone, but its rule gives it {given} it has no record row of",
                shape.table.name
            ));
        }
    }
    Ok(problems)
}

/// The keys `replica` holds of `table`, as JSON arrays: its own and its
/// cohort's when it is a member, by the record and, with `by_rule` (the
/// graph, while the record leaves the rows a rule gives to it), by the
/// rule at each one's position; each once.
pub(crate) async fn keys(
    tx: &tokio_postgres::Transaction<'_>,
    replica: &str,
    table: &str,
    by_rule: Option<&Graph>,
) -> Result<Vec<serde_json::Value>> {
    let recorded = "SELECT key::jsonb AS k FROM sync.held WHERE replica = $1 AND table_name = $2
         UNION ALL
         SELECT h.key::jsonb FROM sync.members m
         JOIN sync.held h ON h.replica = m.cohort AND h.table_name = $2
         WHERE m.replica = $1
           -- A row both hold, once.
           AND NOT EXISTS (SELECT 1 FROM sync.held o
                           WHERE o.table_name = $2 AND o.key = h.key AND o.replica = $1)";
    let ruled = by_rule.and_then(|graph| {
        let shape = graph.shapes.iter().find(|s| s.table.name == table)?;
        super::by_rule::keys_held(graph, shape, "$1")
    });
    let sql = match ruled {
        None => recorded.to_string(),
        // A row recorded and given by the rule, once.
        Some(ruled) => format!("{recorded} UNION {ruled}"),
    };
    Ok(tx
        .query(&sql, &[&replica, &table])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

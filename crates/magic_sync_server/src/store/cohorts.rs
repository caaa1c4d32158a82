//! The cohorts (`sync.cohorts`, how-it-works §20): rows many replicas hold
//! alike, recorded once. A cohort is a holder in `sync.held` under an id no
//! replica can have: it begins with a control character, which the relay
//! refuses in a replica's id.
//!
//! The first one is the cohort of the tables whose rule is `all`
//! ([`ALL`]), recorded while `Settings::record_by_rule` is on. It is made
//! between passes from one view of the database (`relay::cohort`), then
//! planned by every pass like a replica, its difference recorded at the
//! pass's last number. Replicas [`join`] it once a pass recorded what they
//! hold; each member is then sent what the cohort is, in its own messages,
//! and its own record holds its own rows alone.

use crate::error::Result;
use std::collections::BTreeSet;
use tokio_postgres::GenericClient;

/// The cohort of the tables whose rule is `all`, as a holder.
pub(crate) const ALL: &str = "\u{1}all";

/// Whether `holder` is a cohort's id rather than a replica's.
pub(crate) fn is_cohort(holder: &str) -> bool {
    holder.starts_with('\u{1}')
}

/// Whether the cohort [`ALL`] is recorded.
pub(crate) async fn exists(client: &impl GenericClient) -> Result<bool> {
    // Typed, so that it is parsed and run in the round trip of the pass's
    // other first reads (decision 137).
    let rows = client
        .query_typed(
            "SELECT EXISTS (SELECT 1 FROM sync.cohorts WHERE id = $1)",
            &[(&ALL, tokio_postgres::types::Type::TEXT)],
        )
        .await?;
    Ok(rows.first().is_some_and(|row| row.get(0)))
}

/// Clears what is recorded under [`ALL`] before it is made: nothing, unless
/// its row in `sync.cohorts` was deleted by hand.
pub(crate) async fn clear(client: &impl GenericClient) -> Result<()> {
    client
        .execute("DELETE FROM sync.held WHERE replica = $1", &[&ALL])
        .await?;
    client
        .execute("DELETE FROM sync.left_to_rule WHERE replica = $1", &[&ALL])
        .await?;
    client
        .execute("DELETE FROM sync.blocked WHERE replica = $1", &[&ALL])
        .await?;
    client
        .execute("DELETE FROM sync.deferred WHERE replica = $1", &[&ALL])
        .await?;
    Ok(())
}

/// Records the cohort [`ALL`] as made, in the transaction that recorded
/// its rows.
pub(crate) async fn record(client: &impl GenericClient) -> Result<()> {
    client
        .execute(
            "INSERT INTO sync.cohorts (id, kind) VALUES ($1, 'all')",
            &[&ALL],
        )
        .await?;
    Ok(())
}

/// Forgets the cohort [`ALL`], rows, blocks and all, when it holds a row of
/// `holding` (any table when `None`); the relay makes it again before its
/// next pass. Its members hold its rows again themselves first: each is
/// recorded holding every row the cohort holds, carried by the message the
/// cohort's was, or by the one it joined at when later, and held back
/// from what the cohort was, and with the keys kept for it since it was
/// made (`held::kept_as_seen`). A row a member held itself too is held once,
/// at the newer version; with `tables` given, the rows of the shared tables
/// then count every row of the member's pointing at them (without, they
/// count both holders' pointing rows, and their members are to be
/// provisioned again). Returns whether it was forgotten.
///
/// What makes a replica provisioned again makes the cohort again: a
/// changed key or encoding of a table it holds, triggers found missing, a
/// restore; its members, holding those rows again, are provisioned again
/// with the other holders.
pub(crate) async fn forget(
    client: &impl GenericClient,
    holding: Option<&str>,
    tables: Option<&Tables>,
) -> Result<bool> {
    let row = client
        .query_one(
            "WITH gone AS (
                 DELETE FROM sync.cohorts c WHERE c.id = $1
                   AND ($2::text IS NULL
                        OR EXISTS (SELECT 1 FROM sync.held h
                                   WHERE h.table_name = $2 AND h.replica = c.id))
                 RETURNING id),
             members AS (
                 SELECT m.replica, m.since FROM sync.members m
                 WHERE m.cohort IN (SELECT id FROM gone)),
             held_back AS (
                 INSERT INTO sync.held AS o
                        (replica, table_name, key, version, message, ruled, ptrs, refs)
                 SELECT m.replica, h.table_name, h.key, h.version, greatest(h.message, m.since),
                        h.ruled, h.ptrs, h.refs
                 FROM sync.held h CROSS JOIN members m
                 WHERE h.replica IN (SELECT id FROM gone)
                 ON CONFLICT (table_name, key, replica) DO UPDATE
                 SET version = greatest(o.version, excluded.version),
                     ptrs = CASE WHEN excluded.version > o.version THEN excluded.ptrs ELSE o.ptrs END,
                     message = greatest(o.message, excluded.message),
                     ruled = o.ruled OR excluded.ruled,
                     refs = o.refs + excluded.refs),
             blocked_back AS (
                 INSERT INTO sync.blocked (replica, table_name, key, root_table, root_key, settled)
                 SELECT m.replica, b.table_name, b.key, b.root_table, b.root_key, b.settled
                 FROM sync.blocked b CROSS JOIN members m
                 WHERE b.replica IN (SELECT id FROM gone)
                 ON CONFLICT DO NOTHING),
             deferred_back AS (
                 INSERT INTO sync.deferred AS o (replica, table_name, key, seq, xid)
                 SELECT m.replica, d.table_name, d.key, d.seq, d.xid
                 FROM sync.deferred d CROSS JOIN members m
                 WHERE d.replica IN (SELECT id FROM gone)
                 ON CONFLICT (replica, table_name, key) DO UPDATE
                 SET seq = excluded.seq, xid = excluded.xid WHERE o.seq < excluded.seq),
             -- What it held by its rule alone, each member holds so: less
             -- what a member's record holds of it (read before this
             -- statement's writes), counted there.
             left_back AS (
                 INSERT INTO sync.left_to_rule AS l (replica, table_name, rows)
                 SELECT m.replica, s.table_name,
                        s.rows - (SELECT count(*) FROM sync.held o
                                  WHERE o.replica = m.replica AND o.table_name = s.table_name
                                    AND NOT EXISTS (SELECT 1 FROM sync.held c
                                                    WHERE c.table_name = o.table_name
                                                      AND c.key = o.key AND c.replica = s.replica))
                 FROM sync.left_to_rule s CROSS JOIN members m
                 WHERE s.replica IN (SELECT id FROM gone)
                 ON CONFLICT (replica, table_name) DO UPDATE SET rows = l.rows + excluded.rows),
             left_gone AS (DELETE FROM sync.left_to_rule WHERE replica IN (SELECT id FROM gone)),
             held AS (DELETE FROM sync.held WHERE replica IN (SELECT id FROM gone)),
             blocked AS (DELETE FROM sync.blocked WHERE replica IN (SELECT id FROM gone)),
             deferred AS (DELETE FROM sync.deferred WHERE replica IN (SELECT id FROM gone))
             SELECT (SELECT count(*) FROM gone),
                    coalesce((SELECT array_agg(replica) FROM members), '{}')",
            &[&ALL, &holding],
        )
        .await?;
    let (forgotten, members): (i64, Vec<String>) = (row.get(0), row.get(1));
    if let Some(tables) = tables {
        recount(client, &members, tables).await?;
    }
    Ok(forgotten > 0)
}

/// Has the rows `replicas` hold of the shared tables count every row of
/// theirs pointing at them.
async fn recount(client: &impl GenericClient, replicas: &[String], tables: &Tables) -> Result<()> {
    let Some(links) = &tables.links else {
        return Ok(());
    };
    if replicas.is_empty() || tables.shared.is_empty() {
        return Ok(());
    }
    // What points at them: the members' record, and the rows they hold by
    // their rule alone.
    let pointing = match &tables.ruled_as_they_stand {
        Some(ruled) => format!(
            "(SELECT replica, table_name, ptrs FROM sync.held WHERE replica = ANY ($1)
              UNION ALL
              SELECT r, t, ptrs FROM ({}) g)",
            ruled.replace("$2", "$1")
        ),
        None => "sync.held".to_string(),
    };
    client
        .execute(
            &format!(
                "WITH p AS (
                     SELECT c.replica AS r, l.p AS t, (c.ptrs -> l.name)::text AS k,
                            count(*)::int AS n
                     FROM {pointing} c JOIN {links} ON l.c = c.table_name
                     WHERE c.replica = ANY ($1) AND l.p = ANY ($2) AND c.ptrs ? l.name
                     GROUP BY 1, 2, 3)
                 UPDATE sync.held h SET refs = x.n
                 FROM (SELECT h.replica, h.table_name, h.key, coalesce(p.n, 0) AS n
                       FROM sync.held h
                       LEFT JOIN p ON p.r = h.replica AND p.t = h.table_name AND p.k = h.key
                       WHERE h.replica = ANY ($1) AND h.table_name = ANY ($2)) x
                 WHERE h.replica = x.replica AND h.table_name = x.table_name
                   AND h.key = x.key AND h.refs <> x.n"
            ),
            &[&replicas, &tables.shared],
        )
        .await?;
    Ok(())
}

/// A plan's rows of `from` (`_ms_send` or `_ms_del`, under the alias `s`)
/// that `only` selects, as `(r, t, k)`: each of the cohort's given to
/// every member instead (`_ms_r`'s kind `own`), or with `alone` to every
/// member sent the pass in messages of its own (the others are sent the
/// cohort's messages, see [`alone`]).
///
/// With `shared` (rows of tables a member's own rows can reach too), a row
/// both hold is sent a member once, and taken back from it only when
/// neither holds it after the pass: the cohort's take-back not when the
/// member's own record keeps the row, the member's own not when the
/// cohort keeps it.
pub(crate) fn given_to_members(from: &str, only: &str, shared: bool, alone: bool) -> String {
    let all = crate::sql::literal(ALL);
    // Written once into the cohort's batches, its rows are its own too.
    let (alone, others) = match alone {
        true => (" AND o.alone", "true".to_string()),
        false => ("", format!("s.r <> {all}")),
    };
    // Whether holder `h` holds the row `s` after the pass: sent it, or
    // recorded holding it and not taken back.
    let holds_after = |h: &str| {
        format!(
            "(EXISTS (SELECT 1 FROM _ms_send x WHERE x.r = {h} AND x.t = s.t AND x.k = s.k)
              OR EXISTS (SELECT 1 FROM sync.held x
                         WHERE x.replica = {h} AND x.table_name = s.t AND x.key = s.k::text
                           AND NOT EXISTS (SELECT 1 FROM _ms_del e
                                           WHERE e.r = {h} AND e.t = s.t AND e.k = s.k)))"
        )
    };
    match (from, shared) {
        (_, false) => format!(
            "SELECT s.r, s.t, s.k FROM {from} s WHERE {only} AND {others}
             UNION ALL
             SELECT o.r, s.t, s.k FROM {from} s JOIN _ms_r o ON o.kind = 'own'{alone}
             WHERE {only} AND s.r = {all}"
        ),
        ("_ms_del", true) => format!(
            "SELECT s.r, s.t, s.k FROM _ms_del s WHERE {only} AND {others}
               AND NOT (EXISTS (SELECT 1 FROM _ms_r o WHERE o.r = s.r AND o.kind = 'own')
                        AND {cohort})
             UNION ALL
             SELECT o.r, s.t, s.k FROM _ms_del s JOIN _ms_r o ON o.kind = 'own'{alone}
             WHERE {only} AND s.r = {all} AND NOT {member}",
            cohort = holds_after(&all),
            member = holds_after("o.r"),
        ),
        (_, true) => format!(
            "SELECT s.r, s.t, s.k FROM {from} s WHERE {only} AND {others}
             UNION
             SELECT o.r, s.t, s.k FROM {from} s JOIN _ms_r o ON o.kind = 'own'{alone}
             WHERE {only} AND s.r = {all}"
        ),
    }
}

/// Marks in `_ms_r` the members of [`ALL`] that are sent the pass in
/// messages of their own (`alone`), and returns them: those with rows of
/// their own in the difference, and those holding themselves a row of a
/// `shared` table the cohort lets go of, which they keep. Every other
/// member is sent the cohort's messages of the pass, written once, with
/// nothing written for it.
pub(crate) async fn alone(client: &impl GenericClient, shared: &[&str]) -> Result<Vec<String>> {
    use tokio_postgres::types::Type;
    // Typed, so parsed and run in one round trip.
    Ok(client
        .query_typed(
            "WITH f AS (
                 SELECT r FROM _ms_send UNION SELECT r FROM _ms_del
                 UNION
                 SELECT x.replica FROM _ms_del d
                 JOIN sync.held x ON x.table_name = d.t AND x.key = d.k::text AND x.replica <> $1
                 WHERE d.r = $1 AND d.t = ANY ($2)),
             -- The list may stay from the last pass: its marks are undone.
             marked AS (
                 UPDATE _ms_r o SET alone = o.r IN (SELECT r FROM f)
                 WHERE o.kind = 'own' AND (o.alone OR o.r IN (SELECT r FROM f))
                 RETURNING o.r, o.alone)
             SELECT r FROM marked WHERE alone",
            &[(&ALL, Type::TEXT), (&shared, Type::TEXT_ARRAY)],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect())
}

/// The statement recording the messages of [`ALL`] a pass wrote (number,
/// own nonce, body hash; their bodies written), the last numbered
/// `pass_last`, as its newest: for the pass's closing batch.
pub(crate) fn batches_written(parts: &[(i64, Vec<u8>, Vec<u8>)], pass_last: i64) -> String {
    let values: Vec<String> = parts
        .iter()
        .map(|(number, nonce, hash)| {
            format!(
                "({number}::int8, {}, {})",
                crate::sql::bytea(nonce),
                crate::sql::bytea(hash)
            )
        })
        .collect();
    let (_, newest_nonce, _) = parts.last().expect("a pass wrote one");
    let all = crate::sql::literal(ALL);
    format!(
        "INSERT INTO sync.batches (cohort, number, pass_last, nonce, body)
         SELECT {all}, v.number, {pass_last}, v.nonce, b.id
         FROM (VALUES {}) AS v (number, nonce, hash) JOIN sync.bodies b ON b.hash = v.hash;
         UPDATE sync.cohorts SET newest = {pass_last}, newest_nonce = {} WHERE id = {all};",
        values.join(", "),
        crate::sql::bytea(newest_nonce)
    )
}

/// The cohorts' messages each member is owed, as a relation `(replica,
/// number, body)`: numbered past what it acknowledged and the message it
/// joined at, of a pass it was not sent in messages of its own. What its
/// outbox is to a replica, these are to a member, beside its outbox.
pub(crate) const OWED: &str = "SELECT m.replica, c.number, c.body
     FROM sync.members m
     LEFT JOIN sync.acks a ON a.replica = m.replica
     JOIN sync.batches c
       ON c.cohort = m.cohort AND c.number > greatest(m.since, coalesce(a.number, 0))
     WHERE NOT EXISTS (SELECT 1 FROM sync.outbox o
                       WHERE o.replica = m.replica AND o.number = c.pass_last)";

/// The number of the newest message of the chain of the replica whose
/// `sync.replicas` row is `r`: its own last, or its cohort's newest when
/// that is later and it joined before it.
pub(crate) fn head(r: &str) -> String {
    format!(
        "greatest({r}.last_number, (SELECT max(c.newest) FROM sync.members m
                                  JOIN sync.cohorts c ON c.id = m.cohort
                                  WHERE m.replica = {r}.id AND c.newest > m.since))"
    )
}

/// The cohorts' messages every member was sent, or joined after: each
/// cohort's messages up to the least, over its members kept up, of what
/// each acknowledged or joined at; every message of a cohort without such
/// a member. For a pass's closing batch.
pub(crate) const FORGET_SENT_BATCHES: &str = "WITH floor AS (
         SELECT c.id,
                coalesce(min(greatest(coalesce(a.number, 0), m.since))
                             FILTER (WHERE m.replica IS NOT NULL),
                         c.newest) AS floor
         FROM sync.cohorts c
         LEFT JOIN (sync.members m JOIN sync.replicas r
                    ON r.id = m.replica AND r.live AND NOT r.provision)
           ON m.cohort = c.id
         LEFT JOIN sync.acks a ON a.replica = m.replica
         WHERE EXISTS (SELECT 1 FROM sync.batches b WHERE b.cohort = c.id)
         GROUP BY c.id, c.newest),
     moved AS (UPDATE sync.cohorts c SET floor = f.floor FROM floor f
               WHERE c.id = f.id AND c.floor < f.floor)
     DELETE FROM sync.batches b USING floor f WHERE b.cohort = f.id AND b.number <= f.floor;";

/// The tables of the cohort [`ALL`], as joining it reads them.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tables {
    /// Those it holds rows of (`Graph::all_cohort_tables`).
    pub all: Vec<&'static str>,
    /// Those of them a member's own rows can reach too
    /// (`Graph::shared_cohort_tables`).
    pub shared: Vec<&'static str>,
    /// The tables outside it whose rows reach a shared one's
    /// (`Graph::reaching`).
    pub reaching: Vec<&'static str>,
    /// The tracked links (`Graph::tracked_values`).
    pub links: Option<String>,
    /// The rows of the `reaching` and `shared` tables the replicas `$2`
    /// (a text array) hold by their rule alone as members, with no record
    /// row (decision 176), as (`r`, `t`, `k` as text, `ptrs`): their own
    /// rows, not the cohort's. `None` when no such table's rule reads its
    /// rows' own columns.
    pub ruled: Option<String>,
    /// The rows of the tables pointing at a `shared` one through a tracked
    /// link the replicas `$2` hold by their rule alone, the same way, each
    /// replica as it stands: a member, or, once the cohort is forgotten,
    /// holding every rule itself. What [`recount`] counts beside the
    /// record.
    pub ruled_as_they_stand: Option<String>,
    /// Those of `all` whose rows the record leaves to their rule: whether
    /// each holder has a record row of one it holds by its rule says what
    /// points at it, not what it holds, and joining compares the rest.
    /// Empty while the record keeps every row.
    pub left_to_rule: Vec<&'static str>,
}

impl Tables {
    /// The tables of `graph`'s cohort, and, while the record leaves the
    /// rows a rule gives to it (`ruled`), how to read the rows its members
    /// hold by their rule alone.
    pub fn of(graph: &crate::graph::Graph, ruled: super::held::Ruled) -> Tables {
        let thinned = ruled == super::held::Ruled::ByRule;
        let shared = graph.shared_cohort_tables();
        let reaching = graph.reaching(&shared);
        // What points at a shared row: a child through a tracked link.
        let pointing: BTreeSet<&str> = graph
            .tracked()
            .filter(|l| shared.contains(l.parent.name))
            .map(|l| l.child.name)
            .collect();
        let ruled = |kind: &str, tables: &dyn Fn(&str) -> bool| {
            let holders = format!(
                "SELECT id AS r, partition_id AS part, {kind} AS kind
                 FROM sync.replicas WHERE id = ANY ($2)"
            );
            let parts: Vec<String> = graph
                .shapes
                .iter()
                .filter(|s| tables(s.table.name))
                .filter_map(|shape| {
                    let held = crate::store::by_rule::held(graph, shape, &holders)?;
                    let t = crate::sql::literal(shape.table.name);
                    Some(format!(
                        "SELECT g.r, {t}::text AS t, g.k::text AS k, g.ptrs FROM ({held}) g
                         WHERE NOT EXISTS (SELECT 1 FROM sync.held x
                                           WHERE x.table_name = {t} AND x.key = g.k::text
                                             AND x.replica = g.r)"
                    ))
                })
                .collect();
            (thinned && !parts.is_empty()).then(|| parts.join(" UNION ALL "))
        };
        let all = graph.all_cohort_tables();
        let left_to_rule = graph
            .shapes
            .iter()
            .filter(|s| thinned && all.contains(s.table.name))
            .filter(|s| crate::store::by_rule::readable(s))
            .map(|s| s.table.name)
            .collect();
        Tables {
            all: all.into_iter().collect(),
            left_to_rule,
            ruled: ruled("'own'", &|t| reaching.contains(t) || shared.contains(t)),
            ruled_as_they_stand: ruled(
                "CASE WHEN EXISTS (SELECT 1 FROM sync.members m WHERE m.replica = id)
                      THEN 'own' ELSE 'full' END",
                &|t| pointing.contains(t),
            ),
            reaching: reaching.into_iter().collect(),
            shared: shared.into_iter().collect(),
            links: graph.tracked_values(),
        }
    }
}

/// Makes those of `replicas` members of the cohort [`ALL`] whose record
/// holds what the cohort holds of its tables, and their own rows: rows of
/// those tables their own rows reach (a category a till's tab points at,
/// which the catalogue may hold too), found from the record as the
/// planner keeps them: ruled, pointed at, or following. Each forgets the
/// rest of its rows and blocks of those tables, the cohort's standing for
/// them; the rows it keeps count only its own rows pointing at them; and it
/// joins at the message its chain stands at. A replica holding back rows
/// of a table both hold is left as it is. While the record leaves the
/// rows a rule gives to it, the rows of a table whose rule reads its rows'
/// columns are held alike by the rule, at the same position, and only the
/// rest of the record is compared (`Tables::left_to_rule`). Run at the end
/// of a pass, once the record is the pass's. Returns those that joined.
pub(crate) async fn join(
    client: &impl GenericClient,
    replicas: &[String],
    tables: &Tables,
) -> Result<Vec<String>> {
    if replicas.is_empty() {
        return Ok(Vec::new());
    }
    // A member's own rows of the shared tables: ruled, or reached from its
    // rows of other tables, pointed at or followed, over and over.
    // Those of its rows it holds by their rule alone (decision 176) seed
    // the search too: their pointers are the reading's.
    let ruled = match &tables.ruled {
        Some(ruled) => format!(
            " UNION ALL SELECT g.r, g.t, g.k, g.ptrs FROM ({ruled}) g
              WHERE g.t = ANY ($4) OR g.t = ANY ($5)"
        ),
        None => String::new(),
    };
    let seed = format!(
        "SELECT h.replica, h.table_name, h.key, h.ptrs FROM sync.held h
         WHERE h.replica = ANY ($2)
           AND ((h.table_name = ANY ($4) AND h.ruled) OR h.table_name = ANY ($5)){ruled}"
    );
    let own = match &tables.links {
        Some(links) => format!(
            "WITH RECURSIVE own (r, t, k, ptrs) AS (
                 {seed}
                 UNION
                 SELECT x.replica, x.table_name, x.key, x.ptrs
                 FROM own o
                 CROSS JOIN LATERAL (
                     SELECT h.replica, h.table_name, h.key, h.ptrs FROM {links} JOIN sync.held h
                       ON h.replica = o.r AND h.table_name = l.p
                      AND h.key = (o.ptrs -> l.name)::text
                     WHERE l.c = o.t AND o.ptrs ? l.name
                     UNION ALL
                     SELECT h.replica, h.table_name, h.key, h.ptrs FROM {links} JOIN sync.held h
                       ON h.replica = o.r AND h.table_name = l.c
                      AND (h.ptrs -> l.name)::text = o.k
                     WHERE l.follows AND l.p = o.t) x
                 WHERE x.table_name = ANY ($4)),"
        ),
        None => format!("WITH own (r, t, k, ptrs) AS ({seed}),"),
    };
    let alike: Vec<String> = client
        .query(
            &format!(
                "{own}
                 c AS (SELECT table_name, key FROM sync.held
                       WHERE replica = $1 AND NOT (ruled AND table_name = ANY ($6))),
                 m AS (SELECT replica, table_name, key FROM sync.held h
                       WHERE replica = ANY ($2) AND table_name = ANY ($3)
                         AND NOT (ruled AND table_name = ANY ($6))),
                 theirs AS (SELECT * FROM m WHERE NOT EXISTS (
                               SELECT 1 FROM own o
                               WHERE o.r = m.replica AND o.t = m.table_name AND o.k = m.key)),
                 alike AS (
                     SELECT r FROM unnest($2::text[]) r
                     WHERE NOT EXISTS (SELECT table_name, key FROM theirs WHERE theirs.replica = r
                                       EXCEPT SELECT table_name, key FROM c)
                       AND NOT EXISTS (SELECT table_name, key FROM c
                                       EXCEPT SELECT table_name, key FROM m WHERE m.replica = r)
                       AND NOT EXISTS (SELECT 1 FROM sync.blocked b
                                       WHERE b.replica = r AND b.table_name = ANY ($4))),
                 -- `theirs`, read again by the record's key: a join to
                 -- the CTE can be planned as a loop over it for every row
                 -- held (minutes at 20,000 rows, with the record's
                 -- statistics not yet gathered).
                 held AS (DELETE FROM sync.held h
                          WHERE h.replica IN (SELECT r FROM alike) AND h.table_name = ANY ($3)
                            AND NOT EXISTS (SELECT 1 FROM own o
                                            WHERE o.r = h.replica AND o.t = h.table_name
                                              AND o.k = h.key)),
                 blocked AS (DELETE FROM sync.blocked
                             WHERE replica IN (SELECT r FROM alike) AND table_name = ANY ($3)),
                 -- What the rule gives them of those, the cohort holds.
                 left_gone AS (DELETE FROM sync.left_to_rule
                               WHERE replica IN (SELECT r FROM alike) AND table_name = ANY ($3))
             INSERT INTO sync.members (replica, cohort, since, since_nonce)
             SELECT id, $1, last_number, last_nonce FROM sync.replicas
             WHERE id IN (SELECT r FROM alike)
             RETURNING replica"
            ),
            &[
                &ALL,
                &replicas,
                &tables.all,
                &tables.shared,
                &tables.reaching,
                &tables.left_to_rule,
            ],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    // What they held of the shared tables by the rule alone is counted on
    // its way in the cohort's messages from now on: in their own, only
    // the rows they keep a record row of.
    client
        .execute(
            "WITH lets AS (DELETE FROM sync.let_go
                           WHERE replica = ANY ($1) AND table_name = ANY ($2))
             DELETE FROM sync.held_carried WHERE replica = ANY ($1) AND table_name = ANY ($2)",
            &[&alike, &tables.all],
        )
        .await?;
    client
        .execute(
            "INSERT INTO sync.held_carried (replica, message, table_name, rows)
             SELECT h.replica, h.message, h.table_name, count(*) FROM sync.held h
             WHERE h.replica = ANY ($1) AND h.table_name = ANY ($2)
               AND h.message > coalesce((SELECT a.number FROM sync.acks a
                                         WHERE a.replica = h.replica), 0)
             GROUP BY 1, 2, 3",
            &[&alike, &tables.all],
        )
        .await?;
    // The rows they keep of the shared tables count only their own rows
    // pointing at them now.
    recount(client, &alike, tables).await?;
    Ok(alike)
}

/// A cohort's message a member is owed, with the one before it in the
/// member's chain, which its head names.
pub(crate) struct Owed {
    pub replica: String,
    pub number: i64,
    /// The cohort's own nonce of it: the member's is drawn from it
    /// (`seal::member_nonce`).
    pub shared: Vec<u8>,
    /// Its body, by id.
    pub body: i64,
    /// The member's message before it: its number, and its nonce, or the
    /// cohort's own nonce of it when `previous_shared`.
    pub previous: i64,
    pub previous_nonce: Vec<u8>,
    pub previous_shared: bool,
    /// Its replica said it verifies messages signed in a batch.
    pub reads_batches: bool,
}

/// The cohorts' messages owed, as [`owed_page`] reads them: the members
/// looked at (`w`), those with one to send (`m`), each one's chain from
/// where it stands (`chain`), linked to the message before (`linked`).
/// Parameters: after (`$1` replica, `$2` number), `$3` limit, `$4` skip,
/// `$5`, `$6` sent (replicas, numbers), `$7` window.
const OWED_CTES: &str = "w AS MATERIALIZED (
                 SELECT replica, cohort FROM sync.members WHERE replica >= $1
                 ORDER BY replica LIMIT $7),
             m AS (
                 SELECT m.replica, m.cohort, m.since, m.since_nonce,
                        coalesce(a.number, 0) AS acked, a.nonce AS acked_nonce,
                        coalesce(a.reads_batches, false) AS reads_batches,
                        coalesce(s.number, 0) AS sent
                 FROM w JOIN sync.members m ON m.replica = w.replica AND m.cohort = w.cohort
                 JOIN sync.cohorts c ON c.id = m.cohort
                 JOIN sync.replicas r ON r.id = m.replica
                 LEFT JOIN sync.acks a ON a.replica = m.replica
                 LEFT JOIN unnest($5::text[], $6::int8[]) AS s (replica, number)
                   ON s.replica = m.replica
                 WHERE c.newest > greatest(m.since, coalesce(a.number, 0), s.number)
                   AND r.live AND NOT r.provision AND r.snapshot_attempt IS NULL
                   AND m.replica >= $1 AND m.replica <> ALL ($4)
                   -- Only members with one to send at least: the page's
                   -- first members, in order, and no more than it holds.
                   AND EXISTS (
                       SELECT 1 FROM sync.batches b
                       WHERE b.cohort = m.cohort
                         AND b.number > greatest(m.since, coalesce(a.number, 0))
                         AND (m.replica, b.number) > ($1, $2)
                         AND b.number > coalesce(s.number, 0)
                         AND NOT EXISTS (SELECT 1 FROM sync.outbox o
                                         WHERE o.replica = m.replica AND o.number = b.pass_last))
                 ORDER BY m.replica LIMIT $3),
             -- Each member's messages from where it stands, with what the
             -- statement's end needs of the member: no join back to it.
             chain AS (
                 SELECT m.replica, b.number, b.nonce, true AS part, b.body, m.sent, m.reads_batches
                 FROM m JOIN sync.batches b
                   ON b.cohort = m.cohort AND b.number > greatest(m.since, m.acked)
                 WHERE NOT EXISTS (SELECT 1 FROM sync.outbox o
                                   WHERE o.replica = m.replica AND o.number = b.pass_last)
                 UNION ALL
                 SELECT o.replica, o.number, o.nonce, false, NULL, m.sent, m.reads_batches
                 FROM m JOIN sync.outbox o ON o.replica = m.replica AND o.number > m.acked
                 UNION ALL
                 SELECT replica, since, since_nonce, false, NULL, sent, reads_batches FROM m
                 UNION ALL
                 SELECT replica, acked, acked_nonce, false, NULL, sent, reads_batches
                 FROM m WHERE acked > 0),
             linked AS (
                 SELECT c.*, lag(c.number) OVER w AS previous, lag(c.nonce) OVER w AS previous_nonce,
                        lag(c.part) OVER w AS previous_part
                 FROM (SELECT DISTINCT ON (replica, number) * FROM chain
                       ORDER BY replica, number, nonce IS NULL) c
                 WINDOW w AS (PARTITION BY c.replica ORDER BY c.number))";

/// What [`OWED_CTES`] owes, in order: replica, number, the cohort's
/// nonce, body, previous number and nonce, whether the previous is a
/// cohort's, and whether its replica reads batches.
const OWED_SELECT: &str = "SELECT l.replica, l.number, l.nonce, l.body, l.previous,
                    coalesce(l.previous_nonce, ''::bytea) AS previous_nonce, l.previous_part, l.reads_batches
             FROM linked l
             WHERE l.part AND (l.replica, l.number) > ($1, $2) AND l.number > l.sent
             ORDER BY l.replica, l.number LIMIT $3";

/// The cohorts' messages owed from a page's start, as publishing reads
/// them beside the outbox's page: with their bodies, and where the members
/// looked at end.
pub(crate) struct OwedPage {
    pub owed: Vec<Owed>,
    /// The bodies of `owed`, by id: their bytes and hash.
    pub bodies: std::collections::HashMap<i64, (Vec<u8>, Vec<u8>)>,
    /// Where the members looked at end, when their window was full.
    pub through: Option<(String, i64)>,
}

/// Reads [`OwedPage`]: the cohorts' messages members are owed after
/// `after` (replica, number), in order, at most `limit`: each numbered
/// past what the member acknowledged and the message it joined at, of a
/// pass it was not sent in messages of its own (it has no message of its
/// own at the pass's last number), to a member kept up and not in `skip`,
/// and not among what `sent` says went lately (per replica, the number up
/// to which it did). Each comes with the message before it in the member's
/// chain: one of its own still owed, another of the cohort's, the one it
/// acknowledged, or the one it joined at, whichever is the latest below it.
///
/// Members are looked at `window` at a time, in the order of their key
/// from `after` on, so a page costs what a window of members does, not
/// what the fleet does; `through` says where they end when the window was
/// full: nothing past that was looked at.
///
/// Run by a statement prepared once ([`prepare_owed_page`]): planning it
/// each time took longer than running it. Publishing reads it in the
/// transaction it reads the outbox's page in, so that both are of one view
/// (`relay::publish`).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn owed_page(
    client: &impl GenericClient,
    statement: &tokio_postgres::Statement,
    after: &(String, i64),
    limit: i64,
    skip: &std::collections::BTreeSet<String>,
    window: i64,
    sent: (&[String], &[i64]),
) -> Result<OwedPage> {
    let skipped: Vec<&String> = skip.iter().collect();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 7] = [
        &after.0, &after.1, &limit, &skipped, &sent.0, &sent.1, &window,
    ];
    let rows = client.query(statement, &params).await?;
    let mut page = OwedPage {
        owed: Vec::new(),
        bodies: std::collections::HashMap::new(),
        through: None,
    };
    for row in &rows {
        match row.get::<_, i32>(0) {
            1 => page.owed.push(Owed {
                replica: row.get(1),
                number: row.get(2),
                shared: row.get(3),
                body: row.get(4),
                previous: row.get(5),
                previous_nonce: row.get(6),
                previous_shared: row.get(7),
                reads_batches: row.get(8),
            }),
            2 => {
                page.bodies.insert(row.get(4), (row.get(6), row.get(9)));
            }
            _ => {
                if row.get::<_, i64>(2) >= window {
                    page.through = row
                        .get::<_, Option<String>>(1)
                        .map(|replica| (replica, i64::MAX));
                }
            }
        }
    }
    // A union keeps no order: in the order the list was cut in.
    page.owed
        .sort_by(|a, b| (&a.replica, a.number).cmp(&(&b.replica, b.number)));
    Ok(page)
}

/// Prepares [`owed_page`]'s statement on `client`'s connection.
pub(crate) async fn prepare_owed_page(
    client: &impl GenericClient,
) -> Result<tokio_postgres::Statement> {
    use tokio_postgres::types::Type;
    let sql = format!(
        "WITH {OWED_CTES},
              owed AS ({OWED_SELECT}),
              owed_bodies AS (SELECT b.id, b.bytes, b.hash FROM sync.bodies b
                              WHERE b.id IN (SELECT body FROM owed)),
              looked AS (SELECT count(*) AS n, max(replica) AS last FROM w)
         SELECT 1, replica, number, nonce, body, previous, previous_nonce, previous_part,
                reads_batches, NULL::bytea
         FROM owed
         UNION ALL
         SELECT 2, NULL, NULL, NULL, id, NULL, bytes, NULL, NULL, hash
         FROM owed_bodies
         UNION ALL
         SELECT 3, last, n, NULL, NULL, NULL, NULL, NULL, NULL, NULL
         FROM looked"
    );
    let types = [
        Type::TEXT,
        Type::INT8,
        Type::INT8,
        Type::TEXT_ARRAY,
        Type::TEXT_ARRAY,
        Type::INT8_ARRAY,
        Type::INT8,
    ];
    Ok(client.prepare_typed(&sql, &types).await?)
}

/// The members whose chain stands at a message of their cohort's: each
/// with its number and the cohort's own nonce of it.
pub(crate) async fn heads_at_cohort(
    client: &impl GenericClient,
) -> Result<Vec<(String, i64, Vec<u8>)>> {
    Ok(client
        .query(
            "SELECT m.replica, c.newest, c.newest_nonce
             FROM sync.members m JOIN sync.cohorts c ON c.id = m.cohort
             JOIN sync.replicas r ON r.id = m.replica
             WHERE c.newest > greatest(m.since, r.last_number)",
            &[],
        )
        .await?
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

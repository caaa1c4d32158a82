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
use tokio_postgres::GenericClient;

/// The cohort of the tables whose rule is `all`, as a holder.
pub(crate) const ALL: &str = "\u{1}all";

/// Whether `holder` is a cohort's id rather than a replica's.
pub(crate) fn is_cohort(holder: &str) -> bool {
    holder.starts_with('\u{1}')
}

/// Whether the cohort [`ALL`] is recorded.
pub(crate) async fn exists(client: &impl GenericClient) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sync.cohorts WHERE id = $1)",
            &[&ALL],
        )
        .await?
        .get(0))
}

/// Clears what is recorded under [`ALL`] before it is made: nothing, unless
/// its row in `sync.cohorts` was deleted by hand.
pub(crate) async fn clear(client: &impl GenericClient) -> Result<()> {
    client
        .execute("DELETE FROM sync.held WHERE replica = $1", &[&ALL])
        .await?;
    client
        .execute("DELETE FROM sync.blocked WHERE replica = $1", &[&ALL])
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
/// from what the cohort was. A row a member held itself too is held once,
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
             held AS (DELETE FROM sync.held WHERE replica IN (SELECT id FROM gone)),
             blocked AS (DELETE FROM sync.blocked WHERE replica IN (SELECT id FROM gone))
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
    client
        .execute(
            &format!(
                "WITH p AS (
                     SELECT c.replica AS r, l.p AS t, (c.ptrs -> l.name)::text AS k,
                            count(*)::int AS n
                     FROM sync.held c JOIN {links} ON l.c = c.table_name
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
/// every member instead (`_ms_r`'s kind `own`).
///
/// With `shared` (rows of tables a member's own rows can reach too), a row
/// both hold is sent a member once, and taken back from it only when
/// neither holds it after the pass: the cohort's take-back not when the
/// member's own record keeps the row, the member's own not when the
/// cohort keeps it.
pub(crate) fn given_to_members(from: &str, only: &str, shared: bool) -> String {
    let all = crate::sql::literal(ALL);
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
            "SELECT s.r, s.t, s.k FROM {from} s WHERE {only} AND s.r <> {all}
             UNION ALL
             SELECT o.r, s.t, s.k FROM {from} s JOIN _ms_r o ON o.kind = 'own'
             WHERE {only} AND s.r = {all}"
        ),
        ("_ms_del", true) => format!(
            "SELECT s.r, s.t, s.k FROM _ms_del s WHERE {only} AND s.r <> {all}
               AND NOT (EXISTS (SELECT 1 FROM _ms_r o WHERE o.r = s.r AND o.kind = 'own')
                        AND {cohort})
             UNION ALL
             SELECT o.r, s.t, s.k FROM _ms_del s JOIN _ms_r o ON o.kind = 'own'
             WHERE {only} AND s.r = {all} AND NOT {member}",
            cohort = holds_after(&all),
            member = holds_after("o.r"),
        ),
        (_, true) => format!(
            "SELECT s.r, s.t, s.k FROM {from} s WHERE {only} AND s.r <> {all}
             UNION
             SELECT o.r, s.t, s.k FROM {from} s JOIN _ms_r o ON o.kind = 'own'
             WHERE {only} AND s.r = {all}"
        ),
    }
}

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
}

impl Tables {
    pub fn of(graph: &crate::graph::Graph) -> Tables {
        let shared = graph.shared_cohort_tables();
        Tables {
            all: graph.all_cohort_tables().into_iter().collect(),
            reaching: graph.reaching(&shared).into_iter().collect(),
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
/// of a table both hold is left as it is. Run at the end of a pass, once
/// the record is the pass's. Returns those that joined.
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
    let seed = "SELECT h.replica, h.table_name, h.key FROM sync.held h
                WHERE h.replica = ANY ($2)
                  AND ((h.table_name = ANY ($4) AND h.ruled) OR h.table_name = ANY ($5))";
    let own = match &tables.links {
        Some(links) => format!(
            "WITH RECURSIVE own (r, t, k) AS (
                 {seed}
                 UNION
                 SELECT x.replica, x.table_name, x.key
                 FROM own o JOIN sync.held y ON y.replica = o.r AND y.table_name = o.t AND y.key = o.k
                 CROSS JOIN LATERAL (
                     SELECT h.replica, h.table_name, h.key FROM {links} JOIN sync.held h
                       ON h.replica = y.replica AND h.table_name = l.p
                      AND h.key = (y.ptrs -> l.name)::text
                     WHERE l.c = y.table_name AND y.ptrs ? l.name
                     UNION ALL
                     SELECT h.replica, h.table_name, h.key FROM {links} JOIN sync.held h
                       ON h.replica = y.replica AND h.table_name = l.c
                      AND (h.ptrs -> l.name)::text = y.key
                     WHERE l.follows AND l.p = y.table_name) x
                 WHERE x.table_name = ANY ($4)),"
        ),
        None => format!("WITH own (r, t, k) AS ({seed}),"),
    };
    let alike: Vec<String> = client
        .query(
            &format!(
                "{own}
                 c AS (SELECT table_name, key FROM sync.held WHERE replica = $1),
                 m AS (SELECT replica, table_name, key FROM sync.held h
                       WHERE replica = ANY ($2) AND table_name = ANY ($3)),
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
                 held AS (DELETE FROM sync.held h USING theirs t
                          WHERE t.replica IN (SELECT r FROM alike) AND h.replica = t.replica
                            AND h.table_name = t.table_name AND h.key = t.key),
                 blocked AS (DELETE FROM sync.blocked
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
            ],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    // The rows they keep of the shared tables count only their own rows
    // pointing at them now.
    recount(client, &alike, tables).await?;
    Ok(alike)
}

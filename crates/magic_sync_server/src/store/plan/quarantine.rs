//! Rows that cannot go down, planned around.
//!
//! A row whose codec refuses it, or that no message could carry, is found
//! when a load encodes it. The pass then puts it in quarantine
//! (`sync.quarantine`, with why) and plans again: nothing it plans after
//! that sends the row, or anything that points at it, to any replica, and a
//! replica holding an older version of it has that version taken back, with
//! whatever it holds that points at it. Those rows are *blocked* for that
//! replica (`sync.blocked`, naming the row in quarantine they lean on).
//!
//! The planner treats a blocked row as one its replica may not keep: no
//! step adds it to what a replica keeps, and a held one is questioned and
//! not kept by its rule, so it is taken back and its parents are weighed
//! again as for any row that goes. What points at a blocked row is found
//! after the plan ([`Planner::newly_blocked`]): a row the plan sends that
//! points at one, and a row a replica holds that points at one it takes
//! back. Those are blocked in turn and the plan runs again, until a plan
//! blocks nothing new. A plan never sends a row without its parents, so the
//! closure ends with every row that leans on the quarantine set aside.
//!
//! A row in quarantine is tried again once it changes (a note newer than
//! the one it failed at), and a blocked row once it changes itself or its
//! row in quarantine is let go. A relay starting notes every one of them
//! again, so a fix deployed lets them through by itself.

use super::Planner;
use crate::error::{Error, Result, Unsendable};
use crate::graph::wire_key;
use crate::graph::{key_json, Graph, Link};
use crate::sql::literal;
use crate::store::quarantine::SetAside;
use tokio_postgres::{GenericClient, Transaction};

/// What a pass knows of the rows set aside, read as it opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Blocks {
    /// Some row is in quarantine: every row a plan adds is checked.
    pub any: bool,
    /// Some row in quarantine or blocked may still be held by a replica:
    /// the plan takes it back.
    pub unsettled: bool,
}

impl Blocks {
    /// As the database records them.
    pub async fn read(client: &impl GenericClient) -> Result<Blocks> {
        let row = client
            .query_typed_one(
                "SELECT EXISTS (SELECT 1 FROM sync.quarantine),
                        EXISTS (SELECT 1 FROM sync.quarantine WHERE NOT settled)
                        OR EXISTS (SELECT 1 FROM sync.blocked WHERE NOT settled)",
                &[],
            )
            .await?;
        Ok(Blocks {
            any: row.get(0),
            unsettled: row.get(1),
        })
    }

    /// After rows were set aside in this pass.
    pub fn added(&mut self) {
        self.any = true;
        self.unsettled = true;
    }
}

/// A row blocked for one replica, and the row in quarantine it leans on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Blocked {
    pub replica: String,
    pub table: String,
    /// The key, as the record keeps it (the text of its `jsonb` array).
    pub key: String,
    pub root_table: String,
    pub root_key: String,
}

/// SQL: the row `t`, `k` (a `jsonb` key) is set aside for the replica `r`:
/// in quarantine, or blocked for it. Looked up per row by the tables' keys.
pub(crate) fn is_blocked(r: &str, t: &str, k: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM sync.quarantine z WHERE z.table_name = {t} AND z.key = ({k})::text OFFSET 0)
          OR EXISTS (SELECT 1 FROM sync.blocked z WHERE {} AND z.table_name = {t}
                     AND z.key = ({k})::text OFFSET 0))",
        blocked_for(r)
    )
}

/// `sync.blocked z` holds a row back from the holder `r`: for it, or for a
/// cohort it is a member of, which it takes that row from.
fn blocked_for(r: &str) -> String {
    format!(
        "(z.replica = {r}
          OR z.replica IN (SELECT m.cohort FROM sync.members m WHERE m.replica = {r}))"
    )
}

/// `LEFT JOIN LATERAL ... root ON true`: the row in quarantine that the
/// row `t`, `k` is, or leans on for the replica `r` (NULL columns when it
/// is not set aside).
fn root_of(r: &str, t: &str, k: &str) -> String {
    format!(
        "LEFT JOIN LATERAL (
             SELECT z.table_name AS t, z.key AS k FROM sync.quarantine z
             WHERE z.table_name = {t} AND z.key = ({k})::text
             UNION ALL
             SELECT z.root_table, z.root_key FROM sync.blocked z
             WHERE {} AND z.table_name = {t} AND z.key = ({k})::text
             LIMIT 1) root ON true",
        blocked_for(r)
    )
}

/// The rows of `blocked` that are new: not blocked for their replica
/// already, nor in quarantine themselves.
fn new_only(r: &str, t: &str, k: &str) -> String {
    format!("NOT {}", is_blocked(r, t, k))
}

impl Planner<'_, '_> {
    /// Held rows set aside that a pass has not taken back yet (in
    /// quarantine, or blocked for their replica), in question: questioned,
    /// not kept by their rule, and not present, so no step keeps them.
    pub(crate) async fn question_unsettled(&self) -> Result<u64> {
        let q_columns =
            "_ms_q (r, t, k, round, ruled, questioned, present, version, hruled, hptrs, cptrs, refs)";
        let set_aside = "ON CONFLICT (r, t, k) DO UPDATE
                         SET questioned = true, ruled = false, present = false, round = 0";
        let mut n = self
            .fill(
                crate::store::plan::scratch::Scratch::Questioned,
                &format!(
                    "INSERT INTO {q_columns}
                     SELECT h.replica, h.table_name, h.key::jsonb, 0, false, true, false,
                            h.version, h.ruled, h.ptrs, NULL, h.refs
                     FROM sync.quarantine z
                     JOIN sync.held h ON h.table_name = z.table_name AND h.key = z.key
                     JOIN _ms_r r ON r.r = h.replica AND NOT r.fresh
                     WHERE NOT z.settled
                     {set_aside}"
                ),
            )
            .await?;
        n += self
            .fill(
                crate::store::plan::scratch::Scratch::Questioned,
                &format!(
                    "INSERT INTO {q_columns}
                     SELECT h.replica, h.table_name, h.key::jsonb, 0, false, true, false,
                            h.version, h.ruled, h.ptrs, NULL, h.refs
                     FROM sync.blocked b
                     JOIN sync.held h ON h.table_name = b.table_name AND h.key = b.key
                                     AND h.replica = b.replica
                     JOIN _ms_r r ON r.r = h.replica AND NOT r.fresh
                     WHERE NOT b.settled
                     {set_aside}"
                ),
            )
            .await?;
        // The holders of such a row by their rule alone (decision 176),
        // at their position: for a row set aside, every one its rule gives
        // it to; for a row blocked, its holder.
        for shape in &self.graph.shapes {
            let t = literal(shape.table.name);
            let Some(given) = self.given_by_rule(shape, "u.k", "", false) else {
                continue;
            };
            n += self
                .fill(
                    crate::store::plan::scratch::Scratch::Questioned,
                    &format!(
                        "INSERT INTO {q_columns}
                         SELECT g.r, {t}, u.k, 0, false, true, false, 0, true, g.ptrs, NULL, 0
                         FROM (SELECT z.key::jsonb AS k, NULL::text AS r FROM sync.quarantine z
                               WHERE z.table_name = {t} AND NOT z.settled
                               UNION ALL
                               SELECT b.key::jsonb, b.replica FROM sync.blocked b
                               WHERE b.table_name = {t} AND NOT b.settled) u
                         CROSS JOIN LATERAL ({given} OFFSET 0) g
                         WHERE (u.r IS NULL OR g.r = u.r)
                           AND NOT EXISTS (SELECT 1 FROM sync.held h
                                           WHERE h.table_name = {t} AND h.key = u.k::text
                                             AND h.replica = g.r)
                         {set_aside}"
                    ),
                )
                .await?;
        }
        Ok(n)
    }

    /// The rows in question of round `round` that are set aside for their
    /// replica: questioned, not kept by their rule, not present.
    pub(crate) async fn mark_blocked(&self, round: i32) -> Result<()> {
        self.run(&format!(
            "UPDATE _ms_q q SET questioned = true, ruled = false, present = false
             WHERE q.round = {round} AND (NOT q.questioned OR q.ruled OR q.present)
               AND {}",
            is_blocked("q.r", "q.t", "q.k")
        ))
        .await?;
        Ok(())
    }

    /// Rows in quarantine that changed since they failed, and the rows
    /// blocked by them, let go: the plan tries them again. Blocked rows that
    /// changed themselves are let go too (they are among the changed rows
    /// already), and with each, every row blocked for the same holder
    /// behind the same root: a block names its root, not the rows between,
    /// and a row held back through the one that changed (a line following
    /// an order re-pointed away from a customer set aside) may lean on
    /// nothing set aside any more. One that still does is blocked again by
    /// the plan. Returns the rows added to what changed.
    pub(crate) async fn release_changed(&self) -> Result<u64> {
        let roots = "SELECT z.table_name, z.key FROM sync.quarantine z
                     JOIN _ms_changed c ON c.t = z.table_name AND c.k::text = z.key
                     WHERE c.last_seq > z.version";
        // Only what an earlier pass blocked (and settled): this pass's own
        // blocks are of the very changes it plans.
        let behind_changed = "SELECT o.replica, o.table_name, o.key FROM sync.blocked b
             JOIN _ms_changed c ON b.table_name = c.t AND b.key = c.k::text
             JOIN sync.blocked o ON o.replica = b.replica
                 AND o.root_table = b.root_table AND o.root_key = b.root_key
             WHERE b.settled AND o.settled";
        if self.ruled == crate::store::held::Ruled::ByRule {
            // Read before they go: what was let go, and from whom.
            self.fill(
                crate::store::plan::scratch::Scratch::Released,
                &format!(
                    "INSERT INTO _ms_released (r, t, k)
                     SELECT NULL, z.t, z.k::jsonb FROM ({roots}) z (t, k)
                     UNION ALL
                     SELECT b.replica, b.table_name, b.key::jsonb FROM sync.blocked b
                     JOIN ({roots}) z (t, k) ON b.root_table = z.t AND b.root_key = z.k
                     UNION ALL
                     SELECT s.replica, s.table_name, s.key::jsonb FROM ({behind_changed}) s"
                ),
            )
            .await?;
        }
        let added = self
            .fill(
                crate::store::plan::scratch::Scratch::Touched,
                &format!(
                    "INSERT INTO _ms_touched (t, k)
                     SELECT DISTINCT b.table_name, b.key::jsonb FROM sync.blocked b
                     JOIN ({roots}) z (t, k) ON b.root_table = z.t AND b.root_key = z.k
                     WHERE b.table_name IN ({})
                     ON CONFLICT DO NOTHING",
                    self.declared_tables()
                ),
            )
            .await?;
        self.run(&format!(
            "DELETE FROM sync.blocked b USING ({roots}) z (t, k)
             WHERE b.root_table = z.t AND b.root_key = z.k"
        ))
        .await?;
        let added = added
            + self
                .fill(
                    crate::store::plan::scratch::Scratch::Touched,
                    &format!(
                        "INSERT INTO _ms_touched (t, k)
                         SELECT DISTINCT s.table_name, s.key::jsonb FROM ({behind_changed}) s
                         WHERE s.table_name IN ({})
                         ON CONFLICT DO NOTHING",
                        self.declared_tables()
                    ),
                )
                .await?;
        self.run(&format!(
            "DELETE FROM sync.blocked o USING ({behind_changed}) s
             WHERE o.replica = s.replica AND o.table_name = s.table_name AND o.key = s.key"
        ))
        .await?;
        self.run(
            "DELETE FROM sync.quarantine z USING _ms_changed c
             WHERE z.table_name = c.t AND z.key = c.k::text AND c.last_seq > z.version",
        )
        .await?;
        if self.has(crate::store::plan::scratch::Scratch::Released) {
            // Let go, they are held by their rule again, by the reading,
            // wherever it gives them.
            let moved = crate::store::by_rule::moved_with(
                self.graph,
                "SELECT t, k, r FROM _ms_released",
                1,
            );
            if !moved.is_empty() {
                self.run(&moved).await?;
            }
        }
        Ok(added)
    }

    /// What the plan would leave pointing at a row set aside: rows it sends
    /// that point at one, and rows a replica holds that point at one it
    /// takes back. Each is to be blocked, and the plan made again.
    pub(crate) async fn newly_blocked(&self) -> Result<Vec<Blocked>> {
        let mut parts = Vec::new();
        for link in &self.graph.links {
            let tracked = self.graph.tracked().any(|l| std::ptr::eq(l, link));
            if self.has(crate::store::plan::scratch::Scratch::Send) {
                parts.push(self.planned_pointing("_ms_send", link, tracked));
            }
            if self.has(crate::store::plan::scratch::Scratch::Questioned) {
                parts.push(self.held_pointing(link, tracked));
            }
        }
        self.blocked_rows(parts).await
    }

    /// For a snapshot: the rows of its whole set (`_ms_f`) that point at a
    /// row set aside for their replica. Each is to be blocked, and the set
    /// planned again.
    pub(crate) async fn newly_blocked_fresh(&self) -> Result<Vec<Blocked>> {
        let parts = self
            .graph
            .links
            .iter()
            .map(|link| {
                let tracked = self.graph.tracked().any(|l| std::ptr::eq(l, link));
                self.planned_pointing("_ms_f", link, tracked)
            })
            .collect();
        self.blocked_rows(parts).await
    }

    /// The rows the statements `parts` name (replica, table, key, and the
    /// row in quarantine each leans on), each once.
    async fn blocked_rows(&self, parts: Vec<String>) -> Result<Vec<Blocked>> {
        if parts.is_empty() {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT DISTINCT ON (r, t, k) r, t, k, rt, rk FROM ({}) x ORDER BY r, t, k",
            parts.join(" UNION ALL ")
        );
        let rows = self.tx.query(&sql, &[]).await?;
        Ok(rows
            .iter()
            .map(|row| Blocked {
                replica: row.get(0),
                table: row.get(1),
                key: row.get(2),
                root_table: row.get(3),
                root_key: row.get(4),
            })
            .collect())
    }

    /// Rows of `link`'s child in the planner's table `planned` (what a
    /// pass sends, or a snapshot's whole set: both have `r`, `t`, `k` and
    /// `ptrs`) that point through it at a row set aside for their replica:
    /// through what the plan recorded the row pointing at, or, for a link
    /// into an `all` table (not recorded), through the row itself.
    fn planned_pointing(&self, planned: &str, link: &Link, tracked: bool) -> String {
        let c = literal(link.child.name);
        let p = literal(link.parent.name);
        let (from, ptr) = if tracked {
            (String::new(), format!("s.ptrs -> {}", literal(&link.name)))
        } else {
            let child = self.graph.shape(link.child.name);
            (
                format!(
                    "CROSS JOIN LATERAL (SELECT {} AS ptr FROM {} a WHERE {} OFFSET 0) a",
                    link.pointer("a"),
                    child.relation,
                    crate::graph::key_match("a", child, "s.k")
                ),
                "a.ptr".to_string(),
            )
        };
        format!(
            "SELECT s.r, s.t, s.k::text AS k, root.t AS rt, root.k AS rk
             FROM {planned} s {from}
             {root}
             WHERE s.t = {c} AND root.t IS NOT NULL AND {new}",
            root = root_of("s.r", &p, &ptr),
            new = new_only("s.r", "s.t", "s.k"),
        )
    }

    /// Rows of `link`'s child a replica holds pointing through it at a row
    /// set aside that the plan takes back from it (and that the plan does
    /// not send again pointing elsewhere): found in the record by the
    /// replica, or, for a link into an `all` table, in the child table,
    /// held by the replica or, for a row the cohort of the `all` tables
    /// takes back, by any of its members.
    fn held_pointing(&self, link: &Link, tracked: bool) -> String {
        let c = literal(link.child.name);
        let p = literal(link.parent.name);
        let children = if tracked {
            format!(
                "SELECT h.replica, h.key FROM sync.held h
                 WHERE h.replica = q.r AND h.table_name = {c} AND h.ptrs -> {name} = q.k OFFSET 0",
                name = literal(&link.name)
            )
        } else {
            let child = self.graph.shape(link.child.name);
            format!(
                "SELECT h.replica, h.key FROM {rel} a
                 CROSS JOIN LATERAL (SELECT h.replica, h.key FROM sync.held h
                                     WHERE h.table_name = {c} AND h.key = ({ck})::text
                                       AND (h.replica = q.r
                                            OR q.r = {all} AND h.replica IN
                                               (SELECT o.r FROM _ms_r o WHERE o.kind = 'own'))
                                     OFFSET 0) h
                 WHERE {points} OFFSET 0",
                all = literal(crate::store::cohorts::ALL),
                rel = child.relation,
                ck = key_json("a", link.child),
                points = link.points_at("a", "q.k"),
            )
        };
        // And the children held by their rule alone (decision 176): the
        // child table's rows pointing at it, now, whose rule gives them to
        // the holder, read from the table as a link into an `all` table
        // is; a row set aside is rare, and it reads only those.
        let children = match self.ruled_children(link, tracked) {
            Some(ruled) => format!("({children}) UNION ({ruled})"),
            None => children,
        };
        format!(
            "SELECT h.replica AS r, {c} AS t, h.key AS k, root.t AS rt, root.k AS rk
             FROM _ms_q q
             {root}
             CROSS JOIN LATERAL ({children}) h
             WHERE q.t = {p} AND q.questioned AND NOT q.ruled AND NOT q.present
               AND ({tracked_refs}) AND root.t IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM _ms_send s WHERE s.r = h.replica AND s.t = {c}
                               AND s.k = h.key::jsonb AND s.ptrs -> {name} IS DISTINCT FROM q.k)
               AND {new}",
            root = root_of("q.r", "q.t", "q.k"),
            tracked_refs = if tracked { "q.refs > 0" } else { "true" },
            name = literal(&link.name),
            new = new_only("h.replica", &c, "h.key::jsonb"),
        )
    }
}

impl Planner<'_, '_> {
    /// The rows of `link`'s child held by their rule alone, with no record
    /// row, that point through it at the row in question `q`: those its
    /// holder `q.r` holds, or, through a link into an `all` table, a member
    /// of the cohort taking it back. `None` when the record keeps every
    /// row, or the child's rule does not read its own columns.
    fn ruled_children(&self, link: &Link, tracked: bool) -> Option<String> {
        let child = self.graph.shape(link.child.name);
        if self.ruled == crate::store::held::Ruled::Recorded
            || !crate::store::by_rule::readable(child)
        {
            return None;
        }
        let gives = crate::graph::rule(child.table, "a", "x")?;
        let c = literal(link.child.name);
        let members = match tracked {
            true => String::new(),
            false => format!(
                " OR q.r = {} AND x.kind = 'own'",
                literal(crate::store::cohorts::ALL)
            ),
        };
        Some(format!(
            "SELECT x.r, {ck}::text FROM {rel} a
             JOIN _ms_r x ON (x.r = q.r{members}) AND NOT x.fresh AND {gives}
             WHERE {points} AND NOT {whole}
               AND NOT EXISTS (SELECT 1 FROM sync.deferred d
                               WHERE d.replica = x.r AND d.table_name = {c} AND d.key = {ck})
               AND NOT {out}
               AND NOT EXISTS (SELECT 1 FROM sync.held h
                               WHERE h.table_name = {c} AND h.key = ({ck})::text
                                 AND h.replica = x.r)",
            ck = key_json("a", link.child),
            rel = child.relation,
            points = link.points_at("a", "q.k"),
            whole = crate::store::by_rule::recorded_whole(&c),
            out = crate::store::by_rule::ruled_out(&c, &key_json("a", link.child)),
        ))
    }
}

/// Where a load's rows were planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum From {
    /// A pass's difference (`_ms_send`).
    Sends,
    /// A snapshot's whole set (`_ms_f`).
    Fresh,
}

/// The rows `unsendable` names, as the planner's table `from` has them:
/// their keys as the record keeps them, and the versions planned. Read
/// before the plan is rolled back.
pub(crate) async fn resolve(
    tx: &Transaction<'_>,
    graph: &Graph,
    from: From,
    unsendable: &[Unsendable],
) -> Result<Vec<SetAside>> {
    let mut found = Vec::with_capacity(unsendable.len());
    let mut tables: Vec<&str> = unsendable.iter().map(|u| u.table).collect();
    tables.sort_unstable();
    tables.dedup();
    for table in tables {
        let sql = match from {
            // The newest note of the row counts too: a row noted again
            // (by a relay starting, say) and failing again is set aside at
            // that note, or the next attempt would let go of it for it and
            // meet it again, for ever.
            From::Sends => {
                "SELECT s.k::text, s.k, greatest(max(s.version), coalesce(max(ch.last_seq), 0))
                 FROM _ms_send s LEFT JOIN _ms_changed ch ON ch.t = s.t AND ch.k = s.k
                 WHERE s.t = $1 GROUP BY s.k"
            }
            From::Fresh => {
                "SELECT f.k::text, f.k, coalesce(max(ch.last_seq), 0) FROM _ms_f f
                 LEFT JOIN _ms_changed ch ON ch.t = f.t AND ch.k = f.k
                 WHERE f.t = $1 GROUP BY f.k"
            }
        };
        let mut planned = std::collections::HashMap::new();
        for row in tx.query(sql, &[&table]).await? {
            let wire = wire_key(graph.shape(table).table, row.get(1))?;
            planned.insert(wire, (row.get::<_, String>(0), row.get::<_, i64>(2)));
        }
        for u in unsendable.iter().filter(|u| u.table == table) {
            let (key, version) = planned.get(&u.key).cloned().ok_or_else(|| Error::Damaged {
                what: format!(
                    "table `{table}`: the row keyed {} was loaded but is not in the plan",
                    u.key
                ),
            })?;
            found.push(SetAside {
                table: table.to_string(),
                key,
                version,
                reason: u.reason.clone(),
            });
        }
    }
    Ok(found)
}

/// Records `blocked`; `settled` when no replica holds them (a snapshot's).
/// A row blocked before and blocked again is this pass's own block again:
/// a pass lets go of settled blocks of the rows it plans, and letting go
/// of it again on the next attempt would meet it again, for ever.
///
/// With the rows a rule gives left to it (`by_rule`, the graph), a holder
/// its rule gives a row to no longer holds it by the reading once it is
/// blocked for it: its sum of the rows held by the rule alone moves first.
pub(crate) async fn block(
    tx: &Transaction<'_>,
    blocked: &[Blocked],
    settled: bool,
    by_rule: Option<&Graph>,
) -> Result<()> {
    if blocked.is_empty() {
        return Ok(());
    }
    let column = |f: fn(&Blocked) -> &str| blocked.iter().map(f).collect::<Vec<&str>>();
    if let Some(graph) = by_rule {
        use crate::sql::text_array;
        let moved = crate::store::by_rule::moved_with(
            graph,
            &format!(
                "SELECT t, k::jsonb, r FROM unnest({}, {}, {}) AS u (t, k, r)",
                text_array(column(|b| &b.table)),
                text_array(column(|b| &b.key)),
                text_array(column(|b| &b.replica)),
            ),
            -1,
        );
        if !moved.is_empty() {
            tx.batch_execute(&moved).await?;
        }
    }
    tx.execute(
        "INSERT INTO sync.blocked AS b (replica, table_name, key, root_table, root_key, settled)
         SELECT *, $6 FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[])
         ON CONFLICT (replica, table_name, key) DO UPDATE
         SET root_table = excluded.root_table, root_key = excluded.root_key,
             settled = b.settled AND excluded.settled",
        &[
            &column(|b| &b.replica),
            &column(|b| &b.table),
            &column(|b| &b.key),
            &column(|b| &b.root_table),
            &column(|b| &b.root_key),
            &settled,
        ],
    )
    .await?;
    Ok(())
}

//! The planner: for the pending notes, how each replica's wanted set moved,
//! worked out set by set in temporary tables of the relay's connection.
//!
//! A replica wants the least set of rows closed under three rules: the rows
//! its tables' rules send it, every row one of those points at, and every row
//! that follows one of those. The planner never recomputes that set for a
//! replica it keeps up; it works around what changed:
//!
//! 1. **In question** (`_ms_q`): rows the replica holds that a change may
//!    have taken out of its set. First every held row that changed (or whose
//!    group membership changed); then, a round at a time, what they lean on:
//!    the parents a changed row's held version pointed at, and, for a row its
//!    rule does not keep, its parents and the held rows that follow it. A row
//!    its rule keeps stays whatever else moves, so nothing that leans on it
//!    is in question because of it. Every held row outside the set stays.
//! 2. **Kept** (`_ms_k`): of the rows in question and the rows the replica
//!    lacks, those it wants now. Rows its rules send it; rows in question
//!    that a row it keeps outside them points at, or whose parent it keeps
//!    outside them; then, a round at a time from the rows the last round
//!    added, their parents and their followers.
//! 3. **The difference**: kept rows it lacks, or holds as a version older
//!    than a change of the batch, are sent (`_ms_send`); rows in question it
//!    does not keep are taken back (`_ms_del`).
//!
//! A replica provisioned from scratch holds nothing, so its whole set is
//! worked out the same way, from the rows its rules send it.
//!
//! What a held row points at is what the version it holds pointed at: the
//! row as it is if it did not change since, else what the first pending note
//! of it says it pointed at before. Every pass plans every note it can see
//! and records every row it sends at the newest note the snapshot shows of
//! it, so a held version is never older than the first pending note of its row.

use super::graph::{key_json, key_match, row_by_key, rule, Graph, Link, Shape};
use crate::error::Result;
use crate::row::Rule;
use crate::sql::literal;
use std::collections::{BTreeMap, BTreeSet};
use tokio_postgres::{SimpleQueryMessage, Transaction};

const TEMP_TABLES: &str = "
CREATE TEMP TABLE IF NOT EXISTS _ms_r (r text PRIMARY KEY, part text, fresh boolean NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS _ms_notes (at tid, seq bigint, t text, k jsonb, parents jsonb);
CREATE TEMP TABLE IF NOT EXISTS _ms_changed (t text, k jsonb, last_seq bigint NOT NULL, old_parents jsonb, PRIMARY KEY (t, k));
CREATE TEMP TABLE IF NOT EXISTS _ms_touched (t text, k jsonb, PRIMARY KEY (t, k));
CREATE TEMP TABLE IF NOT EXISTS _ms_grant (r text, t text, k jsonb, PRIMARY KEY (r, t, k));
CREATE TEMP TABLE IF NOT EXISTS _ms_q (r text, t text, k jsonb, round int NOT NULL, ruled boolean NOT NULL DEFAULT false, version bigint NOT NULL, PRIMARY KEY (r, t, k));
CREATE TEMP TABLE IF NOT EXISTS _ms_k (r text, t text, k jsonb, round int NOT NULL, held boolean NOT NULL, PRIMARY KEY (r, t, k));
CREATE INDEX IF NOT EXISTS _ms_k_round ON _ms_k (t, round);
CREATE TEMP TABLE IF NOT EXISTS _ms_send (r text, t text, k jsonb, version bigint NOT NULL, held boolean NOT NULL);
CREATE TEMP TABLE IF NOT EXISTS _ms_del (r text, t text, k jsonb);
CREATE TEMP TABLE IF NOT EXISTS _ms_f (r text, t text, k jsonb, round int NOT NULL, ptrs jsonb, via int NOT NULL DEFAULT -1);
";

/// The planner's tables.
const TABLES: [&str; 10] = [
    "_ms_r",
    "_ms_notes",
    "_ms_changed",
    "_ms_touched",
    "_ms_grant",
    "_ms_q",
    "_ms_k",
    "_ms_send",
    "_ms_del",
    "_ms_f",
];

/// A replica as the replica list (`_ms_r`) holds it: id, partition, and
/// whether this pass provisions it from scratch.
pub(crate) type Listed = (String, Option<String>, bool);

/// What the planner's tables hold between passes, so a pass empties no more
/// than it must. A `TRUNCATE` makes new files, about a millisecond a table,
/// which cost a steady pass as much as its plan: only the tables the last
/// pass filled are truncated. A `DELETE` would be cheaper, but leaves dead
/// rows that temporary tables (never vacuumed) carry into every later plan,
/// and a unique index with the same keys dead many times over makes every
/// insert of that key visit them all (measured: a steady pass went from
/// 80 ms to over a second). The replica list is kept from pass to pass
/// while the replicas stay as they were, which in a steady fleet is nearly
/// always: written again, and analysed, only when it changes.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    /// Rows each table was given by the last committed pass; `None` when not
    /// known (no pass yet, or the last one failed).
    filled: Option<BTreeMap<String, u64>>,
    /// The replica list as the last committed pass left it; `None` when not
    /// known.
    list: Option<Vec<Listed>>,
    /// The list this pass left, kept once it commits.
    pending: Option<Vec<Listed>>,
}

impl Leftovers {
    /// Empties what the last pass left but the replica list.
    pub async fn clear(&mut self, tx: &Transaction<'_>) -> Result<()> {
        self.pending = self.list.take();
        let tables: Vec<&str> = match self.filled.take() {
            None => {
                self.pending = None;
                TABLES.to_vec()
            }
            Some(filled) => TABLES
                .iter()
                .copied()
                .filter(|t| *t != "_ms_r" && filled.contains_key(*t))
                .collect(),
        };
        if !tables.is_empty() {
            tx.batch_execute(&format!("TRUNCATE {}", tables.join(", ")))
                .await?;
        }
        Ok(())
    }

    /// Makes the replica list `live`, unless it is that already. Returns
    /// whether it was written (and so wants analysing).
    pub async fn list(&mut self, tx: &Transaction<'_>, live: Vec<Listed>) -> Result<bool> {
        if self.pending.as_ref() == Some(&live) {
            return Ok(false);
        }
        let mut sql = String::new();
        if self.pending.is_some() {
            // Unknown, it was truncated with the rest.
            sql.push_str("TRUNCATE _ms_r;");
        }
        if !live.is_empty() {
            // Written out whole: one round trip, no statement to prepare.
            let rows: Vec<String> = live
                .iter()
                .map(|(id, part, fresh)| {
                    format!(
                        "({}, {}::text, {fresh})",
                        crate::sql::escaped(id),
                        part.as_deref().map_or("NULL".into(), crate::sql::escaped)
                    )
                })
                .collect();
            sql.push_str(&format!(
                "INSERT INTO _ms_r (r, part, fresh) VALUES {};",
                rows.join(", ")
            ));
        }
        if !sql.is_empty() {
            tx.batch_execute(&sql).await?;
        }
        self.pending = Some(live);
        Ok(true)
    }

    /// What a committed pass left in the planner's tables.
    pub fn left(&mut self, filled: BTreeMap<String, u64>) {
        self.filled = Some(filled);
        self.list = self.pending.take();
    }
}

/// The replicas holding the row `c.t`, `c.k`, looked up by index for each
/// changed row: a change is planned around its own row, never by a scan of
/// everything the replicas hold. (`OFFSET 0` keeps PostgreSQL from turning
/// the lookup into a join it would drive from `sync.held`.)
const HOLDERS: &str =
    "SELECT h.replica, h.version FROM sync.held h WHERE h.table_name = c.t AND h.key = c.k OFFSET 0";

/// How large a temporary table grows before the planner has it analysed, so
/// PostgreSQL plans the joins over it for its real size.
const ANALYSE_ABOVE: u64 = 5_000;

/// What a plan came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    /// Notes read.
    pub notes: u64,
    /// Row deliveries to send (a row counts once per replica).
    pub sends: u64,
    /// Rows to take back (once per replica).
    pub deletes: u64,
}

/// Creates the planner's temporary tables on this connection (once).
pub(crate) async fn prepare(tx: &Transaction<'_>) -> Result<()> {
    tx.batch_execute(TEMP_TABLES).await?;
    Ok(())
}

/// A plan under way, in one transaction.
pub(crate) struct Planner<'a, 't> {
    pub tx: &'a Transaction<'t>,
    pub graph: &'a Graph,
    /// Every group rule's tables: (declared table, members, grants).
    pub groups: Vec<Group>,
    /// The planner's tables a statement put rows in.
    pub filled: std::sync::Mutex<BTreeMap<String, u64>>,
}

/// A table given through groups.
pub(crate) struct Group {
    pub table: &'static crate::row::Table,
    pub members: String,
    pub members_name: &'static str,
    pub grants_name: &'static str,
    pub group_type: String,
    pub member_columns: &'static [&'static str],
}

impl Planner<'_, '_> {
    async fn run(&self, sql: &str) -> Result<u64> {
        let started = std::time::Instant::now();
        let n = simple(self.tx, sql).await?.1;
        if n > 0 {
            // "INSERT INTO _ms_x (...": the next pass empties `_ms_x`.
            if let Some(table) = sql
                .trim_start()
                .strip_prefix("INSERT INTO ")
                .and_then(|rest| rest.split([' ', '(']).next())
            {
                *self
                    .filled
                    .lock()
                    .expect("not poisoned")
                    .entry(table.to_string())
                    .or_default() += n;
            }
        }
        if super::tracing() {
            eprintln!(
                "{:>8.1} ms {n:>8} rows  {}",
                started.elapsed().as_secs_f64() * 1e3,
                sql.split_whitespace()
                    .collect::<Vec<_>>()
                    .join(" ")
                    .chars()
                    .take(150)
                    .collect::<String>()
            );
        }
        Ok(n)
    }

    /// Plans the replicas in `_ms_r` against every pending note; the result is
    /// in `_ms_send` and `_ms_del`.
    pub async fn plan(&self, any_fresh: bool) -> Result<Planned> {
        let notes = self.read_notes().await?;
        if notes == 0 && !any_fresh {
            return Ok(Planned::default());
        }
        let mut fresh = 0;
        if any_fresh {
            fresh = self.provision().await?;
        }
        if notes == 0 {
            return Ok(Planned {
                notes,
                sends: fresh,
                deletes: 0,
            });
        }
        // Which tables changes and grants touched, read once for both steps.
        let touched = self.present("_ms_touched").await?;
        let granted = self.present("_ms_grant").await?;
        self.in_question(&touched, &granted).await?;
        self.keep(&touched, &granted).await?;
        let mut sends = 0;
        if self.has("_ms_k") {
            sends += self
                .run(
                    "INSERT INTO _ms_send (r, t, k, version, held)
                     SELECT k.r, k.t, k.k, coalesce(ch.last_seq, 0), h.key IS NOT NULL
                     FROM _ms_k k
                     LEFT JOIN _ms_changed ch ON ch.t = k.t AND ch.k = k.k
                     LEFT JOIN sync.held h ON h.replica = k.r AND h.table_name = k.t AND h.key = k.k
                     WHERE h.key IS NULL OR h.version < coalesce(ch.last_seq, 0)",
                )
                .await?;
        }
        let pointing = self.pointing();
        let not_pointing = if pointing.is_empty() {
            String::new()
        } else {
            format!("AND q.t NOT IN ({})", pointing.join(", "))
        };
        sends += self
            .run(&format!(
                "INSERT INTO _ms_send (r, t, k, version, held)
                 SELECT q.r, q.t, q.k, ch.last_seq, true
                 FROM _ms_q q JOIN _ms_changed ch ON ch.t = q.t AND ch.k = q.k
                 WHERE q.ruled {not_pointing} AND q.version < ch.last_seq"
            ))
            .await?;
        let deletes = self
            .run(
                "INSERT INTO _ms_del (r, t, k)
                 SELECT q.r, q.t, q.k FROM _ms_q q
                 WHERE NOT q.ruled
                   AND NOT EXISTS (SELECT 1 FROM _ms_k k WHERE k.r = q.r AND k.t = q.t AND k.k = q.k)",
            )
            .await?;
        if sends > ANALYSE_ABOVE {
            self.run("ANALYZE _ms_send").await?;
        }
        Ok(Planned {
            notes,
            sends: sends + fresh,
            deletes,
        })
    }

    /// The whole wanted set of every replica provisioned from scratch, in
    /// `_ms_f`: the rows its rules send it, then a round at a time the
    /// parents and the followers of the rows the last round added. Each row
    /// is stored with what it points at (`ptrs`, by link), read as the row
    /// is, so a parent round never reads the child table again. The table
    /// has no index: rounds add rows in bulk, each row once (an anti-join
    /// against what is already there), and PostgreSQL hashes.
    async fn provision(&self) -> Result<u64> {
        let mut total = 0;
        // Tables with rows in `_ms_f` so far: a follower round into a table
        // that has none needs no check against what is already there.
        let mut filled: BTreeSet<&str> = BTreeSet::new();
        // The tables with rows in the round, each with how its rows came: by
        // a rule or as parents (`None`), or as followers through a link.
        // Counted as the rounds add rows, rather than read back from
        // `_ms_f`, which would mean a scan of it per round.
        let mut current: BTreeMap<&str, BTreeSet<Option<usize>>> = BTreeMap::new();
        for shape in &self.graph.shapes {
            let Some(cond) = rule(shape.table, "a", "r") else {
                continue;
            };
            filled.insert(shape.table.name);
            let n = self
                .run(&format!(
                    "INSERT INTO _ms_f (r, t, k, round, ptrs)
                     SELECT r.r, {t}, {key}, 0, {ptrs}
                     FROM {rel} a JOIN _ms_r r ON r.fresh AND {cond}",
                    t = literal(shape.table.name),
                    key = key_json("a", shape.table),
                    ptrs = self.pointers("a", shape.table.name),
                    rel = shape.relation,
                ))
                .await?;
            if n > 0 {
                current.entry(shape.table.name).or_default().insert(None);
            }
            total += n;
        }
        let mut round = 0;
        let mut added = total;
        loop {
            if added > ANALYSE_ABOVE {
                self.run("ANALYZE _ms_f").await?;
            }
            if added == 0 {
                return Ok(total);
            }
            added = 0;
            let mut next: BTreeMap<&str, BTreeSet<Option<usize>>> = BTreeMap::new();
            for (i, link) in self.graph.links.iter().enumerate() {
                // Every row of an `all` table is there from the first round;
                // rows that came as followers through this very link have
                // their parent there already.
                let parent_complete = matches!(link.parent.rule, Rule::All);
                let only_followers_of_it = current
                    .get(link.child.name)
                    .is_some_and(|how| how.len() == 1 && how.contains(&Some(i)));
                if current.contains_key(link.child.name)
                    && !parent_complete
                    && !only_followers_of_it
                {
                    let n = self.provision_parents(i, link, round).await?;
                    if n > 0 {
                        next.entry(link.parent.name).or_default().insert(None);
                    }
                    added += n;
                    filled.insert(link.parent.name);
                }
                if link.follows && current.contains_key(link.parent.name) {
                    let first = !filled.contains(link.child.name);
                    let n = self.provision_followers(i, link, round, first).await?;
                    if n > 0 {
                        next.entry(link.child.name).or_default().insert(Some(i));
                    }
                    added += n;
                    filled.insert(link.child.name);
                }
            }
            total += added;
            current = next;
            round += 1;
        }
    }

    /// `jsonb_build_object('0', ptr, ...)`: what the row `alias` of `table`
    /// points at, by link number; NULL for a table that points at nothing.
    /// A link into an `all` table is left out: every row of it is there from
    /// the first round, so no round follows it.
    fn pointers(&self, alias: &str, table: &str) -> String {
        let items: Vec<String> = self
            .graph
            .links
            .iter()
            .enumerate()
            .filter(|(_, l)| l.child.name == table && !matches!(l.parent.rule, Rule::All))
            .map(|(i, l)| format!("'{i}', {}", l.pointer(alias)))
            .collect();
        if items.is_empty() {
            "NULL::jsonb".into()
        } else {
            format!(
                "jsonb_strip_nulls(jsonb_build_object({}))",
                items.join(", ")
            )
        }
    }

    async fn provision_parents(&self, index: usize, link: &Link, round: i32) -> Result<u64> {
        let parent = self.graph.shape(link.parent.name);
        let p = literal(link.parent.name);
        self.run(&format!(
            "INSERT INTO _ms_f (r, t, k, round, ptrs)
             SELECT x.r, {p}, x.ptr, {next}, {ptrs}
             FROM (SELECT DISTINCT n.r, n.ptrs->'{index}' AS ptr FROM _ms_f n
                   WHERE n.t = {c} AND n.round = {round} AND n.ptrs ? '{index}'
                     AND n.via <> {index}) x
             JOIN {rel} a ON {m}
             WHERE NOT EXISTS (SELECT 1 FROM _ms_f f WHERE f.r = x.r AND f.t = {p} AND f.k = x.ptr)",
            c = literal(link.child.name),
            next = round + 1,
            ptrs = self.pointers("a", link.parent.name),
            rel = parent.relation,
            m = key_match("a", parent, "x.ptr"),
        ))
        .await
    }

    /// The followers of the rows added in round `round`, through link
    /// `index`; each remembers it came through that link, whose parent is
    /// therefore there already.
    async fn provision_followers(
        &self,
        index: usize,
        link: &Link,
        round: i32,
        first: bool,
    ) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        let ck = key_json("a", link.child);
        let new = if first {
            String::new()
        } else {
            format!("AND NOT EXISTS (SELECT 1 FROM _ms_f f WHERE f.r = n.r AND f.t = {c} AND f.k = {ck})")
        };
        self.run(&format!(
            "INSERT INTO _ms_f (r, t, k, round, ptrs, via)
             SELECT n.r, {c}, {ck}, {next}, {ptrs}, {index}
             FROM _ms_f n JOIN {rel} a ON {points}
             WHERE n.t = {p} AND n.round = {round} {new}",
            p = literal(link.parent.name),
            next = round + 1,
            ptrs = self.pointers("a", link.child.name),
            rel = child.relation,
            points = link.points_at("a", "n.k"),
        ))
        .await
    }

    /// Whether a statement of this plan put rows in the planner table `temp`:
    /// a statement reading only an empty one is skipped.
    fn has(&self, temp: &str) -> bool {
        self.filled.lock().expect("not poisoned").contains_key(temp)
    }

    /// The planner's tables this plan put rows in, with how many.
    pub fn filled(&self) -> BTreeMap<String, u64> {
        self.filled.lock().expect("not poisoned").clone()
    }

    /// Every pending note this build can read; per changed row its newest
    /// note and what the first one says it pointed at before; the rows a
    /// membership or a grant touched.
    async fn read_notes(&self) -> Result<u64> {
        let notes = self
            .run(
                "INSERT INTO _ms_notes SELECT ctid, seq, table_name, key, parents
                 FROM sync.notes WHERE format = 1",
            )
            .await?;
        if notes == 0 {
            return Ok(0);
        }
        let names: Vec<String> = self
            .graph
            .shapes
            .iter()
            .map(|s| literal(s.table.name))
            .collect();
        self.run(&format!(
            "INSERT INTO _ms_changed (t, k, last_seq, old_parents)
             SELECT t, k, max(seq), (array_agg(parents ORDER BY seq))[1]
             FROM _ms_notes WHERE t IN ({}) GROUP BY t, k",
            names.join(", ")
        ))
        .await?;
        let changed = self
            .run("INSERT INTO _ms_touched (t, k) SELECT t, k FROM _ms_changed")
            .await?;
        if changed > 100 {
            self.run("ANALYZE _ms_changed, _ms_touched").await?;
        }
        for g in &self.groups {
            let t = literal(g.table.name);
            // A membership that came or went touches its member, for every replica.
            self.run(&format!(
                "INSERT INTO _ms_touched (t, k)
                 SELECT DISTINCT {t}, n.k - 0 FROM _ms_notes n WHERE n.t = {}
                 ON CONFLICT DO NOTHING",
                literal(g.members_name)
            ))
            .await?;
            // A group given or taken touches its members, for that replica.
            let members = g
                .member_columns
                .iter()
                .map(|c| format!("m.{}", crate::sql::ident(c)))
                .collect::<Vec<_>>()
                .join(", ");
            let group_col = match g.table.rule {
                Rule::Group(rule) => rule.group,
                _ => unreachable!("a group table has a group rule"),
            };
            self.run(&format!(
                "INSERT INTO _ms_grant (r, t, k)
                 SELECT DISTINCT r.r, {t}, jsonb_build_array({members})
                 FROM _ms_notes n
                 JOIN _ms_r r ON NOT r.fresh AND r.r = n.k->>0
                 JOIN {} m ON m.{} = (n.k->>1)::{}
                 WHERE n.t = {}
                 ON CONFLICT DO NOTHING",
                g.members,
                crate::sql::ident(group_col),
                g.group_type,
                literal(g.grants_name)
            ))
            .await?;
        }
        Ok(notes)
    }

    /// The rows in question, round by round. Each row is marked, as it is
    /// added, with whether its own rule keeps it.
    async fn in_question(
        &self,
        touched: &BTreeSet<String>,
        granted: &BTreeSet<String>,
    ) -> Result<()> {
        let mut first = 0;
        for shape in &self.graph.shapes {
            let name = shape.table.name;
            let t = literal(name);
            let ruled = self.ruled(shape, "c.k", "r");
            if touched.contains(name) {
                // The row is read once, whichever replicas hold it.
                let (row, ruled_row) = match rule(shape.table, "x", "r") {
                    Some(cond) => (
                        format!("LEFT JOIN {} ON true", row_by_key("x", shape, "c.k")),
                        format!(
                            "(x.{} IS NOT NULL AND coalesce({cond}, false))",
                            crate::sql::ident(shape.table.key[0])
                        ),
                    ),
                    None => (String::new(), "false".to_string()),
                };
                first += self
                    .run(&format!(
                        "INSERT INTO _ms_q (r, t, k, round, ruled, version)
                         SELECT h.replica, c.t, c.k, 0, {ruled_row}, h.version
                         FROM _ms_touched c
                         {row}
                         CROSS JOIN LATERAL ({HOLDERS}) h
                         JOIN _ms_r r ON r.r = h.replica AND NOT r.fresh
                         WHERE c.t = {t}
                         ON CONFLICT DO NOTHING"
                    ))
                    .await?;
            }
            if granted.contains(name) {
                first += self
                    .run(&format!(
                        "INSERT INTO _ms_q (r, t, k, round, ruled, version)
                         SELECT c.r, c.t, c.k, 0, {ruled}, h.version
                         FROM _ms_grant c
                         JOIN sync.held h ON h.table_name = c.t AND h.key = c.k AND h.replica = c.r
                         JOIN _ms_r r ON r.r = c.r
                         WHERE c.t = {t}
                         ON CONFLICT DO NOTHING"
                    ))
                    .await?;
            }
        }
        if first == 0 || self.graph.links.is_empty() {
            return Ok(());
        }
        let mut round = 0;
        loop {
            let tables = self.tables_in("_ms_q", round).await?;
            if tables.is_empty() {
                return Ok(());
            }
            let mut added = 0;
            for link in &self.graph.links {
                if tables.contains(link.child.name) {
                    added += self.question_parents(link, round).await?;
                }
                if link.follows && tables.contains(link.parent.name) {
                    added += self.question_followers(link, round).await?;
                }
            }
            if added == 0 {
                return Ok(());
            }
            round += 1;
        }
    }

    /// The tables that point at other tables, as SQL literals.
    fn pointing(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for l in &self.graph.links {
            let t = literal(l.child.name);
            if !out.contains(&t) {
                out.push(t);
            }
        }
        out
    }

    /// Whether the row of `shape` with key `key` goes to the replica `r` (a
    /// row of `_ms_r`) by its own rule, as an SQL expression.
    fn ruled(&self, shape: &Shape, key: &str, r: &str) -> String {
        match rule(shape.table, "x", r) {
            Some(cond) => format!(
                "EXISTS (SELECT 1 FROM {} x WHERE {} AND {cond})",
                shape.relation,
                key_match("x", shape, key)
            ),
            None => "false".into(),
        }
    }

    /// The tables with rows in round `round` of `temp`.
    async fn tables_in(&self, temp: &str, round: i32) -> Result<BTreeSet<String>> {
        let sql = format!("SELECT DISTINCT t FROM {temp} WHERE round = {round}");
        Ok(simple(self.tx, &sql).await?.0.into_iter().collect())
    }

    /// Held parents of the rows in question of round `round` of `link`'s
    /// child: those its held version pointed at, when the row changed or its
    /// rule does not keep it.
    async fn question_parents(&self, link: &Link, round: i32) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let ruled = self.ruled(self.graph.shape(link.parent.name), "p.ptr", "rr");
        self.run(&format!(
            "INSERT INTO _ms_q (r, t, k, round, ruled, version)
             SELECT q.r, {parent}, p.ptr, {next}, {ruled}, h.version
             FROM _ms_q q
             JOIN _ms_r rr ON rr.r = q.r
             LEFT JOIN _ms_changed ch ON ch.t = {c} AND ch.k = q.k
             LEFT JOIN {rel} a ON ch.k IS NULL AND {m}
             CROSS JOIN LATERAL (SELECT CASE WHEN ch.k IS NOT NULL THEN {from_note} ELSE {from_row} END AS ptr) p
             JOIN sync.held h ON h.replica = q.r AND h.table_name = {parent} AND h.key = p.ptr
             WHERE q.t = {c} AND q.round = {round} AND (ch.k IS NOT NULL OR NOT q.ruled)
             ON CONFLICT DO NOTHING",
            parent = literal(link.parent.name),
            c = literal(link.child.name),
            next = round + 1,
            rel = child.relation,
            m = key_match("a", child, "q.k"),
            from_note = link.pointer_in_note("ch.old_parents"),
            from_row = link.pointer("a"),
        ))
        .await
    }

    /// Held followers of the rows in question of round `round` of `link`'s
    /// parent that its rule does not keep.
    async fn question_followers(&self, link: &Link, round: i32) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let ck_expr = key_json("a", link.child);
        let ruled = self.ruled(child, &ck_expr, "rr");
        self.run(&format!(
            "INSERT INTO _ms_q (r, t, k, round, ruled, version)
             SELECT q.r, {c}, {ck}, {next}, {ruled}, h.version
             FROM _ms_q q
             JOIN _ms_r rr ON rr.r = q.r
             JOIN {rel} a ON {points}
             JOIN sync.held h ON h.replica = q.r AND h.table_name = {c} AND h.key = {ck}
             WHERE q.t = {p} AND q.round = {round} AND NOT q.ruled
             ON CONFLICT DO NOTHING",
            c = literal(link.child.name),
            p = literal(link.parent.name),
            ck = key_json("a", link.child),
            next = round + 1,
            rel = child.relation,
            points = link.points_at("a", "q.k"),
        ))
        .await
    }

    /// The rows kept, round by round.
    async fn keep(&self, touched: &BTreeSet<String>, granted: &BTreeSet<String>) -> Result<()> {
        let questioned = self.present("_ms_q").await?;
        let mut first = 0;
        // A row its rule keeps is kept; it needs planning further only when
        // it points at rows (a re-pointed one may need parents the replica
        // lacks). The others go straight to the difference.
        let pointing = self.pointing();
        if !questioned.is_empty() && !pointing.is_empty() {
            first += self
                .run(&format!(
                    "INSERT INTO _ms_k (r, t, k, round, held)
                     SELECT r, t, k, 0, true FROM _ms_q WHERE ruled AND t IN ({})",
                    pointing.join(", ")
                ))
                .await?;
        }
        for shape in &self.graph.shapes {
            let name = shape.table.name;
            let incremental = touched.contains(name) || granted.contains(name);
            if incremental {
                first += self.keep_by_rule(shape).await?;
            }
        }
        for link in &self.graph.links {
            if questioned.contains(link.parent.name) {
                first += self.keep_pointed_at(link).await?;
            }
            if link.follows
                && (questioned.contains(link.child.name) || touched.contains(link.child.name))
            {
                first += self.keep_following(link).await?;
            }
        }
        if first > ANALYSE_ABOVE {
            self.run("ANALYZE _ms_k").await?;
        }
        if first == 0 || self.graph.links.is_empty() {
            return Ok(());
        }
        let mut round = 0;
        loop {
            let tables = self.tables_in("_ms_k", round).await?;
            if tables.is_empty() {
                return Ok(());
            }
            let mut added = 0;
            for link in &self.graph.links {
                if tables.contains(link.child.name) {
                    added += self.keep_parents(link, round).await?;
                }
                if link.follows && tables.contains(link.parent.name) {
                    added += self.keep_followers(link, round).await?;
                }
            }
            if added == 0 {
                return Ok(());
            }
            if added > ANALYSE_ABOVE {
                self.run("ANALYZE _ms_k").await?;
            }
            round += 1;
        }
    }

    /// Rows a replica kept up lacks that its rules send it, among the rows
    /// that changed or whose group moved.
    async fn keep_by_rule(&self, shape: &Shape) -> Result<u64> {
        let Some(cond) = rule(shape.table, "a", "r") else {
            return Ok(0);
        };
        let t = literal(shape.table.name);
        self.run(&format!(
            "INSERT INTO _ms_k (r, t, k, round, held)
             SELECT r.r, {t}, c.k, 0, false
             FROM (SELECT k FROM _ms_touched WHERE t = {t}
                   UNION SELECT k FROM _ms_grant WHERE t = {t}) c
             CROSS JOIN {row}
             JOIN _ms_r r ON NOT r.fresh AND {cond}
             WHERE NOT EXISTS (SELECT 1 FROM _ms_q q
                               WHERE q.r = r.r AND q.t = {t} AND q.k = c.k)
             ON CONFLICT DO NOTHING",
            row = row_by_key("a", shape, "c.k"),
        ))
        .await
    }

    /// The tables with rows in `temp`.
    async fn present(&self, temp: &str) -> Result<BTreeSet<String>> {
        if !self.has(temp) {
            return Ok(BTreeSet::new());
        }
        let sql = format!("SELECT DISTINCT t FROM {temp}");
        Ok(simple(self.tx, &sql).await?.0.into_iter().collect())
    }

    /// Rows in question that a row the replica holds outside them points at.
    async fn keep_pointed_at(&self, link: &Link) -> Result<u64> {
        let parent = self.graph.shape(link.parent.name);
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        self.run(&format!(
            "INSERT INTO _ms_k (r, t, k, round, held)
             SELECT q.r, q.t, q.k, 0, true FROM _ms_q q
             WHERE q.t = {p} AND NOT q.ruled
               AND EXISTS (SELECT 1 FROM {prel} x WHERE {pm})
               AND EXISTS (
                   SELECT 1 FROM {crel} a
                   JOIN sync.held h ON h.replica = q.r AND h.table_name = {c} AND h.key = {ck}
                   WHERE {points}
                     AND NOT EXISTS (SELECT 1 FROM _ms_q q2
                                     WHERE q2.r = q.r AND q2.t = {c} AND q2.k = {ck}))
             ON CONFLICT DO NOTHING",
            p = literal(link.parent.name),
            prel = parent.relation,
            pm = key_match("x", parent, "q.k"),
            crel = child.relation,
            ck = key_json("a", link.child),
            points = link.points_at("a", "q.k"),
        ))
        .await
    }

    /// Rows in question, and changed rows the replica lacks, that follow a
    /// row it holds outside the rows in question.
    async fn keep_following(&self, link: &Link) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        let p = literal(link.parent.name);
        // The parent stays: held outside the rows in question, or kept by its rule.
        let outside = format!(
            "NOT EXISTS (SELECT 1 FROM _ms_q q2 WHERE q2.r = h.replica AND q2.t = {p} AND q2.k = h.key AND NOT q2.ruled)"
        );
        let in_question = self
            .run(&format!(
                "INSERT INTO _ms_k (r, t, k, round, held)
                 SELECT q.r, q.t, q.k, 0, true FROM _ms_q q
                 JOIN {rel} a ON {m}
                 JOIN sync.held h ON h.replica = q.r AND h.table_name = {p} AND h.key = {ptr}
                 WHERE q.t = {c} AND NOT q.ruled AND {outside}
                 ON CONFLICT DO NOTHING",
                rel = child.relation,
                m = key_match("a", child, "q.k"),
                ptr = link.pointer("a"),
            ))
            .await?;
        let lacking = self
            .run(&format!(
                "INSERT INTO _ms_k (r, t, k, round, held)
                 SELECT r.r, {c}, c.k, 0, false
                 FROM _ms_touched c
                 JOIN {rel} a ON {m}
                 CROSS JOIN _ms_r r
                 JOIN sync.held h ON h.replica = r.r AND h.table_name = {p} AND h.key = {ptr}
                 WHERE c.t = {c} AND NOT r.fresh AND {outside}
                   AND NOT EXISTS (SELECT 1 FROM sync.held h2
                                   WHERE h2.replica = r.r AND h2.table_name = {c} AND h2.key = c.k)
                 ON CONFLICT DO NOTHING",
                rel = child.relation,
                m = key_match("a", child, "c.k"),
                ptr = link.pointer("a"),
            ))
            .await?;
        Ok(in_question + lacking)
    }

    /// The parents of the rows kept in round `round`, unless the replica
    /// holds them outside the rows in question.
    async fn keep_parents(&self, link: &Link, round: i32) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let p = literal(link.parent.name);
        self.run(&format!(
            "INSERT INTO _ms_k (r, t, k, round, held)
             SELECT n.r, {p}, x.ptr, {next},
                    EXISTS (SELECT 1 FROM sync.held h WHERE h.replica = n.r AND h.table_name = {p} AND h.key = x.ptr)
             FROM _ms_k n
             JOIN {rel} a ON {m}
             CROSS JOIN LATERAL (SELECT {ptr} AS ptr) x
             WHERE n.t = {c} AND n.round = {round} AND x.ptr IS NOT NULL
               AND (NOT EXISTS (SELECT 1 FROM sync.held h WHERE h.replica = n.r AND h.table_name = {p} AND h.key = x.ptr)
                    OR EXISTS (SELECT 1 FROM _ms_q q WHERE q.r = n.r AND q.t = {p} AND q.k = x.ptr))
             ON CONFLICT DO NOTHING",
            c = literal(link.child.name),
            next = round + 1,
            rel = child.relation,
            m = key_match("a", child, "n.k"),
            ptr = link.pointer("a"),
        ))
        .await
    }

    /// The followers of the rows kept in round `round`: every follower of a
    /// row the replica lacks; of a row in question, the followers in question
    /// and the changed ones it lacks (it holds the others already).
    async fn keep_followers(&self, link: &Link, round: i32) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        let p = literal(link.parent.name);
        let ck = key_json("a", link.child);
        let of_lacking = self
            .run(&format!(
                "INSERT INTO _ms_k (r, t, k, round, held)
                 SELECT n.r, {c}, {ck}, {next},
                        EXISTS (SELECT 1 FROM sync.held h WHERE h.replica = n.r AND h.table_name = {c} AND h.key = {ck})
                 FROM _ms_k n
                 JOIN {rel} a ON {points}
                 WHERE n.t = {p} AND n.round = {round} AND NOT n.held
                   AND (NOT EXISTS (SELECT 1 FROM sync.held h WHERE h.replica = n.r AND h.table_name = {c} AND h.key = {ck})
                        OR EXISTS (SELECT 1 FROM _ms_q q WHERE q.r = n.r AND q.t = {c} AND q.k = {ck}))
                 ON CONFLICT DO NOTHING",
                next = round + 1,
                rel = child.relation,
                points = link.points_at("a", "n.k"),
            ))
            .await?;
        let in_question = self
            .run(&format!(
                "INSERT INTO _ms_k (r, t, k, round, held)
                 SELECT n.r, {c}, q.k, {next}, true
                 FROM _ms_k n
                 JOIN _ms_q q ON q.r = n.r AND q.t = {c}
                 JOIN {rel} a ON {m}
                 WHERE n.t = {p} AND n.round = {round} AND n.held AND {ptr} = n.k
                 ON CONFLICT DO NOTHING",
                next = round + 1,
                rel = child.relation,
                m = key_match("a", child, "q.k"),
                ptr = link.pointer("a"),
            ))
            .await?;
        let changed = self
            .run(&format!(
                "INSERT INTO _ms_k (r, t, k, round, held)
                 SELECT n.r, {c}, t.k, {next}, false
                 FROM _ms_k n
                 JOIN _ms_touched t ON t.t = {c}
                 JOIN {rel} a ON {m}
                 WHERE n.t = {p} AND n.round = {round} AND n.held AND {ptr} = n.k
                   AND NOT EXISTS (SELECT 1 FROM sync.held h WHERE h.replica = n.r AND h.table_name = {c} AND h.key = t.k)
                 ON CONFLICT DO NOTHING",
                next = round + 1,
                rel = child.relation,
                m = key_match("a", child, "t.k"),
                ptr = link.pointer("a"),
            ))
            .await?;
        Ok(of_lacking + in_question + changed)
    }
}

/// Runs one statement without parameters in a single round trip (the simple
/// query protocol; the extended one prepares first, a round trip of its own).
/// Returns the first column of the rows it returned, and how many rows it
/// returned or changed.
async fn simple(tx: &Transaction<'_>, sql: &str) -> Result<(Vec<String>, u64)> {
    let mut values = Vec::new();
    let mut count = 0;
    for message in tx.simple_query(sql).await? {
        match message {
            SimpleQueryMessage::Row(row) => {
                if let Some(v) = row.get(0) {
                    values.push(v.to_string());
                }
            }
            SimpleQueryMessage::CommandComplete(n) => count = n,
            _ => {}
        }
    }
    Ok((values, count))
}

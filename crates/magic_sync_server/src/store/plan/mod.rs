//! The planner: for the pending notes, how each replica's wanted set moved,
//! worked out set by set in temporary tables of the relay's connection.
//!
//! A replica wants the least set of rows closed under three rules: the rows
//! its tables' rules send it, every row one of those points at, and every row
//! that follows one of those. The planner never recomputes that set for a
//! replica it keeps up; it works around what changed, against what the
//! replica is recorded to hold and why (`sync.held`: whether its own rule
//! sends it the row, what the version it holds points at, and how many rows
//! it holds point at it):
//!
//! 1. **In question** (`_ms_q`): every holder's record of every changed row,
//!    each marked with whether its own rule keeps it now and whether it is
//!    *questioned*: whether the reason it is held may be gone. A changed row
//!    is questioned only when the change could have moved it: it is gone,
//!    its rule no longer sends it where it used to, or the parent it follows
//!    changed. Any other update (a balance, a name, a pointer that is not
//!    followed) is sent again to every holder and questions nothing of its
//!    own. Then, round by round, what leaned on a questioned row: the
//!    parents its held version points at and the held rows that follow it;
//!    and the parents a changed row no longer points at.
//! 2. **Kept** (`_ms_k`): of the questioned rows and the rows a replica
//!    lacks, those it wants now: rows its rules send it; questioned rows
//!    that rows it keeps still point at, counted from the record
//!    (`refs`) less what the rows in question took away, so no host table
//!    is searched for what points at a row; questioned rows following a
//!    parent it keeps; then, a round at a time, the parents and followers of
//!    what the last round added.
//! 3. **The difference**: kept rows it lacks, holds at an older version, or
//!    holds pointing elsewhere, are sent (`_ms_send`); questioned rows not
//!    kept are taken back (`_ms_del`). A kept row held as it is, for
//!    another reason than before (its rule sent it, and now only a row
//!    that points at it keeps it, or the other way round), has the reason
//!    recorded and travels nowhere: the replica's copy did not change.
//!
//! A replica provisioned from scratch holds nothing, so its whole set is
//! worked out from the rows its rules send it (`_ms_f`).
//!
//! Every lookup into `sync.held` or a host table is by an index, row by row
//! from the small side, and fenced (`OFFSET 0`) so that PostgreSQL's guesses
//! about sizes (missing or stale statistics) can never turn it into a scan:
//! a change costs the rows around it, whatever the tables hold. The same
//! goes for looking up a row in one of the planner's own tables from a
//! statement that reads row by row. The few statements that join the
//! planner's tables in bulk do so by hashing (`Planner::bulk`): a loop over
//! a side PostgreSQL guessed at one row, scanning a hundred thousand rows
//! of the other side once per row, is what made a pass over a large
//! backlog run for minutes.

pub(crate) mod cache;
pub(crate) mod closed;
pub(crate) mod quarantine;
pub(crate) mod scratch;

use crate::error::Result;
use crate::graph::{key_json, key_match, row_by_key, rule, Graph, Link, Shape};
use crate::row::Rule;
use crate::sql::{literal, with_setting};
use crate::store::by_rule;
use crate::store::held::Ruled;
pub(crate) use cache::{Batch, Cache};
use quarantine::{is_blocked, Blocks};
use scratch::{Filled, Scratch};
use std::collections::{BTreeMap, BTreeSet};
use tokio_postgres::{SimpleQueryMessage, Transaction};

/// The tables a provisioning round added rows to, each with how they
/// came: by a rule or as parents (`None`), or as followers through the
/// link of that index.
type Round<'g> = BTreeMap<&'g str, BTreeSet<Option<usize>>>;

/// The columns of a row in question, in the order the statements below
/// write them.
const Q_COLUMNS: &str =
    "_ms_q (r, t, k, round, ruled, questioned, present, version, hruled, hptrs, cptrs, refs)";

/// The columns of a kept row.
const K_COLUMNS: &str =
    "_ms_k (r, t, k, round, held, questioned, ruled, ptrs, hptrs, hruled, version)";

/// A row already in question is questioned now too, and looked at again in
/// the next round, unless its rule keeps it (then nothing can take it away).
const QUESTION_AGAIN: &str =
    "ON CONFLICT (r, t, k) DO UPDATE SET questioned = true, round = EXCLUDED.round
     WHERE NOT _ms_q.questioned AND NOT _ms_q.ruled";

/// Joins by hashing only (see `Planner::bulk`), with no JIT: a join
/// method turned off adds 10^10 to the cost of a plan that needs it
/// anyway (a lateral lookup is a nested loop whatever the setting), past
/// every threshold of JIT's, and a statement of 5 ms was compiled for 70
/// to 130 ms before it ran, wherever the session had JIT on (the runner's
/// sessions turn it off; a host's own connection may not). JIT stays off
/// to the transaction's end: `SET LOCAL jit TO DEFAULT` would turn it on
/// again in a session that turned it off, since `DEFAULT` is the server's
/// value, not the session's.
pub(crate) const HASH_ONLY: &str =
    "SET LOCAL jit = off; SET LOCAL enable_nestloop = off; SET LOCAL enable_mergejoin = off;";

/// Joins as the session had them (no session sets these).
pub(crate) const JOINS_AS_THEY_WERE: &str =
    "SET LOCAL enable_nestloop TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT;";

/// Joins by nested loops only (lookups by key from a small table), with
/// no JIT, as [`HASH_ONLY`].
pub(crate) const LOOPS_ONLY: &str =
    "SET LOCAL jit = off; SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off;";

/// Joins as the session had them, after [`LOOPS_ONLY`].
pub(crate) const LOOPS_AS_THEY_WERE: &str =
    "SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT;";

/// A holder as the replica list (`_ms_r`) holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Listed {
    /// A replica's id, or a cohort's.
    pub id: String,
    /// The replica's partition.
    pub partition: Option<String>,
    /// Whether this pass provisions it from scratch.
    pub fresh: bool,
    pub kind: Kind,
}

impl Listed {
    /// A replica kept up: one that holds what every rule gives it, or a
    /// `member` of the cohort of the `all` tables.
    pub fn replica(id: String, partition: Option<String>, member: bool) -> Listed {
        Listed {
            id,
            partition,
            fresh: false,
            kind: match member {
                true => Kind::Own,
                false => Kind::Full,
            },
        }
    }
}

/// What a holder holds by rule (`_ms_r.kind`, read by `graph::rule`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A replica holding what every rule gives it.
    Full,
    /// The cohort of the tables whose rule is `all`.
    All,
    /// A member of that cohort: a replica holding what every rule but
    /// `all` gives it, and the cohort's rows through the cohort.
    Own,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Full => "full",
            Kind::All => "all",
            Kind::Own => "own",
        }
    }
}

/// What the planner's tables hold between passes, so a pass empties no more
/// than it must, and as cheaply as it can.
///
/// A `TRUNCATE` makes new files for the table and its indexes, and its
/// commit unlinks the old ones: for the five tables a pass over one changed
/// row fills, about 8 ms here, as much as the rest of the pass
/// (`--bench pass_cost`). A `DELETE` of a few rows costs a tenth of a
/// millisecond, but leaves dead rows, and temporary tables are never
/// vacuumed: with deletes alone a table keeps every page it ever had for
/// every later plan to scan, and a unique index holds a hot row's key dead
/// once per pass that changed it (measured, with deletes only: a steady
/// pass went from 80 ms to over a second). So a table is emptied by
/// `DELETE` while the rows written to it since it was last truncated are
/// few (`DELETE_UP_TO`), and truncated beyond.
///
/// A table a pass analysed is made again instead: `TRUNCATE` keeps the
/// statistics, and a later pass of another size would be planned by them.
/// The replica list is kept from pass to pass while the replicas stay as
/// they were, which in a steady fleet is nearly always: written again, and
/// analysed, only when it changes.
#[derive(Debug, Default)]
pub(crate) struct Leftovers {
    /// Rows each table was given by the last committed pass, and the tables
    /// it analysed; `None` when not known (no pass yet, or the last one
    /// failed).
    filled: Option<(Filled, BTreeSet<Scratch>)>,
    /// The replica list as the last committed pass left it; `None` when not
    /// known.
    list: Option<Vec<Listed>>,
    /// The list this pass left, kept once it commits.
    pending: Option<Vec<Listed>>,
    /// Whether the replica list carries statistics of its own.
    list_analysed: bool,
    /// Rows written to each table since it was last made empty by a
    /// truncation (or made again): what its dead rows may be at most.
    dead: BTreeMap<Scratch, u64>,
}

/// The most rows written to one of the planner's tables since it was last
/// truncated for it to be emptied by a `DELETE` (see [`Leftovers`]): a few
/// dozen pages of dead rows at most for a plan to scan, and a hot row's key
/// dead at most this often in a unique index. A pass that changes one row
/// truncates once in a thousand passes.
const DELETE_UP_TO: u64 = 1_000;

impl Leftovers {
    /// Empties what the last pass left but the replica list.
    pub async fn clear(&mut self, tx: &Transaction<'_>) -> Result<()> {
        self.pending = self.list.take();
        let mut emptied = Vec::new();
        let mut truncate = Vec::new();
        let mut remake = Vec::new();
        match self.filled.take() {
            None => {
                self.pending = None;
                self.dead.clear();
                remake = Scratch::ALL.to_vec();
            }
            Some((filled, analysed)) => {
                for t in Scratch::ALL.into_iter().filter(|t| *t != Scratch::Replicas) {
                    if analysed.contains(&t) {
                        self.dead.remove(&t);
                        remake.push(t);
                    } else if filled.has(t) {
                        let dead = self.dead.entry(t).or_default();
                        *dead += filled.rows(t);
                        if *dead > DELETE_UP_TO {
                            *dead = 0;
                            truncate.push(t.name());
                        } else {
                            emptied.push(t);
                        }
                    }
                }
            }
        }
        let mut sql = String::new();
        for t in emptied {
            sql.push_str(&format!("DELETE FROM {t};"));
        }
        if !truncate.is_empty() {
            sql.push_str(&format!("TRUNCATE {};", truncate.join(", ")));
        }
        for t in remake {
            sql.push_str(&format!("DROP TABLE IF EXISTS {t};{};", t.create()));
        }
        if !sql.is_empty() {
            tx.batch_execute(&sql).await?;
        }
        Ok(())
    }

    /// Makes the replica list `live`, unless it is that already; analyses
    /// it when it is long enough for PostgreSQL to plan joins over it.
    pub async fn list(&mut self, tx: &Transaction<'_>, live: Vec<Listed>) -> Result<()> {
        if self.pending.as_ref() == Some(&live) {
            return Ok(());
        }
        let mut sql = String::new();
        if self.pending.is_none() || self.list_analysed {
            // Unknown, or carrying the statistics of another list.
            sql.push_str(&format!(
                "DROP TABLE IF EXISTS _ms_r;{};",
                Scratch::Replicas.create()
            ));
        } else {
            sql.push_str("TRUNCATE _ms_r;");
        }
        if !live.is_empty() {
            // Written out whole: one round trip, no statement to prepare.
            let rows: Vec<String> = live
                .iter()
                .map(|l| {
                    format!(
                        "({}, {}::text, {}, '{}')",
                        crate::sql::escaped(&l.id),
                        l.partition
                            .as_deref()
                            .map_or("NULL".into(), crate::sql::escaped),
                        l.fresh,
                        l.kind.as_str()
                    )
                })
                .collect();
            sql.push_str(&format!(
                "INSERT INTO _ms_r (r, part, fresh, kind) VALUES {};",
                rows.join(", ")
            ));
        }
        // Written afresh, a long list would look empty to PostgreSQL.
        self.list_analysed = live.len() > 20;
        if self.list_analysed {
            sql.push_str("ANALYZE _ms_r;");
        }
        tx.batch_execute(&sql).await?;
        self.pending = Some(live);
        Ok(())
    }

    /// What a committed pass left in the planner's tables.
    pub fn left(&mut self, filled: Filled, analysed: BTreeSet<Scratch>) {
        self.filled = Some((filled, analysed));
        self.list = self.pending.take();
    }
}

/// How large a temporary table grows before the planner has it analysed, so
/// PostgreSQL plans the joins over it for its real size. (The next pass
/// makes it again, so the statistics never outlive the pass.)
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
    let sql: Vec<&str> = Scratch::ALL.iter().map(|t| t.create()).collect();
    tx.batch_execute(&sql.join(";")).await?;
    Ok(())
}

/// A plan under way, in one transaction.
pub(crate) struct Planner<'a, 't> {
    pub tx: &'a Transaction<'t>,
    pub graph: &'a Graph,
    /// Every group rule's tables: (declared table, members, grants).
    pub groups: Vec<Group>,
    /// The planner's tables a statement put rows in.
    pub filled: std::sync::Mutex<Filled>,
    /// The planner's tables this plan analysed.
    pub analysed: std::sync::Mutex<BTreeSet<Scratch>>,
    /// The rows set aside, as the pass found them.
    pub blocks: Blocks,
    /// The chunk of a deployment this plan works through, if any, with
    /// its size in rows.
    pub deployment: Option<(&'a crate::store::deployment::Work, i64)>,
    /// What the chunk came to.
    pub worked: std::sync::Mutex<crate::store::deployment::Worked>,
    /// For a snapshot that streamed before it planned: tables whose rule's
    /// filter alone gave it nothing as it streamed, in the same view. A
    /// provisioning does not scan them by their rule again (rows of them
    /// that come as parents or followers are still planned).
    pub ruled_out: BTreeSet<&'static str>,
    /// Whether the record keeps the rows holders' rules give them, or the
    /// planner reads those by the rule at each holder's position.
    pub ruled: crate::store::held::Ruled,
    /// Statements prepared on this connection, by their text.
    pub cache: Option<&'a Cache>,
    /// A dry run's plan (`crate::deploy::dry_run`): the deployment's chunk
    /// alone, no pending note read, nothing of `sync.*` written.
    pub rehearsing: bool,
}

/// The most rows the planner's tables may hold between them for a statement
/// to run by a plan PostgreSQL made once and kept ([`Cache`]).
pub(crate) const CACHED_UP_TO: u64 = 1_000;

/// A table given through groups.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub table: &'static crate::row::Table,
    pub members: String,
    pub members_name: &'static str,
    pub grants_name: &'static str,
    pub group_type: String,
    pub member_columns: &'static [&'static str],
}

/// `EXISTS`: the replica `r` holds the row `t`, `k` (expressions), looked up
/// by `sync.held`'s key, per row.
fn is_held(t: &str, k: &str, r: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM sync.held h WHERE h.table_name = {t} AND h.key = ({k})::text AND h.replica = {r} OFFSET 0)"
    )
}

/// `LATERAL ... h`: the record of the row `t`, `k` held by `r`, looked up by
/// `sync.held`'s key, per row.
fn held_by(t: &str, k: &str, r: &str) -> String {
    format!(
        "LATERAL (SELECT h.version, h.ruled, h.ptrs, h.refs FROM sync.held h
                  WHERE h.table_name = {t} AND h.key = ({k})::text AND h.replica = {r} OFFSET 0) h"
    )
}

/// `EXISTS`: a change of the row `t`, `k` was kept for the replica `r`
/// while its snapshot streamed (`sync.deferred`): until it is planned, the
/// record alone says whether `r` holds the row.
fn kept_for(r: &str, t: &str, k: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM sync.deferred kept
                 WHERE kept.replica = {r} AND kept.table_name = {t} AND kept.key = {k})"
    )
}

/// `LATERAL ... r`: the replica `r` (a row of `_ms_r`) of the expression,
/// looked up by the list's key, per row.
fn replica_of(r: &str) -> String {
    format!("LATERAL (SELECT r.r, r.part, r.fresh, r.kind FROM _ms_r r WHERE r.r = {r} OFFSET 0) r")
}

/// `EXISTS`: the row in question `t`, `k` of the replica `r` is there and
/// matches `and`, looked up by `_ms_q`'s key, per row.
fn in_question(r: &str, t: &str, k: &str, and: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM _ms_q q2 WHERE q2.r = {r} AND q2.t = {t} AND q2.k = {k}{and} OFFSET 0)"
    )
}

/// `LATERAL ... q`: the row in question `t`, `k` of the replica `r`,
/// questioned and not kept by its rule, looked up by `_ms_q`'s key, per row.
fn questioned_row(r: &str, t: &str, k: &str, and: &str) -> String {
    format!(
        "LATERAL (SELECT q.* FROM _ms_q q WHERE q.r = {r} AND q.t = {t} AND q.k = {k}
                  AND q.questioned AND NOT q.ruled{and} OFFSET 0) q"
    )
}

impl Planner<'_, '_> {
    /// ` AND NOT ...`: the row `t`, `k` is not set aside for the replica
    /// `r`; nothing while no row is in quarantine.
    fn unblocked(&self, r: &str, t: &str, k: &str) -> String {
        if self.blocks.any {
            format!(" AND NOT {}", is_blocked(r, t, k))
        } else {
            String::new()
        }
    }

    /// The holders of `_ms_r` that hold the row of `shape` keyed `k` by
    /// their rule alone at their position (decision 176), as rows (`r`,
    /// `ptrs`: what the version they hold points at), those matching
    /// `and` (on `hr`, the holder): those its rule gave the row to as it
    /// was before the pass's notes, or as it is when it has none, less the
    /// holders it is held back from and those a change was kept for while
    /// their snapshot streamed. None while the record keeps every row.
    fn held_by_rule(&self, shape: &Shape, k: &str, and: &str) -> Option<String> {
        self.given_by_rule(shape, k, and, true)
    }

    /// [`Self::held_by_rule`], and with `unblocked` false, the rows set
    /// aside or blocked too: the holders a row held back is to be taken
    /// from while its block is not settled.
    pub(crate) fn given_by_rule(
        &self,
        shape: &Shape,
        k: &str,
        and: &str,
        unblocked: bool,
    ) -> Option<String> {
        if self.ruled == Ruled::Recorded || !by_rule::readable(shape) {
            return None;
        }
        let gave = crate::graph::rule(shape.table, "pre", "hr")?;
        let t = literal(shape.table.name);
        Some(format!(
            "SELECT hr.r, {ptrs} AS ptrs
             FROM (SELECT pre.* FROM _ms_before bef CROSS JOIN LATERAL {before}
                   WHERE bef.t = {t} AND bef.k = {k} AND bef.known AND bef.was
                   UNION ALL
                   SELECT {now} FROM {rel} pre
                   WHERE {key} AND NOT EXISTS (SELECT 1 FROM _ms_before bef
                                               WHERE bef.t = {t} AND bef.k = {k})) pre
             JOIN _ms_r hr ON {gave}
             WHERE NOT hr.fresh{and} AND NOT {kept}{unblocked} AND NOT {whole}
               AND NOT {out}",
            out = by_rule::ruled_out(&t, k),
            ptrs = self.graph.pointers("pre", shape.table.name),
            before = by_rule::before_row(self.graph, shape, "bef.before", "pre"),
            now = by_rule::now_row(self.graph, shape, "pre"),
            rel = shape.relation,
            key = key_match("pre", shape, k),
            kept = kept_for("hr.r", &t, k),
            unblocked = match unblocked {
                true => self.unblocked("hr.r", &t, k),
                false => String::new(),
            },
            whole = by_rule::recorded_whole(&t),
        ))
    }

    /// ` AND NOT EXISTS ...`: the row of the table `t` keyed `k` was not
    /// let go of holding back from the holder `r` this pass
    /// (`_ms_released`). Let go before the plan reads, a row set aside was
    /// taken back from its holders and a row blocked for one never reached
    /// it: neither holds it, whatever its rule gave, and it goes to them as
    /// new, with the parents it points at.
    fn unreleased(&self, r: &str, t: &str, k: &str) -> String {
        match self.has(Scratch::Released) {
            true => format!(
                " AND NOT EXISTS (SELECT 1 FROM _ms_released rel
                                  WHERE rel.t = {t} AND rel.k = {k}
                                    AND (rel.r IS NULL OR rel.r = {r}))"
            ),
            false => String::new(),
        }
    }

    /// `EXISTS`: the replica `r` holds the row of `shape` keyed `k`, by its
    /// record or by its rule ([`Self::held_by_rule`]).
    fn is_held(&self, shape: &Shape, k: &str, r: &str) -> String {
        let recorded = is_held(&literal(shape.table.name), k, r);
        match self.held_by_rule(shape, k, &format!(" AND hr.r = {r}")) {
            None => recorded,
            Some(by_rule) => format!("({recorded} OR EXISTS ({by_rule} OFFSET 0))"),
        }
    }

    /// `LATERAL ... h`: what the replica `r` holds of the row of `shape`
    /// keyed `k` (version, ruled, ptrs, refs): its record, or the version
    /// its rule gives it ([`Self::held_by_rule`]) at version 0, held by its
    /// rule, pointed at by nothing counted.
    fn held_by(&self, shape: &Shape, k: &str, r: &str) -> String {
        let t = literal(shape.table.name);
        let recorded = held_by(&t, k, r);
        match self.held_by_rule(shape, k, &format!(" AND hr.r = {r}")) {
            None => recorded,
            Some(by_rule) => format!(
                "LATERAL ((SELECT h.version, h.ruled, h.ptrs, h.refs FROM sync.held h
                           WHERE h.table_name = {t} AND h.key = ({k})::text AND h.replica = {r}
                           OFFSET 0)
                          UNION ALL
                          (SELECT 0::bigint, true, byr.ptrs, 0 FROM ({by_rule}) byr
                           WHERE NOT {is_recorded} LIMIT 1)) h",
                is_recorded = is_held(&t, k, r),
            ),
        }
    }

    /// ` AND q.present` while rows are set aside: a held row set aside is
    /// in question as not present, so no step keeps it.
    fn present_only(&self) -> &'static str {
        if self.blocks.any {
            " AND q.present"
        } else {
            ""
        }
    }

    /// Runs a statement that fills the planner's table `table`, which the
    /// next pass then empties.
    pub(crate) async fn fill(&self, table: Scratch, sql: &str) -> Result<u64> {
        self.fill_as(table, sql, false).await
    }

    /// [`fill`](Self::fill), joining by hashing only when `hashed`.
    async fn fill_as(&self, table: Scratch, sql: &str, hashed: bool) -> Result<u64> {
        debug_assert!(
            sql.trim_start()
                .strip_prefix("INSERT INTO ")
                .is_some_and(|rest| rest.starts_with(table.name())),
            "a statement said to fill {table}: {sql}"
        );
        let n = match hashed {
            true => {
                let sql = sql.trim_end().trim_end_matches(';');
                self.run(&format!("{HASH_ONLY} {sql}; {JOINS_AS_THEY_WERE}"))
                    .await?
            }
            false => self.run(sql).await?,
        };
        self.filled.lock().expect("not poisoned").add(table, n);
        Ok(n)
    }

    /// The statement `sql` prepared, when it is one statement, a cache is
    /// kept, and the pass is small: a plan made on a few rows is kept for
    /// a few rows; a large pass is planned for the rows it has.
    async fn cached(&self, sql: &str) -> Result<Option<tokio_postgres::Statement>> {
        let Some(cache) = self.cache else {
            return Ok(None);
        };
        let small = self.deployment.is_none()
            && self.filled.lock().expect("not poisoned").total() <= CACHED_UP_TO;
        if !small || sql.trim_end().trim_end_matches(';').contains(';') {
            return Ok(None);
        }
        let statement = cache.statement(self.tx, sql).await?;
        Ok(Some(statement))
    }

    /// Runs a statement, tracing how long it took.
    pub(crate) async fn run(&self, sql: &str) -> Result<u64> {
        let started = std::time::Instant::now();
        let n = match self.cached(sql).await? {
            Some(statement) => self.tx.execute(&statement, &[]).await?,
            None => simple(self.tx, sql).await?.1,
        };
        if tracing::enabled!(target: "magic_sync::plan", tracing::Level::TRACE) {
            let statement: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            tracing::trace!(
                target: "magic_sync::plan",
                ms = started.elapsed().as_secs_f64() * 1e3,
                rows = n,
                statement = %statement.chars().take(150).collect::<String>()
            );
        }
        Ok(n)
    }

    /// Runs a statement that joins the planner's tables in bulk (a
    /// snapshot's rounds, the difference, the counts of what points at a
    /// row) with nested loops and merge joins off, so they are hashed on
    /// their whole keys. Either of the others, on statistics a pass left
    /// stale, can go quadratic: a loop scanning one side once per row of a
    /// side PostgreSQL guessed at one row, or a merge on the table name
    /// alone (sorted by an index that leads with it), comparing every row of
    /// a table with every other (measured: minutes for a pass over a
    /// 400,000-note backlog, 0.4 s hashed). Lookups that must stay per row
    /// are written as fenced lateral subqueries, which no setting turns into
    /// joins.
    ///
    /// The settings and the statement go as one simple query: one round
    /// trip, not three.
    async fn bulk(&self, table: Scratch, sql: &str) -> Result<u64> {
        self.fill_as(table, sql, true).await
    }

    /// Analyses the planner table `temp`, which the next pass then makes
    /// again rather than keep its statistics.
    async fn analyse(&self, temp: Scratch) -> Result<()> {
        self.run(&format!("ANALYZE {temp}")).await?;
        self.analysed.lock().expect("not poisoned").insert(temp);
        Ok(())
    }

    /// [`Self::analyse`], from a tenth of the sample: for a provisioning's
    /// set, whose statements join it hashed, so they want its size and
    /// little else. Its keys are unique and its pointers few: the whole
    /// sample of a set of 100,000 rows cost 90 ms, a tenth of it 17.
    async fn analyse_sampled(&self, temp: Scratch) -> Result<()> {
        let analyse = format!("ANALYZE {temp}");
        self.run(&with_setting("default_statistics_target", "10", &analyse))
            .await?;
        self.analysed.lock().expect("not poisoned").insert(temp);
        Ok(())
    }

    /// Plans the replicas in `_ms_r` against every pending note, and the
    /// changes kept for them while their snapshots streamed; the result is
    /// in `_ms_send` and `_ms_del`.
    pub async fn plan(&self) -> Result<Planned> {
        let (notes, deferred) = match self.rehearsing {
            true => (0, 0),
            false => (self.read_notes().await?, self.read_deferred().await?),
        };
        if self.blocks.any && notes > 0 {
            self.release_changed().await?;
        }
        let (deployed, removed) = self.deployment_rows().await?;
        if notes == 0 && deferred == 0 && deployed == 0 && !self.blocks.unsettled {
            return Ok(Planned::default());
        }
        self.groups_touched().await?;
        // Which tables changes and grants touched, read once for both steps.
        let touched = self.present(Scratch::Touched).await?;
        let granted = self.present(Scratch::Grant).await?;
        if self.ruled == Ruled::ByRule && notes > 0 {
            self.read_before(&touched).await?;
        }
        self.in_question(&touched, &granted).await?;
        let questioned = self.questioned_tables().await?;
        self.keep(&touched, &granted, &questioned).await?;
        let (sends, deletes) = self.difference().await?;
        Ok(Planned {
            notes,
            sends,
            deletes: deletes + removed,
        })
    }

    // ---- A deployment's chunk ----

    /// The chunk of a deployment this plan works through: the next rows of
    /// a table to plan again, as rows touched (and to send again, for a
    /// resend); or the next held rows of a removed table, as rows to take
    /// back, their parents' counts lowered. Returns (rows, of which taken
    /// back).
    async fn deployment_rows(&self) -> Result<(u64, u64)> {
        let Some((work, limit)) = self.deployment else {
            return Ok((0, 0));
        };
        match work {
            crate::store::deployment::Work::Plan {
                table,
                replan,
                resend,
                after,
            } => {
                let rows = self
                    .chunk_again(table, *replan, *resend, after.as_ref(), limit)
                    .await?;
                Ok((rows, 0))
            }
            crate::store::deployment::Work::Remove(removed) => {
                let rows = self.chunk_removed(removed, limit).await?;
                Ok((rows, rows))
            }
        }
    }

    /// The next `limit` rows of `table` after `after`, planned again as rows
    /// touched (`replan`) or waiting to be sent again as held
    /// (`_ms_chunk`). Returns how many.
    async fn chunk_again(
        &self,
        table: &'static str,
        replan: bool,
        resend: bool,
        after: Option<&serde_json::Value>,
        limit: i64,
    ) -> Result<u64> {
        let shape = self.graph.shape(table);
        let chunk = crate::store::deployment::chunk_sql(shape, after, limit);
        let last_order: Vec<String> = (0..shape.table.key.len())
            .map(|i| format!("c{i} DESC"))
            .collect();
        // Planned again: the rows are touched. Only sent again: they
        // wait in a table of their own for the difference's end.
        let (into, scratch) = match replan {
            true => (
                format!(
                    "INSERT INTO _ms_touched (t, k, resend) SELECT {}, k, {resend} FROM c
                     ON CONFLICT (t, k) DO UPDATE SET resend = _ms_touched.resend OR EXCLUDED.resend",
                    literal(table)
                ),
                Scratch::Touched,
            ),
            false => (
                "INSERT INTO _ms_chunk (k) SELECT k FROM c".to_string(),
                Scratch::Chunk,
            ),
        };
        let row = self
            .tx
            .query_one(
                &format!(
                    "WITH c AS MATERIALIZED ({chunk}), i AS ({into})
                     SELECT count(*), (SELECT k::text FROM c ORDER BY {last_order} LIMIT 1) FROM c",
                    last_order = last_order.join(", "),
                ),
                &[],
            )
            .await?;
        let rows = row.get::<_, i64>(0) as u64;
        self.filled.lock().expect("not poisoned").add(scratch, rows);
        if replan && rows > ANALYSE_ABOVE {
            self.analyse(Scratch::Touched).await?;
        }
        *self.worked.lock().expect("not poisoned") = crate::store::deployment::Worked {
            rows,
            last: row.get(1),
            done: (rows as i64) < limit,
        };
        Ok(rows)
    }

    /// The next `limit` rows the kept-up replicas are recorded holding of a
    /// table no longer declared, taken back; what they point at counts them
    /// no more. Returns how many.
    async fn chunk_removed(
        &self,
        removed: &crate::store::deployment::Removed,
        limit: i64,
    ) -> Result<u64> {
        let t = literal(&removed.name);
        let rows = self
            .fill(
                Scratch::Delete,
                &format!(
                    "INSERT INTO _ms_del (r, t, k, hptrs)
                     SELECT h.replica, h.table_name, h.key::jsonb, h.ptrs FROM sync.held h
                     WHERE h.table_name = {t}
                       AND h.replica = ANY (ARRAY (SELECT r FROM _ms_r WHERE NOT fresh))
                     LIMIT {limit}"
                ),
            )
            .await?;
        if rows > 0 && !removed.links.is_empty() {
            // The planner questions those parents below.
            let links: Vec<String> = removed
                .links
                .iter()
                .map(|(name, parent)| format!("({}, {})", literal(name), literal(parent)))
                .collect();
            self.run(&format!(
                "{LOOPS_ONLY}
                 UPDATE sync.held h SET refs = h.refs - x.n
                 FROM (SELECT d.r, l.p AS t, d.hptrs -> l.name AS k, count(*)::int AS n
                       FROM _ms_del d JOIN (VALUES {}) AS l (name, p) ON d.hptrs ? l.name
                       WHERE d.t = {t} GROUP BY 1, 2, 3) x
                 WHERE h.table_name = x.t AND h.key = x.k::text AND h.replica = x.r;
                 {LOOPS_AS_THEY_WERE}",
                links.join(", ")
            ))
            .await?;
        }
        if (rows as i64) < limit {
            // Nothing of it is held by a rule any more either.
            self.run(&format!(
                "DELETE FROM sync.left_to_rule WHERE table_name = {t}"
            ))
            .await?;
        }
        *self.worked.lock().expect("not poisoned") = crate::store::deployment::Worked {
            rows,
            last: None,
            done: (rows as i64) < limit,
        };
        Ok(rows)
    }

    /// The held parents of the removed rows this plan takes back: each may
    /// have been held for them alone.
    async fn question_removed_parents(&self) -> Result<u64> {
        let Some((crate::store::deployment::Work::Remove(removed), _)) = self.deployment else {
            return Ok(0);
        };
        let mut added = 0;
        for (name, parent) in &removed.links {
            let shape = self.graph.shape(parent);
            let link = literal(name);
            added += self
                .fill(
                    Scratch::Questioned,
                    &format!(
                        "INSERT INTO {Q_COLUMNS}
                 SELECT d.r, {p}, d.k, 0, n.ruled, true, cur.present,
                        h.version, h.ruled, h.ptrs, cur.ptrs, h.refs
                 FROM (SELECT DISTINCT d.r, d.hptrs -> {link} AS k FROM _ms_del d
                       WHERE d.t = {t} AND d.hptrs ? {link}) d
                 CROSS JOIN {replica}
                 CROSS JOIN {held}
                 {current}
                 CROSS JOIN LATERAL (SELECT cur.present AND {ruled} AS ruled) n
                 {QUESTION_AGAIN}",
                        p = literal(parent),
                        t = literal(&removed.name),
                        replica = replica_of("d.r"),
                        held = held_by(&literal(parent), "d.k", "d.r"),
                        current = self.current(shape, "d.k"),
                        ruled = Self::ruled(shape, "r"),
                    ),
                )
                .await?;
        }
        Ok(added)
    }

    /// Whether this plan's chunk is planned again and sent again to the
    /// replicas keeping its rows.
    fn resends(&self) -> bool {
        matches!(
            self.deployment,
            Some((
                crate::store::deployment::Work::Plan {
                    replan: true,
                    resend: true,
                    ..
                },
                _
            ))
        )
    }

    /// A chunk only sent again (the encoding changed, nothing else): each
    /// row to every kept-up replica holding it, as it holds it, but for the
    /// rows this plan sends or takes back already.
    async fn resend_chunk(&self) -> Result<u64> {
        let Some((
            crate::store::deployment::Work::Plan {
                table,
                replan: false,
                ..
            },
            _,
        )) = self.deployment
        else {
            return Ok(0);
        };
        if !self.has(Scratch::Chunk) {
            return Ok(0);
        }
        let t = literal(table);
        let mut planned = String::new();
        if self.has(Scratch::Send) {
            planned.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM _ms_send s WHERE s.r = h.replica AND s.t = {t} AND s.k = c.k)"
            ));
        }
        if self.has(Scratch::Delete) {
            planned.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM _ms_del d WHERE d.r = h.replica AND d.t = {t} AND d.k = c.k)"
            ));
        }
        self.bulk(
            Scratch::Send,
            &format!(
                "INSERT INTO _ms_send (r, t, k, version, held, ruled, ptrs, hptrs)
                 SELECT h.replica, {t}, c.k, h.version, true, h.ruled, h.ptrs, h.ptrs
                 FROM _ms_chunk c
                 CROSS JOIN LATERAL (SELECT h.replica, h.version, h.ruled, h.ptrs FROM sync.held h
                                     WHERE h.table_name = {t} AND h.key = c.k::text OFFSET 0) h
                 WHERE h.replica = ANY (ARRAY (SELECT r FROM _ms_r WHERE NOT fresh)){planned}"
            ),
        )
        .await
    }

    /// Whether a statement of this plan put rows in the planner table `temp`:
    /// a statement reading only an empty one is skipped.
    pub(crate) fn has(&self, temp: Scratch) -> bool {
        self.filled.lock().expect("not poisoned").has(temp)
    }

    /// The planner's tables this plan put rows in, with how many.
    pub fn filled(&self) -> Filled {
        self.filled.lock().expect("not poisoned").clone()
    }

    /// The planner's tables this plan analysed.
    pub fn analysed(&self) -> BTreeSet<Scratch> {
        self.analysed.lock().expect("not poisoned").clone()
    }

    /// The tables with rows in `temp`.
    async fn present(&self, temp: Scratch) -> Result<BTreeSet<String>> {
        if !self.has(temp) {
            return Ok(BTreeSet::new());
        }
        let sql = format!("SELECT DISTINCT t FROM {temp}");
        Ok(simple(self.tx, &sql).await?.0.into_iter().collect())
    }

    /// The tables with rows in round `round` of `temp`.
    async fn tables_in(&self, temp: Scratch, round: i32) -> Result<BTreeSet<String>> {
        let sql = format!("SELECT DISTINCT t FROM {temp} WHERE round = {round}");
        Ok(simple(self.tx, &sql).await?.0.into_iter().collect())
    }

    /// The tables with questioned rows its rule does not keep.
    async fn questioned_tables(&self) -> Result<BTreeSet<String>> {
        if !self.has(Scratch::Questioned) {
            return Ok(BTreeSet::new());
        }
        let sql = "SELECT DISTINCT t FROM _ms_q WHERE questioned AND NOT ruled";
        Ok(simple(self.tx, sql).await?.0.into_iter().collect())
    }

    // ---- Notes ----

    /// Every pending note this build can read, and per changed row its
    /// newest note.
    async fn read_notes(&self) -> Result<u64> {
        let notes = self
            .fill(
                Scratch::Notes,
                "INSERT INTO _ms_notes SELECT ctid, seq, table_name, key, xid
                 FROM sync.notes WHERE format = 1",
            )
            .await?;
        if notes == 0 {
            return Ok(0);
        }
        self.fill(
            Scratch::Changed,
            &format!(
                "INSERT INTO _ms_changed (t, k, last_seq)
             SELECT t, k, max(seq) FROM _ms_notes WHERE t IN ({}) GROUP BY t, k",
                self.declared_tables()
            ),
        )
        .await?;
        let changed = self
            .fill(
                Scratch::Touched,
                "INSERT INTO _ms_touched (t, k) SELECT t, k FROM _ms_changed",
            )
            .await?;
        if changed > ANALYSE_ABOVE {
            self.analyse(Scratch::Changed).await?;
            self.analyse(Scratch::Touched).await?;
        }
        Ok(notes)
    }

    /// What each changed row of a table whose rule reads its own columns
    /// was before the notes this pass read (`_ms_before`): the holders its
    /// rule gave it to then hold it, with no record row (decision 176). A
    /// note whose key or parents no longer fit its table cannot say what
    /// its row was: the reading, which casts nothing it cannot, refuses it
    /// as a data exception of its own (`sync.unfit`), and the pass parks it
    /// as it parks a note whose key the planner cannot cast, its key read
    /// by its record alone (`store::parked`).
    async fn read_before(&self, touched: &BTreeSet<String>) -> Result<()> {
        for shape in self.graph.shapes.iter().filter(|s| by_rule::readable(s)) {
            if !touched.contains(shape.table.name) {
                continue;
            }
            let t = literal(shape.table.name);
            let notes = format!(
                "n.ctid = ANY (ARRAY (SELECT at FROM _ms_notes WHERE t = {t})) AND n.table_name = {t}"
            );
            // How many keys it read, and how many of them its notes could
            // not say: the pass's closing counts those holders' sums again.
            let sql = format!(
                "WITH i AS (
                     INSERT INTO _ms_before (t, k, known, was, before, candidates)
                     SELECT {t}, key, known, was, before, candidates
                     FROM ({}) n
                     WHERE CASE WHEN {whole} OR {out} THEN false
                                WHEN fit THEN true
                                ELSE sync.unfit({t}) END
                     RETURNING known)
                 SELECT count(*), count(*) FILTER (WHERE NOT known) FROM i",
                by_rule::pending_among(self.graph, shape, &notes),
                whole = by_rule::recorded_whole(&t),
                out = by_rule::ruled_out(&t, "n.key"),
            );
            let row = match self.cached(&sql).await? {
                Some(statement) => self.tx.query_one(&statement, &[]).await?,
                None => self.tx.query_one(&sql, &[]).await?,
            };
            let (read, unknown): (i64, i64) = (row.get(0), row.get(1));
            let mut filled = self.filled.lock().expect("not poisoned");
            filled.add(Scratch::Before, read as u64);
            if unknown > 0 {
                filled.not_known();
            }
        }
        Ok(())
    }

    /// The declared tables, as SQL literals.
    pub(crate) fn declared_tables(&self) -> String {
        let names: Vec<String> = self
            .graph
            .shapes
            .iter()
            .map(|s| literal(s.table.name))
            .collect();
        names.join(", ")
    }

    /// The changes kept for replicas while their snapshots streamed
    /// (`sync.deferred`), now that they are kept up again: those whose
    /// transaction the snapshot did not see are changes of that replica's
    /// alone (`_ms_grant`, with their version); the others are in the
    /// snapshot, and only go. A cohort's were all seen by the view it was
    /// made from (`held::kept_as_seen`). Returns how many are planned.
    async fn read_deferred(&self) -> Result<u64> {
        let read = self
            .fill(
                Scratch::Deferred,
                "INSERT INTO _ms_deferred (at, r, t, k, seq, unseen)
                 SELECT d.ctid, d.replica, d.table_name, d.key, d.seq,
                        CASE WHEN x.id IS NULL THEN false
                             ELSE x.snapshot IS NULL OR NOT pg_visible_in_snapshot(d.xid, x.snapshot)
                        END
                 FROM sync.deferred d
                 LEFT JOIN sync.replicas x ON x.id = d.replica
                 WHERE d.replica = ANY (ARRAY (SELECT r FROM _ms_r WHERE NOT fresh))",
            )
            .await?;
        if read == 0 {
            return Ok(0);
        }
        self.fill(
            Scratch::Grant,
            &format!(
                "INSERT INTO _ms_grant (r, t, k, seq)
             SELECT r, t, k, seq FROM _ms_deferred WHERE unseen AND t IN ({})
             ON CONFLICT (r, t, k) DO UPDATE SET seq = greatest(_ms_grant.seq, EXCLUDED.seq)",
                self.declared_tables()
            ),
        )
        .await
    }

    /// The rows memberships and grants touched: a membership that came or
    /// went touches its member for every replica (for one replica, when it
    /// was kept for that replica alone); a group given or taken touches the
    /// group's members for that replica.
    async fn groups_touched(&self) -> Result<()> {
        let notes = self.has(Scratch::Notes);
        let deferred = self.has(Scratch::Deferred);
        for g in &self.groups {
            let t = literal(g.table.name);
            let members_table = literal(g.members_name);
            let grants_table = literal(g.grants_name);
            if notes {
                self.fill(
                    Scratch::Touched,
                    &format!(
                        "INSERT INTO _ms_touched (t, k)
                     SELECT DISTINCT {t}, n.k - 0 FROM _ms_notes n WHERE n.t = {members_table}
                     ON CONFLICT DO NOTHING"
                    ),
                )
                .await?;
            }
            if deferred {
                self.fill(Scratch::Grant, &format!(
                    "INSERT INTO _ms_grant (r, t, k, seq)
                     SELECT d.r, {t}, d.k - 0, max(d.seq) FROM _ms_deferred d
                     WHERE d.unseen AND d.t = {members_table} GROUP BY d.r, d.k - 0
                     ON CONFLICT (r, t, k) DO UPDATE SET seq = greatest(_ms_grant.seq, EXCLUDED.seq)"
                ))
                .await?;
            }
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
            let granted = |from: &str, only: &str| {
                format!(
                    "INSERT INTO _ms_grant (r, t, k)
                     SELECT DISTINCT r.r, {t}, m.k
                     FROM {from} n
                     CROSS JOIN {replica}
                     CROSS JOIN LATERAL (SELECT jsonb_build_array({members}) AS k FROM {rel} m
                                         WHERE m.{group} = (n.k->>1)::{ty} OFFSET 0) m
                     WHERE n.t = {grants_table} AND NOT r.fresh {only}
                     ON CONFLICT DO NOTHING",
                    replica = replica_of("n.k->>0"),
                    rel = g.members,
                    group = crate::sql::ident(group_col),
                    ty = g.group_type,
                )
            };
            if notes {
                self.fill(Scratch::Grant, &granted("_ms_notes", "")).await?;
            }
            if deferred {
                // A grant kept for a replica is its own only.
                self.fill(
                    Scratch::Grant,
                    &granted("_ms_deferred", "AND n.unseen AND n.r = r.r"),
                )
                .await?;
            }
        }
        Ok(())
    }

    // ---- What a row is now ----

    /// `LEFT JOIN LATERAL ... x ON true` and the columns `cur.present`,
    /// `cur.ptrs`: the row of `shape` keyed `key` as it is now, read by its
    /// key, and what it points at.
    fn current(&self, shape: &Shape, key: &str) -> String {
        format!(
            "LEFT JOIN {row} ON true
             CROSS JOIN LATERAL (SELECT x.{k0} IS NOT NULL AS present, {ptrs} AS ptrs) cur",
            row = row_by_key("x", shape, key),
            k0 = crate::sql::ident(shape.table.key[0]),
            ptrs = self.graph.pointers("x", shape.table.name),
        )
    }

    /// Whether the row `x` of `shape` goes to the replica `r` (a row of
    /// `_ms_r`) by its own rule, as an SQL expression that is never NULL.
    fn ruled(shape: &Shape, r: &str) -> String {
        match rule(shape.table, "x", r) {
            Some(cond) => format!("coalesce({cond}, false)"),
            None => "false".into(),
        }
    }

    // ---- 1. In question ----

    /// The rows in question, round by round.
    async fn in_question(
        &self,
        touched: &BTreeSet<String>,
        granted: &BTreeSet<String>,
    ) -> Result<()> {
        let mut first = 0;
        for shape in &self.graph.shapes {
            let name = shape.table.name;
            if touched.contains(name) {
                first += self.question_changed(shape).await?;
            }
            if granted.contains(name) {
                first += self.question_granted(shape).await?;
            }
        }
        if self.blocks.unsettled {
            first += self.question_unsettled().await?;
        }
        first += self.question_removed_parents().await?;
        if self.blocks.any && first > 0 {
            self.mark_blocked(0).await?;
        }
        if first > ANALYSE_ABOVE {
            self.analyse(Scratch::Questioned).await?;
        }
        if first == 0 || self.graph.links.is_empty() {
            return Ok(());
        }
        let mut round = 0;
        loop {
            let tables = self.tables_in(Scratch::Questioned, round).await?;
            if tables.is_empty() {
                return Ok(());
            }
            let mut added = 0;
            for link in self.graph.tracked() {
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
            if self.blocks.any {
                self.mark_blocked(round + 1).await?;
            }
            round += 1;
        }
    }

    /// What may have moved a held row this pass looks at: it is gone, its
    /// rule no longer sends it where it did, or the parent it follows
    /// changed. Over `h` (its record) and `n.ruled`, `cur`.
    fn moved(&self, shape: &Shape) -> String {
        let mut moved = "NOT cur.present OR (h.ruled AND NOT n.ruled)".to_string();
        if let Some(link) = self.graph.follows_link(shape.table.name) {
            let name = literal(&link.name);
            moved.push_str(&format!(
                " OR h.ptrs -> {name} IS DISTINCT FROM cur.ptrs -> {name}"
            ));
        }
        moved
    }

    /// Every holder's record of each changed row of `shape`: the row is read
    /// once, its holders looked up by `sync.held`'s key. With the rows a
    /// rule gives left to it, the holders that hold it by their rule alone
    /// too ([`Self::changed_by_rule`]), in the same statement: its branches
    /// are inserted one after the other, the record's first, so a holder
    /// both name is in question by its record (the second is a conflict,
    /// and nothing).
    async fn question_changed(&self, shape: &Shape) -> Result<u64> {
        let mut questioned = vec![format!(
            "SELECT h.replica, c.t, c.k, 0, n.ruled, {moved}, cur.present,
                    h.version, h.ruled, h.ptrs, cur.ptrs, h.refs
             FROM _ms_touched c
             {current}
             CROSS JOIN LATERAL (SELECT h.replica, h.version, h.ruled, h.ptrs, h.refs FROM sync.held h
                                 WHERE h.table_name = c.t AND h.key = c.k::text OFFSET 0) h
             CROSS JOIN {replica}
             CROSS JOIN LATERAL (SELECT cur.present AND {ruled} AS ruled) n
             WHERE c.t = {t} AND NOT r.fresh",
            moved = self.moved(shape),
            replica = replica_of("h.replica"),
            current = self.current(shape, "c.k"),
            ruled = Self::ruled(shape, "r"),
            t = literal(shape.table.name),
        )];
        if self.ruled == Ruled::ByRule && by_rule::readable(shape) {
            questioned.extend(self.changed_by_rule(shape).into_iter().flatten());
        }
        self.fill(
            Scratch::Questioned,
            &format!(
                "INSERT INTO {Q_COLUMNS} {} ON CONFLICT DO NOTHING",
                questioned.join(" UNION ALL ")
            ),
        )
        .await
    }

    /// The holders of each changed row of `shape` that hold it by their
    /// rule alone, with no record row (decision 176), as rows for `_ms_q`:
    /// those its rule gave the row to as it was before the pass's notes
    /// (`_ms_before`), unless it is held back from them, or a change was
    /// kept for them while their snapshot streamed (their record says what
    /// they hold until it is planned). What their version points at is
    /// what the row pointed at then.
    ///
    /// A key whose notes cannot say what it was (two rows sharing it for a
    /// while under a deferrable key) is put in question for every holder
    /// any of its notes' `parents` gives it to, pointing at nothing: sent
    /// again or taken back, never left stale, though the parents it pointed
    /// at keep counting it.
    fn changed_by_rule(&self, shape: &Shape) -> Option<[String; 2]> {
        let gave = crate::graph::rule(shape.table, "p", "r")?;
        // Each holder `r` found, with the row as it is now, unless held
        // back from it or kept for it while its snapshot streamed.
        let rest = format!(
            "{current}
             CROSS JOIN LATERAL (SELECT cur.present AND {ruled} AS ruled) n
             WHERE c.t = {t} AND NOT r.fresh AND NOT {kept}{unblocked}{unreleased}",
            current = self.current(shape, "c.k"),
            ruled = Self::ruled(shape, "r"),
            t = literal(shape.table.name),
            kept = kept_for("r.r", "c.t", "c.k"),
            unblocked = self.unblocked("r.r", "c.t", "c.k"),
            unreleased = self.unreleased("r.r", "c.t", "c.k"),
        );
        // The keys whose notes say what they were, and those whose notes
        // cannot (their candidates).
        Some([
            format!(
                "SELECT r.r, c.t, c.k, 0, n.ruled, {moved}, cur.present,
                        0, true, h.ptrs, cur.ptrs, 0
                 FROM _ms_touched c
                 JOIN _ms_before b ON b.t = c.t AND b.k = c.k AND b.known AND b.was
                 CROSS JOIN LATERAL {before}
                 CROSS JOIN LATERAL (SELECT r.r, r.part, r.fresh, r.kind FROM _ms_r r
                                     WHERE {gave} OFFSET 0) r
                 CROSS JOIN LATERAL (SELECT true AS ruled, {ptrs} AS ptrs) h
                 {rest}",
                moved = self.moved(shape),
                before = by_rule::before_row(self.graph, shape, "b.before", "p"),
                ptrs = self.graph.pointers("p", shape.table.name),
            ),
            format!(
                "SELECT r.r, c.t, c.k, 0, n.ruled, true, cur.present, 0, true, NULL, cur.ptrs, 0
                 FROM _ms_touched c
                 JOIN _ms_before b ON b.t = c.t AND b.k = c.k AND NOT b.known
                 CROSS JOIN LATERAL (SELECT DISTINCT r.r, r.part, r.fresh, r.kind
                                     FROM jsonb_array_elements(b.candidates) e
                                     CROSS JOIN LATERAL {candidate}
                                     JOIN _ms_r r ON {gave} OFFSET 0) r
                 {rest}",
                candidate = by_rule::before_row(self.graph, shape, "e.value", "p"),
            ),
        ])
    }

    /// The record of each row whose group was given to or taken from its
    /// replica, when the replica holds it.
    async fn question_granted(&self, shape: &Shape) -> Result<u64> {
        self.fill(
            Scratch::Questioned,
            &format!(
                "INSERT INTO {Q_COLUMNS}
             SELECT c.r, c.t, c.k, 0, n.ruled, {moved}, cur.present,
                    h.version, h.ruled, h.ptrs, cur.ptrs, h.refs
             FROM _ms_grant c
             CROSS JOIN {replica}
             CROSS JOIN {held}
             {current}
             CROSS JOIN LATERAL (SELECT cur.present AND {ruled} AS ruled) n
             WHERE c.t = {t} AND NOT r.fresh
             ON CONFLICT DO NOTHING",
                moved = self.moved(shape),
                replica = replica_of("c.r"),
                held = held_by("c.t", "c.k", "c.r"),
                current = self.current(shape, "c.k"),
                ruled = Self::ruled(shape, "r"),
                t = literal(shape.table.name),
            ),
        )
        .await
    }

    /// The held parents that rows of `link`'s child in round `round` may no
    /// longer hold up: every parent the held version of a questioned row
    /// points at, and the parent a changed row no longer points at.
    async fn question_parents(&self, link: &Link, round: i32) -> Result<u64> {
        let parent = self.graph.shape(link.parent.name);
        let name = literal(&link.name);
        self.fill(
            Scratch::Questioned,
            &format!(
                "INSERT INTO {Q_COLUMNS}
             SELECT d.r, {p}, d.k, {next}, n.ruled, true, cur.present,
                    h.version, h.ruled, h.ptrs, cur.ptrs, h.refs
             FROM (SELECT DISTINCT q.r, q.hptrs -> {name} AS k FROM _ms_q q
                   WHERE q.t = {c} AND q.round = {round} AND q.hptrs ? {name}
                     AND ((q.questioned AND NOT q.ruled)
                          OR q.hptrs -> {name} IS DISTINCT FROM q.cptrs -> {name})) d
             CROSS JOIN {replica}
             CROSS JOIN {held}
             {current}
             CROSS JOIN LATERAL (SELECT cur.present AND {ruled} AS ruled) n
             {QUESTION_AGAIN}",
                p = literal(link.parent.name),
                c = literal(link.child.name),
                next = round + 1,
                replica = replica_of("d.r"),
                held = self.held_by(parent, "d.k", "d.r"),
                current = self.current(parent, "d.k"),
                ruled = Self::ruled(parent, "r"),
            ),
        )
        .await
    }

    /// The held followers, through `link`, of the questioned rows of round
    /// `round` of its parent: they go if their parent goes. Found through
    /// the index on the child's following columns the start-up check
    /// requires.
    async fn question_followers(&self, link: &Link, round: i32) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        self.fill(
            Scratch::Questioned,
            &format!(
                "INSERT INTO {Q_COLUMNS}
             SELECT DISTINCT ON (q.r, a.k) q.r, {c}, a.k, {next}, false, true, true,
                    h.version, h.ruled, h.ptrs, a.ptrs, h.refs
             FROM _ms_q q
             CROSS JOIN LATERAL (SELECT {ck} AS k, {ptrs} AS ptrs FROM {rel} a
                                 WHERE {points} OFFSET 0) a
             CROSS JOIN {held}
             WHERE q.t = {p} AND q.round = {round} AND q.questioned AND NOT q.ruled
             {QUESTION_AGAIN}",
                p = literal(link.parent.name),
                next = round + 1,
                ck = key_json("a", link.child),
                ptrs = self.graph.pointers("a", link.child.name),
                rel = child.relation,
                points = link.points_at("a", "q.k"),
                held = self.held_by(child, "a.k", "q.r"),
            ),
        )
        .await
    }

    // ---- 2. Kept ----

    /// The rows kept, round by round.
    async fn keep(
        &self,
        touched: &BTreeSet<String>,
        granted: &BTreeSet<String>,
        questioned: &BTreeSet<String>,
    ) -> Result<()> {
        let mut first = 0;
        if self.has(Scratch::Questioned) {
            first += self.keep_repointed().await?;
        }
        for shape in &self.graph.shapes {
            let name = shape.table.name;
            if touched.contains(name) {
                first += self.keep_by_rule(shape, Scratch::Touched).await?;
            }
            if granted.contains(name) {
                first += self.keep_by_rule(shape, Scratch::Grant).await?;
            }
        }
        if !questioned.is_empty() {
            first += self.keep_pointed_at().await?;
        }
        for link in self.graph.links.iter().filter(|l| l.follows) {
            if questioned.contains(link.child.name) {
                first += self.keep_following_questioned(link).await?;
            }
            if touched.contains(link.child.name) {
                first += self.keep_following_changed(link, Scratch::Touched).await?;
            }
            if granted.contains(link.child.name) {
                first += self.keep_following_changed(link, Scratch::Grant).await?;
            }
        }
        if first > ANALYSE_ABOVE {
            self.analyse(Scratch::Kept).await?;
        }
        if first == 0 || self.graph.links.is_empty() {
            return Ok(());
        }
        let mut round = 0;
        loop {
            let tables = self.tables_in(Scratch::Kept, round).await?;
            if tables.is_empty() {
                return Ok(());
            }
            let mut added = 0;
            for link in self.graph.tracked() {
                let parent_complete = matches!(link.parent.rule, Rule::All);
                if tables.contains(link.child.name) && !parent_complete {
                    added += self.keep_parents(link, round, questioned).await?;
                }
                if link.follows && tables.contains(link.parent.name) {
                    added += self.keep_followers(link, round, questioned).await?;
                }
            }
            if added == 0 {
                return Ok(());
            }
            round += 1;
        }
    }

    /// Held rows that stay but point elsewhere now: their new parents are
    /// looked at in the rounds.
    async fn keep_repointed(&self) -> Result<u64> {
        self.fill(
            Scratch::Kept,
            &format!(
                "INSERT INTO {K_COLUMNS}
             SELECT r, t, k, 0, true, false, ruled, cptrs, hptrs, hruled, version FROM _ms_q
             WHERE (ruled OR NOT questioned) AND cptrs IS DISTINCT FROM hptrs
             ON CONFLICT DO NOTHING"
            ),
        )
        .await
    }

    /// Rows a replica lacks that its rules send it, among the rows that
    /// changed (for every replica) or whose group moved (for that replica).
    async fn keep_by_rule(&self, shape: &Shape, from: Scratch) -> Result<u64> {
        let Some(cond) = rule(shape.table, "a", "r") else {
            return Ok(0);
        };
        let t = literal(shape.table.name);
        let replicas = if from == Scratch::Grant {
            format!("CROSS JOIN {}", replica_of("c.r"))
        } else {
            "CROSS JOIN _ms_r r".to_string()
        };
        self.fill(
            Scratch::Kept,
            &format!(
                "INSERT INTO {K_COLUMNS}
             SELECT r.r, {t}, c.k, 0, false, false, true, {ptrs}, NULL, NULL, NULL
             FROM {from} c
             CROSS JOIN {row}
             {replicas}
             WHERE c.t = {t} AND NOT r.fresh AND {cond}
               AND NOT {held}{unblocked}
             ON CONFLICT DO NOTHING",
                held = in_question("r.r", &t, "c.k", ""),
                unblocked = self.unblocked("r.r", &t, "c.k"),
                ptrs = self.graph.pointers("a", shape.table.name),
                row = row_by_key("a", shape, "c.k"),
            ),
        )
        .await
    }

    /// Questioned rows that rows the replica keeps still point at: the
    /// record counts what points at a row (`refs`); the rows in question
    /// take away what their held versions point at, and a row that stays
    /// but points elsewhere now moves its count to its new parents. What
    /// rows kept in the rounds point at is added there.
    async fn keep_pointed_at(&self) -> Result<u64> {
        let Some(links) = self.graph.tracked_values() else {
            return Ok(0);
        };
        self.bulk(
            Scratch::Kept,
            &format!(
                "INSERT INTO {K_COLUMNS}
             SELECT q.r, q.t, q.k, 0, true, true, q.ruled, q.cptrs, q.hptrs, q.hruled, q.version
             FROM _ms_q q
             LEFT JOIN (
                 SELECT a.r, a.t, a.k, sum(a.n) AS n FROM (
                     SELECT q.r, l.p AS t, q.hptrs -> l.name AS k, -1 AS n
                     FROM _ms_q q JOIN {links} ON l.c = q.t
                     WHERE q.hptrs ? l.name
                       AND ((q.questioned AND NOT q.ruled)
                            OR q.hptrs -> l.name IS DISTINCT FROM q.cptrs -> l.name)
                     UNION ALL
                     SELECT q.r, l.p, q.cptrs -> l.name, 1
                     FROM _ms_q q JOIN {links} ON l.c = q.t
                     WHERE q.cptrs ? l.name AND (q.ruled OR NOT q.questioned)
                       AND q.hptrs -> l.name IS DISTINCT FROM q.cptrs -> l.name
                 ) a GROUP BY a.r, a.t, a.k
             ) x ON x.r = q.r AND x.t = q.t AND x.k = q.k
             WHERE q.questioned AND NOT q.ruled AND q.present AND q.refs + coalesce(x.n, 0) > 0
             ON CONFLICT DO NOTHING"
            ),
        )
        .await
    }

    /// Questioned rows of `link`'s child that follow a parent the replica
    /// holds and keeps without question.
    async fn keep_following_questioned(&self, link: &Link) -> Result<u64> {
        let p = literal(link.parent.name);
        let name = literal(&link.name);
        self.fill(
            Scratch::Kept,
            &format!(
                "INSERT INTO {K_COLUMNS}
             SELECT q.r, q.t, q.k, 0, true, true, q.ruled, q.cptrs, q.hptrs, q.hruled, q.version
             FROM _ms_q q
             WHERE q.t = {c} AND q.questioned AND NOT q.ruled AND q.present AND q.cptrs ? {name}
               AND {held}
               AND NOT {questioned}
             ON CONFLICT DO NOTHING",
                c = literal(link.child.name),
                held = self.is_held(
                    self.graph.shape(link.parent.name),
                    &format!("q.cptrs -> {name}"),
                    "q.r"
                ),
                questioned = in_question(
                    "q.r",
                    &p,
                    &format!("q.cptrs -> {name}"),
                    " AND q2.questioned AND NOT q2.ruled"
                ),
            ),
        )
        .await
    }

    /// Changed rows of `link`'s child a replica lacks that follow a parent it
    /// holds and keeps without question: from the rows changed for every
    /// replica (`_ms_touched`), the parent's holders, looked up; from the
    /// rows changed for one (`_ms_grant`), whether it holds the parent.
    async fn keep_following_changed(&self, link: &Link, from: Scratch) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        let p = literal(link.parent.name);
        let ptr = link.pointer("a");
        let parent = self.graph.shape(link.parent.name);
        let holders = if from == Scratch::Grant {
            format!(
                "CROSS JOIN LATERAL (SELECT c.r AS replica WHERE {}) h",
                self.is_held(parent, &ptr, "c.r")
            )
        } else {
            let by_rule = match self.held_by_rule(parent, &ptr, "") {
                Some(by_rule) => format!(" UNION SELECT byr.r FROM ({by_rule}) byr"),
                None => String::new(),
            };
            format!(
                "CROSS JOIN LATERAL ((SELECT h.replica FROM sync.held h
                                      WHERE h.table_name = {p} AND h.key = ({ptr})::text OFFSET 0){by_rule}) h"
            )
        };
        self.fill(
            Scratch::Kept,
            &format!(
                "INSERT INTO {K_COLUMNS}
             SELECT h.replica, {c}, c.k, 0, false, false, false, {ptrs}, NULL, NULL, NULL
             FROM {from} c
             CROSS JOIN {row}
             {holders}
             CROSS JOIN {replica}
             WHERE c.t = {c} AND NOT r.fresh
               AND NOT {held}
               AND NOT {questioned}{unblocked}
             ON CONFLICT DO NOTHING",
                unblocked = self.unblocked("h.replica", &c, "c.k"),
                replica = replica_of("h.replica"),
                held = in_question("h.replica", &c, "c.k", ""),
                questioned =
                    in_question("h.replica", &p, &ptr, " AND q2.questioned AND NOT q2.ruled"),
                ptrs = self.graph.pointers("a", link.child.name),
                row = row_by_key("a", child, "c.k"),
            ),
        )
        .await
    }

    /// The parents, through `link`, of the rows kept in round `round`: those
    /// the replica lacks, and those in question.
    async fn keep_parents(
        &self,
        link: &Link,
        round: i32,
        questioned: &BTreeSet<String>,
    ) -> Result<u64> {
        let parent = self.graph.shape(link.parent.name);
        let p = literal(link.parent.name);
        let name = literal(&link.name);
        let pointed = format!(
            "(SELECT DISTINCT n.r, n.ptrs -> {name} AS k FROM _ms_k n
              WHERE n.t = {c} AND n.round = {round} AND n.ptrs ? {name}) d",
            c = literal(link.child.name),
        );
        let next = round + 1;
        let mut added = self
            .fill(
                Scratch::Kept,
                &format!(
                    "INSERT INTO {K_COLUMNS}
                 SELECT d.r, {p}, d.k, {next}, false, false, {ruled}, {ptrs}, NULL, NULL, NULL
                 FROM {pointed}
                 CROSS JOIN {replica}
                 CROSS JOIN {row}
                 WHERE NOT {held}{unblocked}
                 ON CONFLICT DO NOTHING",
                    unblocked = self.unblocked("d.r", &p, "d.k"),
                    replica = replica_of("d.r"),
                    ruled = Self::ruled(parent, "r"),
                    ptrs = self.graph.pointers("x", link.parent.name),
                    row = row_by_key("x", parent, "d.k"),
                    held = self.is_held(parent, "d.k", "d.r"),
                ),
            )
            .await?;
        if questioned.contains(link.parent.name) {
            added += self
                .fill(Scratch::Kept, &format!(
                    "INSERT INTO {K_COLUMNS}
                     SELECT q.r, q.t, q.k, {next}, true, true, q.ruled, q.cptrs, q.hptrs, q.hruled, q.version
                     FROM {pointed}
                     CROSS JOIN {q}
                     ON CONFLICT DO NOTHING",
                    q = questioned_row("d.r", &p, "d.k", self.present_only()),
                ))
                .await?;
        }
        Ok(added)
    }

    /// The followers, through `link`, of the rows kept in round `round` that
    /// the replica lacked or that were in question: those it lacks, and
    /// those in question. (A row it keeps without question keeps the
    /// followers it holds; the changed ones it lacks came in the first
    /// round.)
    async fn keep_followers(
        &self,
        link: &Link,
        round: i32,
        questioned: &BTreeSet<String>,
    ) -> Result<u64> {
        let child = self.graph.shape(link.child.name);
        let c = literal(link.child.name);
        let p = literal(link.parent.name);
        let next = round + 1;
        let followers = format!(
            "CROSS JOIN LATERAL (SELECT {ck} AS k, {ptrs} AS ptrs FROM {rel} a
                                 WHERE {points} OFFSET 0) a",
            ck = key_json("a", link.child),
            ptrs = self.graph.pointers("a", link.child.name),
            rel = child.relation,
            points = link.points_at("a", "n.k"),
        );
        let mut added = self
            .fill(
                Scratch::Kept,
                &format!(
                    "INSERT INTO {K_COLUMNS}
                 SELECT n.r, {c}, a.k, {next}, false, false, false, a.ptrs, NULL, NULL, NULL
                 FROM _ms_k n
                 {followers}
                 WHERE n.t = {p} AND n.round = {round} AND (NOT n.held OR n.questioned)
                   AND NOT {held}{unblocked}
                 ON CONFLICT DO NOTHING",
                    held = self.is_held(child, "a.k", "n.r"),
                    unblocked = self.unblocked("n.r", &c, "a.k"),
                ),
            )
            .await?;
        if questioned.contains(link.child.name) {
            added += self
                .fill(Scratch::Kept, &format!(
                    "INSERT INTO {K_COLUMNS}
                     SELECT q.r, q.t, q.k, {next}, true, true, q.ruled, q.cptrs, q.hptrs, q.hruled, q.version
                     FROM _ms_k n
                     {followers}
                     CROSS JOIN {q}
                     WHERE n.t = {p} AND n.round = {round} AND n.questioned
                     ON CONFLICT DO NOTHING",
                    q = questioned_row("n.r", &c, "a.k", self.present_only()),
                ))
                .await?;
        }
        Ok(added)
    }

    // ---- 3. The difference ----

    /// Kept rows a replica lacks, or holds at an older version or for other
    /// reasons than now, go in `_ms_send`; the rows that stay without
    /// question are sent again when they changed; questioned rows not kept go
    /// in `_ms_del`. Returns (sends, deletes).
    async fn difference(&self) -> Result<(u64, u64)> {
        // The newest change of each row the plan looks at, for each replica:
        // a note pending for every replica, or a change kept for it alone.
        // A deployment's resend sends every row of its chunk again to each
        // replica keeping it.
        let resends = self.resends();
        let again = if resends {
            " OR coalesce(tt.resend, false)"
        } else {
            ""
        };
        let newest = |r: &str| {
            let resend = if resends {
                format!("LEFT JOIN _ms_touched tt ON tt.t = {r}.t AND tt.k = {r}.k")
            } else {
                String::new()
            };
            format!(
                "LEFT JOIN _ms_changed ch ON ch.t = {r}.t AND ch.k = {r}.k
                 LEFT JOIN _ms_grant g ON g.r = {r}.r AND g.t = {r}.t AND g.k = {r}.k
                 CROSS JOIN LATERAL (SELECT greatest(coalesce(ch.last_seq, 0), coalesce(g.seq, 0)) AS seq) v
                 {resend}"
            )
        };
        let mut sends = 0;
        // Each re-recording goes with the statement beside it, pipelined:
        // no round trip of its own.
        if self.has(Scratch::Kept) {
            let send = format!(
                "INSERT INTO _ms_send (r, t, k, version, held, ruled, ptrs, hptrs)
                 SELECT k.r, k.t, k.k, greatest(coalesce(k.version, 0), v.seq),
                        k.held, k.ruled, k.ptrs, k.hptrs
                 FROM _ms_k k
                 {}
                 WHERE NOT k.held OR k.version < v.seq{again}
                    OR k.ptrs IS DISTINCT FROM k.hptrs",
                newest("k")
            );
            let rerecord = format!(
                "UPDATE sync.held h SET ruled = x.ruled
                 FROM (SELECT k.r, k.t, k.k::text AS k, k.ruled FROM _ms_k k
                       {}
                       WHERE k.held AND NOT (k.version < v.seq{again})
                         AND k.ptrs IS NOT DISTINCT FROM k.hptrs
                         AND k.ruled IS DISTINCT FROM k.hruled OFFSET 0) x
                 WHERE h.replica = x.r AND h.table_name = x.t AND h.key = x.k",
                newest("k")
            );
            let (sent, ()) =
                tokio::try_join!(self.bulk(Scratch::Send, &send), self.rerecord(&rerecord))?;
            sends += sent;
        }
        let mut deletes = 0;
        if self.has(Scratch::Questioned) {
            let send = format!(
                "INSERT INTO _ms_send (r, t, k, version, held, ruled, ptrs, hptrs)
                 SELECT q.r, q.t, q.k, greatest(q.version, v.seq), true, q.ruled, q.cptrs, q.hptrs
                 FROM _ms_q q
                 {}
                 WHERE (q.ruled OR NOT q.questioned)
                   AND (q.version < v.seq{again})
                   AND NOT EXISTS (SELECT 1 FROM _ms_k k WHERE k.r = q.r AND k.t = q.t AND k.k = q.k)",
                newest("q")
            );
            let rerecord = format!(
                "UPDATE sync.held h SET ruled = x.ruled
                 FROM (SELECT q.r, q.t, q.k::text AS k, q.ruled FROM _ms_q q
                       {}
                       WHERE (q.ruled OR NOT q.questioned) AND q.ruled <> q.hruled
                         AND NOT (q.version < v.seq{again})
                         AND NOT EXISTS (SELECT 1 FROM _ms_k k WHERE k.r = q.r AND k.t = q.t AND k.k = q.k)
                       OFFSET 0) x
                 WHERE h.replica = x.r AND h.table_name = x.t AND h.key = x.k",
                newest("q")
            );
            let (sent, ()) =
                tokio::try_join!(self.bulk(Scratch::Send, &send), self.rerecord(&rerecord))?;
            sends += sent;
            deletes = self
                .bulk(
                    Scratch::Delete,
                    "INSERT INTO _ms_del (r, t, k, hptrs)
                     SELECT q.r, q.t, q.k, q.hptrs FROM _ms_q q
                     WHERE q.questioned AND NOT q.ruled
                       AND NOT EXISTS (SELECT 1 FROM _ms_k k WHERE k.r = q.r AND k.t = q.t AND k.k = q.k)",
                )
                .await?;
        }
        sends += self.resend_chunk().await?;
        if sends > ANALYSE_ABOVE {
            self.analyse(Scratch::Send).await?;
        }
        Ok((sends, deletes))
    }

    /// Records, by `sql`, why a replica holds rows it keeps as they are;
    /// a rehearsal records nothing.
    async fn rerecord(&self, sql: &str) -> Result<()> {
        if !self.rehearsing {
            self.run(sql).await?;
        }
        Ok(())
    }

    // ---- Provisioning from scratch ----

    /// The whole wanted set of every replica provisioned from scratch, in
    /// `_ms_f`: the rows its rules send it, then a round at a time the
    /// parents and the followers of the rows the last round added. Each row
    /// is stored with what it points at (`ptrs`, by link), read as the row
    /// is, so a parent round never reads the child table again. The table
    /// has no index: rounds add rows in bulk, each row once (an anti-join
    /// against what is already there), and PostgreSQL hashes.
    pub async fn provision(&self) -> Result<u64> {
        let (mut total, mut filled, mut current) = self.provision_by_rules().await?;
        let mut round = 0;
        let mut added = total;
        loop {
            if added > ANALYSE_ABOVE {
                self.analyse_sampled(Scratch::Fresh).await?;
            }
            if added == 0 {
                return Ok(total);
            }
            added = 0;
            let mut next: Round<'_> = BTreeMap::new();
            for (i, link) in self.graph.links.iter().enumerate() {
                // Every row of an `all` table is there from the first round;
                // rows that came as followers through this very link have
                // their parent there already.
                let parent_complete = matches!(link.parent.rule, Rule::All);
                let only_followers_of_it = current
                    .get(link.child.name)
                    .is_some_and(|how| how.len() == 1 && how.contains(&Some(i)));
                // The first round's rows are its rules': where the child's
                // rule implies the parent's, their parents are there.
                let parents_ruled = round == 0 && self.graph.implied(link);
                if current.contains_key(link.child.name)
                    && !parent_complete
                    && !only_followers_of_it
                    && !parents_ruled
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

    /// The first round of a provisioning: every row a rule gives a fresh
    /// replica. Returns the rows added, the tables with rows in `_ms_f`
    /// (a follower round into a table that has none needs no check against
    /// what is already there), and the tables with rows in the round, each
    /// with how its rows came: by a rule or as parents (`None`), or as
    /// followers through a link. Counted as the rounds add rows, rather
    /// than read back from `_ms_f`, which would mean a scan of it per round.
    async fn provision_by_rules(&self) -> Result<(u64, BTreeSet<&str>, Round<'_>)> {
        let mut total = 0;
        let mut filled: BTreeSet<&str> = BTreeSet::new();
        let mut current: Round<'_> = BTreeMap::new();
        for shape in &self.graph.shapes {
            let Some(cond) = rule(shape.table, "a", "r") else {
                continue;
            };
            if self.ruled_out.contains(shape.table.name) {
                continue;
            }
            filled.insert(shape.table.name);
            let n = self
                .bulk(
                    Scratch::Fresh,
                    &format!(
                        "INSERT INTO _ms_f (r, t, k, round, ptrs)
                     SELECT r.r, {t}, {key}, 0, {ptrs}
                     FROM {rel} a JOIN _ms_r r ON r.fresh AND {cond}{unblocked}",
                        unblocked = self.unblocked(
                            "r.r",
                            &literal(shape.table.name),
                            &key_json("a", shape.table)
                        ),
                        t = literal(shape.table.name),
                        key = key_json("a", shape.table),
                        ptrs = self.graph.pointers("a", shape.table.name),
                        rel = shape.relation,
                    ),
                )
                .await?;
            if n > 0 {
                current.entry(shape.table.name).or_default().insert(None);
            }
            total += n;
        }
        Ok((total, filled, current))
    }

    async fn provision_parents(&self, index: usize, link: &Link, round: i32) -> Result<u64> {
        let parent = self.graph.shape(link.parent.name);
        let p = literal(link.parent.name);
        let name = literal(&link.name);
        // Each parent is read by its key; what is there already is hashed.
        self.bulk(Scratch::Fresh, &format!(
            "INSERT INTO _ms_f (r, t, k, round, ptrs)
             SELECT x.r, {p}, x.ptr, {next}, a.ptrs
             FROM (SELECT DISTINCT n.r, n.ptrs -> {name} AS ptr FROM _ms_f n
                   WHERE n.t = {c} AND n.round = {round} AND n.ptrs ? {name}
                     AND n.via <> {index}) x
             CROSS JOIN LATERAL (SELECT {ptrs} AS ptrs FROM {rel} a WHERE {m} OFFSET 0) a
             WHERE NOT EXISTS (SELECT 1 FROM _ms_f f WHERE f.r = x.r AND f.t = {p} AND f.k = x.ptr){unblocked}",
            unblocked = self.unblocked("x.r", &p, "x.ptr"),
            c = literal(link.child.name),
            next = round + 1,
            ptrs = self.graph.pointers("a", link.parent.name),
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
        self.bulk(
            Scratch::Fresh,
            &format!(
                "INSERT INTO _ms_f (r, t, k, round, ptrs, via)
             SELECT n.r, {c}, {ck}, {next}, {ptrs}, {index}
             FROM _ms_f n JOIN {rel} a ON {points}
             WHERE n.t = {p} AND n.round = {round} {new}{unblocked}",
                unblocked = self.unblocked("n.r", &c, &ck),
                p = literal(link.parent.name),
                next = round + 1,
                ptrs = self.graph.pointers("a", link.child.name),
                rel = child.relation,
                points = link.points_at("a", "n.k"),
            ),
        )
        .await
    }
}

/// Runs statements without parameters in a single round trip (the simple
/// query protocol; the extended one prepares first, a round trip of its own).
/// Returns the first column of the rows they returned, and how many rows
/// they returned or changed.
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
            // Settings sent beside a statement (`HASH_ONLY`) count none.
            SimpleQueryMessage::CommandComplete(n) => count += n,
            _ => {}
        }
    }
    Ok((values, count))
}

/// Fills a snapshot worker's `_ms_changed` with the newest note its
/// snapshot sees of each changed row of a declared table: the versions its
/// rows are recorded at.
pub(crate) async fn changed_for_snapshot(tx: &Transaction<'_>, graph: &Graph) -> Result<()> {
    let names: Vec<String> = graph.shapes.iter().map(|s| literal(s.table.name)).collect();
    tx.batch_execute(&format!(
        "INSERT INTO _ms_changed (t, k, last_seq)
         SELECT table_name, key, max(seq) FROM sync.notes
         WHERE format = 1 AND table_name IN ({}) GROUP BY table_name, key",
        names.join(", ")
    ))
    .await?;
    Ok(())
}

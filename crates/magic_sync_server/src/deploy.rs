//! Deploying changed declarations without provisioning anyone again.
//!
//! A relay starting compares what this build declares with what the last
//! one recorded in `sync.tables`, table by table, by two fingerprints
//! ([`Schema::plan_print`] and [`TableSchema::encoding_print`]): what
//! decides which replicas hold which rows, and how the rows are encoded.
//!
//! - Both equal: the table is reused. Nothing of it is read or sent.
//! - A table new to the sync, or one whose rule or links changed: its rows
//!   are planned again, a chunk a pass, against what each replica is
//!   recorded holding. Only the difference travels: rows that now belong go
//!   with their parents, rows that no longer belong are taken back unless
//!   something still points at them.
//! - The encoding changed (a column added, a codec swapped): the same,
//!   and every row a replica keeps is sent to it again.
//! - A table no longer declared: its rows are taken back from every
//!   replica, read from the record alone; the host's table is not read.
//! - The key changed: nothing recorded can be matched with the rows as
//!   they are keyed now, so the replicas holding the table are provisioned
//!   again, and the others have it planned.
//!
//! What is owed is written to `sync.deployment` in the same transaction as
//! the new fingerprints, so a relay stopped at any point goes on where the
//! last one stopped (each table keeps the key of the last row worked
//! through). The passes work through it beside the notes
//! (`store/deployment.rs`). [`dry_run`] says all this before anything
//! changes.

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::Result;
use crate::graph::Graph;
use crate::sql::qualified;
use crate::store;
use crate::store::by_rule::OldRule;
pub(crate) use crate::store::deployment::Declared;
pub use crate::store::deployment::Progress;
use crate::store::tables::Recorded;
use magic_sync_core::schema::{Schema, TableSchema};
use std::collections::BTreeMap;
use std::fmt;
use tokio_postgres::Client;

/// What a deployment does with one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// New to the sync: its rows are planned for every replica.
    Add,
    /// Its rule or links changed: planned again; only the difference goes.
    Replan,
    /// How its rows are encoded changed, and nothing that decides which
    /// replicas hold them: sent again, as they are held, to their holders.
    Resend,
    /// Its rule or links and its encoding changed: planned again, and sent
    /// again to every replica that keeps them.
    Reshape,
    /// No longer declared, or no longer sent down: its rows are taken back
    /// from every replica, read from the record alone.
    Remove,
    /// Its key changed: the replicas holding its rows are provisioned again.
    Rebuild,
}

impl Action {
    /// The word the summary and `sync.deployment` use.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Add => "add",
            Action::Replan => "replan",
            Action::Resend => "resend",
            Action::Reshape => "reshape",
            Action::Remove => "remove",
            Action::Rebuild => "rebuild",
        }
    }

    /// What `sync.deployment.work` records for it.
    fn work(self) -> &'static str {
        match self {
            Action::Add | Action::Replan | Action::Rebuild => "plan",
            Action::Resend => "resend",
            Action::Reshape => "both",
            Action::Remove => "remove",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One table a deployment changes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// The table.
    pub table: String,
    /// What is done with it.
    pub action: Action,
    /// What changed, in words.
    pub why: String,
    /// Rows to work through: the table's rows for a plan (PostgreSQL's
    /// estimate once the table was analysed), the rows replicas hold for a
    /// resend, a removal or a rebuild.
    pub rows: u64,
    /// The rows replicas hold of it now, largest holders first (at most
    /// five): what a resend sends again and a removal takes back.
    pub held: Vec<(String, u64)>,
    /// Rows held over every replica.
    pub held_total: u64,
}

/// What a build changes against the last one's declarations.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Deployment {
    /// No build has started the sync on this database yet: the first one
    /// makes the sync schema (when it is not there) and provisions every
    /// live replica from a snapshot; nothing is deployed.
    pub first: bool,
    /// Tables whose fingerprints are the last build's: untouched.
    pub reused: Vec<String>,
    /// Tables with something to do, in name order.
    pub changes: Vec<Change>,
    /// What the replicas kept up would be sent and have taken back, per
    /// replica and table (a dry run's; empty for a deployment begun).
    /// Replicas a changed key provisions again are not in it.
    pub moves: crate::relay::Rehearsal,
}

impl Deployment {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first {
            return writeln!(
                f,
                "first start: no build has run the sync here; every live replica is provisioned \
                 from a snapshot of the {} tables declared",
                self.reused.len()
            );
        }
        if self.changes.is_empty() {
            return writeln!(f, "no change: {} tables reused", self.reused.len());
        }
        writeln!(
            f,
            "{} tables reused{}{}",
            self.reused.len(),
            if self.reused.is_empty() { "" } else { ": " },
            self.reused.join(", ")
        )?;
        for c in &self.changes {
            writeln!(f, "{:<8} {}: {}", c.action, c.table, c.why)?;
            match c.action {
                Action::Add | Action::Replan => {
                    writeln!(f, "         about {} rows planned again", c.rows)?
                }
                Action::Resend => writeln!(f, "         {} held rows sent again", c.held_total)?,
                Action::Reshape => writeln!(
                    f,
                    "         about {} rows planned again; the {} held rows kept sent again",
                    c.rows, c.held_total
                )?,
                Action::Remove => writeln!(f, "         {} held rows taken back", c.held_total)?,
                Action::Rebuild => writeln!(
                    f,
                    "         {} replicas holding {} rows provisioned again",
                    c.held.len(),
                    c.held_total
                )?,
            }
            if !c.held.is_empty() {
                let largest: Vec<String> = c.held.iter().map(|(r, n)| format!("{r} {n}")).collect();
                writeln!(f, "         largest holders: {}", largest.join(", "))?;
            }
        }
        if !self.moves.moves.is_empty() {
            let total = self.moves.totals();
            writeln!(
                f,
                "{} rows sent and {} taken back over {} replicas{}:",
                total.send,
                total.take_back,
                self.moves.moves.len(),
                if self.moves.exact {
                    ""
                } else {
                    " (at most: each table counted against the record as it is now)"
                }
            )?;
            for (replica, tables) in &self.moves.moves {
                let each: Vec<String> = tables
                    .iter()
                    .map(|(t, m)| format!("{t} +{} -{}", m.send, m.take_back))
                    .collect();
                writeln!(f, "  {replica}: {}", each.join(", "))?;
            }
        }
        Ok(())
    }
}

/// What a build keeps of a table for the builds after it: enough to take
/// its rows back once it is gone (its key columns' kinds, and the links
/// its held rows are counted in), and to say what changed (its rule,
/// columns and encoding).
pub(crate) fn definition(
    table: &TableSchema,
    links: &[(String, String)],
    encoding: &str,
) -> serde_json::Value {
    let key: Vec<serde_json::Value> = table
        .key
        .iter()
        .map(|k| {
            let kind = table.column(k).map(|c| c.kind.to_string());
            serde_json::json!([k, kind])
        })
        .collect();
    let links: Vec<serde_json::Value> = links
        .iter()
        .map(|(name, parent)| serde_json::json!([name, parent]))
        .collect();
    let columns: Vec<&str> = table.columns.iter().map(|c| c.name.as_str()).collect();
    serde_json::json!({
        "rule": table.rule,
        "key": key,
        "links": links,
        "columns": columns,
        "encoding": encoding,
    })
}

/// How `now` differs from what the last build recorded of the same table.
fn compare(
    before: Option<&Recorded>,
    now: Option<(&TableSchema, &Schema)>,
) -> Option<(Action, String)> {
    let down_now = now.filter(|(t, _)| t.mirror.goes_down());
    let before = before.filter(|b| b.goes_down());
    match (before, down_now) {
        (None, None) => None,
        (None, Some(_)) => Some((Action::Add, "new to the sync".into())),
        (Some(b), None) => {
            let why = if now.is_some() {
                "no longer sent down".to_string()
            } else {
                "no longer declared".to_string()
            };
            match &b.definition {
                Some(_) => Some((Action::Remove, why)),
                // Recorded by a build before deployments: what its rows
                // are keyed by is not known, so its holders start afresh.
                None => Some((
                    Action::Rebuild,
                    format!("{why}; recorded before deployments"),
                )),
            }
        }
        (Some(b), Some((t, schema))) => {
            if b.fingerprint == t.fingerprint().0 {
                return None;
            }
            let Some(def) = &b.definition else {
                return Some((
                    Action::Reshape,
                    "changed since a build that recorded no details".into(),
                ));
            };
            let key_now = definition(t, &[], "")["key"].clone();
            if def["key"] != key_now {
                return Some((Action::Rebuild, format!("key {} → {}", def["key"], key_now)));
            }
            let mut what = Vec::new();
            let rule_before = def["rule"].as_str().unwrap_or("");
            if rule_before != t.rule {
                what.push(format!("rule {rule_before} → {}", t.rule));
            }
            let planned = b.plan_print.as_deref() != Some(&schema.plan_print(t).0[..]);
            if planned && what.is_empty() {
                what.push("links changed".into());
            }
            let encoding = hex::encode(t.encoding_print().0);
            let encoded = def["encoding"].as_str() != Some(encoding.as_str());
            if encoded {
                let before: Vec<&str> = def["columns"]
                    .as_array()
                    .map(|c| c.iter().filter_map(|v| v.as_str()).collect())
                    .unwrap_or_default();
                let now: Vec<&str> = t.columns.iter().map(|c| c.name.as_str()).collect();
                let added: Vec<&str> = now
                    .iter()
                    .filter(|c| !before.contains(c))
                    .copied()
                    .collect();
                let gone: Vec<&str> = before
                    .iter()
                    .filter(|c| !now.contains(c))
                    .copied()
                    .collect();
                if !added.is_empty() {
                    what.push(format!("columns added: {}", added.join(", ")));
                }
                if !gone.is_empty() {
                    what.push(format!("columns removed: {}", gone.join(", ")));
                }
                if added.is_empty() && gone.is_empty() {
                    what.push("encoding changed".into());
                }
            }
            match (planned, encoded) {
                (false, false) => None,
                (false, true) => Some((Action::Resend, what.join("; "))),
                (true, true) => Some((Action::Reshape, what.join("; "))),
                (true, false) => Some((Action::Replan, what.join("; "))),
            }
        }
    }
}

/// The changes `declared` makes against `before`, in name order, and the
/// tables reused.
fn changes(
    before: &BTreeMap<String, Recorded>,
    declared: &Declared,
) -> (Vec<String>, Vec<(String, Action, String)>) {
    let mut names: Vec<&str> = before.keys().map(String::as_str).collect();
    names.extend(declared.schema.tables().iter().map(|t| t.name.as_str()));
    names.sort_unstable();
    names.dedup();
    let mut reused = Vec::new();
    let mut changed = Vec::new();
    for name in names {
        let now = declared.schema.table(name).map(|t| (t, &declared.schema));
        match compare(before.get(name), now) {
            Some((action, why)) => changed.push((name.to_string(), action, why)),
            None if now.is_some_and(|(t, _)| t.mirror.goes_down()) => reused.push(name.to_string()),
            None => {}
        }
    }
    (reused, changed)
}

/// Counts what each change will move: the table's rows, and what replicas
/// hold of it.
async fn counted(
    client: &Client,
    engine: &Engine,
    changed: Vec<(String, Action, String)>,
) -> Result<Vec<Change>> {
    let mut out = Vec::new();
    for (table, action, why) in changed {
        let held = store::deployment::held_of(client, &table).await?;
        let held_total = held.iter().map(|(_, n)| n).sum();
        let rows = match action {
            Action::Remove | Action::Rebuild => held_total,
            _ => table_rows(client, engine, &table).await?,
        };
        let holders = if action == Action::Rebuild {
            held
        } else {
            held.into_iter().take(5).collect()
        };
        out.push(Change {
            table,
            action,
            why,
            rows,
            held: holders,
            held_total,
        });
    }
    Ok(out)
}

/// The rows of a declared table: PostgreSQL's estimate over its
/// partitions, or a count when it was never analysed.
async fn table_rows(client: &Client, engine: &Engine, name: &str) -> Result<u64> {
    let Some(table) = engine.tables().find(|t| t.name == name) else {
        return Ok(0);
    };
    let relation = qualified(table.schema, table.name);
    let estimate: Option<f64> = client
        .query_one(
            &format!(
                "SELECT sum(c.reltuples)::float8 FROM pg_partition_tree({}::regclass) p
                 JOIN pg_class c ON c.oid = p.relid WHERE p.isleaf AND c.reltuples >= 0",
                crate::sql::escaped(&relation)
            ),
            &[],
        )
        .await?
        .get(0);
    if let Some(n) = estimate {
        return Ok(n.max(0.0) as u64);
    }
    let n: i64 = client
        .query_one(&format!("SELECT count(*) FROM {relation}"), &[])
        .await?
        .get(0);
    Ok(n as u64)
}

/// What starting `engine` would change, against what the running (or
/// last) build recorded: changes nothing. The tables reused, and per
/// table changed what is done with it, why, and how many rows it moves;
/// then, per replica kept up and table, the rows it would be sent and
/// have taken back, planned from the record as the deployment will plan
/// them, in a transaction rolled back (`relay::rehearse`). The
/// declarations must match the database. Before the first start (no sync
/// schema yet, or no build recorded) it says so.
pub async fn dry_run(client: &mut Client, engine: &Engine) -> Result<Deployment> {
    let catalog = Catalog::read(client, engine).await?;
    crate::check::declarations(engine, &catalog)?;
    let declared = crate::relay::declared(engine, &catalog)?;
    let first = |declared: &Declared| {
        let mut reused: Vec<String> = declared
            .schema
            .tables()
            .iter()
            .filter(|t| t.mirror.goes_down())
            .map(|t| t.name.clone())
            .collect();
        reused.sort();
        Deployment {
            first: true,
            reused,
            ..Deployment::default()
        }
    };
    if crate::schema::version(client).await? == 0 {
        return Ok(first(&declared));
    }
    crate::schema::require_current(client).await?;
    let before = store::tables::recorded(client).await?;
    if before.is_empty() {
        return Ok(first(&declared));
    }
    let (reused, changed) = changes(&before, &declared);
    let changes = counted(client, engine, changed).await?;
    let owed: Vec<crate::relay::Owed> = changes
        .iter()
        .filter(|c| c.action != Action::Rebuild)
        .map(|c| crate::relay::Owed {
            table: c.table.clone(),
            work: c.action.work(),
            definition: match c.action {
                Action::Remove => before.get(&c.table).and_then(|b| b.definition.clone()),
                _ => None,
            },
        })
        .collect();
    let moves = if owed.is_empty() {
        crate::relay::Rehearsal {
            exact: true,
            ..Default::default()
        }
    } else {
        crate::relay::rehearse(client, engine, &catalog, &owed).await?
    };
    Ok(Deployment {
        first: false,
        reused,
        changes,
        moves,
    })
}

/// Records what this build declares and, in the same transaction, what its
/// deployment owes (`sync.deployment`), merged with what an earlier one
/// left unfinished. Returns the deployment, counted.
pub(crate) async fn begin(
    client: &Client,
    engine: &Engine,
    declared: &Declared,
    graph: &Graph,
    catalog: &Catalog,
) -> Result<Deployment> {
    client.batch_execute("BEGIN").await?;
    let begun = begin_in(client, engine, declared, graph, catalog).await;
    match begun {
        Ok(deployment) => {
            client.batch_execute("COMMIT").await?;
            Ok(deployment)
        }
        Err(e) => {
            // The connection may be gone with the error; nothing was kept.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

async fn begin_in(
    client: &Client,
    engine: &Engine,
    declared: &Declared,
    graph: &Graph,
    catalog: &Catalog,
) -> Result<Deployment> {
    // Two relays starting at once: the second sees what the first wrote.
    store::tables::lock(client).await?;
    let before = store::tables::recorded(client).await?;
    let thinned = store::held::Ruled::stored(client).await? == store::held::Ruled::ByRule;
    let first_build = before.is_empty();
    let (reused, changed) = changes(&before, declared);
    let changes = if first_build {
        // Nothing was recorded: every replica is provisioned from its
        // snapshot under this build, so nothing is owed.
        Vec::new()
    } else {
        counted(client, engine, changed).await?
    };
    if !changes.is_empty() {
        // The last deployment's finished tables make way for this one's.
        store::deployment::clear_done(client).await?;
    }
    // Whatever is unfinished is this build's to work now; a relay of an
    // older build still running leaves it alone.
    let build = declared.schema.fingerprint().0.to_vec();
    store::deployment::adopt(client, &build).await?;
    // A rule this build changes, with the record thinned: what the old one
    // gave is recorded first, unless the triggers' installation did it
    // (`record_whole_before`).
    if thinned {
        for owed in owed_whole(client, &before, declared, graph, catalog).await? {
            let shape = graph.shape(&owed.table);
            let came = store::by_rule::record_whole(
                client,
                graph,
                shape,
                &owed.old,
                owed.old_type.as_deref(),
            )
            .await?;
            tracing::info!(
                table = owed.table,
                ?came,
                "the old rule's rows are recorded whole"
            );
        }
    }
    let ruled = match thinned {
        true => store::held::Ruled::ByRule,
        false => store::held::Ruled::Recorded,
    };
    let cohort_tables = store::cohorts::Tables::of(graph, ruled);
    for c in &changes {
        let definition: Option<serde_json::Value> = match c.action {
            Action::Remove => before.get(&c.table).and_then(|b| b.definition.clone()),
            _ => None,
        };
        if matches!(c.action, Action::Replan | Action::Reshape) {
            // The cohort's rows of a table planned again go back to its
            // members, each planned for itself; the cohort is made again
            // of this build's tables. (It passed its take-backs of rows of
            // tables only the old build shared to every member.)
            store::cohorts::forget(client, Some(&c.table), Some(&cohort_tables)).await?;
        }
        if c.action == Action::Rebuild {
            if thinned && old_rule(&before, &c.table).is_some() {
                // Its rows left to their rule name no holder: everyone.
                store::replicas::provision_again(client, None).await?;
            } else {
                store::deployment::provision_holders(client, &c.table).await?;
            }
            if declared
                .schema
                .table(&c.table)
                .is_none_or(|t| !t.mirror.goes_down())
            {
                // Gone: the snapshots take it back; nothing to plan.
                continue;
            }
        }
        let owed = store::deployment::Owed {
            table: &c.table,
            work: c.action.work(),
            why: &c.why,
            definition,
            rows_total: c.rows,
        };
        store::deployment::owe(client, &owed, &build).await?;
    }
    client
        .batch_execute(store::by_rule::NO_LONGER_WHOLE)
        .await?;
    declare(client, declared).await?;
    Ok(Deployment {
        first: first_build,
        reused,
        changes,
        moves: Default::default(),
    })
}

/// Records `declared`'s tables as the declared ones, replacing what an
/// earlier build recorded.
async fn declare(client: &Client, declared: &Declared) -> Result<()> {
    let tables = declared
        .schema
        .tables()
        .iter()
        .map(|t| {
            let links = declared.links.get(&t.name).cloned().unwrap_or_default();
            store::tables::Declaring {
                name: &t.name,
                mirror: t.mirror.as_str(),
                fingerprint: t.fingerprint().0.to_vec(),
                plan_print: declared.schema.plan_print(t).0.to_vec(),
                definition: {
                    let mut d = definition(t, &links, &hex::encode(t.encoding_print().0));
                    // Where its rows are, for the one read of an operator's
                    // that reads a row of it (`ops::row_progress`).
                    if let Some(schema) = declared.schemas.get(&t.name) {
                        d["schema"] = serde_json::Value::from(schema.as_str());
                    }
                    d
                },
                noted: declared.noted.get(&t.name).cloned().unwrap_or_default(),
            }
        })
        .collect();
    store::tables::declare(client, tables).await
}

/// Where the last deployment stands, table by table: empty when no build
/// changed anything since the sync began.
pub async fn progress(client: &impl tokio_postgres::GenericClient) -> Result<Vec<Progress>> {
    Ok(store::deployment::progress(client).await?)
}

/// A table whose rule this build changes from one that reads its rows'
/// own columns, while the record leaves the rows a rule gives to it: what
/// the old rule gives each holder is recorded before the rule changes
/// ([`store::by_rule::record_whole`]).
pub(crate) struct OwedWhole {
    pub table: String,
    pub old: OldRule,
    /// The type its column is read as; `None` when the table lost it.
    pub old_type: Option<String>,
}

/// The rule `table` had, as the last build recorded it, when it went down
/// and its rule read its rows' own columns.
fn old_rule(before: &BTreeMap<String, Recorded>, table: &str) -> Option<OldRule> {
    let b = before.get(table).filter(|b| b.goes_down())?;
    let text = b.definition.as_ref()?.get("rule")?.as_str()?;
    OldRule::parse(text)
}

/// The tables of `declared` owed recording whole (see [`OwedWhole`]) and
/// not recorded whole yet, from what the last build recorded (`before`).
pub(crate) async fn owed_whole(
    client: &impl tokio_postgres::GenericClient,
    before: &BTreeMap<String, Recorded>,
    declared: &Declared,
    graph: &Graph,
    catalog: &Catalog,
) -> Result<Vec<OwedWhole>> {
    let marked = store::by_rule::marked_whole(client).await?;
    let mut owed = Vec::new();
    for shape in &graph.shapes {
        let table = shape.table;
        let Some(now) = declared.schema.table(table.name) else {
            continue;
        };
        if marked.contains(table.name) {
            continue;
        }
        let Some(old) = old_rule(before, table.name) else {
            continue;
        };
        let unchanged = before
            .get(table.name)
            .and_then(|b| b.definition.as_ref())
            .and_then(|d| d.get("rule"))
            .and_then(|r| r.as_str())
            == Some(now.rule.as_str());
        if unchanged {
            continue;
        }
        let old_type = old.column().and_then(|c| {
            catalog
                .relation(table.schema, table.name)
                .and_then(|r| r.column(c))
                .map(|c| c.base_type.clone())
        });
        owed.push(OwedWhole {
            table: table.name.to_string(),
            old,
            old_type,
        });
    }
    Ok(owed)
}

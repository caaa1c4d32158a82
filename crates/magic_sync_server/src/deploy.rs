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
//! (`relay/deployment.rs`). [`dry_run`] says all this before anything
//! changes.

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::Result;
use crate::sql::qualified;
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
    /// Tables whose fingerprints are the last build's: untouched.
    pub reused: Vec<String>,
    /// Tables with something to do, in name order.
    pub changes: Vec<Change>,
}

impl Deployment {
    /// Whether nothing changes.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
        Ok(())
    }
}

/// What a build recorded of a table in `sync.tables`.
#[derive(Debug, Clone)]
struct Recorded {
    mirror: String,
    fingerprint: Vec<u8>,
    plan_print: Option<Vec<u8>>,
    definition: Option<serde_json::Value>,
}

impl Recorded {
    fn goes_down(&self) -> bool {
        self.mirror != "up"
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

/// What this build declares, per table: its schema, plan print, encoding
/// print and definition.
pub(crate) struct Declared {
    pub schema: Schema,
    /// Per table, the links its held rows point through: (name, parent).
    pub links: BTreeMap<String, Vec<(String, String)>>,
    /// Per table, the relations whose writes are noted for it.
    pub noted: BTreeMap<String, Vec<String>>,
}

async fn recorded(client: &Client) -> Result<BTreeMap<String, Recorded>> {
    let rows = client
        .query(
            "SELECT name, mirror, fingerprint, plan_print, definition FROM sync.tables",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            (
                r.get(0),
                Recorded {
                    mirror: r.get(1),
                    fingerprint: r.get(2),
                    plan_print: r.get(3),
                    definition: r.get(4),
                },
            )
        })
        .collect())
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
        let held = client
            .query(
                "SELECT replica, count(*) FROM sync.held WHERE table_name = $1
                 GROUP BY 1 ORDER BY 2 DESC, 1",
                &[&table],
            )
            .await?;
        let held: Vec<(String, u64)> = held
            .iter()
            .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
            .collect();
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
/// last) build recorded: reads, changes nothing. The tables reused, and per
/// table changed what is done with it, why, and how many rows it moves.
/// The `sync` schema must be current and the declarations must match the
/// database.
pub async fn dry_run(client: &Client, engine: &Engine) -> Result<Deployment> {
    crate::schema::require_current(client).await?;
    let catalog = Catalog::read(client, engine).await?;
    crate::check::declarations(engine, &catalog)?;
    let declared = crate::relay::declared(engine, &catalog)?;
    let before = recorded(client).await?;
    let (reused, changed) = changes(&before, &declared);
    Ok(Deployment {
        reused,
        changes: counted(client, engine, changed).await?,
    })
}

/// Records what this build declares and, in the same transaction, what its
/// deployment owes (`sync.deployment`), merged with what an earlier one
/// left unfinished. Returns the deployment, counted.
pub(crate) async fn begin(
    client: &Client,
    engine: &Engine,
    declared: &Declared,
) -> Result<Deployment> {
    client.batch_execute("BEGIN").await?;
    let begun = begin_in(client, engine, declared).await;
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

async fn begin_in(client: &Client, engine: &Engine, declared: &Declared) -> Result<Deployment> {
    // Two relays starting at once: the second sees what the first wrote.
    client
        .batch_execute("LOCK TABLE sync.tables IN EXCLUSIVE MODE")
        .await?;
    let before = recorded(client).await?;
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
        client
            .batch_execute("DELETE FROM sync.deployment WHERE done_at IS NOT NULL")
            .await?;
    }
    // Whatever is unfinished is this build's to work now; a relay of an
    // older build still running leaves it alone.
    let build = declared.schema.fingerprint().0.to_vec();
    client
        .execute(
            "UPDATE sync.deployment SET build = $1 WHERE done_at IS NULL",
            &[&build],
        )
        .await?;
    for c in &changes {
        let definition: Option<serde_json::Value> = match c.action {
            Action::Remove => before.get(&c.table).and_then(|b| b.definition.clone()),
            _ => None,
        };
        if c.action == Action::Rebuild {
            client
                .execute(
                    "UPDATE sync.replicas SET provision = true
                     WHERE NOT provision AND id IN (SELECT DISTINCT replica FROM sync.held
                                                    WHERE table_name = $1)",
                    &[&c.table],
                )
                .await?;
            if declared
                .schema
                .table(&c.table)
                .is_none_or(|t| !t.mirror.goes_down())
            {
                // Gone: the snapshots take it back; nothing to plan.
                continue;
            }
        }
        // Work left unfinished on the table by a deployment before is
        // folded in: planned again and sent again (`both`) covers whatever
        // it owed.
        client
            .execute(
                "INSERT INTO sync.deployment (table_name, work, why, definition, rows_total, build)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (table_name) DO UPDATE SET
                     work = CASE WHEN EXCLUDED.work = 'remove' OR sync.deployment.done_at IS NOT NULL
                                      OR sync.deployment.work = EXCLUDED.work
                                 THEN EXCLUDED.work ELSE 'both' END,
                     why = EXCLUDED.why, definition = EXCLUDED.definition, after = NULL,
                     rows_done = 0, rows_total = EXCLUDED.rows_total, began_at = now(),
                     done_at = NULL, build = EXCLUDED.build",
                &[
                    &c.table,
                    &c.action.work(),
                    &c.why,
                    &definition,
                    &(c.rows as i64),
                    &build,
                ],
            )
            .await?;
    }
    declare(client, declared).await?;
    Ok(Deployment { reused, changes })
}

/// Records `declared`'s tables as the declared ones, replacing what an
/// earlier build recorded.
async fn declare(client: &Client, declared: &Declared) -> Result<()> {
    let tables = declared.schema.tables();
    let names: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
    let mirrors: Vec<&str> = tables.iter().map(|t| t.mirror.as_str()).collect();
    let prints: Vec<Vec<u8>> = tables.iter().map(|t| t.fingerprint().0.to_vec()).collect();
    let plan_prints: Vec<Vec<u8>> = tables
        .iter()
        .map(|t| declared.schema.plan_print(t).0.to_vec())
        .collect();
    let definitions: Vec<serde_json::Value> = tables
        .iter()
        .map(|t| {
            let links = declared.links.get(&t.name).cloned().unwrap_or_default();
            definition(t, &links, &hex::encode(t.encoding_print().0))
        })
        .collect();
    let noted: Vec<String> = tables
        .iter()
        .map(|t| {
            let list = declared.noted.get(&t.name).cloned().unwrap_or_default();
            serde_json::to_string(&list).expect("strings serialise")
        })
        .collect();
    client
        .execute(
            "WITH wanted AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::bytea[],
                                      $5::jsonb[], $6::text[])
                     AS w (name, mirror, fingerprint, plan_print, definition, noted)),
             gone AS (DELETE FROM sync.tables t WHERE NOT (t.name = ANY($1)))
             INSERT INTO sync.tables (name, mirror, fingerprint, plan_print, definition, noted)
             SELECT name, mirror, fingerprint, plan_print, definition,
                    ARRAY (SELECT jsonb_array_elements_text(noted::jsonb))
             FROM wanted
             ON CONFLICT (name) DO UPDATE SET mirror = excluded.mirror,
                 fingerprint = excluded.fingerprint, plan_print = excluded.plan_print,
                 definition = excluded.definition, noted = excluded.noted,
                 declared_at = CASE WHEN sync.tables.fingerprint = excluded.fingerprint
                                    THEN sync.tables.declared_at ELSE now() END",
            &[
                &names,
                &mirrors,
                &prints,
                &plan_prints,
                &definitions,
                &noted,
            ],
        )
        .await?;
    Ok(())
}

/// The relations whose writes the last build's triggers noted, as recorded
/// in `sync.tables`; `None` when nothing says (no build recorded it).
pub(crate) async fn noted_before(client: &Client) -> Result<Option<Vec<String>>> {
    let row = client
        .query_one(
            "SELECT count(*) > 0 AND bool_and(noted IS NOT NULL),
                    ARRAY (SELECT DISTINCT unnest(noted) FROM sync.tables)
             FROM sync.tables",
            &[],
        )
        .await?;
    let known: Option<bool> = row.get(0);
    Ok(known.unwrap_or(false).then(|| row.get(1)))
}

/// Per table a deployment changed, how far it got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Progress {
    /// The table.
    pub table: String,
    /// `plan`, `resend`, `both` or `remove`.
    pub work: String,
    /// What changed, in words.
    pub why: String,
    /// Rows worked through.
    pub rows_done: u64,
    /// Rows to work through, as estimated when it began.
    pub rows_total: u64,
    /// Whether it is done.
    pub done: bool,
}

/// Where the last deployment stands, table by table: empty when no build
/// changed anything since the sync began.
pub async fn progress(client: &impl tokio_postgres::GenericClient) -> Result<Vec<Progress>> {
    Ok(read_progress(client).await?)
}

/// [`progress`], for the operator's reads.
pub(crate) async fn read_progress(
    client: &impl tokio_postgres::GenericClient,
) -> std::result::Result<Vec<Progress>, tokio_postgres::Error> {
    let rows = client
        .query(
            "SELECT table_name, work, why, rows_done, rows_total, done_at IS NOT NULL
             FROM sync.deployment ORDER BY began_at, table_name",
            &[],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Progress {
            table: r.get(0),
            work: r.get(1),
            why: r.get(2),
            rows_done: r.get::<_, i64>(3) as u64,
            rows_total: r.get::<_, i64>(4) as u64,
            done: r.get(5),
        })
        .collect())
}

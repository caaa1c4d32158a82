//! A deployment worked through beside the passes (`crate::deploy` says
//! what is owed and why).
//!
//! Each pass takes one chunk of one table's work (`Settings::deploy_chunk_rows`
//! rows), removals first, then the other tables parents first:
//!
//! - **plan / both**: the next rows of the table by key, after the last
//!   one worked through, go into the planner's changed rows as rows
//!   *touched* but not written (`_ms_touched` without a note). The planner
//!   then asks of each what it asks of any change: does its rule keep it
//!   where it is held, does a replica that lacks it want it now, does what
//!   leaned on it still stand. A row whose place did not move is not sent,
//!   unless the encoding changed too (`_ms_touched.resend`): then every
//!   replica keeping it is sent it again, in the new encoding.
//! - **resend**: only the encoding changed, so no row's place can have
//!   moved: the next rows by key (`_ms_chunk`) are sent again to each
//!   replica holding them, as the record has them, with no plan at all
//!   (but for the rows a note of the same pass plans anyway).
//! - **remove**: the next rows the kept-up replicas are recorded holding of
//!   a table this build no longer sends go straight into the rows to take
//!   back (`_ms_del`), from the record alone. What they pointed at loses
//!   their count (`refs`) and is questioned, so a parent held only for
//!   them goes too.
//!
//! The chunk's progress is written with the pass (in its closing batch), so
//! a relay stopped mid-deployment goes on from the last committed chunk and
//! sends nothing twice. Ongoing changes are planned in the same passes:
//! a deployment adds a bounded chunk to each, never a whole table.

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::graph::{key_json, Graph, Shape};
use crate::row::Rule;
use crate::sql::{escaped, ident, literal};
use crate::value::Kind;
use std::collections::BTreeMap;
use tokio_postgres::{Client, GenericClient, Transaction};

/// What this build declares, per table: its schema, plan print, encoding
/// print and definition.
pub(crate) struct Declared {
    pub schema: magic_sync_core::schema::Schema,
    /// Per table, the links its held rows point through: (name, parent).
    pub links: BTreeMap<String, Vec<(String, String)>>,
    /// Per table, the relations whose writes are noted for it.
    pub noted: BTreeMap<String, Vec<String>>,
    /// Per table sent down, the schema it is in.
    pub schemas: BTreeMap<String, String>,
}

/// What this build declares, for `crate::deploy`.
pub(crate) fn declared(engine: &Engine, catalog: &Catalog) -> Result<Declared> {
    let tables: Vec<_> = engine.down_tables().collect();
    let graph = Graph::new(&tables, catalog)?;
    let mut links: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for l in graph.tracked() {
        links
            .entry(l.child.name.to_string())
            .or_default()
            .push((l.name.clone(), l.parent.name.to_string()));
    }
    let noted = tables
        .iter()
        .map(|t| {
            let mut relations = vec![t.name.to_string()];
            if let Rule::Group(g) = t.rule {
                relations.push(g.members.to_string());
                relations.push(g.grants.to_string());
            }
            (t.name.to_string(), relations)
        })
        .collect();
    Ok(Declared {
        schema: catalog.schema(engine),
        links,
        noted,
        schemas: tables
            .iter()
            .map(|t| (t.name.to_string(), t.schema.to_string()))
            .collect(),
    })
}

/// A table no longer declared, as the build that last declared it
/// described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Removed {
    /// Its name.
    pub name: String,
    /// Its key columns' kinds, in key order.
    pub key: Vec<Kind>,
    /// The links its held rows are counted in: (name, parent), for the
    /// parents this build still declares.
    pub links: Vec<(String, String)>,
}

/// One chunk of a deployment's work, as a pass takes it.
#[derive(Debug, Clone)]
pub(crate) enum Work {
    /// The next rows of a declared table: planned again when `replan`,
    /// sent again to the replicas keeping them when `resend`.
    Plan {
        table: &'static str,
        replan: bool,
        resend: bool,
        after: Option<serde_json::Value>,
    },
    /// The next held rows of a removed table, taken back.
    Remove(Removed),
}

impl Work {
    /// The table worked on.
    pub fn table(&self) -> &str {
        match self {
            Work::Plan { table, .. } => table,
            Work::Remove(r) => &r.name,
        }
    }
}

/// What one chunk came to, for the pass's closing batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Worked {
    /// Rows worked through.
    pub rows: u64,
    /// The key of the last one (for `plan`), as JSON text.
    pub last: Option<String>,
    /// Whether the table's work is done with this chunk.
    pub done: bool,
}

/// The next chunk owed, if any: removals first, then tables parents
/// first. Only what the build whose declarations' fingerprint is `build` owes.
pub(crate) async fn next(
    tx: &Transaction<'_>,
    graph: &Graph,
    build: &[u8],
) -> Result<Option<Work>> {
    let rows = tx
        .query(
            "SELECT table_name, work, after, definition FROM sync.deployment
             WHERE done_at IS NULL AND build = $1",
            &[&build],
        )
        .await?;
    if rows.is_empty() {
        return Ok(None);
    }
    let mut plans = Vec::new();
    for row in &rows {
        let (table, work): (String, String) = (row.get(0), row.get(1));
        if work == "remove" {
            let definition: Option<serde_json::Value> = row.get(3);
            return Ok(Some(Work::Remove(removed_table(
                &table,
                definition.as_ref(),
                graph,
            )?)));
        }
        let after: Option<serde_json::Value> = row.get(2);
        match graph.shapes.iter().position(|s| s.table.name == table) {
            Some(at) => plans.push((at, work != "resend", work != "plan", after)),
            // Declared again as something that does not go down: nothing
            // of it to plan (its removal, if owed, is its own row).
            None => {
                tx.execute(
                    "UPDATE sync.deployment SET done_at = now() WHERE table_name = $1",
                    &[&table],
                )
                .await?;
            }
        }
    }
    plans.sort_by_key(|(at, ..)| *at);
    Ok(plans
        .into_iter()
        .next()
        .map(|(at, replan, resend, after)| Work::Plan {
            table: graph.shapes[at].table.name,
            replan,
            resend,
            after,
        }))
}

pub(crate) fn removed_table(
    name: &str,
    definition: Option<&serde_json::Value>,
    graph: &Graph,
) -> Result<Removed> {
    let damaged = |why: &str| Error::Damaged {
        what: format!("sync.deployment: the definition of removed table `{name}` {why}"),
    };
    let definition = definition.ok_or_else(|| damaged("is missing"))?;
    let key = definition["key"]
        .as_array()
        .ok_or_else(|| damaged("has no key"))?
        .iter()
        .map(|k| {
            k[1].as_str()
                .and_then(Kind::named)
                .ok_or_else(|| damaged("names a key kind this build does not know"))
        })
        .collect::<Result<Vec<Kind>>>()?;
    let links = definition["links"]
        .as_array()
        .map(|links| {
            links
                .iter()
                .filter_map(|l| Some((l[0].as_str()?.to_string(), l[1].as_str()?.to_string())))
                .filter(|(_, parent)| graph.shapes.iter().any(|s| s.table.name == parent))
                .collect()
        })
        .unwrap_or_default();
    Ok(Removed {
        name: name.to_string(),
        key,
        links,
    })
}

/// The rows of `shape` after `after` (a key as JSON), in key order, at most
/// `limit`: a range read through the key's index. Gives each row's key as
/// `k` and its key columns as `c0`, `c1`, ….
pub(crate) fn chunk_sql(shape: &Shape, after: Option<&serde_json::Value>, limit: i64) -> String {
    let cols: Vec<String> = shape
        .table
        .key
        .iter()
        .map(|c| format!("a.{}", ident(c)))
        .collect();
    let from = match after {
        None => String::new(),
        Some(after) => {
            let json = format!("{}::jsonb", escaped(&after.to_string()));
            let typed: Vec<String> = shape
                .key_types
                .iter()
                .enumerate()
                .map(|(i, ty)| format!("({json}->>{i})::{ty}"))
                .collect();
            format!("WHERE ({}) > ({})", cols.join(", "), typed.join(", "))
        }
    };
    let order = cols.join(", ");
    let named: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| format!("{c} AS c{i}"))
        .collect();
    format!(
        "SELECT {key} AS k, {named} FROM {rel} a {from} ORDER BY {order} LIMIT {limit}",
        named = named.join(", "),
        key = key_json("a", shape.table),
        rel = shape.relation,
    )
}

/// The closing statement of a chunk: where the table's work stands; once
/// done, a table recorded whole while its rule changed is read by its rule
/// again.
pub(crate) fn closing(table: &str, worked: &Worked) -> String {
    let whole = match worked.done {
        true => format!(
            "DELETE FROM sync.recorded_whole WHERE table_name = {};",
            literal(table)
        ),
        false => String::new(),
    };
    format!(
        "UPDATE sync.deployment SET rows_done = rows_done + {rows}, after = coalesce({last}::jsonb, after),
             done_at = {done}
         WHERE table_name = {t} AND done_at IS NULL;{whole}",
        rows = worked.rows,
        last = worked
            .last
            .as_deref()
            .map_or("NULL".to_string(), escaped),
        done = if worked.done { "now()" } else { "NULL" },
        t = literal(table),
    )
}

/// What each replica is recorded holding of `table`, most first.
pub(crate) async fn held_of(client: &Client, table: &str) -> Result<Vec<(String, u64)>> {
    let rows = client
        .query(
            "SELECT replica, count(*) FROM sync.held WHERE table_name = $1
             GROUP BY 1 ORDER BY 2 DESC, 1",
            &[&table],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        // A cohort's rows go to no one yet (`store::cohorts`).
        .filter(|(holder, _)| !crate::store::cohorts::is_cohort(holder))
        .collect())
}

/// Lets the last deployment's finished tables make way for a new one's.
pub(crate) async fn clear_done(client: &Client) -> Result<()> {
    client
        .batch_execute("DELETE FROM sync.deployment WHERE done_at IS NOT NULL")
        .await?;
    Ok(())
}

/// Makes whatever is unfinished the work of the build whose declarations'
/// fingerprint is `build`: a relay of an older build leaves it alone.
pub(crate) async fn adopt(client: &Client, build: &[u8]) -> Result<()> {
    client
        .execute(
            "UPDATE sync.deployment SET build = $1 WHERE done_at IS NULL",
            &[&build],
        )
        .await?;
    Ok(())
}

/// Has every replica recorded holding rows of `table` provisioned again.
pub(crate) async fn provision_holders(client: &Client, table: &str) -> Result<()> {
    // A cohort holding them is made again too.
    crate::store::cohorts::forget(client, Some(table), None).await?;
    client
        .execute(
            "UPDATE sync.replicas SET provision = true
             WHERE NOT provision AND id IN (SELECT DISTINCT replica FROM sync.held
                                            WHERE table_name = $1)",
            &[&table],
        )
        .await?;
    Ok(())
}

/// One table's work, as a deployment owes it.
pub(crate) struct Owed<'a> {
    pub table: &'a str,
    /// `plan`, `resend`, `both` or `remove`.
    pub work: &'a str,
    pub why: &'a str,
    /// For a removed table, its definition as the build that declared it
    /// recorded it.
    pub definition: Option<serde_json::Value>,
    pub rows_total: u64,
}

/// Records `owed` for the build `build`. Work left unfinished on the table
/// by a deployment before is folded in: planned again and sent again
/// (`both`) covers whatever it owed.
pub(crate) async fn owe(client: &Client, owed: &Owed<'_>, build: &[u8]) -> Result<()> {
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
                &owed.table,
                &owed.work,
                &owed.why,
                &owed.definition,
                &(owed.rows_total as i64),
                &build,
            ],
        )
        .await?;
    Ok(())
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
pub(crate) async fn progress(
    client: &impl GenericClient,
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

/// Whether the build whose declarations' fingerprint is `build` owes work
/// not done yet.
pub(crate) async fn owed_by(client: &Client, build: &[u8]) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sync.deployment WHERE done_at IS NULL AND build = $1)",
            &[&build],
        )
        .await?
        .get(0))
}

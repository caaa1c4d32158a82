//! The tables the running build declares (`sync.tables`), each with its
//! fingerprints and definition: written when a relay starts
//! (`crate::deploy`), read by the next build to say what changed, and by
//! the operator's reads to tell a declared table from a name a replica
//! made up.

use crate::error::Result;
use std::collections::BTreeMap;
use tokio_postgres::Client;

/// The name the operator's reads give a table no build declares.
pub const UNDECLARED: &str = "(undeclared)";

/// SQL that is true when `column` (a table name) is one the build
/// declares, or when no build recorded what it declares yet.
pub(crate) fn declared(column: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM sync.tables d WHERE d.name = {column})
          OR NOT EXISTS (SELECT 1 FROM sync.tables))"
    )
}

/// SQL naming `column` (a table name) as the operator's reads show it:
/// itself when [`declared`], else [`UNDECLARED`].
pub(crate) fn shown(column: &str) -> String {
    format!(
        "CASE WHEN {} THEN {column} ELSE '{UNDECLARED}' END",
        declared(column)
    )
}

/// What a build recorded of a table in `sync.tables`.
#[derive(Debug, Clone)]
pub(crate) struct Recorded {
    pub mirror: String,
    pub fingerprint: Vec<u8>,
    pub plan_print: Option<Vec<u8>>,
    pub definition: Option<serde_json::Value>,
}

impl Recorded {
    pub fn goes_down(&self) -> bool {
        self.mirror != "up"
    }
}

/// What the last build recorded, per table.
pub(crate) async fn recorded(client: &Client) -> Result<BTreeMap<String, Recorded>> {
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

/// Takes `sync.tables` for the rest of the transaction, so that of two
/// relays starting at once the second sees what the first wrote.
pub(crate) async fn lock(client: &Client) -> Result<()> {
    client
        .batch_execute("LOCK TABLE sync.tables IN EXCLUSIVE MODE")
        .await?;
    Ok(())
}

/// One table as a build records it.
pub(crate) struct Declaring<'a> {
    pub name: &'a str,
    pub mirror: &'a str,
    pub fingerprint: Vec<u8>,
    pub plan_print: Vec<u8>,
    pub definition: serde_json::Value,
    /// The relations whose writes are noted for it.
    pub noted: Vec<String>,
}

/// Records `tables` as the declared ones, replacing what an earlier build
/// recorded; a table's `declared_at` moves only when its fingerprint did.
pub(crate) async fn declare(client: &Client, tables: Vec<Declaring<'_>>) -> Result<()> {
    let names: Vec<&str> = tables.iter().map(|t| t.name).collect();
    let mirrors: Vec<&str> = tables.iter().map(|t| t.mirror).collect();
    let prints: Vec<&[u8]> = tables.iter().map(|t| t.fingerprint.as_slice()).collect();
    let plan_prints: Vec<&[u8]> = tables.iter().map(|t| t.plan_print.as_slice()).collect();
    let definitions: Vec<&serde_json::Value> = tables.iter().map(|t| &t.definition).collect();
    let noted: Vec<String> = tables
        .iter()
        .map(|t| serde_json::to_string(&t.noted).expect("strings serialise"))
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

//! The tables the running build declares (`sync.tables`), each with its
//! fingerprint: written when a relay starts, read by the operator's reads
//! to tell a declared table from a name a replica made up.

use crate::error::Result;
use magic_sync_core::schema::Schema;
use tokio_postgres::GenericClient;

/// What [`declare`] found changed since the last build that declared.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Declared {
    /// Tables declared now and not before.
    pub added: Vec<String>,
    /// Tables whose fingerprint changed.
    pub changed: Vec<String>,
    /// Tables declared before and not now.
    pub removed: Vec<String>,
}

/// The name the operator's reads give a table no build declares.
pub const UNDECLARED: &str = "(undeclared)";

/// Records `schema`'s tables as the declared ones, replacing what an
/// earlier build recorded, in one statement. Returns what changed.
pub async fn declare(client: &impl GenericClient, schema: &Schema) -> Result<Declared> {
    let names: Vec<&str> = schema.tables().iter().map(|t| t.name.as_str()).collect();
    let mirrors: Vec<&str> = schema.tables().iter().map(|t| t.mirror.as_str()).collect();
    let prints: Vec<Vec<u8>> = schema
        .tables()
        .iter()
        .map(|t| t.fingerprint().0.to_vec())
        .collect();
    let rows = client
        .query(
            "WITH wanted AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[]) AS w (name, mirror, fingerprint)),
             before AS (SELECT name, fingerprint FROM sync.tables),
             gone AS (DELETE FROM sync.tables t WHERE NOT (t.name = ANY($1)) RETURNING t.name),
             -- Run whole whether or not the query reads it, as every
             -- data-modifying WITH is.
             put AS (
                 INSERT INTO sync.tables (name, mirror, fingerprint)
                 SELECT name, mirror, fingerprint FROM wanted
                 ON CONFLICT (name) DO UPDATE SET mirror = excluded.mirror,
                     fingerprint = excluded.fingerprint,
                     declared_at = CASE WHEN sync.tables.fingerprint = excluded.fingerprint
                                        THEN sync.tables.declared_at ELSE now() END)
             SELECT 'added', w.name FROM wanted w LEFT JOIN before b USING (name) WHERE b.name IS NULL
             UNION ALL
             SELECT 'changed', w.name FROM wanted w JOIN before b USING (name)
                 WHERE b.fingerprint <> w.fingerprint
             UNION ALL
             SELECT 'removed', name FROM gone
             ORDER BY 1, 2",
            &[&names, &mirrors, &prints],
        )
        .await?;
    let mut declared = Declared::default();
    for row in rows {
        let (what, name): (&str, String) = (row.get(0), row.get(1));
        match what {
            "added" => declared.added.push(name),
            "changed" => declared.changed.push(name),
            _ => declared.removed.push(name),
        }
    }
    Ok(declared)
}

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

//! Rows set aside because they cannot go down (`sync.quarantine`), and the
//! rows blocked for a replica because they lean on one (`sync.blocked`):
//! how they are recorded, noted again when a relay starts, and read by the
//! operator's reads. How a plan goes around them is `store::plan::quarantine`'s.

use crate::error::Result;
use tokio_postgres::GenericClient;

/// A row to set aside: its table, its key as the record keeps it (the text
/// of its `jsonb` array), the newest note of it the plan saw, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub table: String,
    pub key: String,
    pub version: i64,
    pub reason: String,
}

/// Puts `rows` in quarantine, not settled: the next plan takes them back
/// from wherever they are held.
pub(crate) async fn set_aside(client: &impl GenericClient, rows: &[SetAside]) -> Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    let tables: Vec<&str> = rows.iter().map(|r| r.table.as_str()).collect();
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    let versions: Vec<i64> = rows.iter().map(|r| r.version).collect();
    let reasons: Vec<&str> = rows.iter().map(|r| r.reason.as_str()).collect();
    client
        .execute(
            "INSERT INTO sync.quarantine AS z (table_name, key, version, reason)
             SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[])
             ON CONFLICT (table_name, key) DO UPDATE
             SET version = greatest(z.version, excluded.version), reason = excluded.reason,
                 at = now(), settled = false",
            &[&tables, &keys, &versions, &reasons],
        )
        .await?;
    Ok(())
}

/// Notes every row in quarantine, and every row blocked by one, again: the
/// next pass tries each as if it had changed. A relay does this as it
/// starts, so a fix deployed lets through what the build before it could
/// not send. Returns the rows noted.
pub async fn note_again(client: &impl GenericClient) -> Result<u64> {
    Ok(client
        .execute(
            "INSERT INTO sync.notes (table_name, source, key, parents)
             SELECT table_name, table_name, key::jsonb, NULL FROM (
                 SELECT table_name, key FROM sync.quarantine
                 UNION
                 SELECT table_name, key FROM sync.blocked) s",
            &[],
        )
        .await?)
}

/// One row in quarantine, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    /// The table.
    pub table: String,
    /// The row's key (a JSON array).
    pub key: String,
    /// Why it cannot go.
    pub reason: String,
    /// Since when.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Rows blocked because they lean on it, over the replicas in scope.
    pub blocked: i64,
}

/// Records every row set aside, and every row blocked behind one, as taken
/// back from wherever it was held: for a pass's closing batch.
pub(crate) const SETTLE: &str = "UPDATE sync.quarantine SET settled = true WHERE NOT settled;
     UPDATE sync.blocked SET settled = true WHERE NOT settled;";

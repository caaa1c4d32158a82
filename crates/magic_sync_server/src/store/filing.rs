//! What filing uploads keeps (`crate::file` files them): refused rows with
//! why (`sync.inbox`), each replica's last backlog (`sync.backlogs`), the
//! newest upload answered to it (`sync.uploads_answered`), and the upload
//! each row's owned columns were last filed from (`sync.filed`).

use crate::error::Result;
use crate::sql::literal;
use std::collections::HashSet;
use tokio_postgres::{Client, Transaction};

/// A row kept in the inbox.
pub(crate) struct Kept {
    pub replica: String,
    pub table: String,
    pub key: String,
    /// `None` for a key gone.
    pub data: Option<Vec<u8>>,
    /// The upload it came in.
    pub sequence: i64,
}

/// Every row the inbox keeps, by replica and upload, and the moment they
/// were read: rows refused again are written later than it.
pub(crate) async fn inbox(client: &Client) -> Result<(chrono::DateTime<chrono::Utc>, Vec<Kept>)> {
    let began: chrono::DateTime<chrono::Utc> = client
        .query_one("SELECT clock_timestamp()", &[])
        .await?
        .get(0);
    let rows = client
        .query(
            "SELECT replica, table_name, key, data, sequence FROM sync.inbox
             ORDER BY replica, sequence, table_name, key",
            &[],
        )
        .await?;
    let kept = rows
        .iter()
        .map(|row| Kept {
            replica: row.get(0),
            table: row.get(1),
            key: row.get(2),
            data: row.get(3),
            sequence: row.get(4),
        })
        .collect();
    Ok((began, kept))
}

/// Lets go of the inbox's rows filed since (replica, table and key
/// beside each other), unless one was refused again after `began`.
pub(crate) async fn let_go(
    client: &Client,
    replicas: &[&str],
    tables: &[&str],
    keys: &[&str],
    began: chrono::DateTime<chrono::Utc>,
) -> Result<()> {
    client
        .execute(
            "DELETE FROM sync.inbox i USING unnest($1::text[], $2::text[], $3::text[]) AS u (r, t, k)
             WHERE i.replica = u.r AND i.table_name = u.t AND i.key = u.k AND i.at < $4",
            &[&replicas, &tables, &keys, &began],
        )
        .await?;
    Ok(())
}

/// Of `ids`, the replicas whose inbox holds at least `rows` rows or
/// `bytes` bytes (keys, rows and reasons), with what it holds.
pub(crate) async fn full_inboxes(
    tx: &Transaction<'_>,
    ids: &[&str],
    rows: i64,
    bytes: i64,
) -> Result<Vec<(String, i64, i64)>> {
    let found = tx
        .query(
            "SELECT replica, count(*),
                    sum(octet_length(key) + coalesce(octet_length(data), 0) + octet_length(reason))::int8
             FROM sync.inbox WHERE replica = ANY($1) GROUP BY replica
             HAVING count(*) >= $2
                 OR sum(octet_length(key) + coalesce(octet_length(data), 0) + octet_length(reason)) >= $3",
            &[&ids, &rows, &bytes],
        )
        .await?;
    Ok(found
        .iter()
        .map(|row| (row.get(0), row.get(1), row.get(2)))
        .collect())
}

/// SQL naming the kind of a refusal whose reason is `column`, as
/// `crate::file` words reasons: PostgreSQL's SQLSTATE for its refusals
/// (their message and detail quote the row), and for the engine's own the
/// words before the first `: ` or ` (` (what follows is the row's). What
/// the operator's health groups refused rows by.
pub(crate) fn refusal_kind(column: &str) -> String {
    format!(
        "CASE WHEN {column} LIKE 'PostgreSQL refused it: %'
              THEN 'PostgreSQL refused it '
                   || coalesce(substring({column} FROM '\\[SQLSTATE [0-9A-Z]{{5}}\\]$'), '')
              ELSE split_part(split_part({column}, ': ', 1), ' (', 1) END"
    )
}

/// Of `ids`, the replicas the server knows.
pub(crate) async fn known(tx: &Transaction<'_>, ids: &[&str]) -> Result<HashSet<String>> {
    let rows = tx
        .query("SELECT id FROM sync.replicas WHERE id = ANY($1)", &[&ids])
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Whether `replica` waits for a snapshot or streams one; `None` when the
/// server does not know it.
pub(crate) async fn provisioning(tx: &Transaction<'_>, replica: &str) -> Result<Option<bool>> {
    Ok(tx
        .query_opt(
            "SELECT provision OR snapshot_attempt IS NOT NULL FROM sync.replicas WHERE id = $1",
            &[&replica],
        )
        .await?
        .map(|row| row.get(0)))
}

/// Records each replica's last backlog (`tables`, beside it).
pub(crate) async fn backlogs(
    tx: &Transaction<'_>,
    replicas: &[&str],
    tables: &[serde_json::Value],
) -> Result<()> {
    tx.execute(
        "INSERT INTO sync.backlogs (replica, tables)
         SELECT * FROM unnest($1::text[], $2::jsonb[])
         ON CONFLICT (replica) DO UPDATE SET tables = EXCLUDED.tables, at = now()",
        &[&replicas, &tables],
    )
    .await?;
    Ok(())
}

/// Records, per replica, the newest upload answered it (`sequences`,
/// beside it); a newer one recorded before stays.
pub(crate) async fn answered(
    tx: &Transaction<'_>,
    replicas: &[&str],
    sequences: &[i64],
) -> Result<()> {
    tx.execute(
        "INSERT INTO sync.uploads_answered AS a (replica, sequence)
         SELECT * FROM unnest($1::text[], $2::int8[])
         ON CONFLICT (replica) DO UPDATE SET sequence = greatest(a.sequence, excluded.sequence)",
        &[&replicas, &sequences],
    )
    .await?;
    Ok(())
}

/// Keeps refused rows of one table of one upload (`keys` with `data`
/// beside them, `None` for a key gone), with why.
pub(crate) async fn refused(
    tx: &Transaction<'_>,
    replica: &str,
    table: &str,
    keys: &[String],
    data: &[Option<&[u8]>],
    reason: &str,
    sequence: i64,
) -> Result<()> {
    tx.execute(
        "INSERT INTO sync.inbox (replica, table_name, key, data, reason, sequence)
         SELECT $1, $2, k, d, $5, $6 FROM unnest($3::text[], $4::bytea[]) AS u (k, d)
         ON CONFLICT (replica, table_name, key) DO UPDATE
         SET data = EXCLUDED.data, reason = EXCLUDED.reason, sequence = EXCLUDED.sequence,
             at = now()",
        &[&replica, &table, &keys, &data, &reason, &sequence],
    )
    .await?;
    Ok(())
}

/// Keeps one refused row, as it came in the upload of `sequence`, with
/// why.
pub(crate) async fn refused_one(
    tx: &Transaction<'_>,
    replica: &str,
    sequence: i64,
    table: &str,
    key: &str,
    data: Option<&[u8]>,
    reason: &str,
) -> Result<()> {
    refused(
        tx,
        replica,
        table,
        &[key.to_string()],
        &[data],
        reason,
        sequence,
    )
    .await
}

/// Whether `replica` holds the row of `table` (its relation `relation`)
/// whose values are `json`: by its record, or, with `by_rule` (the graph,
/// while the record leaves the rows a rule gives to it), by its rule at
/// its position. `held_key` is the row's key as SQL over that row (aliased
/// `r`).
pub(crate) async fn holds(
    tx: &Transaction<'_>,
    relation: &str,
    table: &str,
    held_key: &str,
    json: &serde_json::Value,
    replica: &str,
    by_rule: Option<&crate::graph::Graph>,
) -> Result<bool> {
    let key = format!("jsonb_build_array({held_key})");
    let ruled = by_rule
        .and_then(|graph| {
            let shape = graph.shapes.iter().find(|s| s.table.name == table)?;
            super::by_rule::holds_key(graph, shape, "$2", &key)
        })
        .map(|held| format!(" OR {held}"))
        .unwrap_or_default();
    Ok(tx
        .query_one(
            &format!(
                "SELECT EXISTS (
                     SELECT 1 FROM sync.held h
                     WHERE h.table_name = {name} AND h.key = {key}::text
                       AND (h.replica = $2
                            OR h.replica IN (SELECT cohort FROM sync.members WHERE replica = $2))){ruled}
                 FROM jsonb_populate_record(NULL::{relation}, $1) r",
                name = literal(table),
            ),
            &[json, &replica],
        )
        .await?
        .get(0))
}

/// Records that the owned columns of the row (as [`holds`] names it) were
/// filed from `replica`'s upload `sequence`, unless one newer was filed
/// first. Returns whether this one is the newest.
pub(crate) async fn filed_newest(
    tx: &Transaction<'_>,
    relation: &str,
    table: &str,
    held_key: &str,
    json: &serde_json::Value,
    replica: &str,
    sequence: i64,
) -> Result<bool> {
    Ok(tx
        .query_opt(
            &format!(
                "INSERT INTO sync.filed (replica, table_name, key, sequence)
                 SELECT $2, {name}, jsonb_build_array({held_key})::text, $3
                 FROM jsonb_populate_record(NULL::{relation}, $1) r
                 ON CONFLICT (table_name, key, replica) DO UPDATE
                 SET sequence = EXCLUDED.sequence
                 WHERE sync.filed.sequence < EXCLUDED.sequence
                 RETURNING 1",
                name = literal(table),
            ),
            &[json, &replica, &sequence],
        )
        .await?
        .is_some())
}

//! Rows as the check compares them: each keyed by its canonical key and
//! shown as JSON without the columns the replica owns, read from the
//! server or from a replica's file.

use magic_sync::replica::Replica;
use magic_sync::sql::ident;
use magic_sync::Value;
use std::collections::BTreeMap;
use tokio_postgres::Client;

/// A row as compared: its values but the columns the replica owns, as JSON.
fn shown(table: &magic_sync::Table, values: &[Value]) -> String {
    let kept: Vec<serde_json::Value> = table
        .columns
        .iter()
        .zip(values)
        .filter(|(c, _)| !table.owns(c.name))
        .map(|(_, v)| v.to_json())
        .collect();
    serde_json::Value::Array(kept).to_string()
}

fn key_of(table: &magic_sync::Table, values: &[Value]) -> String {
    let key: Vec<Value> = table
        .key_positions()
        .iter()
        .map(|&i| values[i].clone())
        .collect();
    magic_sync::value::canonical_key(&key)
}

/// Every row of `table` on the server, by key.
pub async fn server_rows(client: &Client, table: &magic_sync::Table) -> BTreeMap<String, String> {
    let sql = format!(
        "SELECT {} FROM {} a",
        magic_sync::pg::select_list("a", table),
        table.qualified()
    );
    client
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| {
            let values = magic_sync::pg::read_row(row, 0, table).unwrap();
            (key_of(table, &values), shown(table, &values))
        })
        .collect()
}

/// Every live (not retired) row of `table` a replica holds, by key.
pub fn replica_rows(replica: &Replica, table: &magic_sync::Table) -> BTreeMap<String, String> {
    rows_in(replica.connection(), table)
}

/// Every live (not retired) row of `table` in a replica's database, read
/// on a connection of the caller's, by key.
pub fn rows_in(conn: &rusqlite::Connection, table: &magic_sync::Table) -> BTreeMap<String, String> {
    let cols: Vec<String> = table.columns.iter().map(|c| ident(c.name)).collect();
    let live = table
        .retired
        .map(|r| format!(" WHERE {} IS NULL", ident(r)))
        .unwrap_or_default();
    let sql = format!(
        "SELECT {} FROM {}{live}",
        cols.join(", "),
        ident(table.name)
    );
    let mut stmt = conn.prepare(&sql).unwrap();
    let rows = stmt
        .query_map([], |row| {
            let values = magic_sync::lite::read_row(row, 0, table).unwrap();
            Ok((key_of(table, &values), shown(table, &values)))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

//! Notes the planner cannot plan, parked: a note whose key (or the parents
//! it names) no longer fits its table's columns, written before the table
//! changed type under it, say. Planning casts every note's key to the
//! table's key types, so one such note would fail every pass for every
//! replica. A pass that fails on a data exception looks for them, moves
//! them to `sync.parked` with why, and runs again without them; a relay
//! starting moves them back, for a build that can plan them. The hot path
//! pays nothing: the search runs only after a pass failed so.

use crate::error::Result;
use crate::graph::{Graph, Shape};
use crate::sql::literal;
use crate::store::held::Ruled;
use tokio_postgres::Client;

/// The conditions under which the JSON `key` fits the key columns of
/// `shape`: an array of as many values, each of which casts to its
/// column's type (`sync.castable`, which a key written before the table's
/// type changed may not).
pub(crate) fn key_fits(shape: &Shape, key: &str) -> Vec<String> {
    let mut fits = vec![
        format!("jsonb_typeof({key}) = 'array'"),
        format!("jsonb_array_length({key}) = {}", shape.table.key.len()),
    ];
    fits.extend(
        shape
            .key_types
            .iter()
            .enumerate()
            .map(|(i, ty)| format!("sync.castable({key}->>{i}, {})", literal(ty))),
    );
    fits
}

/// Moves every pending note of a declared table whose key or parents do
/// not fit the table's columns to `sync.parked`, with why. Returns how
/// many it parked.
///
/// With the rows a rule gives left to it ([`Ruled::ByRule`]), a key of a
/// table whose rule reads its rows is read by its record alone from now on
/// (`sync.ruled_out`): its parked note no longer pending, its rule read at
/// a holder's position would put the holder past a change that never
/// went. A key ruled out for the first time has no record row for the
/// holders its rule gave it to, so they are provisioned again, from a view
/// in which the key is ruled out (recorded whole): by a replica rule, the
/// replicas its notes and its row name (every replica where a note names
/// none it can read); by any other, every replica.
pub(crate) async fn park(client: &mut Client, graph: &Graph, ruled: Ruled) -> Result<u64> {
    let tx = client.transaction().await?;
    let mut parked = 0;
    for shape in &graph.shapes {
        let table = shape.table;
        let mut fits = key_fits(shape, "n.key");
        for link in graph.links.iter().filter(|l| l.child.name == table.name) {
            for (column, ty) in link.columns.iter().zip(&link.types) {
                fits.push(format!(
                    "(n.parents IS NULL OR sync.castable(n.parents->>{}, {}))",
                    literal(column),
                    literal(ty)
                ));
            }
        }
        let columns: Vec<String> = table
            .key
            .iter()
            .zip(&shape.key_types)
            .map(|(c, ty)| format!("{c} {ty}"))
            .collect();
        let reason = format!(
            "its key or the parents it names do not fit the table's columns ({}): written \
             before the table changed under it; parked until a build that can plan it starts",
            columns.join(", ")
        );
        let rule_out = ruled == Ruled::ByRule && crate::store::by_rule::readable(shape);
        let row = tx
            .query_one(
                &format!(
                    "WITH bad AS (
                         DELETE FROM sync.notes n
                         WHERE n.format = 1 AND n.table_name = {name} AND NOT ({fits})
                         RETURNING n.*),
                     parked AS (
                         INSERT INTO sync.parked (seq, table_name, source, key, parents, xid, format, op, reason)
                         SELECT seq, table_name, source, key, parents, xid, format, op, $1 FROM bad),
                     out AS (
                         INSERT INTO sync.ruled_out (table_name, key)
                         SELECT DISTINCT table_name, key FROM bad WHERE $2
                         ON CONFLICT DO NOTHING
                         RETURNING key)
                     SELECT (SELECT count(*) FROM bad), (SELECT jsonb_agg(key) FROM out)",
                    name = literal(table.name),
                    fits = fits.join(" AND "),
                ),
                &[&reason, &rule_out],
            )
            .await?;
        parked += row.get::<_, i64>(0) as u64;
        if let Some(keys) = row.get::<_, Option<serde_json::Value>>(1) {
            let again = provision_holders(&tx, shape, &keys).await?;
            tracing::warn!(
                table = table.name,
                replicas = again.len(),
                "keys with a note parked are read by their record alone until it is planned: \
                 the replicas their rule may have given them to are provisioned again"
            );
        }
    }
    tx.commit().await?;
    Ok(parked)
}

/// Provisions again the replicas the rule of `shape` may have given the
/// rows keyed `keys` (a JSON array of keys) to, at any of their notes, the
/// ones just parked included, or as they are (see [`park`]).
async fn provision_holders(
    client: &impl tokio_postgres::GenericClient,
    shape: &Shape,
    keys: &serde_json::Value,
) -> Result<Vec<String>> {
    let crate::row::Rule::Replica(column) = shape.table.rule else {
        return crate::store::replicas::provision_again(client, None).await;
    };
    let column = literal(column);
    let t = literal(shape.table.name);
    // The replica each note names, or NULL where one cannot say (an insert
    // names none and needs none: the row was not there before it).
    let named = client
        .query(
            &format!(
                "SELECT DISTINCT n.parents->>{column}
                 FROM (SELECT parents, op FROM sync.notes WHERE table_name = {t} AND key IN
                           (SELECT jsonb_array_elements($1::jsonb))
                       UNION ALL
                       SELECT parents, op FROM sync.parked WHERE table_name = {t} AND key IN
                           (SELECT jsonb_array_elements($1::jsonb))) n
                 WHERE n.op IS DISTINCT FROM 'i'
                 UNION
                 SELECT a.{col}::text FROM {rel} a
                 WHERE {key} IN (SELECT jsonb_array_elements($1::jsonb))",
                col = crate::sql::ident(match shape.table.rule {
                    crate::row::Rule::Replica(c) => c,
                    _ => unreachable!("a replica rule"),
                }),
                rel = shape.relation,
                key = crate::graph::key_json("a", shape.table),
            ),
            &[keys],
        )
        .await?;
    let named: Vec<Option<String>> = named.iter().map(|r| r.get(0)).collect();
    if named.iter().any(Option::is_none) {
        return crate::store::replicas::provision_again(client, None).await;
    }
    let ids: Vec<String> = named.into_iter().flatten().collect();
    client
        .batch_execute("LOCK TABLE sync.replicas IN SHARE ROW EXCLUSIVE MODE")
        .await?;
    let rows = client
        .query(
            "UPDATE sync.replicas SET provision = true
             WHERE NOT provision AND id = ANY($1) RETURNING id",
            &[&ids],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Moves every parked note back among the pending ones, as it was: a relay
/// starting does this once, so that a build able to plan them plans them,
/// and one that is not parks them again.
pub(crate) async fn unpark(client: &Client) -> Result<u64> {
    Ok(client
        .execute(
            "WITH back AS (DELETE FROM sync.parked RETURNING *)
             INSERT INTO sync.notes (seq, table_name, source, key, parents, xid, format, op)
             SELECT seq, table_name, source, key, parents, xid, format, op FROM back",
            &[],
        )
        .await?)
}

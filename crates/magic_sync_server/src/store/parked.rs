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
pub(crate) async fn park(client: &Client, graph: &Graph) -> Result<u64> {
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
        parked += client
            .execute(
                &format!(
                    "WITH bad AS (
                         DELETE FROM sync.notes n
                         WHERE n.format = 1 AND n.table_name = {name} AND NOT ({fits})
                         RETURNING n.*)
                     INSERT INTO sync.parked (seq, table_name, source, key, parents, xid, format, op, reason)
                     SELECT seq, table_name, source, key, parents, xid, format, op, $1 FROM bad",
                    name = literal(table.name),
                    fits = fits.join(" AND "),
                ),
                &[&reason],
            )
            .await?;
    }
    Ok(parked)
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

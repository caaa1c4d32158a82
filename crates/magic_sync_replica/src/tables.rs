//! The SQL a replica runs against each table that goes down, built once from
//! the declarations and the foreign keys when the replica opens. Every
//! identifier goes through [`ident`].

use crate::lite;
use crate::shape::Table;
use crate::sql::ident;
use magic_sync_core::schema::ForeignKey;

/// The statements for one table that goes down. Key parameters are always
/// `?1..?n`, in declared key order.
#[derive(Debug, Clone)]
pub(crate) struct TableSql {
    /// The table.
    pub table: Table,
    /// The positions of the key columns among the columns, in key order.
    pub key_positions: Vec<usize>,
    /// Inserts a row, and nothing else: for a table a snapshot fills from
    /// empty. Parameters: every column, in order.
    pub insert: String,
    /// Inserts a row, or overwrites every column the replica does not own and
    /// brings a retired row back to life. Parameters: every column, in order.
    pub upsert: String,
    /// Deletes one row by key.
    pub delete: String,
    /// Marks one row retired by key; `?n+1` is the message number. `None`
    /// without a retired column.
    pub retire: Option<String>,
    /// Whether any row of the replica points at the row with this key. `None`
    /// without a retired column (such a row is deleted regardless) or when no
    /// foreign key points at the table.
    pub pointed_at: Option<String>,
    /// Deletes the retired rows nothing points at. `None` without a retired column.
    pub purge: Option<String>,
    /// The keys of the rows the replica holds live.
    pub live_keys: String,
    /// Every row's key, retired ones' too.
    pub every_key: String,
    /// The keys the snapshot in progress has not sent yet.
    pub stale: Stale,
    /// The name of the partial index on the retired column, if any.
    pub retired_index: Option<String>,
}

/// The statements over a table's stale keys: `_magic_sync_stale_<table>`,
/// the keys the table held when a snapshot began that the snapshot has not
/// sent (yet). Key parameters are `?1..?n`, in declared key order.
#[derive(Debug, Clone)]
pub(crate) struct Stale {
    /// Creates the table of stale keys, typed like the key columns.
    pub create: String,
    /// Every key the table holds, retired rows' too, in key order.
    pub fill: String,
    /// Empties it.
    pub clear: String,
    /// Strikes one key off: the snapshot sent the row.
    pub strike: String,
    /// Puts one key back: the row was let go of during the snapshot.
    pub put_back: String,
    /// Whether one key is still stale.
    pub contains: String,
    /// Retires the stale rows one of the replica's own records points at;
    /// `?1` is the message number. `None` when such rows are deleted
    /// regardless.
    pub retire: Option<String>,
    /// Deletes the stale rows that are not kept retired.
    pub delete: String,
}

impl TableSql {
    /// The statements for `table`, given the foreign keys of the replica's
    /// own records (its up tables).
    pub fn new(table: &Table, foreign_keys: &[ForeignKey]) -> Self {
        let into_it: Vec<&ForeignKey> = foreign_keys
            .iter()
            .filter(|fk| fk.parent == table.name)
            .collect();
        let pointed_at_row = table
            .retired
            .as_deref()
            .filter(|_| !into_it.is_empty())
            .map(|_| pointed_at_row(table, &into_it));
        TableSql {
            table: table.clone(),
            key_positions: table.key_positions(),
            insert: insert(table),
            upsert: upsert(table),
            delete: format!(
                "DELETE FROM {} WHERE {}",
                ident(&table.name),
                key_match(table, "")
            ),
            retire: table.retired.as_deref().map(|r| retire(table, r)),
            pointed_at: table
                .retired
                .as_deref()
                .filter(|_| !into_it.is_empty())
                .map(|_| pointed_at(table, &into_it)),
            purge: table.retired.as_deref().map(|r| purge(table, r, &into_it)),
            live_keys: select_keys(table, table.retired.as_deref()),
            every_key: select_keys(table, None),
            stale: stale(table, pointed_at_row.as_deref()),
            retired_index: table.retired.as_deref().map(|_| retired_index_name(table)),
        }
    }
}

/// `"k1", "k2"`, the key columns in declared order.
fn key_list(table: &Table) -> String {
    table
        .key
        .iter()
        .map(|k| ident(k))
        .collect::<Vec<_>>()
        .join(", ")
}

fn stale_table_name(table: &Table) -> String {
    ident(&format!("_magic_sync_stale_{}", table.name))
}

fn stale(table: &Table, pointed_at_row: Option<&str>) -> Stale {
    let name = stale_table_name(table);
    let keys = key_list(table);
    let columns: Vec<String> = table
        .key
        .iter()
        .map(|k| {
            let kind = table.column(k).map_or(crate::value::Kind::Text, |c| c.kind);
            format!("{} {} NOT NULL", ident(k), lite::storage(kind))
        })
        .collect();
    let marks: Vec<String> = (1..=table.key.len()).map(|i| format!("?{i}")).collect();
    let target = ident(&table.name);
    let stale_rows = format!("({keys}) IN (SELECT {keys} FROM {name})");
    let retire = table
        .retired
        .as_deref()
        .zip(pointed_at_row)
        .map(|(retired, pointed_at)| {
            format!(
                "UPDATE {target} SET {} = ?1 WHERE {stale_rows} AND ({pointed_at})",
                ident(retired)
            )
        });
    let delete = match (&retire, pointed_at_row) {
        (Some(_), Some(pointed_at)) => {
            format!("DELETE FROM {target} WHERE {stale_rows} AND NOT ({pointed_at})")
        }
        _ => format!("DELETE FROM {target} WHERE {stale_rows}"),
    };
    Stale {
        create: format!(
            "CREATE TABLE IF NOT EXISTS {name} ({}, PRIMARY KEY ({keys})) STRICT, WITHOUT ROWID",
            columns.join(", ")
        ),
        fill: format!("INSERT INTO {name} ({keys}) SELECT {keys} FROM {target} ORDER BY {keys}"),
        clear: format!("DELETE FROM {name}"),
        strike: format!("DELETE FROM {name} WHERE {}", key_match(table, "")),
        put_back: format!(
            "INSERT OR IGNORE INTO {name} ({keys}) VALUES ({})",
            marks.join(", ")
        ),
        contains: format!(
            "SELECT EXISTS (SELECT 1 FROM {name} WHERE {})",
            key_match(table, "")
        ),
        retire,
        delete,
    }
}

fn insert(table: &Table) -> String {
    let columns: Vec<String> = table.columns.iter().map(|c| ident(&c.name)).collect();
    let values: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
    format!(
        "INSERT INTO {} ({}) VALUES ({})",
        ident(&table.name),
        columns.join(", "),
        values.join(", ")
    )
}

/// `"k1" = ?1 AND "k2" = ?2`, the columns qualified by `alias` when given.
fn key_match(table: &Table, alias: &str) -> String {
    table
        .key
        .iter()
        .enumerate()
        .map(|(i, k)| format!("{alias}{} = ?{}", ident(k), i + 1))
        .collect::<Vec<_>>()
        .join(" AND ")
}

fn upsert(table: &Table) -> String {
    let columns: Vec<String> = table.columns.iter().map(|c| ident(&c.name)).collect();
    let values: Vec<String> = (1..=columns.len()).map(|i| format!("?{i}")).collect();
    let key: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
    let mut set: Vec<String> = table
        .columns
        .iter()
        .filter(|c| !table.key.contains(&c.name) && !table.owns(&c.name))
        .map(|c| format!("{0} = excluded.{0}", ident(&c.name)))
        .collect();
    if let Some(retired) = table.retired.as_deref() {
        set.push(format!("{} = NULL", ident(retired)));
    }
    let on_conflict = if set.is_empty() {
        "DO NOTHING".to_string()
    } else {
        format!("DO UPDATE SET {}", set.join(", "))
    };
    format!(
        "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) {on_conflict}",
        ident(&table.name),
        columns.join(", "),
        values.join(", "),
        key.join(", "),
    )
}

fn retire(table: &Table, retired: &str) -> String {
    format!(
        "UPDATE {} SET {} = ?{} WHERE {}",
        ident(&table.name),
        ident(retired),
        table.key.len() + 1,
        key_match(table, "")
    )
}

/// `c."a" = p."x" AND c."b" = p."y"`, and for a table pointing at itself, not
/// the row itself.
fn join(fk: &ForeignKey, child: &str, parent: &str) -> String {
    let mut terms: Vec<String> = fk
        .child_columns
        .iter()
        .zip(&fk.parent_columns)
        .map(|(c, p)| format!("{child}.{} = {parent}.{}", ident(c), ident(p)))
        .collect();
    if fk.child == fk.parent {
        terms.push(format!("{child}.rowid <> {parent}.rowid"));
    }
    terms.join(" AND ")
}

fn pointed_at(table: &Table, into_it: &[&ForeignKey]) -> String {
    let parent = ident(&table.name);
    let exists: Vec<String> = into_it
        .iter()
        .map(|fk| {
            format!(
                "EXISTS (SELECT 1 FROM {} AS c JOIN {parent} AS p ON {} WHERE {})",
                ident(&fk.child),
                join(fk, "c", "p"),
                key_match(table, "p.")
            )
        })
        .collect();
    format!("SELECT {}", exists.join(" OR "))
}

/// Whether any of the replica's own records points at the row of `table`
/// the statement is at: a condition on the table's own columns.
fn pointed_at_row(table: &Table, into_it: &[&ForeignKey]) -> String {
    let parent = ident(&table.name);
    into_it
        .iter()
        .map(|fk| {
            format!(
                "EXISTS (SELECT 1 FROM {} AS c WHERE {})",
                ident(&fk.child),
                join(fk, "c", &parent)
            )
        })
        .collect::<Vec<_>>()
        .join(" OR ")
}

fn purge(table: &Table, retired: &str, into_it: &[&ForeignKey]) -> String {
    let parent = ident(&table.name);
    let mut terms = vec![format!("p.{} IS NOT NULL", ident(retired))];
    terms.extend(into_it.iter().map(|fk| {
        format!(
            "NOT EXISTS (SELECT 1 FROM {} AS c WHERE {})",
            ident(&fk.child),
            join(fk, "c", "p")
        )
    }));
    format!(
        "DELETE FROM {parent} WHERE rowid IN (SELECT p.rowid FROM {parent} AS p WHERE {})",
        terms.join(" AND ")
    )
}

fn select_keys(table: &Table, live_only: Option<&str>) -> String {
    let key: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
    let filter = live_only
        .map(|r| format!(" WHERE {} IS NULL", ident(r)))
        .unwrap_or_default();
    format!(
        "SELECT {} FROM {}{filter}",
        key.join(", "),
        ident(&table.name)
    )
}

/// The statements of every table that goes down, in the engine's order.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    tables: Vec<TableSql>,
    by_name: std::collections::HashMap<String, usize>,
}

impl Tables {
    /// The statements of every table in `tables` that goes down.
    ///
    /// A row let go of is kept (retired) only for the replica's own records:
    /// rows of its up tables pointing at it. Rows the server sent that point
    /// at it are the server's to let go of or re-point, and it does so in the
    /// same message or an earlier one.
    pub fn new<'t>(tables: impl Iterator<Item = &'t Table>, foreign_keys: &[ForeignKey]) -> Self {
        let all: Vec<&Table> = tables.collect();
        let own: Vec<ForeignKey> = foreign_keys
            .iter()
            .filter(|fk| {
                all.iter()
                    .any(|t| t.name == fk.child && t.mirror == magic_sync_core::row::Mirror::Up)
            })
            .cloned()
            .collect();
        let tables: Vec<TableSql> = all
            .into_iter()
            .filter(|t| t.mirror.goes_down())
            .map(|t| TableSql::new(t, &own))
            .collect();
        let by_name = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.table.name.clone(), i))
            .collect();
        Tables { tables, by_name }
    }

    /// The statements of the table called `name`, if it goes down.
    pub fn get(&self, name: &str) -> Option<&TableSql> {
        self.by_name.get(name).map(|&i| &self.tables[i])
    }

    /// The position of the table called `name` in [`iter`](Self::iter)'s
    /// order, if it goes down.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The statements of the table at `position`.
    pub fn at(&self, position: usize) -> &TableSql {
        &self.tables[position]
    }

    /// How many tables go down.
    pub fn len(&self) -> usize {
        self.tables.len()
    }

    /// Every table that goes down, in the engine's order.
    pub fn iter(&self) -> impl Iterator<Item = &TableSql> {
        self.tables.iter()
    }
}

/// A partial index on the retired column, so a purge finds retired rows
/// without reading the table.
pub(crate) fn retired_index(table: &Table) -> Option<String> {
    table.retired.as_deref().map(|r| {
        format!(
            "CREATE INDEX IF NOT EXISTS {} ON {} ({}) WHERE {} IS NOT NULL",
            ident(&retired_index_name(table)),
            ident(&table.name),
            ident(r),
            ident(r)
        )
    })
}

fn retired_index_name(table: &Table) -> String {
    format!("_magic_sync_retired_{}", table.name)
}

/// An index on a foreign key's columns in the child, so asking whether a row
/// points at a parent reads no more than the rows that do.
pub(crate) fn foreign_key_index(fk: &ForeignKey) -> String {
    let columns: Vec<String> = fk.child_columns.iter().map(|c| ident(c)).collect();
    format!(
        "CREATE INDEX IF NOT EXISTS {} ON {} ({})",
        ident(&foreign_key_index_name(fk)),
        ident(&fk.child),
        columns.join(", ")
    )
}

fn foreign_key_index_name(fk: &ForeignKey) -> String {
    format!("_magic_sync_fk_{}_{}", fk.child, fk.child_columns.join("_"))
}

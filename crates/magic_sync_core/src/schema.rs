//! What a replica's database is made of, owned: every declared table with
//! its columns, key, direction, rule and codec, and the foreign keys among
//! the declared tables, which the server reads from its catalogue. Built
//! from the engine's declarations and those foreign keys, so it can be
//! compared, stored and sent, which `&'static` declarations cannot.
//!
//! Each table has a [`Fingerprint`] of what decides what replicas hold of
//! it and how its rows travel: its name, columns (name, kind, whether NULL
//! is taken, in declared order), key, direction, rule, owned, version,
//! origin and retired columns, codec format, and the foreign keys it points
//! through. Nothing else goes in: not the Rust type's name, not the
//! PostgreSQL schema the server reads it from, not the upload lane. The
//! fingerprint is SHA-256 over a canonical encoding in which every part
//! stands behind its length, so it is stable from build to build and two
//! different tables cannot encode alike.
//!
//! The fingerprints are made in `fingerprint`; the schema as the wire
//! carries it, read back and compared, is in `description`.

use crate::engine::Engine;
use crate::row::{Mirror, Rule, Table};
use crate::value::Kind;

mod description;
mod fingerprint;

pub use description::described_foreign_keys;
pub use fingerprint::Fingerprint;

/// A foreign key among the replica's tables: the `child_columns` of `child`
/// point at the `parent_columns` of `parent`, pairwise. The server reads them
/// from its catalogue; the replica is told them when it opens.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ForeignKey {
    /// The table that points.
    pub child: String,
    /// Its columns that point, in the constraint's order.
    pub child_columns: Vec<String>,
    /// The table pointed at.
    pub parent: String,
    /// The columns pointed at, in the constraint's order.
    pub parent_columns: Vec<String>,
}

impl ForeignKey {
    /// `child(child_columns) → parent(parent_columns)`.
    pub fn new(child: &str, child_columns: &[&str], parent: &str, parent_columns: &[&str]) -> Self {
        ForeignKey {
            child: child.to_string(),
            child_columns: child_columns.iter().map(ToString::to_string).collect(),
            parent: parent.to_string(),
            parent_columns: parent_columns.iter().map(ToString::to_string).collect(),
        }
    }
}

/// One column as a replica holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnSchema {
    /// Its name.
    pub name: String,
    /// The kind of value it holds.
    pub kind: Kind,
    /// Whether it takes NULL.
    pub nullable: bool,
}

/// One declared table, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSchema {
    /// Its name, on the server and on replicas alike.
    pub name: String,
    /// Which way its rows travel.
    pub mirror: Mirror,
    /// Which replicas hold which of its rows, in words a reader and a
    /// fingerprint take alike: `all`, `replica(unit_id)`,
    /// `follows(order_id)`, `group(members=…, …)`.
    pub rule: String,
    /// Its columns, in declared order.
    pub columns: Vec<ColumnSchema>,
    /// Its key columns, in declared order.
    pub key: Vec<String>,
    /// The columns replicas own (`both`).
    pub owned: Vec<String>,
    /// The version column (`up`).
    pub version: Option<String>,
    /// The column naming the replica that wrote a row (`up`).
    pub origin: Option<String>,
    /// The replica-side column set on a row retired rather than deleted.
    pub retired: Option<String>,
    /// The codec's format: `json` or `protobuf`.
    pub codec: String,
    /// The foreign keys it points through at declared tables, sorted.
    pub foreign_keys: Vec<ForeignKey>,
}

impl TableSchema {
    /// `table` as declared, travelling in `codec`, pointing through
    /// whichever of `foreign_keys` it is the child of.
    pub fn new(table: &Table, codec: &str, foreign_keys: &[ForeignKey]) -> TableSchema {
        let mut fks: Vec<ForeignKey> = foreign_keys
            .iter()
            .filter(|fk| fk.child == table.name)
            .cloned()
            .collect();
        fks.sort();
        TableSchema {
            name: table.name.to_string(),
            mirror: table.mirror,
            rule: rule_text(&table.rule),
            columns: table
                .columns
                .iter()
                .map(|c| ColumnSchema {
                    name: c.name.to_string(),
                    kind: c.kind,
                    nullable: c.nullable,
                })
                .collect(),
            key: strings(table.key),
            owned: strings(table.owned),
            version: table.version.map(str::to_string),
            origin: table.origin.map(str::to_string),
            retired: table.retired.map(str::to_string),
            codec: codec.to_string(),
            foreign_keys: fks,
        }
    }

    /// The column called `name`.
    pub fn column(&self, name: &str) -> Option<&ColumnSchema> {
        self.columns.iter().find(|c| c.name == name)
    }
}

/// Every declared table, owned, with the foreign keys among them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Schema {
    tables: Vec<TableSchema>,
}

impl Schema {
    /// The tables `engine` declares, in its order, with whichever of
    /// `foreign_keys` join two of them.
    pub fn new(engine: &Engine, foreign_keys: &[ForeignKey]) -> Schema {
        let declared = |name: &str| engine.codec(name).is_some();
        let among: Vec<ForeignKey> = foreign_keys
            .iter()
            .filter(|fk| declared(&fk.child) && declared(&fk.parent))
            .cloned()
            .collect();
        Schema {
            tables: engine
                .codecs()
                .iter()
                .map(|c| TableSchema::new(c.table(), c.format(), &among))
                .collect(),
        }
    }

    /// Every table, in the engine's order.
    pub fn tables(&self) -> &[TableSchema] {
        &self.tables
    }

    /// The table called `name`.
    pub fn table(&self, name: &str) -> Option<&TableSchema> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Every foreign key among the tables.
    pub fn foreign_keys(&self) -> Vec<ForeignKey> {
        self.tables
            .iter()
            .flat_map(|t| t.foreign_keys.iter().cloned())
            .collect()
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(ToString::to_string).collect()
}

/// A rule in words, with what it names.
fn rule_text(rule: &Rule) -> String {
    match rule {
        Rule::All | Rule::Referenced | Rule::Origin => rule.as_str().to_string(),
        Rule::Replica(c) | Rule::Partition(c) => format!("{}({c})", rule.as_str()),
        Rule::Follows(cols) => format!("follows({})", cols.join(", ")),
        Rule::Group(g) => format!(
            "group(members={}, member=[{}], group={}, grants={}, replica={})",
            g.members,
            g.member.join(", "),
            g.group,
            g.grants,
            g.replica
        ),
    }
}

#[cfg(test)]
mod tests;

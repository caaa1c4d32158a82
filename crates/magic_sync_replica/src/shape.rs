//! The tables as this replica holds them, owned: what each is made of and
//! how its rows are read and written.
//!
//! Everything in the replica that builds SQL, reads keys or notes writes
//! works from these, never from a host's `'static` declarations, so the
//! same code serves a replica whose tables come from elsewhere than Rust
//! types. Today they are made from the host's engine ([`Shapes::of`]).

use crate::value::{Kind, Value};
use magic_sync_core::codec::CodecError;
use magic_sync_core::engine::Engine;
use magic_sync_core::row::Mirror;
use magic_sync_core::wire;
use std::collections::HashMap;

/// One column of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Column {
    /// Its name, in PostgreSQL and SQLite alike.
    pub name: String,
    /// The kind of value it holds.
    pub kind: Kind,
    /// Whether it takes NULL.
    pub nullable: bool,
    /// Whether its values are checked beyond their kind by the codec
    /// (`Field::CHECKED`), so that a row is read through the codec.
    pub checked: bool,
}

/// One table: its columns, key, direction and the columns the replica
/// treats apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Table {
    /// Its name.
    pub name: String,
    /// Which way its rows travel.
    pub mirror: Mirror,
    /// Its columns, in declared order.
    pub columns: Vec<Column>,
    /// Its key columns, in declared order.
    pub key: Vec<String>,
    /// The columns the replica owns (two-way tables).
    pub owned: Vec<String>,
    /// The column naming the replica that wrote a record (up tables).
    pub origin: Option<String>,
    /// The replica-side column set when a row is retired.
    pub retired: Option<String>,
    /// The upload lane its writes go on; `None`: the first lane.
    pub lane: Option<String>,
}

impl Table {
    /// The table a host declared.
    pub fn of(declared: &magic_sync_core::row::Table) -> Table {
        let names = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
        Table {
            name: declared.name.to_string(),
            mirror: declared.mirror,
            columns: declared
                .columns
                .iter()
                .map(|c| Column {
                    name: c.name.to_string(),
                    kind: c.kind,
                    nullable: c.nullable,
                    checked: c.checked,
                })
                .collect(),
            key: names(declared.key),
            owned: names(declared.owned),
            origin: declared.origin.map(str::to_string),
            retired: declared.retired.map(str::to_string),
            lane: declared.lane.map(str::to_string),
        }
    }

    /// The column called `name`, if the table has one.
    pub fn column(&self, name: &str) -> Option<&Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// Whether the replica owns column `column`.
    pub fn owns(&self, column: &str) -> bool {
        self.owned.iter().any(|o| o == column)
    }

    /// The positions of the key columns among the columns, in key order.
    pub fn key_positions(&self) -> Vec<usize> {
        self.key
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| &c.name == k))
            .collect()
    }
}

/// A table with the codec its rows travel in.
#[derive(Debug, Clone)]
pub(crate) struct Codec {
    table: Table,
    inner: wire::Codec,
}

impl Codec {
    /// The table `inner` declares, travelling in it.
    pub fn new(inner: wire::Codec) -> Codec {
        Codec {
            table: Table::of(inner.table()),
            inner,
        }
    }

    /// The table.
    pub fn table(&self) -> &Table {
        &self.table
    }

    /// `json` or `protobuf`.
    pub fn format(&self) -> &'static str {
        self.inner.format()
    }

    /// Encodes a row given as its column values, in column order.
    pub fn encode(&self, values: Vec<Value>) -> Result<Vec<u8>, CodecError> {
        self.inner.encode(values)
    }

    /// Decodes a row into its column values, in column order.
    pub fn decode(&self, bytes: &[u8]) -> Result<Vec<Value>, CodecError> {
        self.inner.decode(bytes)
    }
}

/// Every table the replica holds or writes, in the order they were
/// declared.
#[derive(Debug, Clone)]
pub(crate) struct Shapes {
    codecs: Vec<Codec>,
    by_name: HashMap<String, usize>,
}

impl Shapes {
    /// The tables `engine` declares.
    pub fn of(engine: &Engine) -> Shapes {
        let codecs: Vec<Codec> = engine
            .codecs()
            .iter()
            .map(|c| Codec::new(c.clone()))
            .collect();
        let by_name = codecs
            .iter()
            .enumerate()
            .map(|(i, c)| (c.table.name.clone(), i))
            .collect();
        Shapes { codecs, by_name }
    }

    /// The table called `name`, with its codec.
    pub fn codec(&self, name: &str) -> Option<&Codec> {
        self.by_name.get(name).map(|&i| &self.codecs[i])
    }

    /// Every table, in declared order.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.codecs.iter().map(|c| &c.table)
    }
}

//! The engine: the list of declared tables, and what follows from them alone.

use crate::error::{Error, Mismatch, Result};
use crate::row::{Mirror, Row, Rule, Table};
use crate::wire;
use std::collections::HashMap;

/// A table the engine notes changes of without it being declared: the two
/// tables of a group rule.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GroupTable {
    /// The table's name (in the declaring table's schema).
    pub name: &'static str,
    /// Its schema.
    pub schema: &'static str,
    /// The columns its notes are keyed by, in order.
    pub key: Vec<&'static str>,
    /// Whether it is a members table (else a grants table).
    pub members: bool,
}

/// Every declared table, in one list, keyed by name.
#[derive(Debug, Clone)]
pub struct Engine {
    tables: Vec<wire::Codec>,
    by_name: HashMap<&'static str, usize>,
}

impl Engine {
    /// An engine over `tables`. Refuses two declarations of one name, and
    /// rules that make no sense together.
    pub fn new(tables: Vec<wire::Codec>) -> Result<Self> {
        let mut by_name = HashMap::new();
        let mut problems = Vec::new();
        for (i, codec) in tables.iter().enumerate() {
            let t = codec.table();
            if let Some(&first) = by_name.get(t.name) {
                let other: &wire::Codec = &tables[first];
                problems.push(Mismatch {
                    table: t.name.to_string(),
                    column: None,
                    problem: format!(
                        "declared twice, by `{}` and by `{}`",
                        other.table().rust_type,
                        t.rust_type
                    ),
                });
            }
            by_name.insert(t.name, i);
        }
        let engine = Engine { tables, by_name };
        for group in engine.group_tables() {
            if engine.by_name.contains_key(group.name) {
                problems.push(Mismatch {
                    table: group.name.to_string(),
                    column: None,
                    problem: "is a group table of a rule and also a declared table".into(),
                });
            }
        }
        if problems.is_empty() {
            Ok(engine)
        } else {
            Err(Error::Declarations(problems))
        }
    }

    /// Starts a list of tables: `Engine::builder().table::<Product>().table::<Order>().build()`.
    pub fn builder() -> Builder {
        Builder {
            tables: Vec::new(),
            stamps: Vec::new(),
        }
    }

    /// Every declared table, in the order given.
    pub fn tables(&self) -> impl Iterator<Item = &'static Table> + '_ {
        self.tables.iter().map(wire::Codec::table)
    }

    /// The codecs, in the order given.
    pub fn codecs(&self) -> &[wire::Codec] {
        &self.tables
    }

    /// The codec of the table called `name`.
    pub fn codec(&self, name: &str) -> Option<&wire::Codec> {
        self.by_name.get(name).map(|&i| &self.tables[i])
    }

    /// Tables whose rows travel down (the down path's concern).
    pub fn down_tables(&self) -> impl Iterator<Item = &'static Table> + '_ {
        self.tables().filter(|t| t.mirror.goes_down())
    }

    /// The group tables of every group rule, each once.
    pub fn group_tables(&self) -> Vec<GroupTable> {
        let mut out: Vec<GroupTable> = Vec::new();
        for t in self.tables() {
            if let Rule::Group(g) = &t.rule {
                let mut members_key = vec![g.group];
                members_key.extend_from_slice(g.member);
                let candidates = [
                    GroupTable {
                        name: g.members,
                        schema: t.schema,
                        key: members_key,
                        members: true,
                    },
                    GroupTable {
                        name: g.grants,
                        schema: t.schema,
                        key: vec![g.replica, g.group],
                        members: false,
                    },
                ];
                for c in candidates {
                    if !out.iter().any(|o| o.name == c.name && o.schema == c.schema) {
                        out.push(c);
                    }
                }
            }
        }
        out
    }

    /// Whether any table is of this direction.
    pub fn has(&self, mirror: Mirror) -> bool {
        self.tables().any(|t| t.mirror == mirror)
    }
}

/// Builds an [`Engine`] table by table.
pub struct Builder {
    tables: Vec<wire::Codec>,
    stamps: Vec<(&'static str, wire::Stamp)>,
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stamped: Vec<&str> = self.stamps.iter().map(|(t, _)| *t).collect();
        f.debug_struct("Builder")
            .field("tables", &self.tables)
            .field("stamped", &stamped)
            .finish()
    }
}

impl Builder {
    /// Adds the table `R` declares.
    #[allow(clippy::should_implement_trait)]
    pub fn table<R: Row>(mut self) -> Self {
        self.tables.push(wire::Codec::of::<R>());
        self
    }

    /// Adds the table `R` declares, with `codec` instead of the codec it
    /// declares: one a host builds at run time, or one under test.
    pub fn table_with<R: Row>(mut self, codec: crate::codec::Codec<R>) -> Self {
        self.tables.push(wire::Codec::with(codec));
        self
    }

    /// Stamps what the host knows of a sender on every row it uploads to
    /// `R`'s table (which replicas write: `up`, or the owned columns of
    /// `both`), before the row is filed: a store the till belongs to, a
    /// region, a check that refuses a row. See [`wire::Stamp`].
    ///
    /// `magic_sync::Engine`'s documentation shows one.
    pub fn stamp<R: Row>(
        mut self,
        stamp: impl Fn(
                &str,
                &mut serde_json::Map<String, serde_json::Value>,
            ) -> std::result::Result<(), String>
            + Send
            + Sync
            + 'static,
    ) -> Self {
        self.stamps
            .push((R::TABLE.name, std::sync::Arc::new(stamp)));
        self
    }

    /// The engine. A stamp on a table not declared, or on one replicas do
    /// not write, is refused.
    pub fn build(mut self) -> Result<Engine> {
        let mut problems = Vec::new();
        for (name, stamp) in self.stamps {
            match self.tables.iter_mut().find(|c| c.name() == name) {
                Some(codec) if codec.table().mirror != Mirror::Down => {
                    codec.set_stamp(stamp);
                }
                Some(_) => problems.push(Mismatch {
                    table: name.to_string(),
                    column: None,
                    problem: "has a stamp, but replicas do not write it (a down table)".into(),
                }),
                None => problems.push(Mismatch {
                    table: name.to_string(),
                    column: None,
                    problem: "has a stamp, but is not declared".into(),
                }),
            }
        }
        if !problems.is_empty() {
            return Err(Error::Declarations(problems));
        }
        Engine::new(self.tables)
    }
}

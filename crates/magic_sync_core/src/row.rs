//! What a table declares: the row type, which way it travels, and which
//! replicas hold which of its rows.
//!
//! A declaration is a Rust struct with `#[derive(Row)]`. The derive is the only
//! way to implement [`Row`]: the trait carries a hidden seal that only the
//! macro names, so every declaration went through the macro's checks.

use crate::codec::Codec;
pub use crate::columns::{Column, Columns};

/// Which way a table's rows travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mirror {
    /// The server's rows; replicas hold them read-only (a catalog).
    Down,
    /// Records a replica writes, keyed by the replica that wrote them.
    Up,
    /// The server's rows, of which the replica owns (and may change) some columns.
    Both,
}

impl Mirror {
    /// Whether the server sends this table's rows to replicas.
    pub fn goes_down(self) -> bool {
        matches!(self, Mirror::Down | Mirror::Both)
    }
    /// The word the declaration uses for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mirror::Down => "down",
            Mirror::Up => "up",
            Mirror::Both => "both",
        }
    }
}

/// A group rule: rows given to replicas through groups.
///
/// `members` lists which rows belong to which group (`group` column and the
/// `member` columns, which point at the declared table's key, in key order);
/// `grants` lists which group is given to which replica (`replica` column and
/// its own group column, named like the members' one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupRule {
    /// The members table (in the declared table's schema).
    pub members: &'static str,
    /// The members table's columns pointing at the row, in key order.
    pub member: &'static [&'static str],
    /// The group column, in both the members and the grants table.
    pub group: &'static str,
    /// The grants table (in the declared table's schema).
    pub grants: &'static str,
    /// The grants table's replica column.
    pub replica: &'static str,
}

/// Which replicas hold which rows of a table that goes down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// Every replica holds every row.
    All,
    /// Rows whose column equals the replica's id.
    Replica(&'static str),
    /// Rows whose column equals the replica's partition.
    Partition(&'static str),
    /// Rows given through groups.
    Group(GroupRule),
    /// No rule of its own: a row travels only as the parent of a row a replica holds.
    Referenced,
    /// A row travels with its parent: the named columns are a foreign key to it.
    Follows(&'static [&'static str]),
    /// Up tables: a record stays with the replica that wrote it.
    Origin,
}

impl Rule {
    /// The word the declaration uses for it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Rule::All => "all",
            Rule::Replica(_) => "replica",
            Rule::Partition(_) => "partition",
            Rule::Group(_) => "group",
            Rule::Referenced => "referenced",
            Rule::Follows(_) => "follows",
            Rule::Origin => "origin",
        }
    }
}

/// Everything a declaration says about its table, as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Table {
    /// The table's name in PostgreSQL (and the name replicas know it by).
    pub name: &'static str,
    /// The PostgreSQL schema it lives in.
    pub schema: &'static str,
    /// The Rust type that declared it.
    pub rust_type: &'static str,
    /// Which way it travels.
    pub mirror: Mirror,
    /// Which replicas hold which rows.
    pub rule: Rule,
    /// Every column the replicas see, in field order.
    pub columns: &'static [Column],
    /// Key columns, in declared order.
    pub key: &'static [&'static str],
    /// Columns the replica owns (two-way tables).
    pub owned: &'static [&'static str],
    /// A monotonic version column (up tables).
    pub version: Option<&'static str>,
    /// The column naming the replica that wrote a record (up tables).
    pub origin: Option<&'static str>,
    /// The replica-side column set when a row is retired (kept because a row
    /// of the replica's own points at it). Not a PostgreSQL column.
    pub retired: Option<&'static str>,
    /// The upload lane the replica sends this table's writes on; `None`:
    /// the first lane, shared with every table not given one.
    pub lane: Option<&'static str>,
}

impl Table {
    /// The column called `name`, if the declaration has one.
    pub fn column(&self, name: &str) -> Option<&'static Column> {
        self.columns.iter().find(|c| c.name == name)
    }

    /// The schema-qualified name, quoted for SQL.
    pub fn qualified(&self) -> String {
        format!(
            "{}.{}",
            crate::sql::ident(self.schema),
            crate::sql::ident(self.name)
        )
    }

    /// Whether the replicas own this column.
    pub fn owns(&self, column: &str) -> bool {
        self.owned.contains(&column)
    }

    /// Positions of the key columns among `columns`, in key order.
    pub fn key_positions(&self) -> Vec<usize> {
        self.key
            .iter()
            .map(|k| {
                self.columns
                    .iter()
                    .position(|c| c.name == *k)
                    .unwrap_or_else(|| {
                        panic!("declaration of `{}`: key `{k}` is no column", self.name)
                    })
            })
            .collect()
    }
}

#[doc(hidden)]
pub mod sealed {
    /// Named only by the code `#[derive(Row)]` writes.
    #[derive(Debug)]
    pub struct DeriveOnly(());
    impl DeriveOnly {
        #[doc(hidden)]
        pub const fn __magic_sync_derive_only() -> Self {
            DeriveOnly(())
        }
    }
}

/// A declared table's row. Implement it with `#[derive(Row)]`; there is no other way.
pub trait Row: Columns {
    /// The declaration.
    const TABLE: Table;
    /// The codec rows of this table travel in.
    fn codec() -> Codec<Self>;
    #[doc(hidden)]
    fn __sealed() -> sealed::DeriveOnly;
}

//! What a struct's fields say about the columns they are: a name, a kind,
//! and whether NULL is taken. The codecs read rows through it; a table's
//! declaration ([`crate::row`]) lists its columns with it.

use crate::value::{Kind, Value, ValueError};

/// One column of a declared table, as the Rust field says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Column {
    /// The column's name, in PostgreSQL and SQLite alike.
    pub name: &'static str,
    /// What kind of value the field holds.
    pub kind: Kind,
    /// Whether the field accepts NULL (`Option<T>`).
    pub nullable: bool,
    /// Whether the field's type checks values beyond its kind
    /// ([`crate::value::Field::CHECKED`]).
    pub checked: bool,
}

/// A struct whose fields are columns. `#[derive(Columns)]` implements it; so does `#[derive(Row)]`.
pub trait Columns: Sized + Send + Sync + 'static {
    /// The columns, in field order.
    const COLUMNS: &'static [Column];
    /// The field values, in field order.
    fn to_values(&self) -> Vec<Value>;
    /// Builds the struct from values in field order.
    fn from_values(values: Vec<Value>) -> Result<Self, ValueError>;
}

//! What a replica's database is made of beyond each table's declaration:
//! the foreign keys among the declared tables, which the server reads from
//! its catalogue.

/// A foreign key among the replica's tables: the `child_columns` of `child`
/// point at the `parent_columns` of `parent`, pairwise. The server reads them
/// from its catalogue; the replica is told them when it opens.
#[derive(Debug, Clone, PartialEq, Eq)]
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

//! The tables the running build declares (`sync.tables`), each with its
//! fingerprints: written when a relay starts (`crate::deploy`), read by the
//! operator's reads to tell a declared table from a name a replica made up.

/// The name the operator's reads give a table no build declares.
pub const UNDECLARED: &str = "(undeclared)";

/// SQL that is true when `column` (a table name) is one the build
/// declares, or when no build recorded what it declares yet.
pub(crate) fn declared(column: &str) -> String {
    format!(
        "(EXISTS (SELECT 1 FROM sync.tables d WHERE d.name = {column})
          OR NOT EXISTS (SELECT 1 FROM sync.tables))"
    )
}

/// SQL naming `column` (a table name) as the operator's reads show it:
/// itself when [`declared`], else [`UNDECLARED`].
pub(crate) fn shown(column: &str) -> String {
    format!(
        "CASE WHEN {} THEN {column} ELSE '{UNDECLARED}' END",
        declared(column)
    )
}

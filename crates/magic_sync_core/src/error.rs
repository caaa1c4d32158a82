//! What the protocol core refuses: declarations that disagree with
//! themselves.

use std::fmt;

/// A declaration that disagrees with the database, or with itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    /// The table concerned (as declared).
    pub table: String,
    /// The column concerned, when there is one.
    pub column: Option<String>,
    /// What is wrong, in a sentence.
    pub problem: String,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.column {
            Some(c) => write!(
                f,
                "table `{}`, column `{}`: {}",
                self.table, c, self.problem
            ),
            None => write!(f, "table `{}`: {}", self.table, self.problem),
        }
    }
}

/// The core's one error: declarations that cannot make an engine. The
/// server's and the replica's errors take it in as their own
/// `Declarations`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Declarations that disagree with each other.
    #[error("declarations disagree:\n  {}", list(.0))]
    Declarations(Vec<Mismatch>),
}

/// Items one to a line, as error messages list them.
pub fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  ")
}

/// The core's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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

/// What a side does about a failure: each side's `Error::handling` says
/// which, by the error's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handling {
    /// The infrastructure failed (the database, the network, a lock, a busy
    /// file): the same work may succeed unchanged, after a backoff with
    /// jitter.
    Retry,
    /// The data or the code failed: retrying it unchanged fails the same
    /// way. What it is about is set aside, shown as "deploy a fix", and
    /// everything else goes on.
    SetAside,
    /// The setup is wrong (declarations that disagree with the database,
    /// an index or trigger missing, a schema of another build): nothing can
    /// be done until the operator acts. The runner returns the error, whose
    /// text says what to do, instead of trying again.
    Stop,
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

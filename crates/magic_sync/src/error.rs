//! The engine's one error type. [`Error::is_transient`] is the one
//! classification the engine trusts: transient failures are retried unchanged,
//! everything else is set aside and shown.

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

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL failed.
    #[cfg(feature = "postgres")]
    #[error("postgres: {}", postgres_said(.0))]
    Postgres(#[from] tokio_postgres::Error),
    /// SQLite failed.
    #[cfg(feature = "sqlite")]
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The database's `sync` schema is newer than this build knows.
    #[error(
        "the database's sync schema is at version {found}, but this build knows versions up to \
         {known}: run a newer build of the server, or restore a database it knows"
    )]
    SchemaTooNew {
        /// The version the database is at.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// The `sync` schema is missing or behind: migrations were not run.
    #[error("the database's sync schema is at version {found}, this build needs {needed}: run the migrations first")]
    SchemaBehind {
        /// The version the database is at (0 when absent).
        found: i32,
        /// The version this build needs.
        needed: i32,
    },
    /// Declarations that disagree with the database or with each other.
    #[error("declarations disagree with the database:\n  {}", list(.0))]
    Declarations(Vec<Mismatch>),
    /// Indexes the relay needs on host tables, missing: each names the
    /// statement that makes it.
    #[cfg(feature = "postgres")]
    #[error("the relay needs indexes the database lacks; make them with:\n  {}", list(.0))]
    MissingIndexes(Vec<crate::check::MissingIndex>),
    /// A trigger the engine needs is missing, disabled or not as it would write it.
    #[error("trigger problems, the server will not start:\n  {}", list(.0))]
    Triggers(Vec<TriggerProblem>),
    /// Installing a table's triggers gave way to the application attempt
    /// after attempt: its locks were not granted within the lock timeout, or
    /// it met a deadlock. Nothing of that table was changed.
    #[cfg(feature = "postgres")]
    #[error(
        "installing the triggers on `{relation}` gave way to the application's transactions \
         {attempts} times (its locks were not granted within the lock timeout, or it met a \
         deadlock): try again when the table is quieter, or with a longer \
         InstallSettings::lock_timeout; last: {source}"
    )]
    InstallGaveWay {
        /// The table, schema-qualified.
        relation: String,
        /// Attempts made.
        attempts: u32,
        /// Why the last one gave way.
        source: tokio_postgres::Error,
    },
    /// A row that does not fit its codec.
    #[error("table `{table}`, key {key}: {source}")]
    Codec {
        /// The table.
        table: String,
        /// The row's key, as JSON.
        key: String,
        /// Why.
        source: crate::codec::CodecError,
    },
    /// A row larger than any message the transport takes.
    #[error("table `{table}`, key {key}: the row encodes to {bytes} bytes, more than a message may carry ({limit})")]
    RowTooLarge {
        /// The table.
        table: String,
        /// The row's key, as JSON.
        key: String,
        /// Its encoded size.
        bytes: usize,
        /// What a message may carry.
        limit: usize,
    },
    /// An acknowledgement whose seal does not verify: the server did not
    /// send that message to that replica.
    #[error("replica `{replica}` acknowledged message {number} under a seal the server did not make: refused")]
    Forged {
        /// The replica that sent it (as the transport authenticated it).
        replica: String,
        /// The message number it named.
        number: u64,
    },
    /// The transport did not take a message (it waits, or its snapshot is
    /// begun again).
    #[error("sending message {number} to replica `{replica}`: {reason}")]
    Send {
        /// The replica.
        replica: String,
        /// The message's number.
        number: u64,
        /// What the transport said.
        reason: String,
    },
    /// The engine was given something it does not know.
    #[error("{0}")]
    Invalid(String),
    /// Bytes given to a replica that are not a `ToReplica` message.
    #[error("the bytes given to the replica are not a ToReplica message: {0}")]
    Envelope(#[source] prost::DecodeError),
    /// A `ToReplica` message that decodes but cannot be applied as it is.
    #[error("message {number} to replica `{replica}` is malformed: {problem}")]
    Malformed {
        /// The replica it names.
        replica: String,
        /// Its number.
        number: u64,
        /// What is wrong with it.
        problem: String,
    },
    /// A message was applied and committed, but letting go of the retired rows
    /// nothing points at any more failed afterwards. The replica holds the
    /// message; the retired rows wait for the next purge.
    #[error("message {number} was applied, but purging retired rows afterwards failed: {source}")]
    Purge {
        /// The message that was applied.
        number: u64,
        /// Why the purge failed.
        source: Box<Error>,
    },
}

/// A trigger that is not as the engine would write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TriggerProblem {
    /// The relation the trigger is (or should be) on, schema-qualified.
    pub relation: String,
    /// The trigger's name.
    pub trigger: String,
    /// What is wrong.
    pub problem: String,
}

impl fmt::Display for TriggerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "trigger `{}` on `{}`: {}",
            self.trigger, self.relation, self.problem
        )
    }
}

fn list<T: fmt::Display>(items: &[T]) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n  ")
}

impl Error {
    /// Whether the infrastructure failed, so the same work may succeed unchanged.
    /// Anything not listed here is permanent.
    pub fn is_transient(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            Error::Postgres(e) => postgres_is_transient(e),
            #[cfg(feature = "sqlite")]
            Error::Sqlite(e) => matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
            ),
            Error::Purge { source, .. } => source.is_transient(),
            // The transport is the infrastructure.
            Error::Send { .. } => true,
            #[cfg(feature = "postgres")]
            Error::InstallGaveWay { .. } => true,
            _ => false,
        }
    }
}

/// What PostgreSQL said, in its own words (its message, the detail, the
/// SQLSTATE), not the client's bare "db error".
#[cfg(feature = "postgres")]
fn postgres_said(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({detail}) [{}]", db.message(), db.code().code()),
            None => format!("{} [{}]", db.message(), db.code().code()),
        },
        None => e.to_string(),
    }
}

#[cfg(feature = "postgres")]
fn postgres_is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // No SQLSTATE: the connection or the socket failed.
        None => true,
        Some(code) => {
            let c = code.code();
            c.starts_with("08") // connection exception
                || c.starts_with("53") // insufficient resources
                || c == "40001" // serialization failure
                || c == "40P01" // deadlock detected
                || c == "55P03" // lock not available
                || c == "57P01" // admin shutdown
                || c == "57P02" // crash shutdown
                || c == "57P03" // cannot connect now
                || c == "57014" // query cancelled (statement timeout)
        }
    }
}

/// The engine's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

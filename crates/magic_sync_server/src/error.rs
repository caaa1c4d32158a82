//! The server's errors, and what each one's kind makes the server do
//! ([`Error::handling`]): retry the same work after a backoff, set aside
//! what it is about and go on with the rest, or stop and tell the operator
//! what to do.

use magic_sync_core::error::list;
pub use magic_sync_core::error::{Handling, Mismatch};
use magic_sync_core::link::LinkErrorKind;
use magic_sync_core::sql::{ident, qualified};
use magic_sync_core::ReplicaId;
use std::fmt;
use tokio_postgres::error::SqlState;

/// Everything that can go wrong on the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL failed.
    #[error("postgres: {}", postgres_said(.0))]
    Postgres(#[from] tokio_postgres::Error),
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
    #[error("the relay needs indexes the database lacks; make them with:\n  {}", list(.0))]
    MissingIndexes(Vec<MissingIndex>),
    /// A trigger the engine needs is missing, disabled or not as it would write it.
    #[error("trigger problems, the server will not start:\n  {}", list(.0))]
    Triggers(Vec<TriggerProblem>),
    /// Installing a table's triggers gave way to the application attempt
    /// after attempt: its locks were not granted within the lock timeout, or
    /// it met a deadlock. Nothing of that table was changed.
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
    /// An acknowledgement whose seal does not verify: the server did not
    /// send that message to that replica.
    #[error("replica `{replica}` acknowledged message {number} under a seal the server did not make: refused")]
    Forged {
        /// The replica that sent it (as the transport authenticated it).
        replica: ReplicaId,
        /// The message number it named.
        number: u64,
    },
    /// The transport did not take a message: out of reach, it waits (or
    /// its snapshot is begun again); refused, by its kind, the runner
    /// stops with what the transport said.
    #[error("sending message {number} to replica `{replica}`: {reason}")]
    Send {
        /// The replica.
        replica: ReplicaId,
        /// The message's number.
        number: u64,
        /// What the transport said, and its kind.
        reason: crate::relay::SendError,
    },
    /// An upload from a replica the server does not know (or no longer
    /// lists as live).
    #[error("an upload from replica `{replica}`, which the server does not know")]
    UnknownReplica {
        /// The replica, as the transport authenticated it.
        replica: ReplicaId,
    },
    /// The host's list of replicas cannot be a fleet (an empty id, an id
    /// twice): the host's to fix.
    #[error("the host's list of replicas: {problem}")]
    ReplicaList {
        /// What is wrong with it.
        problem: String,
    },
    /// A row PostgreSQL gave back that does not fit its declaration.
    #[error("table `{table}`: a row read from PostgreSQL does not fit its declaration: {problem}")]
    RowMismatch {
        /// The table.
        table: String,
        /// What does not fit, naming the column.
        problem: String,
    },
    /// TLS to PostgreSQL cannot be set up as asked (root certificates that
    /// do not read, say).
    #[error("TLS to PostgreSQL: {why}")]
    Tls {
        /// What is wrong.
        why: String,
    },
    /// The key signing seeds are sealed under (`MAGIC_SYNC_SEED_KEY`)
    /// is missing, unreadable, or not the one they were sealed with.
    #[error("the server's signing seeds: {why}")]
    SeedKey {
        /// What is wrong, and what to do.
        why: String,
    },
    /// The `sync` schema holds what the engine never writes there.
    #[error("the sync schema is damaged: {what}")]
    Damaged {
        /// What was found, and where.
        what: String,
    },
    /// Rows a load could not send: each does not encode, or is larger than
    /// any message. A pass sets them aside (`sync.quarantine`) and plans
    /// again without them; a snapshot records them and is begun again.
    #[error("rows that cannot go down:\n  {}", list(.0))]
    Unsendable(Vec<Unsendable>),
    /// A pass planned again and again around rows set aside, and found
    /// more to set aside every time: an engine bug, which a fix ends.
    #[error(
        "a pass planned {attempts} times around rows set aside and found more to set aside each \
         time: a bug in the engine (nothing was recorded; deploy a fix)"
    )]
    Unsettled {
        /// Plans made.
        attempts: u32,
    },
    /// A snapshot streamed by the queries in closed form sent other rows
    /// than the plan of the same view holds: an engine bug. The snapshot is
    /// begun again, planned first, as every later one is.
    #[error(
        "the snapshot of replica `{replica}` streamed {streamed} rows where its plan holds \
         {planned}: a bug in the engine; snapshots are planned before they stream from now on \
         (deploy a fix)"
    )]
    Disagreed {
        /// The replica.
        replica: ReplicaId,
        /// Rows streamed.
        streamed: u64,
        /// Rows planned.
        planned: u64,
    },
    /// A named fault point armed by a test: the process "died" there.
    #[cfg(feature = "failpoints")]
    #[error("the fault point `{0}` was armed")]
    Injected(&'static str),
    /// A pass on a connection that does not hold the relay's lock (it was
    /// lost with its connection, or never taken).
    #[error("the relay records only on the connection that holds its lock (Relay::lock)")]
    NotLocked,
}

impl From<magic_sync_core::error::Error> for Error {
    fn from(e: magic_sync_core::error::Error) -> Self {
        match e {
            magic_sync_core::error::Error::Declarations(m) => Error::Declarations(m),
        }
    }
}

/// A row that cannot go down, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unsendable {
    /// The table.
    pub table: &'static str,
    /// The row's key, as it travels (a JSON array).
    pub key: String,
    /// Why: the codec's refusal, or the row's size against the limit.
    pub reason: String,
}

impl fmt::Display for Unsendable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "table `{}`, key {}: {}",
            self.table, self.key, self.reason
        )
    }
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

/// An index the relay needs on a host table, and the database lacks.
///
/// The relay looks rows up by their key, and follows foreign keys from the
/// child to the parent by the parent's key; both have indexes in any schema.
/// Two lookups go the other way and need one the host may not have made: the
/// rows that follow a parent (by the child's following columns), and, for a
/// group rule, a row's groups and a group's members. Without the index, each
/// would scan the table for every row it looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingIndex {
    /// The table's schema.
    pub schema: String,
    /// The table.
    pub table: String,
    /// The columns the index must lead with (in any order).
    pub columns: Vec<String>,
    /// Whether the table is partitioned (an index on it cannot be built
    /// concurrently).
    pub partitioned: bool,
    /// What the relay looks up through it.
    pub why: String,
}

impl MissingIndex {
    /// The statement that makes it: without blocking the table's writes
    /// (`CONCURRENTLY`), but on a partitioned table, where PostgreSQL cannot.
    pub fn create_sql(&self) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| ident(c)).collect();
        let mut name = format!("{}_{}_idx", self.table, self.columns.join("_"));
        if name.len() > 63 {
            let mut cut = 63;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        format!(
            "CREATE INDEX {}IF NOT EXISTS {} ON {} ({})",
            if self.partitioned {
                ""
            } else {
                "CONCURRENTLY "
            },
            ident(&name),
            qualified(&self.schema, &self.table),
            columns.join(", ")
        )
    }
}

impl std::fmt::Display for MissingIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; -- {}", self.create_sql(), self.why)
    }
}

impl Error {
    /// What the server does about this failure, decided for every kind:
    /// a kind added later is classified by whoever adds it, never by a
    /// default.
    pub fn handling(&self) -> Handling {
        match self {
            // The connection, the server's resources, a lock, a conflict:
            // the infrastructure. Anything else PostgreSQL refuses is about
            // the data or the statement, and fails the same way again.
            Error::Postgres(e) => postgres_handling(e),
            // The transport says which, by its kind. A message it refuses
            // was made within the transport's own limit, so the two
            // disagree, and a message cannot be set aside (the chain needs
            // it): the operator's to mend, as credentials refused are.
            Error::Send { reason, .. } => match reason.kind {
                LinkErrorKind::Unreachable => Handling::Retry,
                LinkErrorKind::Refused | LinkErrorKind::Misconfigured => Handling::Stop,
            },
            // The application's transactions held the table: a quieter
            // moment installs it.
            Error::InstallGaveWay { .. } => Handling::Retry,
            // The lock went with its connection: the next attempt takes it
            // again.
            Error::NotLocked => Handling::Retry,
            // As the process dying there would: the next attempt goes on.
            #[cfg(feature = "failpoints")]
            Error::Injected(_) => Handling::Retry,
            // What one replica said, or one row, one plan, one snapshot:
            // refused or set aside, and the rest goes on.
            Error::Forged { .. }
            | Error::UnknownReplica { .. }
            | Error::RowMismatch { .. }
            | Error::Unsendable(_)
            | Error::Unsettled { .. }
            | Error::Disagreed { .. } => Handling::SetAside,
            // The host's list, asked for again before every pass: a host
            // that mends it goes on without a restart.
            Error::ReplicaList { .. } => Handling::SetAside,
            // The setup: nothing changes until the operator acts.
            Error::SchemaTooNew { .. }
            | Error::SchemaBehind { .. }
            | Error::Declarations(_)
            | Error::MissingIndexes(_)
            | Error::Triggers(_)
            | Error::Tls { .. }
            | Error::SeedKey { .. }
            | Error::Damaged { .. } => Handling::Stop,
        }
    }

    /// Whether a transaction lost a race with another (a serialisation
    /// failure, a deadlock): it rolled back whole, its session is sound,
    /// and running the same work again on it is all that is needed.
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            Error::Postgres(e) if e.code().is_some_and(|c| {
                *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
            })
        )
    }

    /// Whether the infrastructure failed, so the same work may succeed
    /// unchanged ([`Handling::Retry`]).
    pub fn is_transient(&self) -> bool {
        self.handling() == Handling::Retry
    }

    /// Whether PostgreSQL refused a value (SQLSTATE class 22, a data
    /// exception: a cast that fails, a number out of range, text that is no
    /// value of its type). What it is about is the value, never the
    /// connection, which stays sound.
    pub fn is_data_exception(&self) -> bool {
        matches!(self, Error::Postgres(e) if is_data_exception(e))
    }
}

/// The SQLSTATE class of a data exception: a value PostgreSQL refuses.
const DATA_EXCEPTION: &str = "22";
/// The SQLSTATE class of an integrity constraint violation: a row a
/// constraint refuses.
const INTEGRITY_CONSTRAINT_VIOLATION: &str = "23";

/// Whether `e` carries a SQLSTATE of `class` (its first two characters).
fn in_class(e: &tokio_postgres::Error, class: &str) -> bool {
    e.code().is_some_and(|c| c.code().starts_with(class))
}

/// Whether PostgreSQL refused a value (SQLSTATE class 22): what a note that
/// no longer fits its table makes a pass fail with (`store::parked`).
pub(crate) fn is_data_exception(e: &tokio_postgres::Error) -> bool {
    in_class(e, DATA_EXCEPTION)
}

/// Whether PostgreSQL refused the row itself: a value it cannot take
/// (class 22), a constraint (class 23), a type it cannot convert. Filing
/// refuses that row alone; anything else is the infrastructure's, and files
/// nothing.
pub(crate) fn refuses_the_row(e: &tokio_postgres::Error) -> bool {
    in_class(e, DATA_EXCEPTION)
        || in_class(e, INTEGRITY_CONSTRAINT_VIOLATION)
        || e.code() == Some(&SqlState::DATATYPE_MISMATCH)
}

/// Whether PostgreSQL refused a statement of many rows for one of them, or
/// for a key it was given twice ([`refuses_the_row`], or a cardinality
/// violation): filing them one by one refuses only the row at fault.
pub(crate) fn refuses_a_row_of_many(e: &tokio_postgres::Error) -> bool {
    refuses_the_row(e) || e.code() == Some(&SqlState::CARDINALITY_VIOLATION)
}

/// Whether a statement gave way to the application's transactions: its
/// locks were not granted in time (the lock or the statement timed out),
/// or it was chosen to break a deadlock. Nothing it did stays, and it may
/// go once the table is quieter.
pub(crate) fn gave_way(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE
            || *c == SqlState::T_R_DEADLOCK_DETECTED
            || *c == SqlState::QUERY_CANCELED
    )
}

/// What PostgreSQL said, in its own words (its message, the detail, the
/// SQLSTATE), not the client's bare "db error".
fn postgres_said(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({detail}) [{}]", db.message(), db.code().code()),
            None => format!("{} [{}]", db.message(), db.code().code()),
        },
        None => e.to_string(),
    }
}

/// What a failure of PostgreSQL's is, as [`Error::handling`] decides it
/// for [`Error::Postgres`]: the connection, the server's resources, a
/// lock, a conflict are the infrastructure ([`Handling::Retry`]); anything
/// else PostgreSQL refuses is about the data or the statement, and fails
/// the same way again ([`Handling::SetAside`]). For a crate beside the
/// server that keeps a `tokio_postgres::Error` of its own.
pub fn postgres_handling(e: &tokio_postgres::Error) -> Handling {
    match postgres_is_transient(e) {
        true => Handling::Retry,
        false => Handling::SetAside,
    }
}

/// The SQLSTATEs that say the infrastructure failed: the connection, the
/// server's resources, a lock, a serialisation conflict, a shutdown, a
/// statement cancelled on its timeout.
const TRANSIENT: &[SqlState] = &[
    // Class 08: connection exception.
    SqlState::CONNECTION_EXCEPTION,
    SqlState::CONNECTION_DOES_NOT_EXIST,
    SqlState::CONNECTION_FAILURE,
    SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    SqlState::SQLSERVER_REJECTED_ESTABLISHMENT_OF_SQLCONNECTION,
    SqlState::TRANSACTION_RESOLUTION_UNKNOWN,
    SqlState::PROTOCOL_VIOLATION,
    // Class 53: insufficient resources.
    SqlState::INSUFFICIENT_RESOURCES,
    SqlState::DISK_FULL,
    SqlState::OUT_OF_MEMORY,
    SqlState::TOO_MANY_CONNECTIONS,
    SqlState::CONFIGURATION_LIMIT_EXCEEDED,
    SqlState::T_R_SERIALIZATION_FAILURE,
    SqlState::T_R_DEADLOCK_DETECTED,
    SqlState::LOCK_NOT_AVAILABLE,
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
    SqlState::QUERY_CANCELED,
];

fn postgres_is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        // No SQLSTATE: the connection or the socket failed.
        None => true,
        Some(code) => TRANSIENT.contains(code),
    }
}

/// The server's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

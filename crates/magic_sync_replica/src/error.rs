//! The replica's errors, and what each one's kind makes the replica do
//! ([`Error::handling`]).

use magic_sync_core::error::list;
pub use magic_sync_core::error::{Handling, Mismatch};
use magic_sync_core::link::LinkErrorKind;

/// Everything that can go wrong on a replica.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A named fault point armed by a test: the process "died" there.
    #[cfg(feature = "failpoints")]
    #[error("the fault point `{0}` was armed")]
    Injected(&'static str),
    /// SQLite failed.
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// Declarations that disagree with the replica's database or with each other.
    #[error("declarations disagree with the replica's database:\n  {}", list(.0))]
    Declarations(Vec<Mismatch>),
    /// A replica following the server's description was told tables it
    /// cannot hold: each reason names the table, and the column where one
    /// is at fault. Nothing of the message that told it was applied.
    #[error("the server describes tables this replica cannot follow:\n  {}", list(.0))]
    Undescribable(Vec<String>),
    /// A declared table the engine has no codec for: a bug in how the
    /// replica was built, not in any row.
    #[error("table `{table}` has no codec in this build")]
    NoCodec {
        /// The table.
        table: String,
    },
    /// A row the replica's database holds in a form its table does not
    /// take (a host wrote it so): it is set aside, and holds back no other.
    #[error("table `{table}`{}: {problem}", .key.as_ref().map(|k| format!(", row {k}")).unwrap_or_default())]
    Unreadable {
        /// The table.
        table: String,
        /// The row's key as noted, when known.
        key: Option<String>,
        /// What does not fit, naming the column.
        problem: String,
    },
    /// The SQLite the process loaded is older than the replica needs.
    #[error("SQLite {found} is loaded, and the replica needs {needed} or later (STRICT tables): update the system's libsqlite3, or build with rusqlite's `bundled` feature")]
    OldSqlite {
        /// The version loaded.
        found: &'static str,
        /// The oldest it takes.
        needed: &'static str,
    },
    /// The replica's own bookkeeping holds what it never writes.
    #[error("the replica's bookkeeping is damaged: {0}")]
    Bookkeeping(String),
    /// Bytes given to the replica that are not a `ToReplica` message.
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
    /// The replica pins no server key, so it can believe nothing it is
    /// sent: its host has not given it the key (see `Replica::trust`).
    #[error("the replica pins no server key: give it the key the server printed when the replica was enrolled (Replica::trust, or --server-key)")]
    NoServerKey,
    /// The host gave a key other than the one the replica pins: the replica
    /// belongs to another server (or the key was mistyped).
    #[error("the replica pins server key {pinned}, and was given {given}: it belongs to another server, or the key is mistyped")]
    OtherServer {
        /// The key the replica was enrolled with.
        pinned: String,
        /// The key it was given.
        given: String,
    },
    /// An answer that is not its server's: refused, counted, and nothing
    /// changed.
    #[error("refused {what}: {why}")]
    Forged {
        /// What was refused.
        what: String,
        /// Why.
        why: magic_sync_core::sign::Forgery,
    },
    /// The transport would not carry what the replica said (an upload);
    /// its kind says whether that passes. The replica's own uplink sets
    /// aside what it refuses and waits while the server is out of reach:
    /// what reaches its loop is a transport that carries nothing until its
    /// operator acts (credentials refused, a setting that cannot work).
    #[error("the transport: {0}")]
    Transport(magic_sync_core::link::LinkError),
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

impl From<magic_sync_core::error::Error> for Error {
    fn from(e: magic_sync_core::error::Error) -> Self {
        match e {
            magic_sync_core::error::Error::Declarations(m) => Error::Declarations(m),
        }
    }
}

impl Error {
    /// What the replica's loop does about this failure, decided for every
    /// kind: a kind added later is classified by whoever adds it, never by
    /// a default.
    pub fn handling(&self) -> Handling {
        match self {
            // The host holds the file longer than the replica waits.
            Error::Sqlite(e) if is_busy(e) => Handling::Retry,
            // The replica's own database failed otherwise (its disk, its
            // file): the host's to decide about. Skipping the message it
            // failed on would only open a gap.
            Error::Sqlite(_) => Handling::Stop,
            // The transport says which, by its kind.
            Error::Transport(e) => match e.kind {
                LinkErrorKind::Unreachable => Handling::Retry,
                LinkErrorKind::Refused => Handling::SetAside,
                LinkErrorKind::Misconfigured => Handling::Stop,
            },
            // The message applied; what failed after it decides.
            Error::Purge { source, .. } => source.handling(),
            // As the process dying there would: the next attempt goes on.
            #[cfg(feature = "failpoints")]
            Error::Injected(_) => Handling::Retry,
            // One row, one message, one answer: refused or skipped, and
            // the rest goes on.
            Error::Unreadable { .. }
            | Error::Envelope(_)
            | Error::Malformed { .. }
            | Error::Forged { .. } => Handling::SetAside,
            // How the replica was built or set up: nothing changes until
            // its host acts.
            Error::Declarations(_)
            | Error::Undescribable(_)
            | Error::NoCodec { .. }
            | Error::OldSqlite { .. }
            | Error::Bookkeeping(_)
            | Error::NoServerKey
            | Error::OtherServer { .. } => Handling::Stop,
        }
    }

    /// Whether the database was busy, so the same work may succeed
    /// unchanged ([`Handling::Retry`]).
    pub fn is_transient(&self) -> bool {
        self.handling() == Handling::Retry
    }
}

/// Whether SQLite gave up waiting for another connection's lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// The replica's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

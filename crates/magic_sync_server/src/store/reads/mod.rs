//! What an operator sees: reads of the engine's own record (the `sync`
//! schema), for dashboards and for the `magic-sync` command.
//!
//! - [`overview`]: is everything where it should be? One state per replica,
//!   counted; the worst few; per table, what is still on its way.
//! - [`listing`]: every replica of a scope, a page at a time.
//! - [`progress`]: how far along one replica is, per table.
//! - [`row_progress`]: where one row is, per replica.
//! - [`health`]: what the engine waits on, each item saying whether to wait
//!   or to deploy a fix.
//! - [`settled`]: whether the fleet is settled; [`deployed`]: whether the
//!   newest build's deployment is complete on every replica.
//! - [`gauges`]: the figures a metrics endpoint exports, of one moment.
//! - [`history`]: the runner's figures of the last hour, period by period.
//!
//! Every read runs in one `REPEATABLE READ READ ONLY` transaction, so its
//! figures are of one moment, and carries that moment as the server tells
//! it (`now()`). Every read counts live replicas only, and reads nothing but
//! the `sync` schema: no host table, and no declaration but what the
//! running build recorded of its tables (`sync.tables`). A host shows
//! them without its [`Engine`](magic_sync_core::Engine), and a dashboard costs the
//! database what the engine records, never what the replicas should hold.
//! The one exception is [`row_progress`], a read of one row: while rows
//! are held by their rule alone, with no record row (decision 176), it
//! reads that row from its table by its key to see whom the rule gives it.
//!
//! What "held" means here is the relay's own rule: a row recorded in
//! `sync.held` counts as held once the replica acknowledged the message that
//! carried it (`sync.acks`); before that it is on its way. A pending note
//! (`sync.notes`) newer than the version a replica holds is a change it
//! lacks: it holds an outdated copy.

mod deployed;
mod gauges;
mod health;
mod history;
mod overview;
mod progress;
mod row;
mod ruled;
mod settled;
mod state;

pub use deployed::{deployed, Deployed};
pub use gauges::{gauges, Gauges, Provisionings, ReplicaGauges};
pub use health::{health, Action, Concern, Health, Item, PendingNotes};
pub use history::{history, Figure, History};
pub use overview::{listing, overview, Listing, Overview, StateCounts, TableFigures};
pub use progress::{progress, Progress, TableProgress, UpBacklog};
pub use row::{row_progress, RowPlace, RowProgress, RowState};
pub use settled::{settled, Settled};
pub use state::{ReplicaState, ReplicaSummary};

use chrono::{DateTime, Utc};
use tokio_postgres::{Client, IsolationLevel, Transaction};

/// Which replicas a read is about. Whatever the scope, only live replicas
/// count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Scope {
    /// Every live replica.
    #[default]
    All,
    /// These replicas (each must be known and live).
    Replicas(Vec<String>),
    /// The live replicas of this partition.
    Partition(String),
}

impl Scope {
    /// The replicas named, or `None` for no such filter (`$1`).
    fn ids(&self) -> Option<Vec<String>> {
        match self {
            Scope::Replicas(ids) => Some(ids.clone()),
            _ => None,
        }
    }

    /// The partition named, or `None` for no such filter (`$2`).
    fn partition(&self) -> Option<String> {
        match self {
            Scope::Partition(p) => Some(p.clone()),
            _ => None,
        }
    }
}

/// The condition a scope puts on `sync.replicas` aliased `r`, over the
/// parameters `$1` (ids, `text[]`) and `$2` (partition, `text`).
const IN_SCOPE: &str = "r.live AND ($1::text[] IS NULL OR r.id = ANY ($1))
                        AND ($2::text IS NULL OR r.partition_id = $2)";

/// The rows held back from each replica (`sync.blocked`), as a relation
/// with its columns: a member of a cohort is held back from what the
/// cohort is (a row both are held back from, once).
const BLOCKED: &str = "(SELECT b.replica, b.table_name, b.key, b.root_table, b.root_key
                        FROM sync.blocked b
                        UNION
                        SELECT m.replica, b.table_name, b.key, b.root_table, b.root_key
                        FROM sync.blocked b JOIN sync.members m ON m.cohort = b.replica)";

/// What a read could not do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// PostgreSQL failed.
    #[error("postgres: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The database has no `sync` schema: the engine was never installed
    /// there.
    #[error(
        "the database has no sync schema: magic_sync was never installed in it \
         (is this the server's database?)"
    )]
    NoSyncSchema,
    /// The `sync` schema is newer than this build knows.
    #[error(
        "the database's sync schema is at version {found}, but this build knows versions up to \
         {known}: use a build of magic_sync as new as the server's"
    )]
    SchemaTooNew {
        /// The version the database is at.
        found: i32,
        /// The newest version this build knows.
        known: i32,
    },
    /// The `sync` schema is older than this build reads.
    #[error(
        "the database's sync schema is at version {found}, this build reads version {needed}: \
         the server's migrations have not run yet"
    )]
    SchemaBehind {
        /// The version the database is at.
        found: i32,
        /// The version this build reads.
        needed: i32,
    },
    /// A replica the server does not know.
    #[error("the server knows no replica `{0}`")]
    UnknownReplica(String),
    /// A replica the server knows, but which is not live: it holds nothing
    /// as far as the server records.
    #[error("replica `{0}` is not live: the server records nothing of it")]
    NotLive(String),
    /// A key of another number of values than its table's keys.
    #[error("table `{table}` is keyed by {expected} values (as its recorded keys show), the key given has {given}")]
    KeyArity {
        /// The table.
        table: String,
        /// Values given.
        given: usize,
        /// Values in its recorded keys.
        expected: usize,
    },
    /// A key value that cannot be of its column's kind.
    #[error("table `{table}`: key value {position} (`{value}`) is not {expected}, as its recorded keys are")]
    KeyValue {
        /// The table.
        table: String,
        /// Which value (1-based).
        position: usize,
        /// The value given.
        value: String,
        /// What the recorded keys have there.
        expected: &'static str,
    },
    /// A table no build declared and nothing in the `sync` schema records
    /// a row of, so neither its key's arity nor its columns' kinds are
    /// known.
    #[error(
        "no build declared table `{0}` and nothing in the sync schema records a row of it (no \
         replica holds one, no note is pending, no upload was refused): no replica holds the \
         row, and its key's columns cannot be checked here"
    )]
    UnrecordedTable(String),
    /// The scope names no replica, or a limit of nothing.
    #[error("{0}")]
    Invalid(&'static str),
}

/// A read's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Opens a read: one `REPEATABLE READ READ ONLY` transaction, the schema
/// checked, the server's time taken.
async fn begin(client: &mut Client) -> Result<(Transaction<'_>, DateTime<Utc>)> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    // The reads are small and run once: compiling them (PostgreSQL's JIT,
    // which their row estimates over a large `sync.held` set off) took
    // 0.6-0.7 s of a 0.75 s overview of a caught-up fleet.
    tx.batch_execute("SET LOCAL jit = off").await?;
    let row = tx
        .query_one(
            "SELECT to_regclass('sync.schema_version') IS NOT NULL, now()",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Err(Error::NoSyncSchema);
    }
    let now: DateTime<Utc> = row.get(1);
    let found: i32 = tx
        .query_opt("SELECT version FROM sync.schema_version", &[])
        .await?
        .map_or(0, |r| r.get(0));
    let known = crate::schema::CURRENT;
    if found > known {
        return Err(Error::SchemaTooNew { found, known });
    }
    if found < known {
        return Err(Error::SchemaBehind {
            found,
            needed: known,
        });
    }
    Ok((tx, now))
}

/// Refuses a scope naming a replica that is unknown or not live.
async fn check_scope(tx: &Transaction<'_>, scope: &Scope) -> Result<()> {
    let Scope::Replicas(ids) = scope else {
        return Ok(());
    };
    if ids.is_empty() {
        return Err(Error::Invalid("the scope names no replica"));
    }
    let rows = tx
        .query(
            "SELECT u.id, r.live FROM unnest($1::text[]) WITH ORDINALITY AS u (id, i)
             LEFT JOIN sync.replicas r ON r.id = u.id ORDER BY u.i",
            &[ids],
        )
        .await?;
    for row in rows {
        let id: String = row.get(0);
        match row.get::<_, Option<bool>>(1) {
            None => return Err(Error::UnknownReplica(id)),
            Some(false) => return Err(Error::NotLive(id)),
            Some(true) => {}
        }
    }
    Ok(())
}

//! Where a replica stands, for its host: its status, whether it holds its
//! configuration whole, how far the host's writes went, its backlog and its
//! digest; asked of the replica, or on a connection of the host's own.

use crate::engine::Engine;
use crate::envelope;
use crate::open::BUSY_TIMEOUT;
use crate::shape::Shapes;
use crate::{described, digest, former, state, up};
use crate::{Mark, Replica, Result, Schema, Status, Written};
use rusqlite::Connection;
use std::path::Path;

impl Replica {
    /// Where the replica stands: ready (a snapshot ended, none under way),
    /// the last message applied (its number, epoch and nonce), a gap it
    /// waits in, the rows it refused, the rows its host wrote that are not
    /// filed yet. A host on a connection of its own asks
    /// [`status`](fn@status), which counts refused forgeries as written.
    pub fn status(&self) -> Result<Status> {
        let mut status = state::status(&self.conn)?;
        (status.forged, status.last_forgery) = self
            .forgeries
            .on_top_of(status.forged, status.last_forgery.take());
        status.stopped.clone_from(&self.stopped);
        Ok(status)
    }

    /// Whether this replica holds whole the configuration it runs: the
    /// server said its declarations with this build's fingerprint (
    /// [`schema`](Self::schema)) have all been sent and applied, by a
    /// snapshot's end or once a deployment of them was done. While a
    /// snapshot or a deployment is arriving, what it holds is consistent
    /// (no row without its parents) but may be part old, part new: a host
    /// that must show a new configuration whole waits for this.
    /// A host reading on a connection of its own asks
    /// [`configuration`](fn@configuration).
    pub fn configuration(&self) -> Result<Configuration> {
        Configuration::read(
            &self.conn,
            &self.schema,
            self.described.as_ref(),
            self.former.iter().cloned().collect(),
        )
    }

    /// The mark of everything the host has written here so far: ask
    /// [`written`](Self::written) how far it went. A host writing on a
    /// connection of its own asks [`mark`](fn@crate::mark) and
    /// [`written`](fn@crate::written) there.
    pub fn mark(&self) -> Result<Mark> {
        up::mark(&self.conn)
    }

    /// How far the host's writes up to `mark` went: still here, filed by
    /// the server, or reached (this replica reads its own writes).
    pub fn written(&self, mark: Mark) -> Result<Written> {
        up::written(&self.conn, mark)
    }

    /// Per table, rows the host wrote that have not gone up, and rows gone
    /// up that the server has not filed yet.
    pub fn progress(&self) -> Result<envelope::Backlog> {
        up::backlog(&self.conn)
    }

    /// What the replica holds of each table that goes down (see the
    /// definition in the `digest` module: rows held live and not refused, and
    /// an FNV-1a fingerprint of their sorted canonical keys).
    pub fn digest(&self) -> Result<envelope::Digest> {
        digest::digest(&self.conn, &self.tables)
    }
}

/// Whether a replica holds its configuration whole (see
/// [`Replica::configuration`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Configuration {
    /// The server said everything of the declarations this build runs
    /// ([`Configuration::own`]) has been sent, and it was applied.
    pub complete: bool,
    /// The fingerprint of this build's declarations.
    pub own: magic_sync_core::schema::Fingerprint,
    /// The fingerprint the server last said the replica holds whole; `None`
    /// while a snapshot is arriving, or before the server said. Another
    /// than [`own`](Self::own): the server runs other declarations than
    /// this build, or a deployment of them is still arriving.
    pub server: Option<Vec<u8>>,
    /// Where the tables the server last described differ from this build's
    /// declarations, in words: a table or column one side has and the
    /// other lacks, or declares otherwise. A replica that disagrees takes
    /// what its build can read; the host's build wants updating.
    pub disagreements: Vec<String>,
    /// Tables an earlier build made here that this build no longer
    /// declares, still in the file: the server has not yet said this
    /// build's configuration is whole. Once it does, the replica drops
    /// them; until then the configuration is not complete.
    pub former_tables: Vec<String>,
}

impl Configuration {
    fn read(
        conn: &Connection,
        schema: &Schema,
        described: Option<&envelope::ReplicaSchema>,
        former_tables: Vec<String>,
    ) -> Result<Configuration> {
        let own = schema.fingerprint();
        let server = state::configuration(conn)?;
        Ok(Configuration {
            complete: server.as_deref() == Some(&own.0[..]) && former_tables.is_empty(),
            own,
            server,
            disagreements: described
                .map(|d| schema.disagreements(d))
                .unwrap_or_default(),
            former_tables,
        })
    }
}

/// Whether the replica whose file `conn` opens, run by a build declaring
/// `engine`, holds its configuration whole (see
/// [`Replica::configuration`]); for a host reading on a connection of its
/// own while the replica runs. The file must have been opened as a
/// replica once. Reads only: a replica whose server has not described its
/// tables yet is read with no foreign keys among them, and is not
/// complete anyway.
pub fn configuration(conn: &Connection, engine: &Engine) -> Result<Configuration> {
    let shapes = Shapes::of(engine);
    let described = described::load(conn)?;
    let foreign_keys = described
        .as_ref()
        .map(|d| described::foreign_keys(&shapes, d))
        .unwrap_or_default();
    let schema = Schema::new(engine, &foreign_keys);
    let former_tables = former::read(conn, &shapes)?;
    Configuration::read(conn, &schema, described.as_ref(), former_tables)
}

/// Where the replica whose file `conn` opens stands (see
/// [`Replica::status`]); for a host reading on a connection of its own.
/// The file must have been opened as a replica once.
pub fn status(conn: &Connection) -> Result<Status> {
    state::status(conn)
}

/// [`status`] of the replica in the file at `path`, opened read-only for
/// the question alone: for a tool beside a running replica. A file that is
/// missing, or was never opened as a replica, is an error.
pub fn status_at(path: impl AsRef<Path>) -> Result<Status> {
    let conn = Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    state::status(&conn)
}

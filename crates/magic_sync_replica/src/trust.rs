//! The server's key the replica pins (`_magic_sync_trust`): the key it was
//! enrolled with, the newest key it has followed the server's endorsements
//! to, and how many messages and answers it refused as not the server's.
//!
//! Refusals are counted in memory ([`Forgeries`]) and written at most once
//! every [`WRITE_EVERY`] (the first at once), and when the replica is
//! closed, each write logged as one line: a flood of forged frames costs
//! the till a verification or two each, and neither a write to its file nor
//! a line of its log. The replica's own `status` counts what is
//! not written yet; a host reading the file on another connection sees the
//! count at most [`WRITE_EVERY`] behind.

use crate::error::{Error, Result};
use magic_sync_core::sign::ServerKey;
use rusqlite::{params, Connection, OptionalExtension};

pub(crate) const CREATE: &str = "
CREATE TABLE IF NOT EXISTS _magic_sync_trust (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    enrolled BLOB NOT NULL,
    current BLOB NOT NULL,
    forged INTEGER NOT NULL DEFAULT 0,
    last_forgery TEXT
) STRICT;
";

/// What the replica trusts, as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Trust {
    /// The key it was enrolled with.
    pub enrolled: Option<ServerKey>,
    /// The newest key it verified a message or answer of.
    pub current: Option<ServerKey>,
    /// Messages and answers refused as not its server's.
    pub forged: u64,
    /// Why the last one was refused.
    pub last_forgery: Option<String>,
}

fn key(bytes: Vec<u8>) -> Result<ServerKey> {
    ServerKey::from_bytes(&bytes)
        .map_err(|e| Error::Bookkeeping(format!("_magic_sync_trust holds {e}")))
}

pub(crate) fn load(conn: &Connection) -> Result<Trust> {
    let row = conn
        .prepare_cached("SELECT enrolled, current, forged, last_forgery FROM _magic_sync_trust")?
        .query_row([], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, Option<String>>(3)?,
            ))
        })
        .optional()?;
    let Some((enrolled, current, forged, last_forgery)) = row else {
        return Ok(Trust::default());
    };
    Ok(Trust {
        enrolled: Some(key(enrolled)?),
        current: Some(key(current)?),
        forged: u64::try_from(forged).unwrap_or(0),
        last_forgery,
    })
}

/// Pins `given` when the replica trusts no key yet. A replica that does
/// takes the key it was enrolled with again, or the one it follows now,
/// and refuses any other: it belongs to another server.
pub(crate) fn pin(conn: &Connection, given: &ServerKey) -> Result<ServerKey> {
    let trust = load(conn)?;
    match (trust.enrolled, trust.current) {
        (Some(enrolled), Some(current)) if enrolled == *given || current == *given => Ok(current),
        (Some(enrolled), Some(_)) => Err(Error::OtherServer {
            pinned: enrolled.to_string(),
            given: given.to_string(),
        }),
        _ => {
            let bytes = given.to_bytes();
            conn.execute(
                "INSERT INTO _magic_sync_trust (id, enrolled, current) VALUES (1, ?1, ?1)",
                params![bytes.as_slice()],
            )?;
            Ok(*given)
        }
    }
}

/// Follows the server to its newer key `key`.
pub(crate) fn advance(conn: &Connection, key: &ServerKey) -> Result<()> {
    conn.prepare_cached("UPDATE _magic_sync_trust SET current = ?1")?
        .execute(params![key.to_bytes().as_slice()])?;
    Ok(())
}

/// How often refusals counted in memory are written to the file, at most.
pub(crate) const WRITE_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Refusals counted and not yet written, with why the last was refused.
#[derive(Debug, Default)]
pub(crate) struct Forgeries {
    pending: u64,
    why: Option<String>,
    written_at: Option<std::time::Instant>,
}

impl Forgeries {
    /// Counts one refusal by `replica`, with why; writes what is pending
    /// if nothing was written for [`WRITE_EVERY`].
    pub(crate) fn count(&mut self, conn: &Connection, replica: &str, why: &str) -> Result<()> {
        self.pending += 1;
        self.why = Some(why.to_string());
        self.write_if_due(conn, replica)
    }

    /// Writes what is pending if nothing was written for [`WRITE_EVERY`].
    pub(crate) fn write_if_due(&mut self, conn: &Connection, replica: &str) -> Result<()> {
        let due = self.written_at.is_none_or(|at| at.elapsed() >= WRITE_EVERY);
        match due {
            true => self.write(conn, replica),
            false => Ok(()),
        }
    }

    /// Writes what is pending now, and says it in one line.
    pub(crate) fn write(&mut self, conn: &Connection, replica: &str) -> Result<()> {
        if self.pending == 0 {
            return Ok(());
        }
        tracing::warn!(
            replica,
            refused = self.pending,
            "refused messages or answers as not the server's; the last: {}",
            self.why.as_deref().unwrap_or("")
        );
        conn.prepare_cached(
            "UPDATE _magic_sync_trust SET forged = forged + ?1, last_forgery = ?2",
        )?
        .execute(params![
            i64::try_from(self.pending).unwrap_or(i64::MAX),
            self.why
        ])?;
        self.pending = 0;
        self.written_at = Some(std::time::Instant::now());
        Ok(())
    }

    /// `trust` as stored, with what is counted and not written yet.
    pub(crate) fn on_top_of(&self, forged: u64, last: Option<String>) -> (u64, Option<String>) {
        match self.pending {
            0 => (forged, last),
            n => (forged.saturating_add(n), self.why.clone().or(last)),
        }
    }
}

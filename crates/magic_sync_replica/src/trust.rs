//! The server's key the replica pins (`_magic_sync_trust`): the key it was
//! enrolled with, the newest key it has followed the server's endorsements
//! to, and how many messages and answers it refused as not the server's.

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

/// Counts one refusal, with why.
pub(crate) fn forged(conn: &Connection, why: &str) -> Result<()> {
    conn.prepare_cached("UPDATE _magic_sync_trust SET forged = forged + 1, last_forgery = ?1")?
        .execute(params![why])?;
    Ok(())
}

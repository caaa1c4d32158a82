//! Waking the relay when a change commits (migration 030).
//!
//! A note trigger notifies [`CHANNEL`] only while the relay dozes (it
//! cannot take [`DOZING`] shared), because a transaction that notifies
//! commits in a queue of one: a notify on every write would cost the host
//! its commits' parallelism. One that can take it holds it to its end, and
//! the relay does not doze until that writer has ended. The relay calls [`doze`] when a
//! pass found nothing to do. While it dozes, the first commit of a note
//! wakes it; it ends its doze with [`wake`] before its next pass.

use crate::error::Result;
use tokio_postgres::{Client, SimpleQueryMessage};

/// The channel a dozing relay listens on.
pub const CHANNEL: &str = "magic_sync_notes";

/// The advisory lock a dozing relay holds exclusively, and a transaction
/// that wrote a note while the relay was at work holds shared, to its end
/// (the key migration 030 writes out).
pub const DOZING: i64 = 0x6d73_5f61_736c_6565;

/// What [`doze`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Doze {
    /// A transaction that wrote a note while the relay was at work is
    /// still in flight, and will not notify: poll until it ends.
    Writing,
    /// A note committed since the last pass read them: pass now.
    Noted,
    /// Dozing: the next note's commit notifies. End it with [`wake`].
    Dozing,
}

/// Begins to doze, unless a note waits or may come without a notification.
/// Its own transaction, at READ COMMITTED whatever the database's default,
/// so that the look at the notes sees every writer that has ended.
pub async fn doze(client: &Client) -> Result<Doze> {
    let messages = client
        .simple_query("BEGIN ISOLATION LEVEL READ COMMITTED; SELECT sync.doze(); COMMIT")
        .await?;
    let found = messages.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
        _ => None,
    });
    Ok(match found.as_deref() {
        Some("dozing") => Doze::Dozing,
        Some("noted") => Doze::Noted,
        _ => Doze::Writing,
    })
}

/// Ends a doze that [`doze`] began: writers stop notifying.
pub async fn wake(client: &Client) -> Result<()> {
    client.batch_execute("SELECT sync.wake()").await?;
    Ok(())
}

/// Listens for the notifications of writers that found the relay dozing.
pub async fn listen(client: &Client) -> Result<()> {
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok(())
}

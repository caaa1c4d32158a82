//! Each replica's secret as the server keeps it (`sync.credentials`): a
//! password hash only (the transport makes and checks it), set, taken away,
//! and read when a replica connects.

use crate::error::Result;
use tokio_postgres::Client;

/// Keeps `hash` as `replica`'s, replacing any it had.
pub async fn set(client: &Client, replica: &str, hash: &str) -> Result<()> {
    client
        .execute(
            "INSERT INTO sync.credentials (replica, hash) VALUES ($1, $2)
             ON CONFLICT (replica) DO UPDATE SET hash = excluded.hash, set_at = now()",
            &[&replica, &hash],
        )
        .await?;
    Ok(())
}

/// Takes `replica`'s hash away. Whether it had one.
pub async fn revoke(client: &Client, replica: &str) -> Result<bool> {
    Ok(client
        .execute(
            "DELETE FROM sync.credentials WHERE replica = $1",
            &[&replica],
        )
        .await?
        > 0)
}

/// `replica`'s hash, if it has one, and whether it proved its secret with
/// it in the last day.
pub async fn hash(client: &Client, replica: &str) -> Result<Option<(String, bool)>> {
    Ok(client
        .query_opt(
            "SELECT hash, coalesce(proved_at > now() - interval '1 day', false)
             FROM sync.credentials WHERE replica = $1",
            &[&replica],
        )
        .await?
        .map(|r| (r.get(0), r.get(1))))
}

/// Notes that `replica` proved its secret against `hash` just now.
pub async fn proved(client: &Client, replica: &str, hash: &str) -> Result<()> {
    client
        .execute(
            "UPDATE sync.credentials SET proved_at = now() WHERE replica = $1 AND hash = $2",
            &[&replica, &hash],
        )
        .await?;
    Ok(())
}

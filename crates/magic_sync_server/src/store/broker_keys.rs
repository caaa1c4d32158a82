//! Each replica's public key on a broker (`sync.broker_keys`), which the
//! broker transport writes its configuration from. The seed is never kept.

use crate::error::Result;
use tokio_postgres::Client;

/// Keeps `public_key` as `replica`'s, replacing any it had.
pub async fn set(client: &Client, replica: &str, public_key: &str) -> Result<()> {
    client
        .execute(
            "INSERT INTO sync.broker_keys (replica, public_key) VALUES ($1, $2)
             ON CONFLICT (replica) DO UPDATE SET public_key = excluded.public_key, set_at = now()",
            &[&replica, &public_key],
        )
        .await?;
    Ok(())
}

/// Takes `replica`'s key away. Whether it had one.
pub async fn revoke(client: &Client, replica: &str) -> Result<bool> {
    Ok(client
        .execute(
            "DELETE FROM sync.broker_keys WHERE replica = $1",
            &[&replica],
        )
        .await?
        > 0)
}

/// Every replica's key, as (replica, public key), by replica.
pub async fn all(client: &Client) -> Result<Vec<(String, String)>> {
    Ok(client
        .query(
            "SELECT replica, public_key FROM sync.broker_keys ORDER BY replica",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

//! What the record keeps of the digests replicas send (`sync.replicas`:
//! when one was last compared, when and how one last differed), for
//! `crate::relay::digests`.

use crate::error::Result;
use tokio_postgres::Transaction;

/// Where a replica stands for a digest to be compared.
pub(crate) struct Standing {
    /// Live, not waiting for a snapshot nor streaming one.
    pub kept_up: bool,
    /// Its last message, its own or its cohort's.
    pub last_number: i64,
    /// Messages are in its outbox.
    pub owed: bool,
    /// A digest of it was compared less than a minute ago.
    pub recent: bool,
}

/// Where `replica` stands, or `None` when the server does not know it.
pub(crate) async fn standing(tx: &Transaction<'_>, replica: &str) -> Result<Option<Standing>> {
    let row = tx
        .query_opt(
            &format!(
                "SELECT r.live AND NOT r.provision AND r.snapshot_attempt IS NULL,
                    {},
                    EXISTS (SELECT 1 FROM sync.outbox o WHERE o.replica = r.id),
                    coalesce(r.digest_compared_at > now() - interval '1 minute', false)
             FROM sync.replicas r WHERE r.id = $1",
                super::cohorts::head("r")
            ),
            &[&replica],
        )
        .await?;
    Ok(row.map(|row| Standing {
        kept_up: row.get(0),
        last_number: row.get(1),
        owed: row.get(2),
        recent: row.get(3),
    }))
}

/// Records that `replica`'s digest matched the record.
pub(crate) async fn matched(tx: &Transaction<'_>, replica: &str) -> Result<()> {
    tx.execute(
        "UPDATE sync.replicas SET digest_compared_at = now() WHERE id = $1",
        &[&replica],
    )
    .await?;
    Ok(())
}

/// Records that `replica`'s digest differed from the record as `said`, and
/// marks it to be provisioned again.
pub(crate) async fn differed(tx: &Transaction<'_>, replica: &str, said: &str) -> Result<()> {
    tx.execute(
        "UPDATE sync.replicas SET digest_compared_at = now(), digest_differed_at = now(),
             digest_said = $2, digest_mismatches = digest_mismatches + 1,
             provision = true, provision_asked = true
         WHERE id = $1 AND live",
        &[&replica, &said],
    )
    .await?;
    Ok(())
}

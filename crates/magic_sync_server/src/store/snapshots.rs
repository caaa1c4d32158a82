//! A replica's snapshot as the record keeps it (`sync.replicas`): waiting
//! for one, under way under an attempt of its own, ended. The snapshot
//! workers (`crate::relay::snapshot`) move it through these.

use crate::error::Result;
use tokio_postgres::{Client, GenericClient, Transaction};

/// Replicas waiting for a snapshot, oldest observed first.
pub(crate) async fn waiting(client: &Client) -> Result<Vec<String>> {
    Ok(client
        .query(
            "SELECT id FROM sync.replicas WHERE live AND provision AND snapshot_attempt IS NULL
             ORDER BY observed_at, id",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// Where a replica stood when its snapshot began.
pub(crate) struct Begun {
    pub partition: Option<String>,
    pub last_number: i64,
    pub last_nonce: Vec<u8>,
    /// The number of the snapshot's first message.
    pub first: i64,
}

/// The longest a replica that keeps asking to be provisioned again waits
/// between such snapshots; and how long it must go without asking for its
/// waits to start again from `Settings::provision_asked_every`.
pub(crate) const ASKED_LONGEST: std::time::Duration = std::time::Duration::from_secs(3600);

/// Records `replica` as streaming under `attempt`, and drops what it was
/// recorded holding and owed: the snapshot replaces them. Only while the
/// connection holds the advisory lock `lock` (a relay that lost it begins
/// nothing), and only for a replica still waiting. One waiting at its own
/// asking (a gap, an acknowledgement the server cannot take, a digest that
/// differs) waits from the last such snapshot `asked_every`, doubled for
/// each it asked for since it last went [`ASKED_LONGEST`] without asking,
/// up to that: the pace is the relay's, kept in the record, so neither a
/// reconnection nor another transport starts it afresh. `None` when it
/// does not wait, or not yet.
pub(crate) async fn begin(
    tx: &Transaction<'_>,
    replica: &str,
    attempt: &[u8],
    lock: i64,
    asked_every: std::time::Duration,
) -> Result<Option<Begun>> {
    let row = tx
        .query_opt(
            "UPDATE sync.replicas SET provision = false, snapshot = NULL,
                 snapshot_attempt = $2, snapshot_began_at = now(),
                 snapshot_number = nextval('sync.message_seq'),
                 asked_at = CASE WHEN provision_asked THEN now() ELSE asked_at END,
                 asked_times = CASE
                     WHEN NOT provision_asked THEN asked_times
                     WHEN asked_at IS NULL OR asked_at <= now() - $5::float8 * interval '1 second' THEN 1
                     ELSE least(asked_times + 1, 64) END,
                 provision_asked = false
             WHERE id = $1 AND live AND provision AND snapshot_attempt IS NULL
               AND NOT (provision_asked AND coalesce(asked_at > now()
                   - least($5::float8, $4::float8 * power(2, least(greatest(asked_times - 1, 0), 32)))
                     * interval '1 second', false))
               AND EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
                           AND pid = pg_backend_pid() AND granted
                           AND ((classid::int8 << 32) | objid::int8) = $3)
             RETURNING partition_id, last_number, last_nonce, snapshot_number",
            &[
                &replica,
                &attempt,
                &lock,
                &asked_every.as_secs_f64(),
                &ASKED_LONGEST.as_secs_f64(),
            ],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    tx.batch_execute(&format!(
        "DELETE FROM sync.held WHERE replica = {r};
         DELETE FROM sync.left_to_rule WHERE replica = {r};
         DELETE FROM sync.let_go WHERE replica = {r};
         DELETE FROM sync.outbox WHERE replica = {r};
         DELETE FROM sync.deferred WHERE replica = {r};
         DELETE FROM sync.blocked WHERE replica = {r};
         DELETE FROM sync.members WHERE replica = {r};",
        r = crate::sql::escaped(replica)
    ))
    .await?;
    Ok(Some(Begun {
        partition: row.get(0),
        last_number: row.get(1),
        last_nonce: row.get(2),
        first: row.get(3),
    }))
}

/// Puts `replica` back to waiting for a snapshot, with `why` in
/// `last_error`, unless an attempt other than `attempt` took it up
/// meanwhile.
pub(crate) async fn abandon(
    client: &Client,
    replica: &str,
    attempt: &[u8],
    why: &str,
) -> Result<()> {
    client
        .execute(
            "UPDATE sync.replicas SET provision = true, snapshot_attempt = NULL,
                 snapshot_began_at = NULL, last_error = $3
             WHERE id = $1 AND snapshot_attempt = $2",
            &[&replica, &attempt, &why],
        )
        .await?;
    Ok(())
}

/// Puts back to waiting every replica whose snapshot a relay before this
/// one left under way: they have no worker any more.
pub(crate) async fn orphaned(tx: &impl GenericClient) -> Result<()> {
    tx.batch_execute(
        "UPDATE sync.replicas SET provision = true, snapshot_attempt = NULL,
             snapshot_began_at = NULL
         WHERE snapshot_attempt IS NOT NULL",
    )
    .await?;
    Ok(())
}

/// How a snapshot ended.
pub(crate) struct Ended<'a> {
    pub replica: &'a str,
    pub attempt: &'a [u8],
    /// The PostgreSQL snapshot it read, as text.
    pub seen: &'a str,
    /// Its last message.
    pub last_number: i64,
    pub last_nonce: &'a [u8],
    /// Its first message.
    pub first: i64,
    /// The declarations' fingerprint it carried.
    pub schema: &'a [u8],
}

/// Records the replica kept up from the snapshot's end, if `attempt` is
/// still the one under way. Returns whether it was.
pub(crate) async fn ended(tx: &Transaction<'_>, e: &Ended<'_>) -> Result<bool> {
    let changed = tx
        .execute(
            "UPDATE sync.replicas SET snapshot_attempt = NULL, snapshot_began_at = NULL,
                 snapshot_ended_at = now(), snapshot = $3::text::pg_snapshot, last_number = $4, last_nonce = $5,
                 snapshot_number = $6, snapshot_last = $4, last_error = NULL, configured = $7,
                 described = $7
             WHERE id = $1 AND snapshot_attempt = $2",
            &[
                &e.replica,
                &e.attempt,
                &e.seen,
                &e.last_number,
                &e.last_nonce,
                &e.first,
                &e.schema,
            ],
        )
        .await?;
    Ok(changed > 0)
}

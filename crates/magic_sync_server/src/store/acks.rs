//! What each replica says it applied (`sync.acks`), and what that lets go
//! of: its outbox up to there. Acknowledgements are recorded on a
//! connection of their own while the relay records (`crate::relay::replies`
//! judges them first).

use crate::error::{Error, Result};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// A live replica's chain as the server records it.
pub(crate) struct Chain {
    pub id: String,
    /// The last number sent it, in its own messages or its cohort's (any
    /// number drawn, while its snapshot streams).
    pub last: i64,
    /// The last number it acknowledged.
    pub acked: i64,
    /// Kept up: not waiting for, or streaming, a snapshot.
    pub kept_up: bool,
    /// The newest upload the server answered it.
    pub answered: i64,
}

/// The chains of the live replicas among `ids`.
pub(crate) async fn chains(client: &Client, ids: &[&str]) -> Result<Vec<Chain>> {
    let rows = client
        .query_typed(
            &format!(
                "SELECT r.id,
                    CASE WHEN r.snapshot_attempt IS NULL THEN {head}
                         ELSE (SELECT last_value FROM sync.message_seq) END,
                    coalesce(a.number, 0),
                    NOT r.provision AND r.snapshot_attempt IS NULL,
                    coalesce(u.sequence, 0)
             FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
             LEFT JOIN sync.uploads_answered u ON u.replica = r.id
             WHERE r.id = ANY($1) AND r.live",
                head = super::cohorts::head("r")
            ),
            &[(&ids, Type::TEXT_ARRAY)],
        )
        .await
        .map_err(Error::from)?;
    Ok(rows
        .iter()
        .map(|r| Chain {
            id: r.get(0),
            last: r.get(1),
            acked: r.get(2),
            kept_up: r.get(3),
            answered: r.get(4),
        })
        .collect())
}

/// The acknowledgements that counted, one per replica, as columns.
#[derive(Default)]
pub(crate) struct Said<'a> {
    pub replicas: Vec<&'a str>,
    /// The number each acknowledged.
    pub numbers: Vec<i64>,
    /// That message's nonce.
    pub nonces: Vec<&'a [u8]>,
    /// Whether it reads messages signed in a batch.
    pub reads_batches: Vec<bool>,
}

/// Records the acknowledgements that counted, and has the replicas in
/// `again` provisioned again; returns how many of those were not marked so
/// already. The filing state of those `restored` from an older copy starts
/// afresh: what the server took of their own columns before was under
/// upload numbers they may count through again.
pub(crate) async fn record(
    client: &Client,
    said: &Said<'_>,
    again: &[&str],
    restored: &[&str],
) -> Result<u64> {
    if !restored.is_empty() {
        client
            .execute(
                "DELETE FROM sync.filed WHERE replica = ANY($1)",
                &[&restored],
            )
            .await?;
    }
    if !said.replicas.is_empty() {
        // Typed, so parsed and run in one round trip.
        let params: [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 4] = [
            (&said.replicas, Type::TEXT_ARRAY),
            (&said.numbers, Type::INT8_ARRAY),
            (&said.reads_batches, Type::BOOL_ARRAY),
            (&said.nonces, Type::BYTEA_ARRAY),
        ];
        // The replica's row is locked against deletion first: a pass
        // forgetting the replica meanwhile leaves nothing to insert, rather
        // than a foreign key to break. What it applied needs sending no
        // more: its outbox up to there goes in the same statement, so
        // whoever reads the outbox and the acknowledgement together (a
        // chain continued from the acknowledged message) never sees one
        // without the other. The counts of what those messages carried are
        // left for [`forget_carried`].
        client
            .query_typed(
                "WITH acked AS (
                     INSERT INTO sync.acks AS a (replica, number, at, reads_batches, nonce)
                     SELECT u.id, u.number, now(), u.batches, u.nonce
                     FROM (SELECT DISTINCT id, number, batches, nonce
                           FROM unnest($1::text[], $2::int8[], $3::bool[], $4::bytea[])
                                AS u (id, number, batches, nonce)) u
                     JOIN sync.replicas r ON r.id = u.id FOR KEY SHARE OF r
                     ON CONFLICT (replica) DO UPDATE
                     SET number = greatest(a.number, excluded.number), at = excluded.at,
                         reads_batches = excluded.reads_batches,
                         nonce = CASE WHEN excluded.number >= a.number
                                      THEN excluded.nonce ELSE a.nonce END
                     -- Also at the same number when it says otherwise of
                     -- batches: a replica going back to an earlier build
                     -- reads none.
                     WHERE a.number < excluded.number
                        OR a.reads_batches IS DISTINCT FROM excluded.reads_batches)
                 DELETE FROM sync.outbox o USING unnest($1::text[], $2::int8[]) AS u (id, number)
                 WHERE o.replica = u.id AND o.number <= u.number",
                &params,
            )
            .await?;
    }
    if again.is_empty() {
        return Ok(0);
    }
    Ok(client
        .execute(
            // A replica already marked so is not written again.
            "UPDATE sync.replicas SET provision = true, provision_asked = true
                 WHERE id = ANY($1) AND NOT (provision AND provision_asked)",
            &[&again],
        )
        .await?)
}

/// Forgets, while rows are left to their rule, the counts of what each
/// message a replica acknowledged carried (`sync.held_carried`) and which
/// of those messages its rows let go were in (`sync.let_go`): the reads
/// count only messages on their way, and nothing else moves these once the
/// message arrived. With the record whole, the record's own moves keep the
/// counts few, and nothing is done. Run now and then (with the runner's
/// figures), not at every acknowledgement: deleting them there took locks
/// the passes' own moves of those counts waited on, and a row changed a
/// thousand times a second reached the replicas twice as late.
pub(crate) async fn forget_carried(client: &Client) -> Result<u64> {
    let forgotten = client
        .query_one(
            "WITH carried AS (
                 DELETE FROM sync.held_carried c USING sync.acks a
                 WHERE c.replica = a.replica AND c.message <= a.number
                   AND (SELECT by_rule FROM sync.record_form)
                 RETURNING 1),
             arrived AS (
                 DELETE FROM sync.let_go l USING sync.acks a
                 WHERE l.replica = a.replica AND l.message <= a.number
                   AND (SELECT by_rule FROM sync.record_form)
                 RETURNING 1)
             SELECT (SELECT count(*) FROM carried) + (SELECT count(*) FROM arrived)",
            &[],
        )
        .await?;
    Ok(forgotten.get::<_, i64>(0) as u64)
}

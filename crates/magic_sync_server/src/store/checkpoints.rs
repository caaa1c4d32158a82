//! The uploads a replica waits to hear were done (`sync.checkpoints`):
//! recorded once an upload's filing committed (`crate::file`), answered by
//! a pass's `Reached` message (`crate::relay::reached`), and let go of once
//! that message was acknowledged.

use crate::error::Result;
use crate::sql::{int8_array, text_array};
use std::collections::BTreeMap;
use tokio_postgres::Transaction;

/// Lets go of checkpoints whose message the replica acknowledged, takes
/// back the answers of those of replicas in `provisioned`, and returns,
/// per replica of `kept`, the send ids of its checkpoints not answered yet,
/// oldest first.
pub(crate) async fn due<'a>(
    tx: &Transaction<'_>,
    provisioned: impl Iterator<Item = &'a str>,
    kept: impl Iterator<Item = &'a str>,
) -> Result<BTreeMap<String, Vec<Vec<u8>>>> {
    let rows = tx
        .query_typed(
            &format!(
                "WITH acknowledged AS (
                     DELETE FROM sync.checkpoints c USING sync.acks a
                     WHERE a.replica = c.replica AND c.message <= a.number),
                 taken_back AS (
                     UPDATE sync.checkpoints SET message = NULL
                     WHERE message IS NOT NULL AND replica = ANY({provisioned}))
                 SELECT replica, send_id FROM sync.checkpoints
                 WHERE message IS NULL AND replica = ANY({kept})
                 ORDER BY replica, at, send_id",
                provisioned = text_array(provisioned),
                kept = text_array(kept),
            ),
            &[],
        )
        .await?;
    let mut due = BTreeMap::<String, Vec<Vec<u8>>>::new();
    for row in rows {
        due.entry(row.get(0)).or_default().push(row.get(1));
    }
    Ok(due)
}

/// The statement recording that each replica's message `number` answers
/// its checkpoints not answered yet, for a pass's closing batch. The pass's
/// snapshot sees exactly the checkpoints `due` read: one recorded since is
/// invisible to this update, and waits for the next.
pub(crate) fn answered(replicas: Vec<&str>, numbers: Vec<i64>) -> String {
    format!(
        "UPDATE sync.checkpoints c SET message = u.number
         FROM unnest({}, {}) AS u (replica, number)
         WHERE c.replica = u.replica AND c.message IS NULL;",
        text_array(replicas),
        int8_array(numbers)
    )
}

/// The most checkpoints a replica keeps waiting: an honest replica has an
/// upload or two in flight, while one sending an upload in every frame
/// would otherwise have every pass's [`due`] read thousands of them.
/// Past it, its oldest are let go of (their `Reached` never comes).
pub const MAX_WAITING: i64 = 1_024;

/// Records that each of `replicas` waits to read its own writes up to the
/// upload whose send id is beside it, keeping each replica's newest
/// [`MAX_WAITING`].
pub(crate) async fn record(
    client: &tokio_postgres::Client,
    replicas: &[&str],
    send_ids: &[&[u8]],
) -> Result<()> {
    client
        .execute(
            "INSERT INTO sync.checkpoints (replica, send_id)
             SELECT * FROM unnest($1::text[], $2::bytea[])
             ON CONFLICT (replica, send_id) DO NOTHING",
            &[&replicas, &send_ids],
        )
        .await?;
    // After the insert, not beside it: it must see the rows just made.
    client
        .execute(
            "DELETE FROM sync.checkpoints c
             USING (SELECT replica, send_id,
                           row_number() OVER (PARTITION BY replica
                                              ORDER BY at DESC, send_id DESC) AS n
                    FROM sync.checkpoints WHERE replica = ANY($1)) o
             WHERE c.replica = o.replica AND c.send_id = o.send_id AND o.n > $2",
            &[&replicas, &MAX_WAITING],
        )
        .await?;
    Ok(())
}

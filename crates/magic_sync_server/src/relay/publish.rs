//! Publishing: each replica's outbox, in order, through the host's
//! [`Transport`], beside the passes.

use super::outbox::{message_id, whole, Epoch};
use super::{Published, SendError, Transport};
use crate::error::{Error, Result};
use futures_util::stream::{self, StreamExt};
use std::collections::HashMap;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

/// Messages read per round trip, across replicas.
const PAGE: i64 = 512;
/// How long a message the transport took may go unacknowledged before it
/// is sent again: lost on the way, it may be the last one its replica was
/// sent, whose loss the replica cannot see.
pub const RESEND_AFTER: std::time::Duration = std::time::Duration::from_secs(30);
/// About how many bytes of messages are read per round trip.
const PAGE_BYTES: i64 = 2 << 20;

/// One message as it waits in the outbox.
struct Waiting {
    replica: String,
    number: i64,
    nonce: Vec<u8>,
    head: Vec<u8>,
    body: Vec<u8>,
    hash: Vec<u8>,
    seal: Vec<u8>,
}

impl Waiting {
    fn bytes(self, epoch: &Epoch) -> Vec<u8> {
        whole(epoch, &self.head, &self.body, &self.hash, self.seal)
    }
}

/// Sends every replica's outbox in order, up to `concurrency` replicas at
/// once, a page of messages at a time: what was never sent, and what the
/// transport took more than [`RESEND_AFTER`] ago and the replica has not
/// acknowledged. A message leaves the outbox once its replica acknowledges
/// it (or one after it); a replica a send fails to keeps the rest of its
/// outbox, in order, with why in `sync.replicas.last_error`, and holds back
/// no other. Needs no lock: the outbox holds only what a recording relay
/// committed, and a replica applies a message once however often it comes,
/// so it runs on a connection of its own while the relay records.
pub async fn publish<T: Transport>(
    client: &Client,
    transport: &T,
    concurrency: usize,
) -> Result<Published> {
    let mut published = Published::default();
    let mut failed: HashMap<String, String> = HashMap::new();
    let mut after = (String::new(), 0i64);
    let mut epoch: Option<Epoch> = None;
    loop {
        let page = read_page(client, &after, &mut epoch).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = (last.replica.clone(), last.number);
        // A page short of both bounds is the last: no query to hear so.
        let bytes: usize = page.iter().map(|m| m.body.len()).sum();
        let last_page = page.len() < PAGE as usize && (bytes as i64) < PAGE_BYTES;
        let epoch = epoch.as_ref().expect("read with the first page");
        let queues = queues(page, &failed);
        let results: Vec<Sent> = stream::iter(queues)
            .map(|queue| send_in_order(transport, epoch, queue))
            .buffer_unordered(concurrency.max(1))
            .collect()
            .await;
        let mut taken_replicas = Vec::new();
        let mut taken_numbers = Vec::new();
        for (replica, taken, sent, failure) in results {
            published.sent += sent;
            if let Some(n) = taken {
                taken_replicas.push(replica.clone());
                taken_numbers.push(n);
            }
            if let Some(why) = failure {
                failed.insert(replica, why);
            }
        }
        // Taken by the transport, not marked sent: sent again, and
        // applied once.
        fail::fail_point!("publish-after-send", |_| Err(
            crate::error::Error::Injected("publish-after-send")
        ));
        if !taken_replicas.is_empty() {
            // It stays until the replica acknowledges it, and goes again
            // if that takes longer than RESEND_AFTER.
            client
                .query_typed(
                    "UPDATE sync.outbox o SET sent_at = now()
                     FROM unnest($1::text[], $2::int8[]) AS t (replica, number)
                     WHERE o.replica = t.replica AND o.number <= t.number
                       AND (o.sent_at IS NULL OR o.sent_at < now() - $3::float8 * interval '1 second')",
                    &[
                        (&taken_replicas, Type::TEXT_ARRAY),
                        (&taken_numbers, Type::INT8_ARRAY),
                        (&RESEND_AFTER.as_secs_f64(), Type::FLOAT8),
                    ],
                )
                .await?;
        }
        if last_page {
            break;
        }
    }
    if published.sent > 0 || !failed.is_empty() {
        published.failed = record_failures(client, failed).await?;
    }
    Ok(published)
}

/// What sending one replica's queue came to: the replica, the last number
/// the transport took, how many it took, and why it stopped.
type Sent = (String, Option<i64>, u64, Option<String>);

/// The next page of the outbox after `after`, in order: at most PAGE
/// messages and about PAGE_BYTES (whole messages until their bytes pass the
/// bound, and at least one). The epoch is read with the first page, in the
/// same round trip.
async fn read_page(
    client: &Client,
    after: &(String, i64),
    epoch: &mut Option<Epoch>,
) -> Result<Vec<Waiting>> {
    let resend = RESEND_AFTER.as_secs_f64();
    // Typed, so parsed and run in one round trip.
    let params: [(&(dyn ToSql + Sync), Type); 5] = [
        (&after.0, Type::TEXT),
        (&after.1, Type::INT8),
        (&PAGE, Type::INT8),
        (&PAGE_BYTES, Type::INT8),
        (&resend, Type::FLOAT8),
    ];
    // What was never sent, and what went unacknowledged too long.
    let page = client.query_typed(
        "SELECT replica, number, nonce, head, bytes, hash, seal FROM (
             SELECT o.replica, o.number, o.nonce, o.head, b.bytes, b.hash, o.seal,
                    sum(length(b.bytes)) OVER (ORDER BY o.replica, o.number) - length(b.bytes) AS before
             FROM sync.outbox o JOIN sync.bodies b ON b.id = o.body
             WHERE (o.replica, o.number) > ($1, $2)
               AND (o.sent_at IS NULL OR o.sent_at < now() - $5::float8 * interval '1 second')
             ORDER BY o.replica, o.number LIMIT $3) page
         WHERE before < $4",
        &params,
    );
    let rows = match epoch {
        Some(_) => page.await?,
        None => {
            let (rows, read) = tokio::try_join!(
                async { page.await.map_err(Error::from) },
                Epoch::read(client)
            )?;
            *epoch = Some(read);
            rows
        }
    };
    Ok(rows
        .iter()
        .map(|row| Waiting {
            replica: row.get(0),
            number: row.get(1),
            nonce: row.get(2),
            head: row.get(3),
            body: row.get(4),
            hash: row.get(5),
            seal: row.get(6),
        })
        .collect())
}

/// Per replica, its messages of the page, in order; none for a replica a
/// send already failed to in this round.
fn queues(page: Vec<Waiting>, failed: &HashMap<String, String>) -> Vec<Vec<Waiting>> {
    let mut queues: Vec<Vec<Waiting>> = Vec::new();
    for message in page {
        if failed.contains_key(&message.replica) {
            continue;
        }
        match queues.last_mut() {
            Some(q) if q[0].replica == message.replica => q.push(message),
            _ => queues.push(vec![message]),
        }
    }
    queues
}

/// Records why sends failed in `sync.replicas.last_error`, and clears it
/// for replicas sent to whole again. Returns the failures, sorted.
async fn record_failures(
    client: &Client,
    failed: HashMap<String, String>,
) -> Result<Vec<(String, String)>> {
    let (ids, errors): (Vec<String>, Vec<String>) = failed.into_iter().unzip();
    let failed_ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    // Independent statements, sent together: one round trip. A replica
    // still failing for the same reason keeps its row as it is: the relay
    // may be recording on another connection, and a row rewritten under
    // its snapshot would make that pass fail.
    let mark = async {
        if !ids.is_empty() {
            client
                .execute(
                    "UPDATE sync.replicas r SET last_error = f.error
                     FROM unnest($1::text[], $2::text[]) AS f (id, error)
                     WHERE r.id = f.id AND r.last_error IS DISTINCT FROM f.error",
                    &[&ids, &errors],
                )
                .await?;
        }
        Ok::<(), Error>(())
    };
    let clear = async {
        client
            .execute(
                "UPDATE sync.replicas SET last_error = NULL
                 WHERE last_error IS NOT NULL AND NOT (id = ANY($1))
                   AND NOT provision AND snapshot_attempt IS NULL
                   AND NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.replica = id AND o.sent_at IS NULL)",
                &[&failed_ids],
            )
            .await?;
        Ok::<(), Error>(())
    };
    tokio::try_join!(mark, clear)?;
    let mut failed: Vec<(String, String)> = ids.into_iter().zip(errors).collect();
    failed.sort();
    Ok(failed)
}

/// Sends one replica's messages in order until one fails; returns the last
/// number the transport took, how many it took, and why it stopped.
async fn send_in_order<T: Transport>(
    transport: &T,
    epoch: &Epoch,
    queue: Vec<Waiting>,
) -> (String, Option<i64>, u64, Option<String>) {
    let replica = queue[0].replica.clone();
    let mut taken = None;
    let mut sent = 0;
    for message in queue {
        let number = message.number;
        let id = message_id(epoch, number, &message.nonce);
        match transport.send(&replica, &id, message.bytes(epoch)).await {
            Ok(()) => {
                taken = Some(number);
                sent += 1;
            }
            Err(SendError(why)) => {
                return (
                    replica,
                    taken,
                    sent,
                    Some(format!("sending message {number}: {why}")),
                )
            }
        }
    }
    (replica, taken, sent, None)
}

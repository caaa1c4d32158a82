//! Publishing: each replica's outbox, in order, through the host's
//! [`Transport`], beside the passes.

use super::outbox::{message_id, whole, Epoch};
use super::{Published, ReplicaId, SendError, Transport};
use crate::error::Result;
use crate::store;
use futures_util::stream::{self, StreamExt};
use std::collections::HashMap;
use tokio_postgres::Client;

/// Messages read per round trip, across replicas.
const PAGE: i64 = 512;
/// How long a message the transport took may go unacknowledged before it
/// is sent again: lost on the way, it may be the last one its replica was
/// sent, whose loss the replica cannot see.
pub const RESEND_AFTER: std::time::Duration = std::time::Duration::from_secs(30);
/// About how many bytes of messages are read per round trip.
const PAGE_BYTES: i64 = 2 << 20;

use crate::store::outbox::Waiting;

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
    let mut failed: HashMap<ReplicaId, String> = HashMap::new();
    let mut after = (String::new(), 0i64);
    let mut epoch: Option<Epoch> = None;
    loop {
        let page = read_page(client, &after, &mut epoch).await?;
        let Some(last) = page.last() else {
            break;
        };
        after = (last.replica.to_string(), last.number);
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
                taken_replicas.push(replica.to_string());
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
            store::outbox::mark_sent(client, &taken_replicas, &taken_numbers, RESEND_AFTER).await?;
        }
        if last_page {
            break;
        }
        // A replica a send failed to is skipped whole: the next page begins
        // after the last of its messages, however many wait (an outbox
        // grows while its replica is away, up to
        // `Settings::outbox_messages`).
        if failed.contains_key(after.0.as_str()) {
            after.1 = i64::MAX;
        }
    }
    if published.sent > 0 || !failed.is_empty() {
        published.failed = record_failures(client, failed).await?;
    }
    Ok(published)
}

/// What sending one replica's queue came to: the replica, the last number
/// the transport took, how many it took, and why it stopped.
type Sent = (ReplicaId, Option<i64>, u64, Option<String>);

/// The next page of the outbox after `after`, in order: at most PAGE
/// messages and about PAGE_BYTES (whole messages until their bytes pass the
/// bound, and at least one). The epoch is read with the first page, in the
/// same round trip.
async fn read_page(
    client: &Client,
    after: &(String, i64),
    epoch: &mut Option<Epoch>,
) -> Result<Vec<Waiting>> {
    let page = store::outbox::page(client, after, PAGE, PAGE_BYTES, RESEND_AFTER);
    match epoch {
        Some(_) => page.await,
        None => {
            let (rows, read) = tokio::try_join!(page, Epoch::read(client))?;
            *epoch = Some(read);
            Ok(rows)
        }
    }
}

/// Per replica, its messages of the page, in order; none for a replica a
/// send already failed to in this round.
fn queues(page: Vec<Waiting>, failed: &HashMap<ReplicaId, String>) -> Vec<Vec<Waiting>> {
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
    failed: HashMap<ReplicaId, String>,
) -> Result<Vec<(ReplicaId, String)>> {
    let (ids, errors): (Vec<ReplicaId>, Vec<String>) = failed.into_iter().unzip();
    let failed_ids: Vec<&str> = ids.iter().map(ReplicaId::as_str).collect();
    // Independent statements, sent together: one round trip.
    tokio::try_join!(
        store::outbox::failed(client, &failed_ids, &errors),
        store::outbox::recovered(client, &failed_ids)
    )?;
    let mut failed: Vec<(ReplicaId, String)> = ids.into_iter().zip(errors).collect();
    failed.sort();
    Ok(failed)
}

/// Sends one replica's messages in order until one fails; returns the last
/// number the transport took, how many it took, and why it stopped.
async fn send_in_order<T: Transport>(transport: &T, epoch: &Epoch, queue: Vec<Waiting>) -> Sent {
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

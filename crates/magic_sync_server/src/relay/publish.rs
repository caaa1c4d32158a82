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
    let mut away = Away::new(RESEND_AFTER, RESEND_AFTER);
    publish_beside(client, transport, concurrency, &mut away).await
}

/// Replicas a send failed to, passed over by publishing until their next
/// try is due, so that however many messages wait for a replica away, the
/// others' publishing reads none of them. The wait doubles with each
/// failure, between the bounds given, and ends when a send to the replica
/// goes through or it is heard from ([`Away::back`]).
#[derive(Debug)]
pub struct Away {
    replicas: HashMap<ReplicaId, (std::time::Instant, std::time::Duration)>,
    least: std::time::Duration,
    most: std::time::Duration,
}

impl Away {
    /// None away yet; a replica a send fails to waits `least` before it is
    /// tried again, twice as long after each failure since, up to `most`.
    pub fn new(least: std::time::Duration, most: std::time::Duration) -> Away {
        Away {
            replicas: HashMap::new(),
            least,
            most: most.max(least),
        }
    }

    /// A send to `replica` failed.
    fn failed(&mut self, replica: &ReplicaId) {
        let wait = match self.replicas.get(replica) {
            Some((_, wait)) => (*wait * 2).min(self.most),
            None => self.least,
        };
        self.replicas
            .insert(replica.clone(), (std::time::Instant::now() + wait, wait));
    }

    /// `replica` is reachable: a send to it went through, or it was heard
    /// from.
    pub fn back(&mut self, replica: &ReplicaId) {
        self.replicas.remove(replica);
    }

    /// The replicas to pass over now: those whose wait is not over, unless
    /// `transport` says they are back.
    fn passed_over(&self, transport: &impl Transport) -> std::collections::BTreeSet<String> {
        let now = std::time::Instant::now();
        self.replicas
            .iter()
            .filter(|(r, (due, _))| *due > now && transport.reachable(r) != Some(true))
            .map(|(r, _)| r.to_string())
            .collect()
    }

    /// Forgets the replicas that were due by `began` and failed no send
    /// since: nothing waited for them.
    fn settle(&mut self, began: std::time::Instant) {
        self.replicas.retain(|_, (due, _)| *due > began);
    }

    /// When the first replica away is due to be tried again.
    pub fn next_try(&self) -> Option<std::time::Instant> {
        self.replicas.values().map(|(due, _)| *due).min()
    }
}

/// [`publish`], passing over the replicas `away` holds until they are due,
/// and adding to it those a send fails to.
pub async fn publish_beside<T: Transport>(
    client: &Client,
    transport: &T,
    concurrency: usize,
    away: &mut Away,
) -> Result<Published> {
    let began = std::time::Instant::now();
    let mut published = Published::default();
    let mut failed: HashMap<ReplicaId, String> = HashMap::new();
    let mut sent_to = std::collections::HashSet::new();
    let mut after = (String::new(), 0i64);
    let mut epoch: Option<Epoch> = None;
    loop {
        let skip = away.passed_over(transport);
        let page = read_page(client, &after, &mut epoch, &skip).await?;
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
                sent_to.insert(replica.clone());
            }
            match failure {
                Some(why) => {
                    away.failed(&replica);
                    failed.insert(replica, why);
                }
                None => away.back(&replica),
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
    }
    // A replica that was due and failed no send had nothing waiting.
    away.settle(began);
    if published.sent > 0 || !failed.is_empty() {
        published.failed = record_failures(client, failed, &sent_to).await?;
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
    skip: &std::collections::BTreeSet<String>,
) -> Result<Vec<Waiting>> {
    let page = store::outbox::page(client, after, PAGE, PAGE_BYTES, RESEND_AFTER, skip);
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
    sent: &std::collections::HashSet<ReplicaId>,
) -> Result<Vec<(ReplicaId, String)>> {
    let sent_whole: Vec<&str> = sent
        .iter()
        .filter(|r| !failed.contains_key(*r))
        .map(ReplicaId::as_str)
        .collect();
    let (ids, errors): (Vec<ReplicaId>, Vec<String>) = failed.into_iter().unzip();
    let failed_ids: Vec<&str> = ids.iter().map(ReplicaId::as_str).collect();
    // Independent statements, sent together: one round trip.
    tokio::try_join!(
        store::outbox::failed(client, &failed_ids, &errors),
        store::outbox::recovered(client, &sent_whole)
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

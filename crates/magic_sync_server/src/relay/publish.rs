//! Publishing: each replica's outbox, in order, through the host's
//! [`Transport`], beside the passes.

use super::observe::member_nonce;
use super::outbox::{message_id, stamped, whole, Epoch};
use super::{Published, ReplicaId, SendError, Transport};
use crate::error::{Error, Handling, Result};
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
/// Members of cohorts looked at per page for the cohorts' messages they
/// are owed: a page costs these, not the fleet.
const MEMBERS_LOOKED_AT: i64 = 4 * PAGE;

use crate::store::outbox::Waiting;

/// By default, a page's messages to replicas that read batches are signed
/// together once at least this many go (decision 165): below it, a
/// signature each costs under a millisecond a page, and the messages carry
/// no path.
pub const BATCH_FROM: usize = 64;

/// A message of the page, whole and signed, with what publishing needs of
/// it.
struct Signed {
    replica: ReplicaId,
    number: i64,
    nonce: Vec<u8>,
    bytes: Vec<u8>,
}

/// Signs `page`: the messages to replicas that read batches together, when
/// there are `batch_from` or more of them (one signature over their
/// tree), and every other on its own; in the page's order. A message sent
/// before goes on its own (a replica gone back to a build that reads no
/// batches, and said so since, reads it), and so does one the path would
/// make larger than the transport carries (`max_bytes`).
fn sign(epoch: &Epoch, page: Vec<Waiting>, batch_from: usize, max_bytes: usize) -> Vec<Signed> {
    let batchable = |m: &Waiting| m.reads_batches && !m.resent;
    let batched = page.iter().filter(|m| batchable(m)).count() >= batch_from.max(2);
    let mut bytes: Vec<Option<Vec<u8>>> = vec![None; page.len()];
    if batched {
        let (at, unsigned): (Vec<usize>, Vec<_>) = page
            .iter()
            .enumerate()
            .filter(|(_, m)| batchable(m))
            .map(|(i, m)| {
                let unsigned = magic_sync_core::sign::Unsigned {
                    head: &m.head,
                    body: &m.body,
                    body_hash: &m.hash,
                    seal: m.seal.clone(),
                };
                (i, unsigned)
            })
            .unzip();
        for (i, signed) in at.into_iter().zip(epoch.signer.batch(unsigned)) {
            bytes[i] = Some(signed).filter(|b| b.len() <= max_bytes);
        }
    }
    page.into_iter()
        .zip(bytes)
        .map(|(m, signed)| Signed {
            bytes: signed.unwrap_or_else(|| whole(epoch, &m.head, &m.body, &m.hash, m.seal)),
            replica: m.replica,
            number: m.number,
            nonce: m.nonce,
        })
        .collect()
}

/// Sends every replica's outbox in order, up to `concurrency` replicas at
/// once, a page of messages at a time, the page's messages to replicas that
/// read batches signed together once `batch_from` of them go
/// ([`BATCH_FROM`] by default, `Settings::batch_from`): what was never sent, and what the
/// transport took more than [`RESEND_AFTER`] ago and the replica has not
/// acknowledged. A message leaves the outbox once its replica acknowledges
/// it (or one after it); a replica a send fails to keeps the rest of its
/// outbox, in order, with why in `sync.replicas.last_error`, and holds back
/// no other. A send the transport refuses for good rather than for now (by
/// the [`SendError`]'s kind) is recorded so too, and ends publishing with
/// [`Error::Send`], whose handling stops the runner. Needs no lock: the outbox holds only what a recording relay
/// committed, and a replica applies a message once however often it comes,
/// so it runs on a connection of its own while the relay records.
pub async fn publish<T: Transport>(
    client: &Client,
    transport: &T,
    concurrency: usize,
    batch_from: usize,
) -> Result<Published> {
    let mut away = Away::new(RESEND_AFTER, RESEND_AFTER);
    publish_beside(client, transport, concurrency, batch_from, &mut away).await
}

/// Replicas a send failed to, passed over by publishing until their next
/// try is due, so that however many messages wait for a replica away, the
/// others' publishing reads none of them. The wait doubles with each
/// failure, between the bounds given, and ends when a send to the replica
/// goes through or it is heard from ([`Away::back`]).
///
/// It also remembers what no row records: up to which number each member
/// of a cohort was sent the cohort's messages, and when. They are written
/// once for every member (`sync.batches`), so nothing marks them sent per
/// member; a relay that starts again sends them again, and a replica
/// applies each once.
#[derive(Debug)]
pub struct Away {
    replicas: HashMap<ReplicaId, (std::time::Instant, std::time::Duration)>,
    least: std::time::Duration,
    most: std::time::Duration,
    batches_sent: HashMap<ReplicaId, (i64, std::time::Instant)>,
    /// The relay may record cohorts: their messages owed are read beside
    /// the outbox, in one view.
    cohorts: bool,
    /// That read, prepared once on the publisher's connection: planning
    /// it costs more than running it. It ties an `Away` to the connection
    /// it publishes on: a publisher on a new connection starts a new one
    /// (one used on another anyway fails a page, and prepares again).
    page: Option<tokio_postgres::Statement>,
}

impl Away {
    /// None away yet; a replica a send fails to waits `least` before it is
    /// tried again, twice as long after each failure since, up to `most`.
    pub fn new(least: std::time::Duration, most: std::time::Duration) -> Away {
        Away {
            replicas: HashMap::new(),
            least,
            most: most.max(least),
            batches_sent: HashMap::new(),
            cohorts: true,
            page: None,
        }
    }

    /// Whether the relay publishing records by rule
    /// (`Settings::record_by_rule`; yes unless said): when it does not, no
    /// cohort has messages to send (one recorded before is handed to its
    /// members' outboxes when the relay starts), and a page is the
    /// outbox's alone, read in one statement.
    pub fn by_rule(mut self, cohorts: bool) -> Away {
        self.cohorts = cohorts;
        self
    }

    /// The members sent their cohort's messages less than `RESEND_AFTER`
    /// ago, each with the number up to which they were.
    fn sent_lately(&self) -> (Vec<String>, Vec<i64>) {
        let now = std::time::Instant::now();
        self.batches_sent
            .iter()
            .filter(|(_, (_, at))| now.duration_since(*at) < RESEND_AFTER)
            .map(|(r, (n, _))| (r.to_string(), *n))
            .unzip()
    }

    /// Whether `replica` was sent its cohort's message `number` before.
    fn sent_before(&self, replica: &str, number: i64) -> bool {
        self.batches_sent
            .get(replica)
            .is_some_and(|(n, _)| number <= *n)
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
    batch_from: usize,
    away: &mut Away,
) -> Result<Published> {
    let began = std::time::Instant::now();
    let mut published = Published::default();
    let mut failed: HashMap<ReplicaId, String> = HashMap::new();
    // The first send the transport refused for good, rather than for now.
    let mut refused: Option<Error> = None;
    let mut sent_to = std::collections::HashSet::new();
    let mut after = (String::new(), 0i64);
    let mut epoch: Option<Epoch> = None;
    loop {
        let skip = away.passed_over(transport);
        let (page, end) = read_page(client, &after, &mut epoch, &skip, away).await?;
        let Some(last) = page.last() else {
            // Nothing to send among the members looked at: the next page
            // looks past them.
            match end {
                Some(end) => {
                    after = end;
                    continue;
                }
                None => break,
            }
        };
        let last_page = end.is_none();
        // Everything up to the page's end was read.
        after = end.unwrap_or_else(|| (last.replica.to_string(), last.number));
        let epoch = epoch.as_ref().expect("read with the first page");
        let members: std::collections::HashSet<ReplicaId> = page
            .iter()
            .filter(|m| m.batched)
            .map(|m| m.replica.clone())
            .collect();
        // What goes to a replica a send already failed to in this round
        // is neither signed nor sent.
        let page: Vec<Waiting> = page
            .into_iter()
            .filter(|m| !failed.contains_key(&m.replica))
            .collect();
        let signed = sign(epoch, page, batch_from, transport.max_message_bytes());
        let queues = queues(signed, &failed);
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
                if members.contains(&replica) {
                    away.batches_sent
                        .insert(replica.clone(), (n, std::time::Instant::now()));
                }
            }
            match failure {
                Some((number, reason)) => {
                    away.failed(&replica);
                    failed.insert(
                        replica.clone(),
                        format!("sending message {number}: {reason}"),
                    );
                    let error = Error::Send {
                        replica,
                        number: u64::try_from(number).unwrap_or(0),
                        reason,
                    };
                    // Only a replica out of reach is tried again.
                    if error.handling() != Handling::Retry {
                        refused.get_or_insert(error);
                    }
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
        if last_page || refused.is_some() {
            break;
        }
    }
    // A replica that was due and failed no send had nothing waiting.
    away.settle(began);
    if published.sent > 0 || !failed.is_empty() {
        published.failed = record_failures(client, failed, &sent_to).await?;
    }
    // Recorded as the replica's last error, and returned: the runner stops
    // with what the transport said.
    match refused {
        Some(error) => Err(error),
        None => Ok(published),
    }
}

/// What sending one replica's queue came to: the replica, the last number
/// the transport took, how many it took, and the message it stopped at
/// with why.
type Sent = (ReplicaId, Option<i64>, u64, Option<(i64, SendError)>);

/// The next page after `after`, in order (by replica, then number): what
/// waits in the outbox, and the cohorts' messages members are owed, each
/// stamped for its member. At most PAGE messages and about PAGE_BYTES
/// (whole messages until their bytes pass the bound, and at least one),
/// and where it ends: everything waiting up to there is in it, and
/// nothing is past it when `None`. The epoch is read with the first page,
/// in the same round trip.
///
/// Both lists are read in one transaction (`REPEATABLE READ`), so of one
/// view of the database: a pass may commit between two statements, and a
/// member's message of its own read without the cohort's before it (or the
/// other way round) would reach the replica without the one it follows.
async fn read_page(
    client: &Client,
    after: &(String, i64),
    epoch: &mut Option<Epoch>,
    skip: &std::collections::BTreeSet<String>,
    away: &mut Away,
) -> Result<(Vec<Waiting>, Option<(String, i64)>)> {
    let epoch_read = async {
        match epoch {
            Some(_) => Ok(None),
            None => Epoch::read(client).await.map(Some),
        }
    };
    if !away.cohorts {
        let page = store::outbox::page(client, after, PAGE, PAGE_BYTES, RESEND_AFTER, skip);
        let (rows, read) = tokio::try_join!(page, epoch_read)?;
        if let Some(read) = read {
            *epoch = Some(read);
        }
        let end = full(&rows);
        return Ok((rows, end));
    }
    let statement = match &away.page {
        Some(statement) => statement.clone(),
        None => {
            let statement = store::cohorts::prepare_owed_page(client).await?;
            away.page = Some(statement.clone());
            statement
        }
    };
    let (sent, numbers) = away.sent_lately();
    // One transaction, its statements sent together: one round trip, one
    // view. The outbox's page is planned for its parameters, as without
    // cohorts (a plan for any parameters would scan the outboxes of the
    // replicas away); the cohorts' part by the plan prepared.
    let begin = async {
        Ok(client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            .await?)
    };
    let outbox = store::outbox::page(client, after, PAGE, PAGE_BYTES, RESEND_AFTER, skip);
    let owed = store::cohorts::owed_page(
        client,
        &statement,
        after,
        PAGE,
        skip,
        MEMBERS_LOOKED_AT,
        (&sent[..], &numbers[..]),
    );
    let commit = async { Ok(client.batch_execute("COMMIT").await?) };
    // Polled in this order, so sent in it, and the first error is the
    // cause (not a later statement's "transaction is aborted").
    let ((), mut rows, owed, read, ()) = match tokio::try_join!(biased; begin, outbox, owed, epoch_read, commit)
    {
        Ok(read) => read,
        Err(e) => {
            // The COMMIT sent beside the statements ended the
            // transaction, unless a statement failed before it went: a
            // ROLLBACK makes sure (and is a no-op otherwise). The
            // statement may have been prepared on a connection since
            // replaced: prepared again with the next page.
            client.batch_execute("ROLLBACK").await.ok();
            away.page = None;
            return Err(e);
        }
    };
    if let Some(read) = read {
        *epoch = Some(read);
    }
    let epoch = epoch.as_ref().expect("read with the first page");
    // Where each list stopped short of what waits: the page ends at the
    // earliest, so that nothing is passed over.
    let mut ends = vec![full(&rows), owed.through];
    if !owed.owed.is_empty() {
        let sent_before = |r: &str, n: i64| away.sent_before(r, n);
        let owed = stamp_owed(epoch, owed.owed, &owed.bodies, &sent_before, PAGE_BYTES)?;
        ends.push(full(&owed));
        rows.extend(owed);
        rows.sort_by(|a, b| (&a.replica, a.number).cmp(&(&b.replica, b.number)));
    }
    let end = ends.into_iter().flatten().min();
    if let Some(end) = &end {
        rows.retain(|m| (m.replica.as_str(), m.number) <= (end.0.as_str(), end.1));
    }
    Ok((rows, end))
}

/// Where a list of messages stopped short of what waits, if it did: at
/// its last message, when it holds PAGE of them or PAGE_BYTES.
fn full(page: &[Waiting]) -> Option<(String, i64)> {
    let bytes: usize = page.iter().map(|m| m.body.len()).sum();
    let full = page.len() >= PAGE as usize || bytes as i64 >= PAGE_BYTES;
    full.then(|| page.last().map(|m| (m.replica.to_string(), m.number)))
        .flatten()
}

/// The cohorts' messages `owed`, each stamped for its member as the
/// outbox's are when written: its own nonce, drawn from the cohort's, and
/// the member's message before it; whole messages until their bytes pass
/// `most_bytes`. `sent_before` says which went before.
pub(crate) fn stamp_owed(
    epoch: &Epoch,
    owed: Vec<store::cohorts::Owed>,
    bodies: &HashMap<i64, (Vec<u8>, Vec<u8>)>,
    sent_before: &(dyn Fn(&str, i64) -> bool + Sync),
    most_bytes: i64,
) -> Result<Vec<Waiting>> {
    let mut bytes = 0;
    let mut waiting = Vec::with_capacity(owed.len());
    for o in owed {
        if bytes as i64 >= most_bytes {
            break;
        }
        let nonce = member_nonce(&epoch.secret, &o.replica, o.number, &o.shared);
        let previous_nonce = match o.previous_shared {
            true => member_nonce(&epoch.secret, &o.replica, o.previous, &o.previous_nonce),
            false => o.previous_nonce,
        };
        let head = stamped(
            epoch,
            &o.replica,
            o.number,
            nonce,
            (o.previous, previous_nonce),
            false,
        );
        let (body, hash) = bodies.get(&o.body).cloned().ok_or_else(|| Error::Damaged {
            what: format!("the body of the cohort's message {} is missing", o.number),
        })?;
        bytes += body.len();
        waiting.push(Waiting {
            resent: sent_before(&o.replica, o.number),
            replica: o.replica.into(),
            number: o.number,
            nonce: head.nonce,
            head: head.head,
            body,
            hash,
            seal: head.seal,
            reads_batches: o.reads_batches,
            batched: true,
        });
    }
    Ok(waiting)
}

/// Per replica, its messages of the page, in order; none for a replica a
/// send already failed to in this round.
fn queues(page: Vec<Signed>, failed: &HashMap<ReplicaId, String>) -> Vec<Vec<Signed>> {
    let mut queues: Vec<Vec<Signed>> = Vec::new();
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
async fn send_in_order<T: Transport>(transport: &T, epoch: &Epoch, queue: Vec<Signed>) -> Sent {
    let replica = queue[0].replica.clone();
    let mut taken = None;
    let mut sent = 0;
    for message in queue {
        let number = message.number;
        let id = message_id(epoch, number, &message.nonce);
        match transport.send(&replica, &id, message.bytes).await {
            Ok(()) => {
                taken = Some(number);
                sent += 1;
            }
            Err(why) => return (replica, taken, sent, Some((number, why))),
        }
    }
    (replica, taken, sent, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use magic_sync_core::envelope::ToReplica;
    use magic_sync_core::sign::{verify_message, Signer};
    use prost::Message;
    use sha2::{Digest, Sha256};

    /// A message to `replica` with a body of `body_bytes`, its replica
    /// reading batches, sent before when `resent`.
    fn waiting(replica: &str, body_bytes: usize, resent: bool) -> Waiting {
        let head = ToReplica {
            replica: replica.into(),
            epoch: vec![7; 24],
            number: 9,
            nonce: vec![3; 16],
            ..ToReplica::default()
        }
        .encode_to_vec();
        let body = ToReplica {
            body: Some(magic_sync_core::envelope::to_replica::Body::Down(
                magic_sync_core::envelope::Down {
                    tables: vec![magic_sync_core::envelope::TableRows {
                        table: "products".into(),
                        upserts: vec![magic_sync_core::envelope::RowData {
                            key: b"[1]".to_vec(),
                            data: vec![b'x'; body_bytes],
                        }],
                        ..Default::default()
                    }],
                },
            )),
            ..ToReplica::default()
        }
        .encode_to_vec();
        Waiting {
            replica: replica.into(),
            number: 9,
            nonce: vec![3; 16],
            hash: Sha256::digest(&body).to_vec(),
            head,
            body,
            seal: vec![4; 32],
            reads_batches: true,
            resent,
            batched: false,
        }
    }

    fn path_of(bytes: &[u8]) -> usize {
        ToReplica::decode(bytes).unwrap().batch_path.len()
    }

    #[test]
    fn a_message_the_path_would_make_too_large_and_one_sent_before_go_on_their_own() {
        let server = Signer::new(&[5; 32], Vec::new());
        let epoch = Epoch::for_tests(server.clone());
        let alone = whole(
            &epoch,
            &waiting("t1", 900, false).head,
            &waiting("t1", 900, false).body,
            &waiting("t1", 900, false).hash,
            vec![4; 32],
        )
        .len();
        // The transport carries the largest message signed on its own, and
        // not one byte of a path more.
        let max = alone;
        let page = vec![
            waiting("t0", 100, false),
            waiting("t1", 900, false),
            waiting("t2", 100, true),
            waiting("t3", 100, false),
        ];
        let signed = sign(&epoch, page, 2, max);
        let paths: Vec<usize> = signed.iter().map(|s| path_of(&s.bytes)).collect();
        assert_eq!(paths, [64, 0, 0, 64], "t1 too large, t2 sent before");
        for s in &signed {
            assert!(
                s.bytes.len() <= max,
                "{}: {} bytes",
                s.replica,
                s.bytes.len()
            );
            assert_eq!(
                verify_message(&server.public(), &s.bytes),
                Ok(server.public())
            );
        }
    }

    #[test]
    fn below_the_threshold_or_to_replicas_of_earlier_builds_every_message_goes_on_its_own() {
        let server = Signer::new(&[5; 32], Vec::new());
        let epoch = Epoch::for_tests(server);
        let mut earlier = waiting("t2", 10, false);
        earlier.reads_batches = false;
        let page = vec![waiting("t0", 10, false), waiting("t1", 10, false), earlier];
        let signed = sign(&epoch, page, 3, 1 << 20);
        assert!(signed.iter().all(|s| path_of(&s.bytes) == 0));
        let page = vec![waiting("t0", 10, false), waiting("t1", 10, false)];
        let signed = sign(&epoch, page, 2, 1 << 20);
        assert!(signed.iter().all(|s| path_of(&s.bytes) == 32));
    }
}

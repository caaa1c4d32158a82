//! The outbox: messages numbered, chained and sealed as they are written,
//! sent in order once the record committed, and what replicas say back.

use super::pack::Packed;
use super::{Acknowledged, Published, SendError, Transport};
use crate::envelope::{Ack, Gap, ToReplica};
use crate::error::{Error, Result};
use crate::seal;
use crate::sql;
use futures_util::stream::{self, StreamExt};
use prost::Message;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, SimpleQueryMessage, Statement, Transaction};

/// The installation's epoch.
pub(crate) struct Epoch {
    pub id: Vec<u8>,
    secret: Vec<u8>,
}

impl Epoch {
    pub async fn read(client: &impl tokio_postgres::GenericClient) -> Result<Epoch> {
        let row = client
            .query_opt("SELECT id, secret FROM sync.epoch", &[])
            .await?
            .ok_or_else(|| {
                Error::Invalid("sync.epoch is empty: the migrations did not run whole".into())
            })?;
        Ok(Epoch {
            id: row.get(0),
            secret: row.get(1),
        })
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Epoch").field("id", &hex(&self.id)).finish()
    }
}

/// Where a replica's chain of messages stands while a pass writes it.
#[derive(Debug, Clone)]
pub(crate) struct Chain {
    pub last_number: i64,
    pub last_nonce: Vec<u8>,
    /// The next message begins a snapshot.
    pub begins_snapshot: bool,
    /// The first message of the snapshot written this pass.
    pub snapshot_number: Option<i64>,
}

/// The statements that write messages, prepared once on the relay's
/// connection: each then runs in one round trip instead of two (prepare,
/// then run), and the two of a batch go together.
#[derive(Debug)]
pub(crate) struct Statements {
    bodies: Statement,
    outbox: Statement,
}

impl Statements {
    pub async fn prepare(tx: &Transaction<'_>) -> Result<Statements> {
        Ok(Statements {
            bodies: tx
                .prepare(
                    "INSERT INTO sync.bodies (hash, bytes) SELECT * FROM unnest($1::bytea[], $2::bytea[])
                     ON CONFLICT (hash) DO NOTHING",
                )
                .await?,
            outbox: tx
                .prepare(
                    "INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
                     SELECT o.replica, o.number, o.nonce, o.head, b.id, o.seal
                     FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bytea[], $5::bytea[], $6::bytea[])
                          AS o (replica, number, nonce, head, hash, seal)
                     JOIN sync.bodies b ON b.hash = o.hash",
                )
                .await?,
        })
    }
}

/// Numbers, chains, seals and writes messages, a batch at a time.
pub(crate) struct Writer<'e> {
    statements: &'e Statements,
    epoch: &'e Epoch,
    chains: HashMap<String, Chain>,
    /// Replicas written to this pass.
    touched: Vec<String>,
    written: u64,
}

impl<'e> Writer<'e> {
    pub fn new(
        statements: &'e Statements,
        epoch: &'e Epoch,
        chains: HashMap<String, Chain>,
    ) -> Self {
        Writer {
            statements,
            epoch,
            chains,
            touched: Vec::new(),
            written: 0,
        }
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Writes `packed` to the outbox, in order: each draws the next number,
    /// names its replica's previous message, and is sealed.
    pub async fn write(&mut self, tx: &Transaction<'_>, packed: Vec<Packed>) -> Result<()> {
        if packed.is_empty() {
            return Ok(());
        }
        let mut numbers: Vec<i64> = Vec::with_capacity(packed.len());
        let sql = format!(
            "SELECT nextval('sync.message_seq') FROM generate_series(1, {})",
            packed.len()
        );
        for message in tx.simple_query(&sql).await? {
            if let SimpleQueryMessage::Row(row) = message {
                let number = row
                    .get(0)
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| Error::Invalid("sync.message_seq gave no number".into()))?;
                numbers.push(number);
            }
        }
        numbers.sort_unstable();
        let mut bodies: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rows = Rows::default();
        for (message, number) in packed.into_iter().zip(numbers) {
            let chain = self
                .chains
                .get_mut(&message.replica)
                .expect("a message is for a replica the pass planned");
            if !self.touched.contains(&message.replica) {
                self.touched.push(message.replica.clone());
            }
            let mut nonce = vec![0u8; 16];
            rand::thread_rng().fill_bytes(&mut nonce);
            let begins = chain.begins_snapshot;
            if begins {
                chain.begins_snapshot = false;
                chain.snapshot_number = Some(number);
            }
            let number_u = u64::try_from(number).expect("sequence numbers are positive");
            let head = ToReplica {
                replica: message.replica.clone(),
                epoch: self.epoch.id.clone(),
                number: number_u,
                nonce: nonce.clone(),
                previous: u64::try_from(chain.last_number).unwrap_or(0),
                previous_nonce: chain.last_nonce.clone(),
                begins_snapshot: begins,
                body: None,
                seal: Vec::new(),
            }
            .encode_to_vec();
            let sealed = seal::seal(
                &self.epoch.secret,
                &message.replica,
                &self.epoch.id,
                number_u,
                &nonce,
            );
            chain.last_number = number;
            chain.last_nonce = nonce.clone();
            let hash = Sha256::digest(&message.body).to_vec();
            bodies.entry(hash.clone()).or_insert(message.body);
            rows.replica.push(message.replica);
            rows.number.push(number);
            rows.nonce.push(nonce);
            rows.head.push(head);
            rows.hash.push(hash);
            rows.seal.push(sealed.to_vec());
        }
        self.written += rows.number.len() as u64;
        let (hashes, bytes): (Vec<Vec<u8>>, Vec<Vec<u8>>) = bodies.into_iter().unzip();
        // Sent together, run in order: the outbox rows find their bodies.
        let body_params: [&(dyn ToSql + Sync); 2] = [&hashes, &bytes];
        let outbox_params: [&(dyn ToSql + Sync); 6] = [
            &rows.replica,
            &rows.number,
            &rows.nonce,
            &rows.head,
            &rows.hash,
            &rows.seal,
        ];
        tokio::try_join!(
            tx.execute(&self.statements.bodies, &body_params),
            tx.execute(&self.statements.outbox, &outbox_params)
        )?;
        Ok(())
    }

    /// Where each chain written to now stands: each such replica's last
    /// message of the pass, and the statement that records it (run with the
    /// pass's other closing statements, in one round trip).
    pub fn finish(self) -> (HashMap<String, i64>, String) {
        let mut last = HashMap::new();
        let mut values = Vec::new();
        for id in self.touched {
            let chain = &self.chains[&id];
            last.insert(id.clone(), chain.last_number);
            values.push(format!(
                "({}, {}::int8, {}, {}::int8)",
                sql::escaped(&id),
                chain.last_number,
                sql::bytea(&chain.last_nonce),
                chain
                    .snapshot_number
                    .map_or("NULL".to_string(), |n| n.to_string())
            ));
        }
        if values.is_empty() {
            return (last, String::new());
        }
        // A snapshot is written whole in one pass: its last message is the
        // replica's last of the pass.
        let statement = format!(
            "UPDATE sync.replicas r SET last_number = u.number, last_nonce = u.nonce,
                 snapshot_number = coalesce(u.snapshot, r.snapshot_number),
                 snapshot_last = CASE WHEN u.snapshot IS NULL THEN r.snapshot_last ELSE u.number END,
                 provision = r.provision AND u.snapshot IS NULL
             FROM (VALUES {}) AS u (id, number, nonce, snapshot)
             WHERE r.id = u.id;",
            values.join(", ")
        );
        (last, statement)
    }
}

/// Measures every live replica's outbox beyond the snapshot it begins with
/// against the bound in `settings`; one past it is marked to be provisioned
/// again (which drops its outbox and held set when the pass observes it),
/// with an alarm saying why. Returns those replicas.
pub(crate) async fn bound(tx: &Transaction<'_>, settings: &super::Settings) -> Result<Vec<String>> {
    let rows = tx
        .query(
            "WITH owed AS (
                 SELECT o.replica, count(*) AS messages,
                        sum(octet_length(o.head) + octet_length(o.seal) + octet_length(b.bytes))::int8 AS bytes
                 FROM sync.outbox o
                 JOIN sync.replicas r ON r.id = o.replica
                 JOIN sync.bodies b ON b.id = o.body
                 WHERE o.number > r.snapshot_last AND r.live AND NOT r.provision
                 GROUP BY o.replica)
             UPDATE sync.replicas r SET provision = true, alarm_at = now(),
                 alarm = format('its outbox outgrew its bound: %s messages, %s bytes beyond the snapshot it begins with '
                     '(at most %s messages, %s bytes); dropped, and the replica provisioned again',
                     owed.messages, owed.bytes, $1::int8, $2::int8)
             FROM owed
             WHERE owed.replica = r.id AND (owed.messages > $1::int8 OR owed.bytes > $2::int8)
             RETURNING r.id",
            &[&settings.outbox_messages, &settings.outbox_bytes],
        )
        .await?;
    let mut dropped: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    dropped.sort();
    Ok(dropped)
}

#[derive(Default)]
struct Rows {
    replica: Vec<String>,
    number: Vec<i64>,
    nonce: Vec<Vec<u8>>,
    head: Vec<Vec<u8>>,
    hash: Vec<Vec<u8>>,
    seal: Vec<Vec<u8>>,
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Messages read per round trip, across replicas.
const PAGE: i64 = 512;
/// About how many bytes of messages are read per round trip.
const PAGE_BYTES: i64 = 2 << 20;

/// One message as it waits in the outbox.
struct Waiting {
    replica: String,
    number: i64,
    nonce: Vec<u8>,
    head: Vec<u8>,
    body: Vec<u8>,
    seal: Vec<u8>,
}

impl Waiting {
    /// The bytes the transport is given: head, body and seal, one after the
    /// other, which is the encoding of the whole `ToReplica`.
    fn bytes(self) -> Vec<u8> {
        let tail = ToReplica {
            seal: self.seal,
            ..ToReplica::default()
        }
        .encode_to_vec();
        let mut bytes = self.head;
        bytes.extend_from_slice(&self.body);
        bytes.extend_from_slice(&tail);
        bytes
    }
}

/// Sends every replica's outbox in order, up to `concurrency` replicas at
/// once, a page of messages at a time. A replica a send fails to keeps the
/// rest of its outbox, in order, and holds back no other.
pub(crate) async fn publish<T: Transport>(
    client: &Client,
    transport: &T,
    concurrency: usize,
) -> Result<Published> {
    let mut published = Published::default();
    let mut failed: HashMap<String, String> = HashMap::new();
    let mut after = (String::new(), 0i64);
    let mut epoch: Option<Epoch> = None;
    loop {
        // A page is at most PAGE messages and about PAGE_BYTES: whole
        // messages until their bytes pass the bound, and at least one.
        let params: [&(dyn ToSql + Sync); 4] = [&after.0, &after.1, &PAGE, &PAGE_BYTES];
        let page = client.query(
            "SELECT replica, number, nonce, head, bytes, seal FROM (
                 SELECT o.replica, o.number, o.nonce, o.head, b.bytes, o.seal,
                        sum(length(b.bytes)) OVER (ORDER BY o.replica, o.number) - length(b.bytes) AS before
                 FROM sync.outbox o JOIN sync.bodies b ON b.id = o.body
                 WHERE (o.replica, o.number) > ($1, $2)
                 ORDER BY o.replica, o.number LIMIT $3) page
             WHERE before < $4",
            &params,
        );
        // The epoch is read with the first page, in the same round trip.
        let rows = match &epoch {
            Some(_) => page.await?,
            None => {
                let (rows, read) = tokio::try_join!(
                    async { page.await.map_err(Error::from) },
                    Epoch::read(client)
                )?;
                epoch = Some(read);
                rows
            }
        };
        let Some(last) = rows.last() else {
            break;
        };
        after = (last.get(0), last.get(1));
        // A page short of both bounds is the last: no query to hear so.
        let bytes: usize = rows.iter().map(|r| r.get::<_, &[u8]>(4).len()).sum();
        let last_page = rows.len() < PAGE as usize && (bytes as i64) < PAGE_BYTES;
        let epoch = epoch.as_ref().expect("read with the first page");
        // Per replica, its messages of this page, in order.
        let mut queues: Vec<Vec<Waiting>> = Vec::new();
        for row in &rows {
            let message = Waiting {
                replica: row.get(0),
                number: row.get(1),
                nonce: row.get(2),
                head: row.get(3),
                body: row.get(4),
                seal: row.get(5),
            };
            if failed.contains_key(&message.replica) {
                continue;
            }
            match queues.last_mut() {
                Some(q) if q[0].replica == message.replica => q.push(message),
                _ => queues.push(vec![message]),
            }
        }
        let results: Vec<(String, Option<i64>, u64, Option<String>)> = stream::iter(queues)
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
        if !taken_replicas.is_empty() {
            client
                .execute(
                    "DELETE FROM sync.outbox o USING unnest($1::text[], $2::int8[]) AS t (replica, number)
                     WHERE o.replica = t.replica AND o.number <= t.number",
                    &[&taken_replicas, &taken_numbers],
                )
                .await?;
        }
        if last_page {
            break;
        }
    }
    if published.sent > 0 || !failed.is_empty() {
        let (ids, errors): (Vec<String>, Vec<String>) = failed.into_iter().unzip();
        let failed_ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        // Independent statements, sent together: one round trip. A replica
        // still failing for the same reason keeps its row as it is: the
        // relay may be recording on another connection, and a row rewritten
        // under its snapshot would make that pass fail.
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
                       AND NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.replica = id)",
                    &[&failed_ids],
                )
                .await?;
            Ok::<(), Error>(())
        };
        tokio::try_join!(mark, clear)?;
        published.failed = ids.into_iter().zip(errors).collect();
        published.failed.sort();
    }
    Ok(published)
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
        let id = format!("{}-{number}-{}", hex(&epoch.id), hex(&message.nonce));
        match transport.send(&replica, &id, message.bytes()).await {
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

/// See [`super::Relay::acknowledge`].
pub(crate) async fn acknowledge(client: &Client, replica: &str, ack: &Ack) -> Result<Acknowledged> {
    let mut outcomes = acknowledge_all(client, &[(replica.to_string(), ack.clone())]).await?;
    outcomes.pop().expect("one outcome per acknowledgement")
}

/// See [`super::Relay::acknowledge_all`].
pub(crate) async fn acknowledge_all(
    client: &Client,
    acks: &[(String, Ack)],
) -> Result<Vec<Result<Acknowledged>>> {
    if acks.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<&str> = acks.iter().map(|(r, _)| r.as_str()).collect();
    // Both read in one round trip.
    let (epoch, rows) = tokio::try_join!(Epoch::read(client), async {
        client
            .query(
                "SELECT r.id, r.last_number, coalesce(a.number, 0)
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                 WHERE r.id = ANY($1) AND r.live",
                &[&ids],
            )
            .await
            .map_err(Error::from)
    })?;
    let mut known: HashMap<String, (i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let mut outcomes = Vec::with_capacity(acks.len());
    let mut again: Vec<&str> = Vec::new();
    for (replica, ack) in acks {
        let Some((last, acked)) = known.get_mut(replica) else {
            outcomes.push(Ok(Acknowledged::Unknown));
            continue;
        };
        let Ok(number) = i64::try_from(ack.number) else {
            outcomes.push(Err(Error::Invalid(format!(
                "replica `{replica}` acknowledged message {}, beyond any number the server gives",
                ack.number
            ))));
            continue;
        };
        if ack.epoch != epoch.id {
            again.push(replica);
            outcomes.push(Ok(Acknowledged::Provisioning));
            continue;
        }
        if !seal::verify(
            &epoch.secret,
            replica,
            &epoch.id,
            ack.number,
            &ack.nonce,
            &ack.seal,
        ) {
            outcomes.push(Err(Error::Forged {
                replica: replica.clone(),
                number: ack.number,
            }));
            continue;
        }
        if number > *last || number < *acked {
            // Sealed by this server, but not the chain it records: the
            // server's database or the replica's was restored from an older copy.
            again.push(replica);
            outcomes.push(Ok(Acknowledged::Provisioning));
            continue;
        }
        *acked = number;
        outcomes.push(Ok(Acknowledged::Recorded));
    }
    let (recorded, numbers): (Vec<&str>, Vec<i64>) = acks
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| matches!(o, Ok(Acknowledged::Recorded)))
        .map(|((r, _), _)| (r.as_str(), known[r].1))
        .unzip();
    if !recorded.is_empty() {
        client
            .execute(
                // The replica's row is locked against deletion first: a
                // pass forgetting the replica meanwhile leaves nothing to
                // insert, rather than a foreign key to break.
                "INSERT INTO sync.acks AS a (replica, number, at)
                 SELECT u.id, u.number, now()
                 FROM (SELECT DISTINCT id, number FROM unnest($1::text[], $2::int8[]) AS u (id, number)) u
                 JOIN sync.replicas r ON r.id = u.id FOR KEY SHARE OF r
                 ON CONFLICT (replica) DO UPDATE SET number = excluded.number, at = excluded.at
                 WHERE a.number < excluded.number",
                &[&recorded, &numbers],
            )
            .await?;
    }
    if !again.is_empty() {
        client
            .execute(
                "UPDATE sync.replicas SET provision = true WHERE id = ANY($1)",
                &[&again],
            )
            .await?;
    }
    Ok(outcomes)
}

/// See [`super::Relay::gap`].
pub(crate) async fn gap(client: &Client, replica: &str, gap: &Gap) -> Result<bool> {
    let epoch = Epoch::read(client).await?;
    let number = i64::try_from(gap.number).unwrap_or(i64::MAX);
    let same_epoch = gap.epoch == epoch.id;
    let changed = client
        .execute(
            "UPDATE sync.replicas SET provision = true
             WHERE id = $1 AND live AND NOT ($2 AND snapshot_number > $3)",
            &[&replica, &same_epoch, &number],
        )
        .await?;
    Ok(changed > 0)
}

//! The outbox: messages numbered, chained and sealed as they are written,
//! sent in order once the record committed, and what replicas say back.

use super::pack::Packed;
use super::{Acknowledged, Published, SendError, Transport};
use crate::envelope::{Ack, Gap, ToReplica};
use crate::error::{Error, Result};
use crate::seal;
use futures_util::stream::{self, StreamExt};
use prost::Message;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use tokio_postgres::{Client, Transaction};

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

/// Numbers, chains, seals and writes messages, a batch at a time.
pub(crate) struct Writer<'e> {
    epoch: &'e Epoch,
    chains: HashMap<String, Chain>,
    /// Replicas written to this pass.
    touched: Vec<String>,
    written: u64,
}

impl<'e> Writer<'e> {
    pub fn new(epoch: &'e Epoch, chains: HashMap<String, Chain>) -> Self {
        Writer {
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
        let count = i32::try_from(packed.len()).expect("a flush is far below 2^31 messages");
        let mut numbers: Vec<i64> = tx
            .query(
                "SELECT nextval('sync.message_seq') FROM generate_series(1, $1)",
                &[&count],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
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
        tx.execute(
            "INSERT INTO sync.bodies (hash, bytes) SELECT * FROM unnest($1::bytea[], $2::bytea[])
             ON CONFLICT (hash) DO NOTHING",
            &[&hashes, &bytes],
        )
        .await?;
        tx.execute(
            "INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
             SELECT o.replica, o.number, o.nonce, o.head, b.id, o.seal
             FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bytea[], $5::bytea[], $6::bytea[])
                  AS o (replica, number, nonce, head, hash, seal)
             JOIN sync.bodies b ON b.hash = o.hash",
            &[
                &rows.replica,
                &rows.number,
                &rows.nonce,
                &rows.head,
                &rows.hash,
                &rows.seal,
            ],
        )
        .await?;
        Ok(())
    }

    /// Records where each chain written to now stands; returns each such
    /// replica's last message of the pass.
    pub async fn finish(self, tx: &Transaction<'_>) -> Result<HashMap<String, i64>> {
        let mut last = HashMap::new();
        let mut ids = Vec::new();
        let mut numbers = Vec::new();
        let mut nonces = Vec::new();
        let mut snapshots = Vec::new();
        for id in self.touched {
            let chain = &self.chains[&id];
            last.insert(id.clone(), chain.last_number);
            ids.push(id);
            numbers.push(chain.last_number);
            nonces.push(chain.last_nonce.clone());
            snapshots.push(chain.snapshot_number);
        }
        tx.execute(
            "UPDATE sync.replicas r SET last_number = u.number, last_nonce = u.nonce,
                 snapshot_number = coalesce(u.snapshot, r.snapshot_number),
                 provision = r.provision AND u.snapshot IS NULL
             FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::int8[]) AS u (id, number, nonce, snapshot)
             WHERE r.id = u.id",
            &[&ids, &numbers, &nonces, &snapshots],
        )
        .await?;
        Ok(last)
    }
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

/// Messages read from an outbox per round trip.
const PAGE: i64 = 64;

/// Sends every replica's outbox in order, up to `concurrency` replicas at
/// once. A replica a send fails to keeps the rest of its outbox, in order,
/// and holds back no other.
pub(crate) async fn publish<T: Transport>(
    client: &Client,
    transport: &T,
    concurrency: usize,
) -> Result<Published> {
    let replicas: Vec<String> = client
        .query("SELECT DISTINCT replica FROM sync.outbox", &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if replicas.is_empty() {
        return Ok(Published::default());
    }
    let epoch = Epoch::read(client).await?;
    let results: Vec<Result<(String, u64, Option<String>)>> = stream::iter(replicas)
        .map(|r| publish_one(client, transport, &epoch, r))
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let mut published = Published::default();
    for result in results {
        let (replica, sent, failure) = result?;
        published.sent += sent;
        if let Some(why) = failure {
            published.failed.push((replica, why));
        }
    }
    published.failed.sort();
    client
        .execute(
            "DELETE FROM sync.bodies b WHERE NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.body = b.id)",
            &[],
        )
        .await?;
    Ok(published)
}

async fn publish_one<T: Transport>(
    client: &Client,
    transport: &T,
    epoch: &Epoch,
    replica: String,
) -> Result<(String, u64, Option<String>)> {
    let mut after = 0i64;
    let mut sent = 0u64;
    loop {
        let rows = client
            .query(
                "SELECT o.number, o.nonce, o.head, b.bytes, o.seal
                 FROM sync.outbox o JOIN sync.bodies b ON b.id = o.body
                 WHERE o.replica = $1 AND o.number > $2 ORDER BY o.number LIMIT $3",
                &[&replica, &after, &PAGE],
            )
            .await?;
        if rows.is_empty() {
            break;
        }
        let mut failure = None;
        let mut taken = after;
        for row in &rows {
            let number: i64 = row.get(0);
            let nonce: Vec<u8> = row.get(1);
            let head: Vec<u8> = row.get(2);
            let body: Vec<u8> = row.get(3);
            let sealed: Vec<u8> = row.get(4);
            let tail = ToReplica {
                seal: sealed,
                ..ToReplica::default()
            }
            .encode_to_vec();
            let mut bytes = head;
            bytes.extend_from_slice(&body);
            bytes.extend_from_slice(&tail);
            let id = format!("{}-{number}-{}", hex(&epoch.id), hex(&nonce));
            match transport.send(&replica, &id, bytes).await {
                Ok(()) => {
                    taken = number;
                    sent += 1;
                }
                Err(SendError(why)) => {
                    failure = Some(why);
                    break;
                }
            }
        }
        if taken > after {
            client
                .execute(
                    "DELETE FROM sync.outbox WHERE replica = $1 AND number <= $2",
                    &[&replica, &taken],
                )
                .await?;
            after = taken;
        }
        if let Some(why) = failure {
            client
                .execute(
                    "UPDATE sync.replicas SET last_error = $2 WHERE id = $1",
                    &[&replica, &format!("sending message {}: {why}", after + 1)],
                )
                .await?;
            return Ok((replica, sent, Some(why)));
        }
    }
    client
        .execute(
            "UPDATE sync.replicas SET last_error = NULL WHERE id = $1 AND last_error IS NOT NULL",
            &[&replica],
        )
        .await?;
    Ok((replica, sent, None))
}

/// See [`super::Relay::acknowledge`].
pub(crate) async fn acknowledge(client: &Client, replica: &str, ack: &Ack) -> Result<Acknowledged> {
    let epoch = Epoch::read(client).await?;
    let Ok(number) = i64::try_from(ack.number) else {
        return Err(Error::Invalid(format!(
            "replica `{replica}` acknowledged message {}, beyond any number the server gives",
            ack.number
        )));
    };
    let Some(row) = client
        .query_opt(
            "SELECT last_number, acked_number FROM sync.replicas WHERE id = $1 AND live",
            &[&replica],
        )
        .await?
    else {
        return Ok(Acknowledged::Unknown);
    };
    if ack.epoch != epoch.id {
        provision(client, replica).await?;
        return Ok(Acknowledged::Provisioning);
    }
    if !seal::verify(
        &epoch.secret,
        replica,
        &epoch.id,
        ack.number,
        &ack.nonce,
        &ack.seal,
    ) {
        return Err(Error::Forged {
            replica: replica.to_string(),
            number: ack.number,
        });
    }
    let (last, acked): (i64, i64) = (row.get(0), row.get(1));
    if number > last || number < acked {
        // Sealed by this server, but not the chain it records: the server's
        // database or the replica's was restored from an older copy.
        provision(client, replica).await?;
        return Ok(Acknowledged::Provisioning);
    }
    client
        .execute(
            "UPDATE sync.replicas SET acked_number = $2, acked_at = now() WHERE id = $1",
            &[&replica, &number],
        )
        .await?;
    Ok(Acknowledged::Recorded)
}

async fn provision(client: &Client, replica: &str) -> Result<()> {
    client
        .execute(
            "UPDATE sync.replicas SET provision = true WHERE id = $1",
            &[&replica],
        )
        .await?;
    Ok(())
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

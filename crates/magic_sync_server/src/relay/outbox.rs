//! The outbox: messages numbered, chained and sealed as they are written,
//! in the pass's transaction; `super::publish` sends them once it
//! committed. Snapshots number, chain and seal their messages the same way
//! (`stamp`), and send them as they go.

use super::pack::Packed;
use crate::envelope::ToReplica;
use crate::error::{Error, Result};
use crate::seal;
use crate::sql;
use magic_sync_core::sign::Signer;
use prost::Message;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use tokio_postgres::types::ToSql;
use tokio_postgres::{SimpleQueryMessage, Statement, Transaction};

/// The installation's epoch, and the key its messages are signed with.
pub(crate) struct Epoch {
    pub id: Vec<u8>,
    pub(crate) secret: Vec<u8>,
    pub(crate) signer: Signer,
}

impl Epoch {
    /// The epoch and the server's newest key, in one round trip.
    pub async fn read(client: &impl tokio_postgres::GenericClient) -> Result<Epoch> {
        let sql = format!(
            "SELECT e.id, e.secret, k.* FROM sync.epoch e CROSS JOIN LATERAL ({}) k",
            crate::store::keys::READ
        );
        let row = client
            .query_typed_opt(&sql, &[])
            .await?
            .ok_or_else(|| Error::Damaged {
                what: "sync.epoch is empty: the migrations did not run whole".into(),
            })?;
        let seeds: Option<Vec<Vec<u8>>> = row.get(2);
        let endorsements: Option<Vec<Option<Vec<u8>>>> = row.get(3);
        Ok(Epoch {
            id: row.get(0),
            secret: row.get(1),
            signer: crate::store::keys::signer(
                &seeds.unwrap_or_default(),
                &endorsements.unwrap_or_default(),
            )?,
        })
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Epoch")
            .field("id", &hex::encode(&self.id))
            .field("key", &self.signer.public())
            .finish()
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
        let numbers = draw(tx, packed.len()).await?;
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
            let stamped = stamp(self.epoch, chain, &message.replica, number);
            let hash = Sha256::digest(&message.body).to_vec();
            bodies.entry(hash.clone()).or_insert(message.body);
            rows.replica.push(message.replica);
            rows.number.push(number);
            rows.nonce.push(stamped.nonce);
            rows.head.push(stamped.head);
            rows.hash.push(hash);
            rows.seal.push(stamped.seal);
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

    /// Each replica written to so far, with its last message.
    pub fn last_numbers(&self) -> HashMap<&str, i64> {
        self.touched
            .iter()
            .map(|id| (id.as_str(), self.chains[id].last_number))
            .collect()
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

impl super::load::Sink for Writer<'_> {
    async fn take(&mut self, tx: &Transaction<'_>, packed: Vec<Packed>) -> Result<()> {
        self.write(tx, packed).await
    }
}

/// The next `n` message numbers, in order.
pub(crate) async fn draw(tx: &Transaction<'_>, n: usize) -> Result<Vec<i64>> {
    let mut numbers: Vec<i64> = Vec::with_capacity(n);
    let sql = format!("SELECT nextval('sync.message_seq') FROM generate_series(1, {n})");
    for message in tx.simple_query(&sql).await? {
        if let SimpleQueryMessage::Row(row) = message {
            let number = row
                .get(0)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| Error::Damaged {
                    what: "sync.message_seq gave no number".into(),
                })?;
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// A message's own parts around its body: its head (replica, epoch,
/// number, a fresh nonce, the previous message it follows) and its seal.
pub(crate) struct Stamped {
    pub nonce: Vec<u8>,
    pub head: Vec<u8>,
    pub seal: Vec<u8>,
}

/// Stamps the message numbered `number` for `replica`, next on `chain`,
/// and moves the chain on to it.
pub(crate) fn stamp(epoch: &Epoch, chain: &mut Chain, replica: &str, number: i64) -> Stamped {
    let mut nonce = vec![0u8; 16];
    rand::thread_rng().fill_bytes(&mut nonce);
    let begins = chain.begins_snapshot;
    if begins {
        chain.begins_snapshot = false;
        chain.snapshot_number = Some(number);
    }
    let number_u = u64::try_from(number).expect("sequence numbers are positive");
    let head = ToReplica {
        replica: replica.to_string(),
        epoch: epoch.id.clone(),
        number: number_u,
        nonce: nonce.clone(),
        previous: u64::try_from(chain.last_number).unwrap_or(0),
        previous_nonce: chain.last_nonce.clone(),
        begins_snapshot: begins,
        ..ToReplica::default()
    }
    .encode_to_vec();
    let seal = seal::seal(&epoch.secret, replica, &epoch.id, number_u, &nonce).to_vec();
    chain.last_number = number;
    chain.last_nonce = nonce.clone();
    Stamped { nonce, head, seal }
}

/// The bytes the transport is given: head, body and a tail of the seal and
/// the server's signature, one after the other, which is the encoding of the
/// whole `ToReplica`. `body_hash` is the body's SHA-256.
pub(crate) fn whole(
    epoch: &Epoch,
    head: &[u8],
    body: &[u8],
    body_hash: &[u8],
    seal: Vec<u8>,
) -> Vec<u8> {
    epoch.signer.message(head, body, body_hash, seal)
}

/// The id a transport de-duplicates a message by: the same however often it
/// goes.
pub(crate) fn message_id(epoch: &Epoch, number: i64, nonce: &[u8]) -> String {
    format!("{}-{number}-{}", hex::encode(&epoch.id), hex::encode(nonce))
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
    // A snapshot's messages go to the transport as they are read, not
    // through the outbox: one lost on the way past the last the replica
    // acknowledged is never sent again, and with nothing after it to show
    // a gap, the replica waits for the rest of its snapshot for ever.
    // Once it has said nothing new for `RESEND_AFTER` since the snapshot
    // ended, it is provisioned again; a first snapshot lost whole leaves no
    // acknowledgement at all, and counts from its end alone.
    let stalled = tx
        .query(
            "UPDATE sync.replicas r SET provision = true,
                 last_error = 'the end of its snapshot was lost on the way: provisioned again'
             FROM sync.replicas s LEFT JOIN sync.acks a ON a.replica = s.id
             WHERE s.id = r.id AND r.live AND NOT r.provision AND r.snapshot_attempt IS NULL
               AND r.snapshot_last > coalesce(a.number, 0) AND r.last_number > coalesce(a.number, 0)
               AND greatest(a.at, r.snapshot_ended_at) < now() - $1::float8 * interval '1 second'
               AND NOT EXISTS (SELECT 1 FROM sync.outbox o
                               WHERE o.replica = r.id AND o.number > coalesce(a.number, 0))
             RETURNING r.id",
            &[&super::publish::RESEND_AFTER.as_secs_f64()],
        )
        .await?;
    for row in &stalled {
        let id: String = row.get(0);
        tracing::warn!(replica = %id, "the end of a snapshot was lost on the way: provisioned again");
        dropped.push(id);
    }
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

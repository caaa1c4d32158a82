//! The outbox: messages numbered, chained and sealed as they are written,
//! in the pass's transaction; `super::publish` sends them once it
//! committed. Snapshots number, chain and seal their messages the same way
//! (`stamp`), and send them as they go.

use super::pack::Packed;
use crate::envelope::ToReplica;
use crate::error::Result;
use crate::seal;
use crate::store;
use magic_sync_core::MessageNo;
use prost::Message;
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use tokio_postgres::Transaction;

pub(crate) use crate::store::epoch::Epoch;

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
    statements: &'e store::outbox::Statements,
    epoch: &'e Epoch,
    chains: HashMap<String, Chain>,
    /// Replicas written to this pass.
    touched: Vec<String>,
    written: u64,
    /// The number the last messages of the pass's streams share, once
    /// drawn.
    pass_last: Option<i64>,
    /// The cohort's messages of the pass, when it writes them once for
    /// its members.
    batches: Option<Batches>,
}

/// A cohort's messages a pass writes once, for the members it sends them.
struct Batches {
    /// The members sent the pass in the cohort's messages rather than in
    /// messages of their own.
    owed: std::collections::HashSet<String>,
    /// Each message: its number, its own nonce, its body's hash.
    parts: Vec<(i64, Vec<u8>, Vec<u8>)>,
}

impl<'e> Writer<'e> {
    pub fn new(
        statements: &'e store::outbox::Statements,
        epoch: &'e Epoch,
        chains: HashMap<String, Chain>,
    ) -> Self {
        Writer {
            statements,
            epoch,
            chains,
            touched: Vec::new(),
            written: 0,
            pass_last: None,
            batches: None,
        }
    }

    /// Writes the messages of the cohort `cohorts::ALL` once, into its
    /// batches, for the members `owed`; each is sent them stamped for it
    /// when published (`super::publish`), and nothing is written for it.
    pub fn batch_for(&mut self, owed: std::collections::HashSet<String>) {
        self.batches = Some(Batches {
            owed,
            parts: Vec::new(),
        });
    }

    /// The members sent the cohort's messages of the pass, with the number
    /// of the last one, if any was written.
    pub fn sent_batches(&self) -> Option<(&std::collections::HashSet<String>, i64)> {
        let batches = self.batches.as_ref()?;
        let (last, _, _) = batches.parts.last()?;
        Some((&batches.owed, *last))
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// The number the last messages of the pass's streams share, if one
    /// was written: what every holder's rows of the pass are recorded at.
    pub fn pass_last(&self) -> Option<i64> {
        self.pass_last
    }

    /// Writes `packed` to the outbox, in order: each draws the next number,
    /// names its replica's previous message, and is sealed. The last
    /// messages of their streams ([`Packed::last`]) share one number, drawn
    /// after every other: each stream's rows of the pass are carried at the
    /// same number, whatever replica it is for (the record by rule counts a
    /// cohort's rows held by a member that acknowledged it). Numbers need
    /// only grow along each replica's chain, and a message's nonce, seal
    /// and id are its replica's.
    pub async fn write(&mut self, tx: &Transaction<'_>, packed: Vec<Packed>) -> Result<()> {
        if packed.is_empty() {
            return Ok(());
        }
        let others = packed.iter().filter(|p| !p.last).count();
        let ending = usize::from(others < packed.len());
        // In order: the others' numbers, then the last messages' one.
        let drawn = store::outbox::draw(tx, others + ending).await?;
        let (mut others, shared) = (drawn[..others].iter(), drawn.last());
        if ending == 1 {
            self.pass_last = shared.copied();
        }
        let numbers: Vec<i64> = packed
            .iter()
            .map(|p| match p.last {
                true => shared,
                false => others.next(),
            })
            .map(|n| *n.expect("a number drawn for each message"))
            .collect();
        let mut bodies: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut rows = store::outbox::Rows::default();
        for (message, number) in packed.into_iter().zip(numbers) {
            let hash = Sha256::digest(&message.body).to_vec();
            bodies.entry(hash.clone()).or_insert(message.body);
            if store::cohorts::is_cohort(&message.replica) {
                let batches = self
                    .batches
                    .as_mut()
                    .expect("a cohort's messages are written into its batches");
                let mut nonce = vec![0u8; 16];
                rand::thread_rng().fill_bytes(&mut nonce);
                batches.parts.push((number, nonce, hash));
                self.written += 1;
                continue;
            }
            let chain = self
                .chains
                .get_mut(&message.replica)
                .expect("a message is for a replica the pass planned");
            if !self.touched.contains(&message.replica) {
                self.touched.push(message.replica.clone());
            }
            // A member sent the cohort's messages of the pass follows the
            // last of them, as it was stamped for it.
            let part = self
                .batches
                .as_ref()
                .filter(|b| b.owed.contains(&message.replica))
                .and_then(|b| b.parts.last());
            if let Some((part, shared)) = part
                .filter(|(n, _, _)| *n > chain.last_number && *n < number)
                .map(|(n, nonce, _)| (*n, nonce))
            {
                chain.last_number = part;
                chain.last_nonce = super::observe::member_nonce(
                    &self.epoch.secret,
                    &message.replica,
                    part,
                    shared,
                );
            }
            let stamped = stamp(self.epoch, chain, &message.replica, number);
            rows.replica.push(message.replica);
            rows.number.push(number);
            rows.nonce.push(stamped.nonce);
            rows.head.push(stamped.head);
            rows.hash.push(hash);
            rows.seal.push(stamped.seal);
        }
        self.written += rows.number.len() as u64;
        let (hashes, bytes): (Vec<Vec<u8>>, Vec<Vec<u8>>) = bodies.into_iter().unzip();
        store::outbox::insert(tx, self.statements, &hashes, &bytes, &rows).await?;
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
        let mut moved = Vec::new();
        for id in self.touched {
            let chain = &self.chains[&id];
            last.insert(id.clone(), chain.last_number);
            moved.push(store::outbox::Moved {
                id,
                number: chain.last_number,
                nonce: &chain.last_nonce,
                snapshot: chain.snapshot_number,
            });
        }
        let mut statement = store::outbox::chains_moved(&moved);
        if let Some(batches) = self.batches.filter(|b| !b.parts.is_empty()) {
            let pass_last = self
                .pass_last
                .expect("a cohort's last message of a pass is numbered last");
            statement.push_str(&store::cohorts::batches_written(&batches.parts, pass_last));
        }
        (last, statement)
    }
}

impl super::load::Sink for Writer<'_> {
    async fn take(&mut self, tx: &Transaction<'_>, packed: Vec<Packed>) -> Result<()> {
        self.write(tx, packed).await
    }
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
    let previous = (chain.last_number, std::mem::take(&mut chain.last_nonce));
    let stamped = stamped(epoch, replica, number, nonce, previous, begins);
    chain.last_number = number;
    chain.last_nonce = stamped.nonce.clone();
    stamped
}

/// The head and seal of the message numbered `number` for `replica`, with
/// `nonce`, following its message `previous` (number and nonce).
pub(crate) fn stamped(
    epoch: &Epoch,
    replica: &str,
    number: i64,
    nonce: Vec<u8>,
    previous: (i64, Vec<u8>),
    begins_snapshot: bool,
) -> Stamped {
    let number = MessageNo::from_store(number);
    let head = ToReplica {
        replica: replica.to_string(),
        epoch: epoch.id.to_vec(),
        number: number.wire(),
        nonce: nonce.clone(),
        previous: u64::try_from(previous.0).unwrap_or(0),
        previous_nonce: previous.1,
        begins_snapshot,
        ..ToReplica::default()
    }
    .encode_to_vec();
    let seal = seal::seal(&epoch.secret, replica, &epoch.id, number, &nonce).to_vec();
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
    let bytes = i64::try_from(settings.outbox_bytes.as_u64()).unwrap_or(i64::MAX);
    let mut dropped = store::outbox::past_bound(tx, settings.outbox_messages, bytes).await?;
    // A snapshot's messages go to the transport as they are read, not
    // through the outbox: one lost on the way past the last the replica
    // acknowledged is never sent again, and with nothing after it to show
    // a gap, the replica waits for the rest of its snapshot for ever.
    // Once it has said nothing new for `RESEND_AFTER` since the snapshot
    // ended, it is provisioned again; a first snapshot lost whole leaves no
    // acknowledgement at all, and counts from its end alone.
    let stalled = store::outbox::snapshot_end_lost(tx, super::publish::RESEND_AFTER).await?;
    for id in stalled {
        tracing::warn!(replica = %id, "the end of a snapshot was lost on the way: provisioned again");
        dropped.push(id);
    }
    dropped.sort();
    Ok(dropped)
}

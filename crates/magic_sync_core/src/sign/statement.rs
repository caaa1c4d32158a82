//! The statements a signature is over, each of a fixed shape: a tag that
//! names what is signed and in which version, then its parts, each of a
//! fixed length or behind its own. A message's, a `Filed` answer's, a
//! key's endorsement and a batch's root each have theirs, so one cannot
//! pass for another, and no byte can move from one part to the next.

use super::ServerKey;
use crate::envelope::{Endorsement, Receipt};
use sha2::{Digest, Sha256};

pub(super) const MESSAGE: &[u8] = b"magic_sync/v1 message\0";
const ENDORSED: &[u8] = b"magic_sync/v2 message\0";
const FILED: &[u8] = b"magic_sync/v1 filed\0";
const RECEIPTED: &[u8] = b"magic_sync/v2 filed\0";
const KEY: &[u8] = b"magic_sync/v1 key\0";
const BATCH: &[u8] = b"magic_sync/v1 batch\0";

/// The statement a message's signature is over: of the first shape when
/// it carries no endorsement, so replicas of earlier builds read it.
pub(super) fn message_statement(
    head: &[u8],
    body_hash: &[u8],
    seal: &[u8],
    endorsements: &[Endorsement],
) -> Vec<u8> {
    let mut statement = Vec::with_capacity(MESSAGE.len() + 32 + 8 + body_hash.len() + seal.len());
    let tag = match endorsements.is_empty() {
        true => MESSAGE,
        false => ENDORSED,
    };
    statement.extend_from_slice(tag);
    statement.extend_from_slice(&Sha256::digest(head));
    part(&mut statement, body_hash);
    part(&mut statement, seal);
    if !endorsements.is_empty() {
        part(&mut statement, &endorsements_hash(endorsements));
    }
    statement
}

/// The statement a batch's signature is over.
pub(super) fn batch_statement(root: &[u8; 32]) -> Vec<u8> {
    let mut statement = BATCH.to_vec();
    statement.extend_from_slice(root);
    statement
}

/// The statement an answer's signature is over: of the first shape when
/// it carries no receipt, so replicas of earlier builds read it.
pub(super) fn filed_statement(
    replica: &str,
    send_id: &[u8],
    receipt: Option<&Receipt>,
    endorsements: &[Endorsement],
) -> Vec<u8> {
    let Some(receipt) = receipt else {
        let mut statement = FILED.to_vec();
        part(&mut statement, replica.as_bytes());
        part(&mut statement, send_id);
        return statement;
    };
    let mut statement = RECEIPTED.to_vec();
    part(&mut statement, replica.as_bytes());
    part(&mut statement, send_id);
    part(&mut statement, &receipt.epoch);
    part(&mut statement, &receipt.sequence.to_be_bytes());
    part(&mut statement, &receipt.seal);
    part(&mut statement, &endorsements_hash(endorsements));
    statement
}

/// The SHA-256 of a list of endorsements: how many, then each key and
/// signature behind its length.
fn endorsements_hash(endorsements: &[Endorsement]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update((endorsements.len() as u64).to_be_bytes());
    for e in endorsements {
        for bytes in [&e.key, &e.signature] {
            hash.update((bytes.len() as u64).to_be_bytes());
            hash.update(bytes);
        }
    }
    hash.finalize().into()
}

pub(super) fn key_statement(key: &ServerKey) -> Vec<u8> {
    let mut statement = KEY.to_vec();
    statement.extend_from_slice(&key.to_bytes());
    statement
}

pub(super) fn part(statement: &mut Vec<u8>, bytes: &[u8]) {
    // usize is at most 64 bits on every platform Rust supports.
    statement.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    statement.extend_from_slice(bytes);
}

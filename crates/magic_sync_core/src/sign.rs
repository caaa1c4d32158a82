//! The server's signature on what it sends a replica: Ed25519 under the
//! server's key, over every byte that decides what the replica does.
//!
//! Two proofs travel on a message, and they protect different things:
//!
//! - The **signature** is for the replica. It covers the head (replica,
//!   epoch, number, nonce, the message it follows, whether it begins a
//!   snapshot), the body and the seal. A replica pins the server's public key
//!   when it is enrolled and applies nothing that key (or a key it endorsed)
//!   did not sign: whoever stands between the two can neither write nor wipe
//!   rows, forge a `Filed` answer, nor send a high number that would make
//!   every real message after it look like a duplicate.
//! - The **seal** (see [`crate::seal`]) is for the server. It is an HMAC under
//!   the epoch's secret, which no replica sees; the replica hands it back with
//!   its acknowledgement and the server checks it there.
//!
//! What is signed is a statement of fixed shape, never the bytes as they
//! came, so no framing trick can move a byte from one part to another:
//!
//! - a message: `magic_sync/v1 message\0`, the SHA-256 of its head, the
//!   SHA-256 of its body, the length of its seal (8 bytes, big-endian) and
//!   the seal. The body's hash is the one the server keys bodies by, so a
//!   body shared by many replicas is hashed once, and signing a message
//!   costs one small hash and one signature whatever the body's size. A
//!   message that carries endorsements (the server rotated its key) is
//!   signed as `magic_sync/v2 message\0` over the same parts and the
//!   SHA-256 of its endorsements: none can be added, dropped or altered
//!   unseen, and one with none is signed byte for byte as before, so a
//!   replica of an earlier build reads it.
//! - a `Filed` answer: `magic_sync/v1 filed\0`, then the replica's id and
//!   the send id, each behind its length. An answer that carries a receipt
//!   (the replica takes them) is signed as `magic_sync/v2 filed\0` over
//!   those, the receipt's epoch, sequence and seal, and the SHA-256 of its
//!   endorsements.
//! - an endorsement of a new key: `magic_sync/v1 key\0` and the new key.
//! - a batch of messages published together: `magic_sync/v1 batch\0` and
//!   the root of a Merkle tree over their statements (below).
//!
//! Which statement a frame is checked against follows from what it
//! carries, so stripping the endorsements or the receipt off a frame signed
//! over them leaves a signature over another statement: refused.
//!
//! The head, body and tail are found by walking the message's top-level
//! fields: a message whose fields are not in the server's order (head 1-7,
//! body 10-14, tail 15-19) is refused, so what was verified is what applies.
//!
//! **Batches.** One signature a message is 13-15 µs of a core: a pass
//! that publishes a catalogue's change to 10,000 replicas would spend more
//! signing than the rest of the pass. [`Signer::batch`] signs many
//! messages at once: each message's leaf is the SHA-256 of `0x00` and its
//! statement (as above); a level's nodes are paired, each pair's parent the
//! SHA-256 of `0x01`, left and right, and a level of odd width pairs its
//! last node with 32 zero bytes (which no leaf or node hashes to, so a
//! message verifies at its own place only); the root is signed once. Each message carries its
//! leaf's index and its path (its sibling on each level, from the leaf up),
//! and the replica hashes its own leaf up to the root and checks the one
//! signature. The prefixes keep a node from passing for a leaf, and the
//! root's tag keeps a root's signature from passing for a message's. A leaf
//! hashes in the message's seal, which no replica can make, so a path tells
//! its replica nothing of the others' rows; its length tells roughly how
//! many messages went together. A message with no path is signed on its
//! own, as every message was before batches: the form a replica of an
//! earlier build reads.
//!
//! **Rotation.** The server may replace its key. Every message then carries
//! the chain of endorsements from its first key on: each newer key signed by
//! the one before it, [`MAX_ENDORSEMENTS`] at most. A replica checks the
//! signature under the key it pins first (one verification, whatever the
//! endorsements), and only when that fails follows the chain from there,
//! each endorsement after its pinned key in turn, stopping at the first
//! that does not verify; it pins the newest key once a message signed by it
//! verifies: from then on an older key's message is refused. A forged frame
//! thus costs a replica two verifications, and one more per rotation since
//! the key it pins, before it is refused, whatever it carries.

use crate::envelope::{Endorsement, Filed, Receipt, ToReplica};
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use prost::Message;
use sha2::{Digest, Sha256};
use std::fmt;

/// The length of a signature, in bytes.
pub const SIGNATURE_LEN: usize = 64;

/// Endorsements a message or an answer carries at most: one per rotation
/// of the server's key since its first. More is refused before any is
/// checked.
pub const MAX_ENDORSEMENTS: usize = 64;

const MESSAGE: &[u8] = b"magic_sync/v1 message\0";
const ENDORSED: &[u8] = b"magic_sync/v2 message\0";
const FILED: &[u8] = b"magic_sync/v1 filed\0";
const RECEIPTED: &[u8] = b"magic_sync/v2 filed\0";
const KEY: &[u8] = b"magic_sync/v1 key\0";
const BATCH: &[u8] = b"magic_sync/v1 batch\0";

/// Levels a batch's tree has at most: 2^32 messages signed at once.
pub const MAX_BATCH_LEVELS: usize = 32;

/// A message to sign: its encoded head and body, the body's SHA-256, and
/// its seal (see [`Signer::message`]).
#[derive(Debug, Clone)]
pub struct Unsigned<'a> {
    /// Fields 1 to 7 of a `ToReplica`, encoded.
    pub head: &'a [u8],
    /// One of fields 10 to 14, encoded.
    pub body: &'a [u8],
    /// The body's SHA-256.
    pub body_hash: &'a [u8],
    /// The seal.
    pub seal: Vec<u8>,
}

/// The server's public key: what a replica pins when it is enrolled. As
/// text it is its 32 bytes in URL-safe base64 without padding.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerKey(VerifyingKey);

impl ServerKey {
    /// The key of these 32 bytes, if they are a valid Ed25519 public key.
    pub fn from_bytes(bytes: &[u8]) -> Result<ServerKey, Forgery> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| Forgery::BadKey {
            why: format!("{} bytes where a key has 32", bytes.len()),
        })?;
        VerifyingKey::from_bytes(&bytes)
            .map(ServerKey)
            .map_err(|e| Forgery::BadKey { why: e.to_string() })
    }

    /// The key's 32 bytes.
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    fn verify(&self, statement: &[u8], signature: &[u8]) -> bool {
        Signature::from_slice(signature).is_ok_and(|s| self.0.verify(statement, &s).is_ok())
    }
}

impl fmt::Display for ServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.to_bytes()))
    }
}

impl fmt::Debug for ServerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerKey({self})")
    }
}

impl std::str::FromStr for ServerKey {
    type Err = Forgery;

    fn from_str(text: &str) -> Result<ServerKey, Forgery> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text.trim())
            .map_err(|e| Forgery::BadKey {
                why: format!("not URL-safe base64 without padding: {e}"),
            })?;
        ServerKey::from_bytes(&bytes)
    }
}

/// Why a replica would not take what came as its server's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Forgery {
    /// No signature at all.
    #[error("it is not signed")]
    Unsigned,
    /// Signed, but not by the key the replica pins nor one it endorsed.
    #[error("its signature does not verify under the server's key {trusted}")]
    BadSignature {
        /// The newest key the replica could follow the endorsements to.
        trusted: String,
    },
    /// Its fields are not where the server writes them, so what is signed
    /// cannot be told from what would apply.
    #[error("it is not laid out as the server writes messages: {why}")]
    Layout {
        /// What was out of place.
        why: String,
    },
    /// A key that is not an Ed25519 public key.
    #[error("a server key that is not one: {why}")]
    BadKey {
        /// Why.
        why: String,
    },
}

/// The server's signing key, with the endorsements that lead to it from
/// the server's first key. Its `Debug` never shows the secret half.
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
    endorsements: Vec<Endorsement>,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("public", &self.public())
            .field("endorsements", &self.endorsements.len())
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// The key of this 32-byte seed, reached from the server's first key
    /// through `endorsements` (none when it is the first).
    pub fn new(seed: &[u8; 32], endorsements: Vec<Endorsement>) -> Signer {
        Signer {
            key: SigningKey::from_bytes(seed),
            endorsements,
        }
    }

    /// The public half: what replicas pin.
    pub fn public(&self) -> ServerKey {
        ServerKey(self.key.verifying_key())
    }

    /// The endorsements from the first key to this one.
    pub fn endorsements(&self) -> &[Endorsement] {
        &self.endorsements
    }

    /// This key's endorsement of `next`, the key that replaces it.
    pub fn endorse(&self, next: &ServerKey) -> Endorsement {
        Endorsement {
            key: next.to_bytes().to_vec(),
            signature: self.sign(&key_statement(next)),
        }
    }

    fn sign(&self, statement: &[u8]) -> Vec<u8> {
        self.key.sign(statement).to_bytes().to_vec()
    }

    /// The whole message, as the transport is given it: `head`, `body` (whose
    /// SHA-256 is `body_hash`) and the tail, which holds `seal`, the
    /// signature and the endorsements. `head` holds fields 1 to 7 of a
    /// `ToReplica` and `body` one of fields 10 to 14, encoded.
    pub fn message(&self, head: &[u8], body: &[u8], body_hash: &[u8], seal: Vec<u8>) -> Vec<u8> {
        debug_assert_eq!(body_hash, Sha256::digest(body).as_slice());
        let statement = message_statement(head, body_hash, &seal, &self.endorsements);
        let signature = self.sign(&statement);
        let tail = ToReplica {
            seal,
            signature,
            endorsements: self.endorsements.clone(),
            ..ToReplica::default()
        }
        .encode_to_vec();
        let mut bytes = Vec::with_capacity(head.len() + body.len() + tail.len());
        bytes.extend_from_slice(head);
        bytes.extend_from_slice(body);
        bytes.extend_from_slice(&tail);
        bytes
    }

    /// `messages`, each whole as [`message`](Self::message) makes it, under
    /// one signature over the root of their tree (see the module's
    /// "Batches"), in the order given. A batch of one is signed on its own.
    pub fn batch(&self, messages: Vec<Unsigned<'_>>) -> Vec<Vec<u8>> {
        if messages.len() < 2 {
            return messages
                .into_iter()
                .map(|m| self.message(m.head, m.body, m.body_hash, m.seal))
                .collect();
        }
        let leaves: Vec<[u8; 32]> = messages
            .iter()
            .map(|m| {
                debug_assert_eq!(m.body_hash, Sha256::digest(m.body).as_slice());
                leaf(&message_statement(
                    m.head,
                    m.body_hash,
                    &m.seal,
                    &self.endorsements,
                ))
            })
            .collect();
        let levels = tree(leaves);
        let root = levels.last().expect("a tree has a root")[0];
        let signature = self.sign(&batch_statement(&root));
        messages
            .into_iter()
            .enumerate()
            .map(|(index, m)| {
                let tail = ToReplica {
                    seal: m.seal,
                    signature: signature.clone(),
                    endorsements: self.endorsements.clone(),
                    batch_index: index as u64,
                    batch_path: path(&levels, index),
                    ..ToReplica::default()
                }
                .encode_to_vec();
                let mut bytes = Vec::with_capacity(m.head.len() + m.body.len() + tail.len());
                bytes.extend_from_slice(m.head);
                bytes.extend_from_slice(m.body);
                bytes.extend_from_slice(&tail);
                bytes
            })
            .collect()
    }

    /// `message`, signed: what a host that builds its own messages (a test
    /// standing in for the server, say) hands a replica. Its `signature`
    /// and `endorsements` are replaced.
    pub fn to_replica(&self, message: &ToReplica) -> Vec<u8> {
        let head = ToReplica {
            body: None,
            seal: Vec::new(),
            signature: Vec::new(),
            endorsements: Vec::new(),
            batch_index: 0,
            batch_path: Vec::new(),
            ..message.clone()
        }
        .encode_to_vec();
        let body = ToReplica {
            body: message.body.clone(),
            ..ToReplica::default()
        }
        .encode_to_vec();
        let hash = Sha256::digest(&body);
        self.message(&head, &body, &hash, message.seal.clone())
    }

    /// The signed answer to `replica`'s upload `send_id`, as a replica
    /// that takes no receipts reads it (one of an earlier build).
    pub fn filed(&self, replica: &str, send_id: Vec<u8>) -> Filed {
        self.answer(replica, send_id, None)
    }

    /// The signed answer to `replica`'s upload `send_id`, with the
    /// server's `receipt` for it when given: signed over the receipt and
    /// the endorsements too.
    pub fn answer(&self, replica: &str, send_id: Vec<u8>, receipt: Option<Receipt>) -> Filed {
        let statement = filed_statement(replica, &send_id, receipt.as_ref(), &self.endorsements);
        Filed {
            signature: self.sign(&statement),
            send_id,
            endorsements: self.endorsements.clone(),
            receipt,
        }
    }
}

/// The statement a message's signature is over: of the first shape when
/// it carries no endorsement, so replicas of earlier builds read it.
fn message_statement(
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

/// A leaf of a batch's tree: the SHA-256 of a message's statement behind
/// the leaf prefix.
fn leaf(statement: &[u8]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update([0u8]);
    hash.update(statement);
    hash.finalize().into()
}

/// A node of a batch's tree over its two children.
fn node(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut hash = Sha256::new();
    hash.update([1u8]);
    hash.update(left);
    hash.update(right);
    hash.finalize().into()
}

/// What a level of odd width pairs its last node with. Pairing it with
/// itself instead would let a message verify at a second place (its index
/// plus one), a tail that differs from the one signed.
const PAD: [u8; 32] = [0; 32];

/// Every level of the tree over `leaves`, the leaves first and the root
/// alone last; a level of odd width pairs its last node with [`PAD`].
fn tree(leaves: Vec<[u8; 32]>) -> Vec<Vec<[u8; 32]>> {
    let mut levels = vec![leaves];
    while levels.last().expect("at least the leaves").len() > 1 {
        let below = levels.last().expect("at least the leaves");
        let above = below
            .chunks(2)
            .map(|pair| node(&pair[0], pair.get(1).unwrap_or(&PAD)))
            .collect();
        levels.push(above);
    }
    levels
}

/// The path of the `index`th leaf: its sibling on each level below the
/// root, from the leaf up, 32 bytes each.
fn path(levels: &[Vec<[u8; 32]>], index: usize) -> Vec<u8> {
    let mut path = Vec::with_capacity(32 * levels.len().saturating_sub(1));
    let mut at = index;
    for level in &levels[..levels.len() - 1] {
        let sibling = level.get(at ^ 1).unwrap_or(&PAD);
        path.extend_from_slice(sibling);
        at /= 2;
    }
    path
}

/// The root `path` leads to from `leaf` at `index`, or why it cannot be
/// one the server made.
fn root_of(leaf: [u8; 32], index: u64, path: &[u8]) -> Result<[u8; 32], Forgery> {
    let layout = |why: String| Forgery::Layout { why };
    if !path.len().is_multiple_of(32) {
        return Err(layout(format!(
            "its batch path is {} bytes, not a whole number of 32-byte hashes",
            path.len()
        )));
    }
    let levels = path.len() / 32;
    if levels > MAX_BATCH_LEVELS {
        return Err(layout(format!(
            "its batch path has {levels} levels, more than any server makes ({MAX_BATCH_LEVELS})"
        )));
    }
    if index >> levels != 0 {
        return Err(layout(format!(
            "its batch index {index} is past a tree of {levels} levels"
        )));
    }
    let mut at = index;
    let mut hash = leaf;
    for sibling in path.chunks_exact(32) {
        let sibling: &[u8; 32] = sibling.try_into().expect("chunks of 32");
        hash = match at & 1 {
            0 => node(&hash, sibling),
            _ => node(sibling, &hash),
        };
        at >>= 1;
    }
    Ok(hash)
}

/// The statement a batch's signature is over.
fn batch_statement(root: &[u8; 32]) -> Vec<u8> {
    let mut statement = BATCH.to_vec();
    statement.extend_from_slice(root);
    statement
}

/// The statement an answer's signature is over: of the first shape when
/// it carries no receipt, so replicas of earlier builds read it.
fn filed_statement(
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

fn key_statement(key: &ServerKey) -> Vec<u8> {
    let mut statement = KEY.to_vec();
    statement.extend_from_slice(&key.to_bytes());
    statement
}

fn part(statement: &mut Vec<u8>, bytes: &[u8]) {
    // usize is at most 64 bits on every platform Rust supports.
    statement.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
    statement.extend_from_slice(bytes);
}

/// Follows `endorsements` from `trusted`: the newest key reached. The
/// chain is taken up after the endorsement of `trusted` (found by its key,
/// no signature checked), or from the first when none names it (`trusted`
/// is the server's first key); from there every endorsement must verify
/// under the key before it, and the first that does not ends the frame.
fn follow(trusted: &ServerKey, endorsements: &[Endorsement]) -> Result<ServerKey, Forgery> {
    let pinned = trusted.to_bytes();
    let from = endorsements
        .iter()
        .rposition(|e| e.key.as_slice() == pinned.as_slice())
        .map_or(0, |at| at + 1);
    let mut current = *trusted;
    for endorsement in &endorsements[from..] {
        let Ok(next) = ServerKey::from_bytes(&endorsement.key) else {
            return Err(Forgery::BadKey {
                why: "an endorsement names no key".into(),
            });
        };
        if !current.verify(&key_statement(&next), &endorsement.signature) {
            return Err(Forgery::BadSignature {
                trusted: current.to_string(),
            });
        }
        current = next;
    }
    Ok(current)
}

/// The key among `trusted` and the keys it endorsed that signed
/// `statement`: `trusted` itself first, so a replica that follows the
/// newest key checks one signature whatever the endorsements; then the
/// newest key the endorsements lead to.
fn signed_by(
    trusted: &ServerKey,
    statement: &[u8],
    signature: &[u8],
    endorsements: &[Endorsement],
) -> Result<ServerKey, Forgery> {
    if signature.is_empty() {
        return Err(Forgery::Unsigned);
    }
    if endorsements.len() > MAX_ENDORSEMENTS {
        return Err(too_many(endorsements.len()));
    }
    if trusted.verify(statement, signature) {
        return Ok(*trusted);
    }
    let signer = follow(trusted, endorsements)?;
    if signer != *trusted && signer.verify(statement, signature) {
        Ok(signer)
    } else {
        Err(Forgery::BadSignature {
            trusted: signer.to_string(),
        })
    }
}

fn too_many(n: usize) -> Forgery {
    Forgery::Layout {
        why: format!(
            "it carries {n} endorsements, more than any server makes ({MAX_ENDORSEMENTS})"
        ),
    }
}

/// Verifies a whole `ToReplica` as it came against the key the replica
/// pins, before anything in it is believed: the key that signed it
/// (`trusted`, or a newer one `trusted` endorsed), or why it is refused.
pub fn verify_message(trusted: &ServerKey, bytes: &[u8]) -> Result<ServerKey, Forgery> {
    let (head, body, tail) = split(bytes)?;
    let tail = ToReplica::decode(tail).map_err(|e| Forgery::Layout {
        why: format!("its tail does not decode: {e}"),
    })?;
    let statement = message_statement(head, &Sha256::digest(body), &tail.seal, &tail.endorsements);
    if tail.batch_path.is_empty() {
        if tail.batch_index != 0 {
            return Err(Forgery::Layout {
                why: "it names a place in a batch but carries no path".into(),
            });
        }
        return signed_by(trusted, &statement, &tail.signature, &tail.endorsements);
    }
    let root = root_of(leaf(&statement), tail.batch_index, &tail.batch_path)?;
    signed_by(
        trusted,
        &batch_statement(&root),
        &tail.signature,
        &tail.endorsements,
    )
}

/// Verifies an answer to an upload of `replica`'s against the key it pins:
/// the key that signed it, or why it is refused. Its receipt, when it
/// carries one, is the server's as much as the rest.
pub fn verify_filed(
    trusted: &ServerKey,
    replica: &str,
    filed: &Filed,
) -> Result<ServerKey, Forgery> {
    if filed.endorsements.len() > MAX_ENDORSEMENTS {
        return Err(too_many(filed.endorsements.len()));
    }
    let statement = filed_statement(
        replica,
        &filed.send_id,
        filed.receipt.as_ref(),
        &filed.endorsements,
    );
    signed_by(trusted, &statement, &filed.signature, &filed.endorsements)
}

/// `ToReplica.endorsements`.
const ENDORSEMENTS_FIELD: u32 = 17;

/// Which part of a message a top-level field belongs to.
fn group(field: u32) -> Option<u8> {
    match field {
        1..=7 => Some(0),
        10..=14 => Some(1),
        15..=19 => Some(2),
        _ => None,
    }
}

/// An encoded `ToReplica`'s head, body and tail.
type Parts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// The head, body and tail of an encoded `ToReplica`, found by walking its
/// top-level fields, which must come head first, then body, then tail. The
/// endorsements are counted as they are walked: a tail of more than
/// [`MAX_ENDORSEMENTS`] is refused before any is decoded.
fn split(bytes: &[u8]) -> Result<Parts<'_>, Forgery> {
    let layout = |why: String| Forgery::Layout { why };
    let mut at = 0;
    let mut current = 0u8;
    let mut endorsements = 0usize;
    // Where the body and the tail begin.
    let mut starts = [None::<usize>; 2];
    while at < bytes.len() {
        let start = at;
        let key = varint(bytes, &mut at).ok_or_else(|| layout("a field key is cut".into()))?;
        let field = u32::try_from(key >> 3).unwrap_or(u32::MAX);
        let Some(g) = group(field) else {
            return Err(layout(format!("field {field} is none of the server's")));
        };
        if g < current {
            return Err(layout(format!("field {field} comes after a later part")));
        }
        for part in current + 1..=g {
            starts[usize::from(part) - 1].get_or_insert(start);
        }
        current = g;
        if field == ENDORSEMENTS_FIELD {
            endorsements += 1;
            if endorsements > MAX_ENDORSEMENTS {
                return Err(too_many(endorsements));
            }
        }
        let skip = match key & 7 {
            0 => {
                varint(bytes, &mut at).ok_or_else(|| layout("a number is cut".into()))?;
                0
            }
            2 => usize::try_from(
                varint(bytes, &mut at).ok_or_else(|| layout("a length is cut".into()))?,
            )
            .unwrap_or(usize::MAX),
            1 => 8,
            5 => 4,
            other => return Err(layout(format!("field {field} has wire type {other}"))),
        };
        at = at
            .checked_add(skip)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| layout(format!("field {field} runs past the end")))?;
    }
    let body = starts[0].unwrap_or(bytes.len());
    let tail = starts[1].unwrap_or(bytes.len()).max(body);
    Ok((&bytes[..body], &bytes[body..tail], &bytes[tail..]))
}

/// Reads a base-128 varint at `at`, moving past it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7F) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{to_replica::Body, Down, EndSnapshot, RowData, TableRows};

    fn signer(seed: u8) -> Signer {
        Signer::new(&[seed; 32], Vec::new())
    }

    fn message(number: u64) -> ToReplica {
        ToReplica {
            replica: "till-1".into(),
            epoch: vec![1; 16],
            number,
            nonce: vec![2; 16],
            previous: number - 1,
            previous_nonce: vec![3; 16],
            begins_snapshot: false,
            body: Some(Body::Down(Down {
                tables: vec![TableRows {
                    table: "products".into(),
                    deletes: vec![b"[7]".to_vec()],
                    upserts: vec![RowData {
                        key: b"[1]".to_vec(),
                        data: b"{\"id\":1}".to_vec(),
                    }],
                }],
            })),
            seal: vec![4; 32],
            ..ToReplica::default()
        }
    }

    #[test]
    fn a_signed_message_verifies_and_decodes_as_it_was() {
        let server = signer(1);
        let bytes = server.to_replica(&message(5));
        assert_eq!(
            verify_message(&server.public(), &bytes),
            Ok(server.public())
        );
        let decoded = ToReplica::decode(bytes.as_slice()).unwrap();
        assert_eq!(decoded.number, 5);
        assert_eq!(decoded.body, message(5).body);
        assert_eq!(decoded.seal, vec![4; 32]);
        assert_eq!(decoded.signature.len(), SIGNATURE_LEN);
    }

    #[test]
    fn another_key_and_no_signature_are_refused() {
        let bytes = signer(1).to_replica(&message(5));
        assert!(matches!(
            verify_message(&signer(2).public(), &bytes),
            Err(Forgery::BadSignature { .. })
        ));
        let unsigned = message(5).encode_to_vec();
        assert_eq!(
            verify_message(&signer(1).public(), &unsigned),
            Err(Forgery::Unsigned)
        );
    }

    #[test]
    fn every_flipped_byte_is_refused() {
        let server = signer(1);
        let bytes = server.to_replica(&message(5));
        for i in 0..bytes.len() {
            for bit in [0x01, 0x80] {
                let mut flipped = bytes.clone();
                flipped[i] ^= bit;
                assert!(
                    verify_message(&server.public(), &flipped).is_err(),
                    "byte {i} flipped by {bit:#x} verified"
                );
            }
        }
    }

    #[test]
    fn a_field_moved_after_the_body_is_refused() {
        // Prost takes the last value of a field: a number appended after a
        // signed message would decode as the message's number.
        let server = signer(1);
        let mut bytes = server.to_replica(&message(5));
        bytes.extend(
            ToReplica {
                number: u64::MAX >> 1,
                ..ToReplica::default()
            }
            .encode_to_vec(),
        );
        assert!(matches!(
            verify_message(&server.public(), &bytes),
            Err(Forgery::Layout { .. })
        ));
    }

    #[test]
    fn endorsements_added_to_a_signed_message_are_refused() {
        // What the signature covers is what came: an endorsement nobody
        // signed for, put after a genuine message, makes it a forgery.
        let server = signer(1);
        let genuine = server.to_replica(&message(5));
        let junk = ToReplica {
            endorsements: vec![signer(7).endorse(&signer(8).public())],
            ..ToReplica::default()
        }
        .encode_to_vec();
        let forged = [genuine.as_slice(), &junk].concat();
        assert!(verify_message(&server.public(), &forged).is_err());
    }

    #[test]
    fn an_endorsement_stripped_or_altered_is_refused() {
        let first = signer(1);
        let second = Signer::new(&[2; 32], vec![first.endorse(&signer(2).public())]);
        let bytes = second.to_replica(&message(9));
        assert_eq!(
            verify_message(&second.public(), &bytes),
            Ok(second.public())
        );
        let mut decoded = ToReplica::decode(bytes.as_slice()).unwrap();
        decoded.endorsements.clear();
        let stripped = resigned_tail(&bytes, &decoded);
        assert!(verify_message(&second.public(), &stripped).is_err());
        decoded.endorsements = vec![signer(7).endorse(&signer(2).public())];
        let altered = resigned_tail(&bytes, &decoded);
        assert!(verify_message(&second.public(), &altered).is_err());
    }

    /// `bytes` with its tail replaced by `decoded`'s seal, signature and
    /// endorsements, the head and body as they were.
    fn resigned_tail(bytes: &[u8], decoded: &ToReplica) -> Vec<u8> {
        let (head, body, _) = split(bytes).unwrap();
        let tail = ToReplica {
            seal: decoded.seal.clone(),
            signature: decoded.signature.clone(),
            endorsements: decoded.endorsements.clone(),
            ..ToReplica::default()
        }
        .encode_to_vec();
        [head, body, &tail].concat()
    }

    #[test]
    fn a_message_with_another_body_is_refused() {
        let server = signer(1);
        let real = server.to_replica(&message(5));
        let (head, _, tail) = split(&real).unwrap();
        let other = ToReplica {
            body: Some(Body::EndSnapshot(EndSnapshot {
                tables: vec!["products".into()],
                schema: Vec::new(),
                described: None,
            })),
            ..ToReplica::default()
        }
        .encode_to_vec();
        let forged = [head, &other, tail].concat();
        assert!(verify_message(&server.public(), &forged).is_err());
    }

    #[test]
    fn a_rotated_key_is_followed_from_an_endorsement_and_not_otherwise() {
        let first = signer(1);
        let second = Signer::new(&[2; 32], vec![first.endorse(&signer(2).public())]);
        let third = Signer::new(&[3; 32], {
            let mut chain = second.endorsements().to_vec();
            chain.push(second.endorse(&signer(3).public()));
            chain
        });
        let bytes = third.to_replica(&message(9));
        // Pinned at the first key, or at the second: both lead to the third.
        assert_eq!(verify_message(&first.public(), &bytes), Ok(third.public()));
        assert_eq!(verify_message(&second.public(), &bytes), Ok(third.public()));
        assert_eq!(verify_message(&third.public(), &bytes), Ok(third.public()));
        // A key nobody endorsed, carrying the real chain, leads nowhere.
        let stranger = Signer::new(&[9; 32], third.endorsements().to_vec());
        assert!(verify_message(&first.public(), &stranger.to_replica(&message(9))).is_err());
        // An endorsement signed by a stranger is not followed.
        let hijack = Signer::new(&[8; 32], vec![signer(9).endorse(&signer(8).public())]);
        assert!(verify_message(&first.public(), &hijack.to_replica(&message(9))).is_err());
    }

    #[test]
    fn a_filed_answer_verifies_for_its_replica_only() {
        let server = signer(1);
        let filed = server.filed("till-1", vec![7; 16]);
        assert_eq!(
            verify_filed(&server.public(), "till-1", &filed),
            Ok(server.public())
        );
        assert!(verify_filed(&server.public(), "till-2", &filed).is_err());
        let other = Filed {
            send_id: vec![8; 16],
            ..filed.clone()
        };
        assert!(verify_filed(&server.public(), "till-1", &other).is_err());
        let unsigned = Filed {
            send_id: vec![7; 16],
            ..Filed::default()
        };
        assert_eq!(
            verify_filed(&server.public(), "till-1", &unsigned),
            Err(Forgery::Unsigned)
        );
    }

    #[test]
    fn an_answer_s_receipt_is_signed_with_it() {
        let server = signer(1);
        let receipt = Receipt {
            epoch: vec![1; 24],
            sequence: 42,
            seal: vec![9; 32],
        };
        let filed = server.answer("till-1", vec![7; 16], Some(receipt.clone()));
        assert_eq!(
            verify_filed(&server.public(), "till-1", &filed),
            Ok(server.public())
        );
        // Each part of the receipt, altered or taken away, is refused.
        let altered = [
            Receipt {
                sequence: 43,
                ..receipt.clone()
            },
            Receipt {
                epoch: vec![2; 24],
                ..receipt.clone()
            },
            Receipt {
                seal: vec![8; 32],
                ..receipt.clone()
            },
        ];
        for other in altered {
            let forged = Filed {
                receipt: Some(other),
                ..filed.clone()
            };
            assert!(verify_filed(&server.public(), "till-1", &forged).is_err());
        }
        let stripped = Filed {
            receipt: None,
            ..filed.clone()
        };
        assert!(verify_filed(&server.public(), "till-1", &stripped).is_err());
        // A receipt put on an answer signed without one is refused too.
        let added = Filed {
            receipt: Some(receipt),
            ..server.filed("till-1", vec![7; 16])
        };
        assert!(verify_filed(&server.public(), "till-1", &added).is_err());
    }

    #[test]
    fn more_endorsements_than_any_server_makes_are_refused_unchecked() {
        let server = signer(1);
        let junk = server.endorse(&signer(2).public());
        let many = Signer::new(&[1; 32], vec![junk; MAX_ENDORSEMENTS + 1]);
        let refused = verify_message(&server.public(), &many.to_replica(&message(5)));
        assert!(
            matches!(refused, Err(Forgery::Layout { ref why }) if why.contains("endorsements")),
            "{refused:?}"
        );
        let filed = many.answer("till-1", vec![7; 16], None);
        assert!(matches!(
            verify_filed(&server.public(), "till-1", &filed),
            Err(Forgery::Layout { .. })
        ));
    }

    #[test]
    fn a_message_without_endorsements_is_signed_as_before_rotations() {
        // What a replica of an earlier build checks: the statement of the
        // first shape, over head, body hash and seal alone.
        let server = signer(1);
        let bytes = server.to_replica(&message(5));
        let (head, body, tail) = split(&bytes).unwrap();
        let tail = ToReplica::decode(tail).unwrap();
        let mut statement = MESSAGE.to_vec();
        statement.extend_from_slice(&Sha256::digest(head));
        part(&mut statement, &Sha256::digest(body));
        part(&mut statement, &tail.seal);
        assert!(server.public().verify(&statement, &tail.signature));
    }

    /// `n` messages, one a replica, signed together by `server`.
    fn batch(server: &Signer, n: usize) -> Vec<Vec<u8>> {
        let parts: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (0..n)
            .map(|i| {
                let m = ToReplica {
                    replica: format!("till-{i}"),
                    ..message(5 + i as u64)
                };
                let head = ToReplica {
                    body: None,
                    seal: Vec::new(),
                    ..m.clone()
                }
                .encode_to_vec();
                let body = ToReplica {
                    body: m.body.clone(),
                    ..ToReplica::default()
                }
                .encode_to_vec();
                let hash = Sha256::digest(&body).to_vec();
                (head, body, hash)
            })
            .collect();
        server.batch(
            parts
                .iter()
                .enumerate()
                .map(|(i, (head, body, hash))| Unsigned {
                    head,
                    body,
                    body_hash: hash,
                    seal: vec![i as u8; 32],
                })
                .collect(),
        )
    }

    fn tail_of(bytes: &[u8]) -> ToReplica {
        ToReplica::decode(split(bytes).unwrap().2).unwrap()
    }

    #[test]
    fn every_message_of_a_batch_verifies_under_one_signature_whatever_its_width() {
        let server = signer(1);
        for n in 1..=9 {
            let signed = batch(&server, n);
            assert_eq!(signed.len(), n);
            for (i, bytes) in signed.iter().enumerate() {
                assert_eq!(
                    verify_message(&server.public(), bytes),
                    Ok(server.public()),
                    "message {i} of {n}"
                );
                let tail = tail_of(bytes);
                assert_eq!(tail.signature, tail_of(&signed[0]).signature);
                // A batch of one is a message signed on its own; a tree of
                // n leaves has ceil(log2 n) levels.
                let levels = (n as f64).log2().ceil() as usize;
                assert_eq!(tail.batch_path.len(), 32 * levels, "{n}");
                assert_eq!(tail.batch_index, if n == 1 { 0 } else { i as u64 });
                assert_eq!(
                    ToReplica::decode(bytes.as_slice()).unwrap().replica,
                    format!("till-{i}")
                );
            }
        }
    }

    #[test]
    fn a_batch_message_altered_anywhere_or_moved_in_its_tree_is_refused() {
        let server = signer(1);
        let signed = batch(&server, 5);
        for bytes in &signed {
            for i in 0..bytes.len() {
                let mut flipped = bytes.clone();
                flipped[i] ^= 0x01;
                assert!(
                    verify_message(&server.public(), &flipped).is_err(),
                    "byte {i} flipped verified"
                );
            }
        }
        let (head, body, tail) = split(&signed[2]).unwrap();
        let tail = ToReplica::decode(tail).unwrap();
        let with = |tail: ToReplica| [head, body, &tail.encode_to_vec()].concat();
        // Its neighbour's place, a place past the tree, a path cut short
        // or lengthened, a path of half a hash, no path at all.
        for changed in [
            ToReplica {
                batch_index: 3,
                ..tail.clone()
            },
            ToReplica {
                batch_index: 8,
                ..tail.clone()
            },
            ToReplica {
                batch_path: tail.batch_path[32..].to_vec(),
                ..tail.clone()
            },
            ToReplica {
                batch_path: [tail.batch_path.clone(), vec![0; 32]].concat(),
                ..tail.clone()
            },
            ToReplica {
                batch_path: tail.batch_path[..16].to_vec(),
                ..tail.clone()
            },
            ToReplica {
                batch_path: Vec::new(),
                ..tail.clone()
            },
            ToReplica {
                batch_path: Vec::new(),
                batch_index: 0,
                ..tail.clone()
            },
        ] {
            assert!(
                verify_message(&server.public(), &with(changed.clone())).is_err(),
                "index {} path {} bytes verified",
                changed.batch_index,
                changed.batch_path.len()
            );
        }
        // Another message's head under this one's tail.
        let (other_head, _, _) = split(&signed[1]).unwrap();
        let moved = [other_head, body, &tail.encode_to_vec()].concat();
        assert!(verify_message(&server.public(), &moved).is_err());
        // A root another key signed.
        let stranger = batch(&signer(2), 5);
        assert!(verify_message(&server.public(), &stranger[2]).is_err());
    }

    #[test]
    fn the_last_message_of_an_odd_level_verifies_at_its_own_place_only() {
        // Paired with itself, the last node would also verify at the next
        // index (and beyond, a level up): the shape of CVE-2012-2459.
        let server = signer(1);
        for n in [3usize, 5, 6, 7, 9] {
            let signed = batch(&server, n);
            let last = n - 1;
            let (head, body, tail) = split(&signed[last]).unwrap();
            let tail = ToReplica::decode(tail).unwrap();
            let levels = tail.batch_path.len() / 32;
            for index in (last + 1)..(1usize << levels) {
                let moved = ToReplica {
                    batch_index: index as u64,
                    ..tail.clone()
                };
                let bytes = [head, body, &moved.encode_to_vec()].concat();
                assert!(
                    verify_message(&server.public(), &bytes).is_err(),
                    "message {last} of {n} verified at {index}"
                );
            }
        }
    }

    #[test]
    fn a_batch_message_is_a_message_signed_on_its_own_but_for_its_tail() {
        let server = signer(1);
        let signed = batch(&server, 4);
        for bytes in &signed {
            let decoded = ToReplica::decode(bytes.as_slice()).unwrap();
            let alone = server.to_replica(&decoded);
            let (head, body, tail) = split(bytes).unwrap();
            let (alone_head, alone_body, alone_tail) = split(&alone).unwrap();
            assert_eq!((head, body), (alone_head, alone_body));
            // On its own: no place, no path.
            let alone_tail = ToReplica::decode(alone_tail).unwrap();
            assert_eq!(
                (alone_tail.batch_index, alone_tail.batch_path.len()),
                (0, 0)
            );
            assert_eq!(ToReplica::decode(tail).unwrap().seal, alone_tail.seal);
        }
    }

    #[test]
    fn a_root_s_signature_does_not_stand_for_a_message_s_nor_the_other_way() {
        let server = signer(1);
        let signed = batch(&server, 4);
        // The root's signature, carried as a message's own.
        let (head, body, tail) = split(&signed[0]).unwrap();
        let unbatched = ToReplica {
            batch_index: 0,
            batch_path: Vec::new(),
            ..ToReplica::decode(tail).unwrap()
        };
        let bytes = [head, body, &unbatched.encode_to_vec()].concat();
        assert!(verify_message(&server.public(), &bytes).is_err());
        // A message's own signature, carried with a path: the path's root
        // is not what was signed.
        let own = server.to_replica(&ToReplica::decode(signed[0].as_slice()).unwrap());
        let (head, body, tail) = split(&own).unwrap();
        let pathed = ToReplica {
            batch_path: vec![0; 32],
            ..ToReplica::decode(tail).unwrap()
        };
        let bytes = [head, body, &pathed.encode_to_vec()].concat();
        assert!(verify_message(&server.public(), &bytes).is_err());
    }

    #[test]
    fn a_batch_signed_after_a_rotation_is_followed_as_a_message_is() {
        let first = signer(1);
        let second = Signer::new(&[2; 32], vec![first.endorse(&signer(2).public())]);
        for bytes in batch(&second, 3) {
            assert_eq!(verify_message(&first.public(), &bytes), Ok(second.public()));
            // The endorsements are in every leaf: stripped, nothing verifies.
            let (head, body, tail) = split(&bytes).unwrap();
            let stripped = ToReplica {
                endorsements: Vec::new(),
                ..ToReplica::decode(tail).unwrap()
            };
            let bytes = [head, body, &stripped.encode_to_vec()].concat();
            assert!(verify_message(&first.public(), &bytes).is_err());
        }
    }

    #[test]
    fn a_key_reads_back_from_its_text() {
        let key = signer(1).public();
        assert_eq!(key.to_string().parse::<ServerKey>(), Ok(key));
        assert!("not a key".parse::<ServerKey>().is_err());
        assert!("AAAA".parse::<ServerKey>().is_err());
        assert!(!format!("{:?}", signer(1)).contains(&hex::encode([1u8; 32])));
    }
}

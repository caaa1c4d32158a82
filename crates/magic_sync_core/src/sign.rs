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
//!
//! One file a part: `key` (the server's key and the signer), `statement`
//! (what is signed), `batch` (the tree), `verify` (the replica's checks,
//! rotation included) and `layout` (finding a message's head, body and
//! tail).

mod batch;
mod key;
mod layout;
mod statement;
mod verify;

pub use batch::MAX_BATCH_LEVELS;
pub use key::{ServerKey, Signer, Unsigned};
pub use verify::{verify_filed, verify_message, Forgery};

/// The length of a signature, in bytes.
pub const SIGNATURE_LEN: usize = 64;

/// Endorsements a message or an answer carries at most: one per rotation
/// of the server's key since its first. More is refused before any is
/// checked.
pub const MAX_ENDORSEMENTS: usize = 64;

#[cfg(test)]
mod tests;

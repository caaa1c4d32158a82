//! What signing and verifying a message costs, against what a message
//! costs without them, in the same run.
//!
//! cargo bench -p magic_sync_core --bench sign
//!
//! For bodies of 1 KiB, 64 KiB and 1 MiB (a snapshot's messages are up to
//! the transport's message size), the server's side is sealing and putting
//! head, body and tail together (what it did before signing) against that
//! with the signature;
//! the replica's side is decoding the message (what it did before) against
//! verifying then decoding. The body's hash is the one `sync.bodies`
//! already keeps, so the server's signing does not hash the body; the
//! replica's verifying does, once.
//!
//! Then one pass for N members (1, 100, 1,000, 10,000) of a batch whose
//! 1 KiB body they all share (docs/how-it-works.md section 20, "The record
//! by rule"), signed two ways:
//!
//! - per member, as today: each member's head (its own replica id and
//!   number), its seal and `Signer::message`: N signatures;
//! - once per pass: each member's leaf, the SHA-256 of `0x00` and the
//!   statement it is signed over today (tag, head hash, body hash, seal);
//!   a Merkle tree over the leaves (inner nodes the SHA-256 of `0x01`,
//!   left, right; a level of odd width pairs its last node with itself);
//!   one Ed25519 signature over `magic_sync/v1 batch\0` and the root; and
//!   each member's message carrying its leaf index (field 18) and its
//!   path, its sibling on each level from its leaf up (field 19).
//!
//! For each way: the server's time for the whole pass and per member
//! (building each head, sealing, signing and putting each message
//! together); the replica's time to verify one member's message
//! (`verify_message`, against hashing up its path and one verification
//! over the root); and the bytes the index and the path add to a message.
//! The tree is the bench's own, a measurement and not the engine's code;
//! a self-check at start-up makes sure it verifies what it should and
//! refuses what it should not.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use magic_sync_core::envelope::{to_replica::Body, Down, RowData, TableRows, ToReplica};
use magic_sync_core::seal;
use magic_sync_core::sign::{verify_message, Signer};
use prost::encoding::{decode_key, decode_varint, WireType};
use prost::Message;
use sha2::{Digest, Sha256};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// A message number from the wire, as the seal takes it.
fn wire(number: u64) -> magic_sync_core::MessageNo {
    magic_sync_core::MessageNo::from_wire(number).expect("a number the server could draw")
}

fn message(body_bytes: usize) -> ToReplica {
    let row = RowData {
        key: b"[123456]".to_vec(),
        data: vec![b'x'; 90],
    };
    let rows = (body_bytes / 104).max(1);
    ToReplica {
        replica: "till-0042".into(),
        epoch: vec![7; 16],
        number: 1_234_567,
        nonce: vec![9; 16],
        previous: 1_234_560,
        previous_nonce: vec![8; 16],
        body: Some(Body::Down(Down {
            tables: vec![TableRows {
                table: "products".into(),
                upserts: vec![row; rows],
                ..TableRows::default()
            }],
        })),
        ..ToReplica::default()
    }
}

/// Mean time of `f` over at least half a second.
fn time(mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed() < Duration::from_millis(500) || n < 10 {
        f();
        n += 1;
    }
    started.elapsed() / n
}

fn main() {
    check_the_tree();
    let signer = Signer::new(&[0x42; 32], Vec::new());
    let key = signer.public();
    let secret = [0x11u8; 32];
    println!(
        "| body | server: seal | seal + sign | ratio | replica: decode | verify + decode | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for size in [1 << 10, 64 << 10, 1 << 20] {
        let m = message(size);
        let head = ToReplica {
            body: None,
            ..m.clone()
        }
        .encode_to_vec();
        let body = ToReplica {
            body: m.body.clone(),
            ..ToReplica::default()
        }
        .encode_to_vec();
        let hash = Sha256::digest(&body);
        let sealed =
            || seal::seal(&secret, &m.replica, &m.epoch, wire(m.number), &m.nonce).to_vec();
        let unsigned = [
            head.as_slice(),
            &body,
            &ToReplica {
                seal: sealed(),
                ..ToReplica::default()
            }
            .encode_to_vec(),
        ]
        .concat();
        let signed = signer.message(&head, &body, &hash, sealed());
        // What the server did before: seal, and put head, body and tail together.
        let seal_only = time(|| {
            let tail = ToReplica {
                seal: sealed(),
                ..ToReplica::default()
            }
            .encode_to_vec();
            black_box([head.as_slice(), &body, &tail].concat());
        });
        let seal_and_sign = time(|| {
            black_box(signer.message(&head, &body, &hash, sealed()));
        });
        let decode = time(|| {
            black_box(ToReplica::decode(unsigned.as_slice()).unwrap());
        });
        let verify = time(|| {
            verify_message(&key, &signed).unwrap();
            black_box(ToReplica::decode(signed.as_slice()).unwrap());
        });
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {} KiB | {} | {} | {:.2}x | {} | {} | {:.2}x |",
            size >> 10,
            us(seal_only),
            us(seal_and_sign),
            seal_and_sign.as_secs_f64() / seal_only.as_secs_f64(),
            us(decode),
            us(verify),
            verify.as_secs_f64() / decode.as_secs_f64(),
        );
    }
    one_pass();
}

/// What a batch's root is signed as.
const BATCH: &[u8] = b"magic_sync/v1 batch\0";
/// What a message is signed as today (`sign.rs`, a key without
/// endorsements).
const MESSAGE: &[u8] = b"magic_sync/v1 message\0";
/// The prefixes that keep a leaf from being taken for an inner node, and
/// an inner node for a leaf.
const LEAF: u8 = 0x00;
const NODE: u8 = 0x01;

type Hash = [u8; 32];

/// A batch message's tail: the seal and the signature (the root's) where
/// today's are, then the member's leaf index and its path, 32 bytes a
/// level from its leaf up.
#[derive(Clone, PartialEq, prost::Message)]
struct BatchTail {
    #[prost(bytes = "vec", tag = "15")]
    seal: Vec<u8>,
    #[prost(bytes = "vec", tag = "16")]
    signature: Vec<u8>,
    #[prost(uint64, tag = "18")]
    leaf: u64,
    #[prost(bytes = "vec", tag = "19")]
    path: Vec<u8>,
}

/// A body of about `bytes`, encoded as `Signer::message` takes it.
fn body(bytes: usize) -> Vec<u8> {
    ToReplica {
        body: message(bytes).body,
        ..ToReplica::default()
    }
    .encode_to_vec()
}

/// Member `i`'s head (fields 1-7, encoded) and seal, in one pass.
fn member(i: usize, secret: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let number = 1_234_567 + i as u64;
    let head = ToReplica {
        replica: format!("till-{i}"),
        epoch: vec![7; 24],
        number,
        nonce: vec![9; 16],
        previous: number - 7,
        previous_nonce: vec![8; 16],
        ..ToReplica::default()
    };
    let seal = seal::seal(
        secret,
        &head.replica,
        &head.epoch,
        wire(number),
        &head.nonce,
    );
    (head.encode_to_vec(), seal.to_vec())
}

/// The statement `Signer::message` signs today: the tag, the head's hash,
/// then the body's hash and the seal, each behind its length.
fn statement(head: &[u8], body_hash: &[u8], seal: &[u8]) -> Vec<u8> {
    let mut statement = MESSAGE.to_vec();
    statement.extend_from_slice(&Sha256::digest(head));
    for part in [body_hash, seal] {
        statement.extend_from_slice(&(part.len() as u64).to_be_bytes());
        statement.extend_from_slice(part);
    }
    statement
}

fn leaf(head: &[u8], body_hash: &[u8], seal: &[u8]) -> Hash {
    let statement = statement(head, body_hash, seal);
    Sha256::new()
        .chain_update([LEAF])
        .chain_update(statement)
        .finalize()
        .into()
}

fn node(left: &[u8], right: &[u8]) -> Hash {
    Sha256::new()
        .chain_update([NODE])
        .chain_update(left)
        .chain_update(right)
        .finalize()
        .into()
}

/// The tree over `leaves` (one at least), level by level from the leaves
/// to the root. A level of odd width pairs its last node with itself, so
/// every path has a sibling on every level and the replica needs no
/// count of the leaves to hash up one.
fn tree(leaves: Vec<Hash>) -> Vec<Vec<Hash>> {
    let mut levels = vec![leaves];
    loop {
        let below = levels.last().expect("the leaves");
        if below.len() == 1 {
            return levels;
        }
        let above = below
            .chunks(2)
            .map(|pair| node(&pair[0], &pair[pair.len() - 1]))
            .collect();
        levels.push(above);
    }
}

/// Leaf `index`'s path: its sibling on each level below the root (itself
/// where it is the odd last node).
fn path(levels: &[Vec<Hash>], mut index: usize) -> Vec<u8> {
    let mut path = Vec::with_capacity(32 * (levels.len() - 1));
    for level in &levels[..levels.len() - 1] {
        path.extend_from_slice(level.get(index ^ 1).unwrap_or(&level[index]));
        index /= 2;
    }
    path
}

/// The root `leaf`, at `index`, hashes up to along `path`: none when the
/// path is not whole hashes or the index reaches past it.
fn hash_up(leaf: Hash, mut index: u64, path: &[u8]) -> Option<Hash> {
    if !path.len().is_multiple_of(32) || path.len() > 32 * 64 {
        return None;
    }
    let mut hash = leaf;
    for sibling in path.chunks_exact(32) {
        hash = match index & 1 {
            0 => node(&hash, sibling),
            _ => node(sibling, &hash),
        };
        index >>= 1;
    }
    (index == 0).then_some(hash)
}

fn root_statement(root: &Hash) -> Vec<u8> {
    [BATCH, root].concat()
}

/// Every member's message of one pass, signed per member as today, each
/// handed to `send` as it is made.
fn per_member(
    signer: &Signer,
    n: usize,
    secret: &[u8],
    body: &[u8],
    body_hash: &[u8],
    mut send: impl FnMut(Vec<u8>),
) {
    for i in 0..n {
        let (head, seal) = member(i, secret);
        send(signer.message(&head, body, body_hash, seal));
    }
}

/// Every member's message of one pass, signed once: each member's leaf,
/// the tree, one signature over its root, and each member's path.
fn batch(
    key: &SigningKey,
    n: usize,
    secret: &[u8],
    body: &[u8],
    body_hash: &[u8],
    mut send: impl FnMut(Vec<u8>),
) {
    let members: Vec<_> = (0..n).map(|i| member(i, secret)).collect();
    let leaves = members
        .iter()
        .map(|(head, seal)| leaf(head, body_hash, seal))
        .collect();
    let levels = tree(leaves);
    let root = &levels[levels.len() - 1][0];
    let signature = key.sign(&root_statement(root)).to_bytes().to_vec();
    for (i, (head, seal)) in members.into_iter().enumerate() {
        let tail = BatchTail {
            seal,
            signature: signature.clone(),
            leaf: i as u64,
            path: path(&levels, i),
        }
        .encode_to_vec();
        send([head.as_slice(), body, &tail].concat());
    }
}

/// The head, body and tail of an encoded message, found by its top-level
/// fields as `sign.rs` finds them (head 1-7, body 10-14, tail from 15 on;
/// unlike it, this sketch does not check their order).
fn split(bytes: &[u8]) -> Option<[&[u8]; 3]> {
    let mut cuts = [bytes.len(); 2];
    let mut rest = bytes;
    while !rest.is_empty() {
        let at = bytes.len() - rest.len();
        let (field, wire) = decode_key(&mut rest).ok()?;
        for (cut, from) in cuts.iter_mut().zip([10, 15]) {
            if field >= from {
                *cut = (*cut).min(at);
            }
        }
        let skip = match wire {
            WireType::Varint => {
                decode_varint(&mut rest).ok()?;
                0
            }
            WireType::LengthDelimited => usize::try_from(decode_varint(&mut rest).ok()?).ok()?,
            _ => return None,
        };
        rest = rest.get(skip..)?;
    }
    Some([
        &bytes[..cuts[0]],
        &bytes[cuts[0]..cuts[1]],
        &bytes[cuts[1]..],
    ])
}

/// Whether a batch message verifies, as a replica would check it: its
/// leaf from what came (hashing the body once), hashed up its path, and
/// one verification of the signature over the root.
fn verify_batch(key: &VerifyingKey, bytes: &[u8]) -> bool {
    let Some([head, body, tail]) = split(bytes) else {
        return false;
    };
    let Ok(tail) = BatchTail::decode(tail) else {
        return false;
    };
    let leaf = leaf(head, &Sha256::digest(body), &tail.seal);
    let Some(root) = hash_up(leaf, tail.leaf, &tail.path) else {
        return false;
    };
    Signature::from_slice(&tail.signature)
        .is_ok_and(|s| key.verify(&root_statement(&root), &s).is_ok())
}

/// The tree verifies what it should and refuses what it should not, so
/// the figures are of working code: every member of trees of 1 to 9
/// leaves (odd widths on several levels) verifies; none does with another
/// member's head, another body, a bit of its path flipped, its
/// neighbour's index, or the root signed by another key. And a leaf is
/// over today's statement: today's signature verifies over it.
fn check_the_tree() {
    let signer = Signer::new(&[0x42; 32], Vec::new());
    let key = SigningKey::from_bytes(&[0x42; 32]);
    let public = key.verifying_key();
    let secret = [0x11u8; 32];
    let body = body(1 << 10);
    let other_body = self::body(2 << 10);
    let hash = Sha256::digest(&body);
    let (head, seal) = member(3, &secret);
    let today = signer.message(&head, &body, &hash, seal.clone());
    let today = ToReplica::decode(today.as_slice()).unwrap();
    let signature = Signature::from_slice(&today.signature).unwrap();
    assert!(
        public
            .verify(&statement(&head, &hash, &seal), &signature)
            .is_ok(),
        "today's signature is not over the leaf's statement"
    );
    for n in 1..=9 {
        let mut messages = Vec::new();
        batch(&key, n, &secret, &body, &hash, |m| messages.push(m));
        for (i, message) in messages.iter().enumerate() {
            assert!(verify_batch(&public, message), "member {i} of {n}");
            let [head, _, tail] = split(message).unwrap();
            let tail = BatchTail::decode(tail).unwrap();
            let rebuilt = |head: &[u8], body: &[u8], tail: &BatchTail| {
                [head, body, &tail.encode_to_vec()].concat()
            };
            let (another, _) = member(i + 1, &secret);
            let mut forged = vec![
                rebuilt(&another, &body, &tail),
                rebuilt(head, &other_body, &tail),
            ];
            for bit in (0..tail.path.len() * 8).step_by(37) {
                let mut flipped = tail.clone();
                flipped.path[bit / 8] ^= 1 << (bit % 8);
                forged.push(rebuilt(head, &body, &flipped));
            }
            if (i ^ 1) < n {
                let moved = BatchTail {
                    leaf: (i ^ 1) as u64,
                    ..tail.clone()
                };
                forged.push(rebuilt(head, &body, &moved));
            }
            for (k, forged) in forged.iter().enumerate() {
                assert!(
                    !verify_batch(&public, forged),
                    "forgery {k} of member {i} of {n} verifies"
                );
            }
        }
        let stranger = SigningKey::from_bytes(&[0x43; 32]);
        batch(&stranger, n, &secret, &body, &hash, |m| {
            assert!(!verify_batch(&public, &m), "a stranger's root of {n}");
        });
    }
}

/// The second table: one pass for N members, signed per member and once.
fn one_pass() {
    let signer = Signer::new(&[0x42; 32], Vec::new());
    let server = signer.public();
    let key = SigningKey::from_bytes(&[0x42; 32]);
    let public = key.verifying_key();
    let secret = [0x11u8; 32];
    let body = body(1 << 10);
    let hash = Sha256::digest(&body);
    println!();
    println!("One pass for N members, a 1 KiB body shared by all:");
    println!();
    println!(
        "| members | per member: pass | a member | batch: pass | a member | ratio | replica: verify | path + root | bytes added (max) |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for n in [1, 100, 1_000, 10_000] {
        let signed = time(|| {
            per_member(&signer, n, &secret, &body, &hash, |m| {
                black_box(m);
            })
        });
        let batched = time(|| {
            batch(&key, n, &secret, &body, &hash, |m| {
                black_box(m);
            })
        });
        let (mut today, mut with_paths) = (Vec::new(), Vec::new());
        per_member(&signer, n, &secret, &body, &hash, |m| today.push(m));
        batch(&key, n, &secret, &body, &hash, |m| with_paths.push(m));
        // The last member: the longest index, a path as long as any.
        let last = n - 1;
        let verify = time(|| {
            verify_message(&server, &today[last]).unwrap();
        });
        let hash_up = time(|| {
            assert!(verify_batch(&public, &with_paths[last]));
        });
        let (added, longest) = today
            .iter()
            .zip(&with_paths)
            .map(|(a, b)| (b.len() - a.len(), a.len()))
            .max()
            .expect("a member");
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1e3);
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {n} | {} | {} | {} | {} | {:.1}x | {} | {} | {added} ({:.0}% of {longest}) |",
            ms(signed),
            us(signed / n as u32),
            ms(batched),
            us(batched / n as u32),
            signed.as_secs_f64() / batched.as_secs_f64(),
            us(verify),
            us(hash_up),
            100.0 * added as f64 / longest as f64,
        );
    }
}

//! The Merkle tree a batch of messages is signed over (`sign`'s
//! "Batches"): leaves and nodes hashed behind different prefixes, a level
//! of odd width padded with zeros, the path a message carries from its
//! leaf up, and the root a replica hashes that path back to.

use super::Forgery;
use sha2::{Digest, Sha256};

/// Levels a batch's tree has at most: 2^32 messages signed at once.
pub const MAX_BATCH_LEVELS: usize = 32;

/// A leaf of a batch's tree: the SHA-256 of a message's statement behind
/// the leaf prefix.
pub(super) fn leaf(statement: &[u8]) -> [u8; 32] {
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
pub(super) fn tree(leaves: Vec<[u8; 32]>) -> Vec<Vec<[u8; 32]>> {
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
pub(super) fn path(levels: &[Vec<[u8; 32]>], index: usize) -> Vec<u8> {
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
pub(super) fn root_of(leaf: [u8; 32], index: u64, path: &[u8]) -> Result<[u8; 32], Forgery> {
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

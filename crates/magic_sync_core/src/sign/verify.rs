//! What a replica checks before it believes anything that came as the
//! server's, and why it refuses: a message or a `Filed` answer is signed
//! by the key the replica pins, or else by the newest key the endorsements
//! lead to from it, each endorsement verified under the key before it
//! (`sign`'s "Rotation").

use super::batch::{leaf, root_of};
use super::layout::split;
use super::statement::{batch_statement, filed_statement, key_statement, message_statement};
use super::{ServerKey, MAX_ENDORSEMENTS};
use crate::envelope::{Endorsement, Filed, ToReplica};
use prost::Message;
use sha2::{Digest, Sha256};

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

pub(super) fn too_many(n: usize) -> Forgery {
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

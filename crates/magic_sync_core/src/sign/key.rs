//! The server's key in its two halves. [`ServerKey`] is the public half a
//! replica pins, with its text form. [`Signer`] is the secret half with the
//! endorsements that lead to it from the server's first key; it makes what
//! a replica checks: a message signed on its own, a batch of messages
//! under one signature over their tree's root, a `Filed` answer, and its
//! endorsement of the key that replaces it.

use super::batch::{leaf, path, tree};
use super::statement::{batch_statement, filed_statement, key_statement, message_statement};
use super::Forgery;
use crate::envelope::{Endorsement, Filed, Receipt, ToReplica};
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, Verifier as _, VerifyingKey};
use prost::Message;
use sha2::{Digest, Sha256};
use std::fmt;

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

    pub(super) fn verify(&self, statement: &[u8], signature: &[u8]) -> bool {
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
    /// one signature over the root of their tree (see [`crate::sign`]'s
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

//! The seal on a message from the server: HMAC-SHA256 over the replica it is
//! for, the epoch, the message's number and its nonce, under the epoch's secret.
//!
//! The replica never sees the secret. It hands the seal back unchanged when it
//! says which message it applied, and the server checks it then: a seal that
//! verifies proves the server itself sent that message, in that epoch, to that
//! replica. A database restored from an older copy can number messages again,
//! but it cannot seal one of its predecessor's messages.
//!
//! Every part goes into the MAC behind its length (8 bytes, big-endian), so no
//! two different lists of parts feed the MAC the same bytes: moving bytes from
//! the end of the replica id to the start of the epoch changes the input.
//!
//! Two more proofs of the server's to itself live here:
//!
//! - **Receipts.** The answer to an upload carries a receipt: an HMAC over
//!   the replica, the epoch and the upload's sequence, under a key drawn
//!   from the epoch's secret for receipts alone (so no receipt is ever a
//!   message's seal). The replica keeps the newest and gives it back with
//!   its acknowledgements; a server whose record of what it answered is
//!   below a receipt it made was restored from an older copy. A number a
//!   replica merely claims proves nothing, so nothing done for the fleet
//!   follows from one.
//! - **Epoch secrets.** An epoch the server begins takes the secret drawn
//!   from a master secret kept beside it and the epoch's id
//!   ([`epoch_secret`]). A server restored from a copy older than an epoch
//!   its predecessor began still holds the master, so it can check a seal
//!   of that epoch, which a replica acknowledging it hands back, and learn
//!   that it went back in time.

use crate::ids::MessageNo;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The length of a seal, in bytes.
pub const SEAL_LEN: usize = 32;

/// A seal, as it travels in `ToReplica.seal` and `Ack.seal`.
pub type Seal = [u8; SEAL_LEN];

type HmacSha256 = Hmac<Sha256>;

/// What a seal covers: one message's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sealed<'a> {
    replica: &'a str,
    epoch: &'a [u8],
    number: MessageNo,
    nonce: &'a [u8],
}

impl Sealed<'_> {
    fn mac(&self, secret: &[u8]) -> HmacSha256 {
        // HMAC accepts a key of any length (a long one is hashed first), so
        // this cannot fail whatever the secret is.
        let mut mac =
            HmacSha256::new_from_slice(secret).expect("HMAC-SHA256 takes a key of any length");
        part(&mut mac, self.replica.as_bytes());
        part(&mut mac, self.epoch);
        part(&mut mac, &self.number.wire().to_be_bytes());
        part(&mut mac, self.nonce);
        mac
    }
}

/// Feeds one part to the MAC behind its length.
fn part(mac: &mut HmacSha256, bytes: &[u8]) {
    // usize is at most 64 bits on every platform Rust supports.
    let len = bytes.len() as u64;
    mac.update(&len.to_be_bytes());
    mac.update(bytes);
}

/// The seal of message `number` (with `nonce`) of `epoch`, for `replica`.
pub fn seal(secret: &[u8], replica: &str, epoch: &[u8], number: MessageNo, nonce: &[u8]) -> Seal {
    let sealed = Sealed {
        replica,
        epoch,
        number,
        nonce,
    };
    sealed.mac(secret).finalize().into_bytes().into()
}

/// The secret of the epoch `epoch`, drawn from the installation's
/// `master` secret: the same for the same epoch, whichever copy of the
/// database draws it, and told apart from every other epoch's.
pub fn epoch_secret(master: &[u8], epoch: &[u8]) -> Seal {
    let mut mac =
        HmacSha256::new_from_slice(master).expect("HMAC-SHA256 takes a key of any length");
    part(&mut mac, b"magic_sync/v1 epoch secret");
    part(&mut mac, epoch);
    mac.finalize().into_bytes().into()
}

/// The nonce of a cohort's message `number`, whose own nonce is `shared`,
/// as sent to its member `replica`: a message written once for many
/// replicas is stamped for each one as it is sent, and this makes its nonce
/// the same every time it goes to that replica, and different for each.
/// The first 16 bytes of an HMAC under the epoch's `secret`, so no replica
/// can make another's.
pub fn member_nonce(secret: &[u8], replica: &str, number: MessageNo, shared: &[u8]) -> Vec<u8> {
    let mut mac =
        HmacSha256::new_from_slice(secret).expect("HMAC-SHA256 takes a key of any length");
    part(&mut mac, b"magic_sync/v1 member nonce");
    part(&mut mac, replica.as_bytes());
    part(&mut mac, &number.wire().to_be_bytes());
    part(&mut mac, shared);
    mac.finalize().into_bytes()[..16].to_vec()
}

/// The key receipts of an epoch are made under, drawn from its secret.
fn receipt_key(secret: &[u8]) -> Seal {
    let mut mac =
        HmacSha256::new_from_slice(secret).expect("HMAC-SHA256 takes a key of any length");
    part(&mut mac, b"magic_sync/v1 receipt key");
    mac.finalize().into_bytes().into()
}

fn receipt_mac(secret: &[u8], replica: &str, epoch: &[u8], sequence: u64) -> HmacSha256 {
    let mut mac = HmacSha256::new_from_slice(&receipt_key(secret))
        .expect("HMAC-SHA256 takes a key of any length");
    part(&mut mac, replica.as_bytes());
    part(&mut mac, epoch);
    part(&mut mac, &sequence.to_be_bytes());
    mac
}

/// The receipt's seal for `replica`'s upload of `sequence`, filed in
/// `epoch`, whose secret is `secret`.
pub fn receipt(secret: &[u8], replica: &str, epoch: &[u8], sequence: u64) -> Seal {
    receipt_mac(secret, replica, epoch, sequence)
        .finalize()
        .into_bytes()
        .into()
}

/// Whether `seal` is the receipt for `replica`'s upload of `sequence`,
/// filed in `epoch` under `secret`. Compares in constant time.
pub fn verify_receipt(
    secret: &[u8],
    replica: &str,
    epoch: &[u8],
    sequence: u64,
    seal: &[u8],
) -> bool {
    receipt_mac(secret, replica, epoch, sequence)
        .verify_slice(seal)
        .is_ok()
}

/// Whether `seal` is the seal of that message under `secret`. Compares in
/// constant time, so a forger learns nothing from how long a refusal takes.
pub fn verify(
    secret: &[u8],
    replica: &str,
    epoch: &[u8],
    number: MessageNo,
    nonce: &[u8],
    seal: &[u8],
) -> bool {
    let sealed = Sealed {
        replica,
        epoch,
        number,
        nonce,
    };
    sealed.mac(secret).verify_slice(seal).is_ok()
}

#[cfg(test)]
mod tests {
    use super::{epoch_secret, member_nonce, receipt, seal, verify, verify_receipt};
    use crate::ids::MessageNo;

    fn no(number: i64) -> MessageNo {
        MessageNo::from_store(number)
    }

    const SECRET: &[u8] = b"the epoch's secret";
    const EPOCH: &[u8] = &[7; 16];
    const NONCE: &[u8] = &[9; 16];

    fn sealed() -> [u8; 32] {
        seal(SECRET, "unit-1", EPOCH, no(42), NONCE)
    }

    #[test]
    fn a_members_nonce_is_its_own_and_the_same_each_time() {
        let n = member_nonce(SECRET, "unit-1", no(42), NONCE);
        assert_eq!(n.len(), 16);
        assert_eq!(n, member_nonce(SECRET, "unit-1", no(42), NONCE));
        assert_ne!(n, member_nonce(SECRET, "unit-2", no(42), NONCE));
        assert_ne!(n, member_nonce(SECRET, "unit-1", no(43), NONCE));
        assert_ne!(n, member_nonce(SECRET, "unit-1", no(42), &[8; 16]));
        assert_ne!(n, member_nonce(b"another secret", "unit-1", no(42), NONCE));
    }

    #[test]
    fn a_seal_verifies_for_the_message_it_was_made_for() {
        assert!(verify(SECRET, "unit-1", EPOCH, no(42), NONCE, &sealed()));
        assert_eq!(sealed(), sealed(), "a seal is deterministic");
    }

    #[test]
    fn a_changed_part_fails() {
        let s = sealed();
        let mut epoch = EPOCH.to_vec();
        epoch[15] ^= 1;
        let mut nonce = NONCE.to_vec();
        nonce[0] ^= 0x80;
        assert!(
            !verify(SECRET, "unit-2", EPOCH, no(42), NONCE, &s),
            "replica"
        );
        assert!(
            !verify(SECRET, "unit-1", &epoch, no(42), NONCE, &s),
            "epoch"
        );
        assert!(
            !verify(SECRET, "unit-1", EPOCH, no(43), NONCE, &s),
            "number"
        );
        assert!(
            !verify(SECRET, "unit-1", EPOCH, no(42), &nonce, &s),
            "nonce"
        );
        assert!(
            !verify(b"another secret", "unit-1", EPOCH, no(42), NONCE, &s),
            "secret"
        );
    }

    #[test]
    fn a_changed_byte_of_the_seal_fails() {
        for i in 0..32 {
            let mut s = sealed();
            s[i] ^= 1;
            assert!(
                !verify(SECRET, "unit-1", EPOCH, no(42), NONCE, &s),
                "byte {i}"
            );
        }
        let s = sealed();
        assert!(
            !verify(SECRET, "unit-1", EPOCH, no(42), NONCE, &s[..31]),
            "short"
        );
        assert!(
            !verify(SECRET, "unit-1", EPOCH, no(42), NONCE, &[]),
            "empty"
        );
    }

    #[test]
    fn a_receipt_verifies_for_its_replica_epoch_and_sequence_only() {
        let r = receipt(SECRET, "unit-1", EPOCH, 7);
        assert!(verify_receipt(SECRET, "unit-1", EPOCH, 7, &r));
        assert!(!verify_receipt(SECRET, "unit-2", EPOCH, 7, &r));
        assert!(!verify_receipt(SECRET, "unit-1", &[8; 16], 7, &r));
        assert!(!verify_receipt(SECRET, "unit-1", EPOCH, 8, &r));
        assert!(!verify_receipt(b"another", "unit-1", EPOCH, 7, &r));
        assert!(!verify_receipt(SECRET, "unit-1", EPOCH, 7, &[]));
        // Never a message's seal, whatever the nonce.
        assert!(!verify(SECRET, "unit-1", EPOCH, no(7), &[], &r));
    }

    #[test]
    fn an_epoch_s_secret_is_drawn_from_the_master_and_its_id() {
        let a = epoch_secret(b"master", &[1; 24]);
        assert_eq!(a, epoch_secret(b"master", &[1; 24]));
        assert_ne!(a, epoch_secret(b"master", &[2; 24]));
        assert_ne!(a, epoch_secret(b"other master", &[1; 24]));
    }

    #[test]
    fn bytes_moved_between_parts_do_not_collide() {
        // Without the lengths, both would feed the MAC "unit-1" ++ "ab".
        let a = seal(SECRET, "unit-1a", b"b", no(1), NONCE);
        let b = seal(SECRET, "unit-1", b"ab", no(1), NONCE);
        assert_ne!(a, b);
        let c = seal(SECRET, "u", b"", no(1), b"x");
        let d = seal(SECRET, "u", b"x", no(1), b"");
        assert_ne!(c, d);
    }
}

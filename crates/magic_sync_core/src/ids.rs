//! Identifiers that cross between the wire and the store, each with one way
//! in and one way out.

use std::fmt;

/// A message's number: drawn by the server from a PostgreSQL sequence
/// (`int8`, never negative), carried on the wire as `uint64`.
///
/// The wire can name numbers the store can never have drawn (past
/// `i64::MAX`): [`MessageNo::from_wire`] refuses them, so a number read from
/// a replica is either one the server could have sent or a refusal with the
/// number it named. No other conversion between the two exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct MessageNo(i64);

/// A number from the wire that no message of the server's can have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("message number {0} is beyond any number the server gives (at most {max})", max = i64::MAX)]
pub struct BeyondAnyMessage(pub u64);

impl MessageNo {
    /// No message: what a replica that applied nothing names.
    pub const NONE: MessageNo = MessageNo(0);

    /// A number as the store keeps it. Panics on a negative number, which
    /// the sequence never draws.
    pub fn from_store(n: i64) -> MessageNo {
        assert!(n >= 0, "message numbers are never negative, got {n}");
        MessageNo(n)
    }

    /// A number as a replica sent it.
    pub fn from_wire(n: u64) -> Result<MessageNo, BeyondAnyMessage> {
        i64::try_from(n)
            .map(MessageNo)
            .map_err(|_| BeyondAnyMessage(n))
    }

    /// As the store keeps it (`int8`).
    pub fn store(self) -> i64 {
        self.0
    }

    /// As the wire carries it (`uint64`).
    pub fn wire(self) -> u64 {
        // Never negative: see `from_store`.
        self.0.unsigned_abs()
    }
}

impl fmt::Display for MessageNo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A replica's id: what the host lists it by, what the transport
/// authenticates it as, and what rules compare a replica column with.
///
/// One type for it, so that a replica's id is never mistaken for a table's
/// name or a partition's, and every function that takes one says so. It
/// reads as the text it is (`Deref<Target = str>`, `Display`), and is made
/// from text with `From`: what makes an id acceptable (not empty, listed
/// once) is checked where the host's list comes in.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(transparent)]
pub struct ReplicaId(String);

impl ReplicaId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as owned text.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::ops::Deref for ReplicaId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for ReplicaId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for ReplicaId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<String> for ReplicaId {
    fn from(id: String) -> ReplicaId {
        ReplicaId(id)
    }
}

impl From<&str> for ReplicaId {
    fn from(id: &str) -> ReplicaId {
        ReplicaId(id.to_string())
    }
}

impl From<&String> for ReplicaId {
    fn from(id: &String) -> ReplicaId {
        ReplicaId(id.clone())
    }
}

impl From<ReplicaId> for String {
    fn from(id: ReplicaId) -> String {
        id.0
    }
}

impl PartialEq<str> for ReplicaId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ReplicaId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ReplicaId {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<ReplicaId> for str {
    fn eq(&self, other: &ReplicaId) -> bool {
        self == other.0
    }
}

impl PartialEq<ReplicaId> for &str {
    fn eq(&self, other: &ReplicaId) -> bool {
        *self == other.0
    }
}

impl PartialEq<ReplicaId> for String {
    fn eq(&self, other: &ReplicaId) -> bool {
        *self == other.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An epoch's id: what every message of one history of the server's
/// database names. The server draws a new one when it finds its database
/// restored from an older copy, and a message of another epoch than the one
/// a replica follows is never the next for it to apply.
///
/// An id the server draws now is *ordered*: its generation (8 bytes,
/// big-endian), then 16 random bytes. Each epoch the server begins takes a
/// generation above the one before and never below its clock in
/// microseconds, so a replica can tell a message of an older epoch (a
/// replay of one the server sent before it began a new one) from one of a
/// newer epoch, and refuses the first. An id of 16 random bytes, drawn
/// before epochs were ordered, has no generation and is ordered with none.
///
/// Bytes on the wire and in both stores; this type is what the chain, the
/// seal and the server's record of it compare. It reads as its bytes
/// (`Deref<Target = [u8]>`), compares with the bytes a message carries, and
/// shows as hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct EpochId(Vec<u8>);

/// The length of an ordered epoch's id: its generation and 16 random bytes.
pub const ORDERED_EPOCH_LEN: usize = 8 + 16;

impl EpochId {
    /// The ordered epoch of `generation`, told apart from any other of the
    /// same generation (a restored server's, say) by `random`.
    pub fn ordered(generation: u64, random: [u8; 16]) -> EpochId {
        let mut bytes = Vec::with_capacity(ORDERED_EPOCH_LEN);
        bytes.extend_from_slice(&generation.to_be_bytes());
        bytes.extend_from_slice(&random);
        EpochId(bytes)
    }

    /// Its generation, if it is ordered.
    pub fn generation(&self) -> Option<u64> {
        let bytes: [u8; ORDERED_EPOCH_LEN] = self.0.as_slice().try_into().ok()?;
        let (generation, _) = bytes.split_first_chunk::<8>()?;
        Some(u64::from_be_bytes(*generation))
    }

    /// Whether this epoch began before `other`: both are ordered, and its
    /// generation is lower. An epoch without a generation precedes none
    /// and follows none.
    pub fn precedes(&self, other: &EpochId) -> bool {
        matches!((self.generation(), other.generation()), (Some(a), Some(b)) if a < b)
    }

    /// The generation of the epoch begun after this one at `now`
    /// (microseconds since 1970), once an epoch of generation `seen` is
    /// known to have been: above both, and never below the clock, so an
    /// epoch begun by a server restored from an older copy still follows
    /// the ones its predecessor began.
    pub fn next_generation(&self, seen: Option<u64>, now: u64) -> u64 {
        let after = |g: Option<u64>| g.map_or(0, |g| g.saturating_add(1));
        after(self.generation()).max(after(seen)).max(now)
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The id's bytes, owned: what a message carries.
    pub fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

impl std::ops::Deref for EpochId {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl AsRef<[u8]> for EpochId {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

impl From<Vec<u8>> for EpochId {
    fn from(bytes: Vec<u8>) -> EpochId {
        EpochId(bytes)
    }
}

impl From<&[u8]> for EpochId {
    fn from(bytes: &[u8]) -> EpochId {
        EpochId(bytes.to_vec())
    }
}

impl PartialEq<[u8]> for EpochId {
    fn eq(&self, other: &[u8]) -> bool {
        self.0 == other
    }
}

impl PartialEq<Vec<u8>> for EpochId {
    fn eq(&self, other: &Vec<u8>) -> bool {
        &self.0 == other
    }
}

impl PartialEq<EpochId> for Vec<u8> {
    fn eq(&self, other: &EpochId) -> bool {
        *self == other.0
    }
}

impl fmt::Display for EpochId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(&self.0))
    }
}

#[cfg(test)]
mod tests {
    use super::{BeyondAnyMessage, EpochId, MessageNo, ReplicaId};
    use std::collections::HashMap;

    #[test]
    fn an_epoch_id_compares_with_the_bytes_a_message_carries_and_shows_as_hex() {
        let carried: Vec<u8> = vec![0xab, 0x01];
        let id = EpochId::from(carried.clone());
        assert_eq!(id, carried);
        assert_eq!(carried, id);
        assert_ne!(id, vec![0xab, 0x02]);
        assert_eq!(id.as_bytes(), &[0xab, 0x01]);
        assert_eq!(id.to_string(), "ab01");
        assert_eq!(id.into_bytes(), carried);
    }

    #[test]
    fn ordered_epochs_order_by_their_generation_and_the_others_with_none() {
        let older = EpochId::ordered(7, [1; 16]);
        let newer = EpochId::ordered(8, [0; 16]);
        let unordered = EpochId::from(vec![0xff; 16]);
        assert_eq!(older.len(), super::ORDERED_EPOCH_LEN);
        assert_eq!(older.generation(), Some(7));
        assert_eq!(unordered.generation(), None);
        assert!(older.precedes(&newer));
        assert!(!newer.precedes(&older));
        assert!(
            !older.precedes(&EpochId::ordered(7, [2; 16])),
            "same generation"
        );
        assert!(!unordered.precedes(&newer) && !newer.precedes(&unordered));
        // The next generation: past this one, past one seen, past the clock.
        assert_eq!(newer.next_generation(None, 0), 9);
        assert_eq!(newer.next_generation(Some(20), 0), 21);
        assert_eq!(newer.next_generation(None, 1_000), 1_000);
        assert_eq!(unordered.next_generation(None, 5), 5);
        assert_eq!(
            EpochId::ordered(u64::MAX, [0; 16]).next_generation(None, 0),
            u64::MAX
        );
    }

    #[test]
    fn a_replica_id_reads_as_its_text_and_finds_itself_by_it() {
        let id = ReplicaId::from("till-1");
        assert_eq!(id.as_str(), "till-1");
        assert_eq!(id.to_string(), "till-1");
        assert_eq!(id, "till-1");
        assert!(id.starts_with("till"));
        let kept: HashMap<ReplicaId, u32> = HashMap::from([(id.clone(), 3)]);
        assert_eq!(kept.get("till-1"), Some(&3));
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"till-1\"");
        assert_eq!(String::from(id), "till-1");
    }

    #[test]
    fn the_wire_names_no_number_the_store_cannot_hold() {
        assert_eq!(MessageNo::from_wire(7).map(MessageNo::store), Ok(7));
        let max = i64::MAX.unsigned_abs();
        assert_eq!(MessageNo::from_wire(max).map(MessageNo::wire), Ok(max));
        assert_eq!(
            MessageNo::from_wire(max + 1),
            Err(BeyondAnyMessage(max + 1))
        );
        assert_eq!(
            MessageNo::from_wire(u64::MAX),
            Err(BeyondAnyMessage(u64::MAX))
        );
        assert_eq!(MessageNo::from_store(12).wire(), 12);
    }

    #[test]
    #[should_panic(expected = "never negative")]
    fn a_negative_stored_number_is_a_bug() {
        let _ = MessageNo::from_store(-1);
    }
}

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

#[cfg(test)]
mod tests {
    use super::{BeyondAnyMessage, MessageNo};

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

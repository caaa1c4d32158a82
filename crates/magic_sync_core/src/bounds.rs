//! Bounds on what a replica's [`Up`] decodes to, checked on its encoded
//! bytes before anything is allocated from them.
//!
//! A transport bounds the bytes it receives, and that is not enough: an
//! entry of a repeated field costs its sender two bytes on the wire (a tag
//! and a zero length) and the decoder a whole struct (48 to 80 bytes), so a
//! message of 1 MiB can decode to 40 MiB and more. What is bounded here is
//! what decoding would make.
//!
//! 1. **Count.** [`count_up`] walks the encoded `Up` field by field, as the
//!    decoder would, into the messages that hold repeated fields, and
//!    counts the entries of each: the tables of rows, their rows and keys
//!    gone, the refusals, the tables of the digest and of the backlog. It
//!    allocates nothing; a wire it cannot walk (a length past the end, a
//!    varint of eleven bytes, a group, which no message of ours has) is
//!    refused there.
//! 2. **Check.** [`Counts::check`] holds the counts to [`UpBounds`]: the
//!    rows one upload may carry ([`MAX_UPLOAD_ROWS`], the bound the
//!    replica's uplink keeps to), the refusals a replica keeps
//!    ([`MAX_REFUSED`]), the tables any list may name ([`MAX_TABLES`]).
//! 3. **Decode.** Only then does prost decode, and [`bounded_decode`] gives
//!    with the `Up` [`Counts::decoded_bytes`]: a bound on the heap it holds
//!    (each struct, each list at most twice as long as it holds, the bytes
//!    of every string and byte field, which together never exceed the
//!    encoded length, and the allocator's own per allocation), which a
//!    transport adds up to bound what it holds decoded at once. Decoding
//!    itself briefly takes one more copy of a byte field on the way, so at
//!    most the encoded length more while it runs.
//!
//! Both transports are meant to decode through here: the broker does
//! (`magic_sync_nats`), and the socket's hub can.

use crate::envelope::{Refused, RowData, TableBacklog, TableDigest, Up, UpRows};
use crate::link::MAX_UPLOAD_ROWS;
use prost::Message as _;
use std::mem::size_of;

/// Refusals a replica keeps on record, and so says in one digest, at most
/// (`magic_sync_replica::MAX_REFUSED` is taken from it).
pub const MAX_REFUSED: usize = 10_000;

/// Tables one list of an `Up` names at most: the tables of rows of an
/// upload, of a digest, of a backlog. Far above any schema's tables.
pub const MAX_TABLES: usize = 10_000;

/// What the allocator adds to each allocation, as bounded here: its
/// header and the rounding of a small request.
const PER_ALLOCATION: usize = 32;

/// What one `Up` may hold once decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpBounds {
    /// Its encoded bytes at most: the transport's message size.
    pub bytes: usize,
    /// Rows and keys gone, over all its tables.
    pub rows: usize,
    /// Refusals.
    pub refused: usize,
    /// Tables named by each of its lists (rows, digest, backlog).
    pub tables: usize,
}

impl UpBounds {
    /// The engine's bounds for an `Up` of at most `bytes` encoded.
    pub fn of_messages(bytes: usize) -> UpBounds {
        UpBounds {
            bytes,
            rows: MAX_UPLOAD_ROWS,
            refused: MAX_REFUSED,
            tables: MAX_TABLES,
        }
    }
}

/// The entries of an encoded `Up`'s repeated fields, counted on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Its encoded length.
    pub bytes: usize,
    /// Tables of rows (`Up.tables`).
    pub tables: usize,
    /// Rows (`UpRows.rows`), over all tables.
    pub rows: usize,
    /// Of those tables, the ones with any row.
    pub tables_with_rows: usize,
    /// Keys gone (`UpRows.gone`), over all tables.
    pub gone: usize,
    /// Of those tables, the ones with any key gone.
    pub tables_with_gone: usize,
    /// Refusals (`Up.refused`).
    pub refused: usize,
    /// Tables of the digest (`Digest.tables`).
    pub digest_tables: usize,
    /// Tables of the backlog (`Backlog.tables`).
    pub backlog_tables: usize,
}

/// Why an `Up` was refused before it was decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// More bytes than a message may have.
    #[error("an Up of {found} bytes, more than a message may have ({bound})")]
    TooLarge {
        /// Its bytes.
        found: usize,
        /// The bound.
        bound: usize,
    },
    /// More entries of one kind than an `Up` may carry.
    #[error(
        "an Up carrying {found} {what}, more than one may carry ({bound}): refused before decoding"
    )]
    TooMany {
        /// What was counted, as the message says it.
        what: &'static str,
        /// How many there were.
        found: usize,
        /// The bound.
        bound: usize,
    },
    /// Bytes that are not an encoded `Up`.
    #[error("not an Up: {0}")]
    Malformed(String),
}

/// The `Up` in `encoded` once its counts are within `bounds`, with a bound
/// on the bytes it takes decoded; refused, with what was too many, before
/// anything is allocated from it.
pub fn bounded_decode(encoded: &[u8], bounds: &UpBounds) -> Result<Bounded, Refusal> {
    if encoded.len() > bounds.bytes {
        return Err(Refusal::TooLarge {
            found: encoded.len(),
            bound: bounds.bytes,
        });
    }
    let counts = count_up(encoded)?;
    counts.check(bounds)?;
    let up = Up::decode(encoded).map_err(|e| Refusal::Malformed(e.to_string()))?;
    Ok(Bounded {
        up,
        decoded_bytes: counts.decoded_bytes(),
    })
}

/// An `Up` decoded within its bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounded {
    /// The `Up`.
    pub up: Up,
    /// At most the heap it takes ([`Counts::decoded_bytes`]).
    pub decoded_bytes: usize,
}

impl Counts {
    /// Whether every count is within `bounds`; the first that is not, named.
    pub fn check(&self, bounds: &UpBounds) -> Result<(), Refusal> {
        let too_many = |what, found, bound| {
            if found > bound {
                Err(Refusal::TooMany { what, found, bound })
            } else {
                Ok(())
            }
        };
        if self.bytes > bounds.bytes {
            return Err(Refusal::TooLarge {
                found: self.bytes,
                bound: bounds.bytes,
            });
        }
        too_many("rows and keys gone", self.rows + self.gone, bounds.rows)?;
        too_many("tables of rows", self.tables, bounds.tables)?;
        too_many("refusals", self.refused, bounds.refused)?;
        too_many("tables in its digest", self.digest_tables, bounds.tables)?;
        too_many("tables in its backlog", self.backlog_tables, bounds.tables)
    }

    /// At most the heap an `Up` with these counts takes once decoded.
    pub fn decoded_bytes(&self) -> usize {
        // A list grows by doubling from four: it never holds room for more
        // than twice its entries, or four.
        let lists = |lists: usize, entries: usize, size: usize| {
            (4 * lists + 2 * entries).saturating_mul(size)
        };
        let structs = size_of::<Up>()
            + lists(1, self.tables, size_of::<UpRows>())
            + lists(self.tables_with_rows, self.rows, size_of::<RowData>())
            + lists(self.tables_with_gone, self.gone, size_of::<Vec<u8>>())
            + lists(1, self.refused, size_of::<Refused>())
            + lists(1, self.digest_tables, size_of::<TableDigest>())
            + lists(1, self.backlog_tables, size_of::<TableBacklog>());
        // Every string and byte field of every entry may be an allocation
        // of its own; the Up's own fields and lists are a few more.
        let allocations = 16
            + 3 * self.tables
            + 2 * self.rows
            + self.gone
            + 3 * self.refused
            + self.digest_tables
            + self.backlog_tables;
        structs
            .saturating_add(self.bytes)
            .saturating_add(allocations.saturating_mul(PER_ALLOCATION))
    }
}

/// The entries of the repeated fields of the `Up` in `encoded`, counted
/// without decoding it.
pub fn count_up(encoded: &[u8]) -> Result<Counts, Refusal> {
    let mut counts = Counts {
        bytes: encoded.len(),
        ..Counts::default()
    };
    let mut up = Fields::new(encoded);
    while let Some((number, value)) = up.next_field()? {
        match (number, value) {
            (UP_TABLES, Value::Bytes(table)) => {
                counts.tables += 1;
                let (rows, gone) = count_table(table)?;
                counts.rows += rows;
                counts.gone += gone;
                counts.tables_with_rows += usize::from(rows > 0);
                counts.tables_with_gone += usize::from(gone > 0);
            }
            (UP_REFUSED, Value::Bytes(_)) => counts.refused += 1,
            (UP_DIGEST, Value::Bytes(digest)) => {
                counts.digest_tables += count(digest, LIST_TABLES)?
            }
            (UP_BACKLOG, Value::Bytes(backlog)) => {
                counts.backlog_tables += count(backlog, LIST_TABLES)?;
            }
            // Anything else holds no list: a scalar, a string, a message
            // without a repeated field, or a field this build does not
            // know (which the decoder skips, keeping nothing of it).
            _ => {}
        }
    }
    Ok(counts)
}

/// The endorsements the `Filed` answers in the encoded `FromServer`
/// `frame` carry, counted without decoding it (a replica decodes an answer
/// before it checks its signature, and an empty endorsement is two bytes
/// sent and tens held).
pub fn count_filed_endorsements(frame: &[u8]) -> Result<usize, Refusal> {
    let mut n = 0;
    let mut fields = Fields::new(frame);
    while let Some((number, value)) = fields.next_field()? {
        if let (FROM_SERVER_FILED, Value::Bytes(filed)) = (number, value) {
            n += count(filed, FILED_ENDORSEMENTS)?;
        }
    }
    Ok(n)
}

/// `FromServer.filed`, and `Filed.endorsements`.
const FROM_SERVER_FILED: u32 = 2;
const FILED_ENDORSEMENTS: u32 = 3;

// Field numbers of the wire contract (`proto/magic_sync.proto`) that hold
// lists.
const UP_TABLES: u32 = 3;
const UP_REFUSED: u32 = 5;
const UP_DIGEST: u32 = 6;
const UP_BACKLOG: u32 = 8;
const UP_ROWS_ROWS: u32 = 2;
const UP_ROWS_GONE: u32 = 3;
/// `Digest.tables` and `Backlog.tables`.
const LIST_TABLES: u32 = 1;

/// The rows and keys gone of one encoded `UpRows`.
fn count_table(encoded: &[u8]) -> Result<(usize, usize), Refusal> {
    let (mut rows, mut gone) = (0, 0);
    let mut fields = Fields::new(encoded);
    while let Some((number, value)) = fields.next_field()? {
        match (number, value) {
            (UP_ROWS_ROWS, Value::Bytes(_)) => rows += 1,
            (UP_ROWS_GONE, Value::Bytes(_)) => gone += 1,
            _ => {}
        }
    }
    Ok((rows, gone))
}

/// The entries of field `list` in the encoded message `encoded`.
fn count(encoded: &[u8], list: u32) -> Result<usize, Refusal> {
    let mut n = 0;
    let mut fields = Fields::new(encoded);
    while let Some((number, value)) = fields.next_field()? {
        n += usize::from(number == list && matches!(value, Value::Bytes(_)));
    }
    Ok(n)
}

/// A field's value on the wire, borrowed.
enum Value<'a> {
    /// A varint, or a fixed 32 or 64 bits.
    Scalar,
    /// Length-delimited: a string, bytes, or a message.
    Bytes(&'a [u8]),
}

/// The fields of one encoded message, in order, borrowed from it.
struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn new(encoded: &'a [u8]) -> Self {
        Fields { rest: encoded }
    }

    fn varint(&mut self) -> Result<u64, Refusal> {
        let mut value = 0u64;
        for (i, byte) in self.rest.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.rest = &self.rest[i + 1..];
                return Ok(value);
            }
        }
        Err(Refusal::Malformed(if self.rest.len() < 10 {
            "a varint cut short".into()
        } else {
            "a varint longer than ten bytes".into()
        }))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], Refusal> {
        match usize::try_from(n) {
            Ok(n) if n <= self.rest.len() => {
                let (taken, rest) = self.rest.split_at(n);
                self.rest = rest;
                Ok(taken)
            }
            _ => Err(Refusal::Malformed(format!(
                "a field of {n} bytes where {} remain",
                self.rest.len()
            ))),
        }
    }

    /// The next field's number and value; `None` at the end.
    fn next_field(&mut self) -> Result<Option<(u32, Value<'a>)>, Refusal> {
        if self.rest.is_empty() {
            return Ok(None);
        }
        let key = self.varint()?;
        let number = u32::try_from(key >> 3)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| Refusal::Malformed(format!("a field numbered {}", key >> 3)))?;
        let value = match key & 7 {
            0 => {
                self.varint()?;
                Value::Scalar
            }
            1 => {
                self.take(8)?;
                Value::Scalar
            }
            2 => {
                let len = self.varint()?;
                Value::Bytes(self.take(len)?)
            }
            5 => {
                self.take(4)?;
                Value::Scalar
            }
            kind => {
                return Err(Refusal::Malformed(format!(
                    "field {number} of wire type {kind}, which no message of the contract has"
                )))
            }
        };
        Ok(Some((number, value)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::{Ack, Backlog, Digest};

    fn up_of(tables: usize, rows: usize, gone: usize, refused: usize) -> Up {
        Up {
            lane: "main".into(),
            send_id: vec![1; 16],
            tables: (0..tables)
                .map(|t| UpRows {
                    table: format!("t{t}"),
                    rows: (0..rows)
                        .map(|r| RowData {
                            key: format!("[{r}]").into_bytes(),
                            data: vec![7; 10],
                        })
                        .collect(),
                    gone: (0..gone).map(|g| format!("[{g}]").into_bytes()).collect(),
                })
                .collect(),
            applied: Some(Ack {
                number: 3,
                ..Ack::default()
            }),
            refused: (0..refused)
                .map(|n| Refused {
                    table: "t0".into(),
                    key: b"[1]".to_vec(),
                    number: n as u64,
                    reason: "no".into(),
                })
                .collect(),
            digest: Some(Digest {
                tables: vec![TableDigest::default(); 3],
                ..Digest::default()
            }),
            backlog: Some(Backlog {
                tables: vec![TableBacklog::default(); 2],
            }),
            ..Up::default()
        }
    }

    #[test]
    fn counts_on_the_wire_are_those_of_the_decoded_up() {
        let up = up_of(3, 4, 2, 5);
        let encoded = up.encode_to_vec();
        let counts = count_up(&encoded).unwrap();
        assert_eq!(
            counts,
            Counts {
                bytes: encoded.len(),
                tables: 3,
                rows: 12,
                tables_with_rows: 3,
                gone: 6,
                tables_with_gone: 3,
                refused: 5,
                digest_tables: 3,
                backlog_tables: 2,
            }
        );
        assert_eq!(counts.rows + counts.gone, crate::link::upload_rows(&up));
        let bounded = bounded_decode(&encoded, &UpBounds::of_messages(1 << 20)).unwrap();
        assert_eq!(bounded.up, up);
        assert_eq!(bounded.decoded_bytes, counts.decoded_bytes());
        assert_eq!(count_up(&[]).unwrap(), Counts::default());
    }

    #[test]
    fn a_message_repeated_on_the_wire_is_counted_as_the_decoder_merges_it() {
        // A digest given twice: the decoder appends the second's tables to
        // the first's.
        let half = Up {
            digest: Some(Digest {
                tables: vec![TableDigest::default(); 2],
                ..Digest::default()
            }),
            ..Up::default()
        }
        .encode_to_vec();
        let twice = [half.clone(), half].concat();
        assert_eq!(count_up(&twice).unwrap().digest_tables, 4);
        assert_eq!(
            Up::decode(twice.as_slice())
                .unwrap()
                .digest
                .unwrap()
                .tables
                .len(),
            4
        );
    }

    #[test]
    fn an_up_past_any_bound_is_refused_with_what_was_too_many() {
        let bounds = UpBounds {
            bytes: 1 << 20,
            rows: 10,
            refused: 3,
            tables: 3,
        };
        let refused = |up: &Up| bounded_decode(&up.encode_to_vec(), &bounds).unwrap_err();
        let within = up_of(2, 3, 2, 3);
        assert!(bounded_decode(&within.encode_to_vec(), &bounds).is_ok());
        assert_eq!(
            refused(&up_of(2, 4, 2, 0)),
            Refusal::TooMany {
                what: "rows and keys gone",
                found: 12,
                bound: 10
            }
        );
        assert_eq!(
            refused(&up_of(4, 0, 0, 0)),
            Refusal::TooMany {
                what: "tables of rows",
                found: 4,
                bound: 3
            }
        );
        let err = refused(&up_of(0, 0, 0, 4));
        assert_eq!(
            err.to_string(),
            "an Up carrying 4 refusals, more than one may carry (3): refused before decoding"
        );
        let mut digest = up_of(0, 0, 0, 0);
        digest.digest = Some(Digest {
            tables: vec![TableDigest::default(); 4],
            ..Digest::default()
        });
        assert!(matches!(
            refused(&digest),
            Refusal::TooMany {
                what: "tables in its digest",
                ..
            }
        ));
        let small = UpBounds {
            bytes: 10,
            ..bounds
        };
        assert!(matches!(
            bounded_decode(&within.encode_to_vec(), &small),
            Err(Refusal::TooLarge { bound: 10, .. })
        ));
    }

    #[test]
    fn empty_entries_two_bytes_each_are_counted_and_bounded_as_decoded() {
        // 1 MiB of empty refusals: half a million structs of 80 bytes.
        let forged = [0x2a, 0x00].repeat(512 * 1024);
        let counts = count_up(&forged).unwrap();
        assert_eq!(counts.refused, 512 * 1024);
        assert!(counts.decoded_bytes() > 40 * forged.len());
        assert_eq!(
            bounded_decode(&forged, &UpBounds::of_messages(1 << 21)).unwrap_err(),
            Refusal::TooMany {
                what: "refusals",
                found: 512 * 1024,
                bound: MAX_REFUSED
            }
        );
        // The bound holds for what is decoded, whatever the entries hold.
        let up = up_of(20, 50, 50, 100);
        let decoded = up.tables.capacity() * size_of::<UpRows>()
            + up.refused.capacity() * size_of::<Refused>()
            + up.tables
                .iter()
                .map(|t| t.rows.capacity() * size_of::<RowData>())
                .sum::<usize>();
        assert!(count_up(&up.encode_to_vec()).unwrap().decoded_bytes() > decoded);
    }

    #[test]
    fn a_wire_that_cannot_be_walked_is_refused() {
        let malformed = |bytes: &[u8]| matches!(count_up(bytes), Err(Refusal::Malformed(_)));
        // A length past the end.
        assert!(malformed(&[0x1a, 0x05, 0x00]));
        // A varint cut short, and one of eleven bytes.
        assert!(malformed(&[0x08, 0x80]));
        assert!(malformed(
            &[[0x08].as_slice(), &[0xff; 10], &[0x01]].concat()
        ));
        // A group, and field number 0.
        assert!(malformed(&[0x0b]));
        assert!(malformed(&[0x02, 0x00]));
        // Inside a table.
        assert!(malformed(&[0x1a, 0x02, 0x12, 0x05]));
        // A field this build does not know is skipped, as the decoder does.
        let unknown = [0xfa, 0x01, 0x02, 0x2a, 0x00];
        assert_eq!(count_up(&unknown).unwrap().refused, 0);
    }
}

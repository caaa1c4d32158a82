//! What the hub writes to its log of what others do wrong, kept to a line
//! a minute per kind, however many do it and from however many addresses:
//! the first of a kind is written as it comes; those after it within the
//! minute are counted, and the first one after the minute is written with
//! that count. A flood of wrong secrets, or a replica reconnecting to send
//! the same forged acknowledgement, costs the log a line a minute.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a line of one kind is written at most.
pub(crate) const EVERY: Duration = Duration::from_secs(60);

/// What a line is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// A request without credentials the hub reads.
    NoCredentials,
    /// An id that cannot be a replica's.
    NotAnId,
    /// A wrong secret, or an id with none.
    WrongSecret,
    /// A secret that could not be checked: the database, too many waiting.
    CannotCheck,
    /// A connection closed as soon as accepted: too many open.
    Crowded,
    /// A connection that failed before it became a replica's: TLS, HTTP,
    /// the handshake's time.
    Handshake,
    /// A replica the relay found misbehaving.
    Misbehaved,
    /// A replica's connection closed for what it sent.
    Refused,
    /// A replica's connection lost.
    Lost,
}

#[derive(Debug)]
struct Tally {
    written_at: Instant,
    unwritten: u64,
}

/// Per kind, when its last line was written and what happened since.
#[derive(Debug, Default)]
pub(crate) struct Logbook {
    kinds: Mutex<HashMap<Kind, Tally>>,
}

impl Logbook {
    /// One more of `kind`: `Some(n)` when a line is to be written now, `n`
    /// being how many of that kind were not written since the last line.
    pub(crate) fn note(&self, kind: Kind) -> Option<u64> {
        self.note_at(kind, Instant::now())
    }

    fn note_at(&self, kind: Kind, now: Instant) -> Option<u64> {
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match kinds.get_mut(&kind) {
            None => {
                kinds.insert(
                    kind,
                    Tally {
                        written_at: now,
                        unwritten: 0,
                    },
                );
                Some(0)
            }
            Some(tally) if now.saturating_duration_since(tally.written_at) >= EVERY => {
                let unwritten = tally.unwritten;
                *tally = Tally {
                    written_at: now,
                    unwritten: 0,
                };
                Some(unwritten)
            }
            Some(tally) => {
                tally.unwritten += 1;
                None
            }
        }
    }
}

/// What a line adds of the events it did not write.
pub(crate) fn since(unwritten: u64) -> String {
    match unwritten {
        0 => String::new(),
        n => format!(" ({n} more since the last such line)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_is_written_first_then_counted_then_written_with_its_count() {
        let book = Logbook::default();
        let t0 = Instant::now();
        assert_eq!(book.note_at(Kind::WrongSecret, t0), Some(0));
        for s in 1..60 {
            assert_eq!(
                book.note_at(Kind::WrongSecret, t0 + Duration::from_secs(s)),
                None
            );
        }
        // Another kind has a line of its own.
        assert_eq!(book.note_at(Kind::Misbehaved, t0), Some(0));
        assert_eq!(book.note_at(Kind::WrongSecret, t0 + EVERY), Some(59));
        assert_eq!(book.note_at(Kind::WrongSecret, t0 + EVERY), None);
        assert_eq!(
            book.note_at(Kind::WrongSecret, t0 + EVERY * 3),
            Some(1),
            "quiet since: the next line says only what it did not write"
        );
    }

    #[test]
    fn a_line_says_what_it_did_not_write() {
        assert_eq!(since(0), "");
        assert_eq!(since(3), " (3 more since the last such line)");
    }
}

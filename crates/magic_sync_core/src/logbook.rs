//! A log kept to a line a minute per kind of event, however many happen:
//! the first of a kind is written as it comes; those after it within the
//! minute are counted, and the first one after the minute is written with
//! that count. What others do wrong (wrong secrets, forged
//! acknowledgements, reports refused) costs the log a line a minute, not
//! a line an event. No I/O: the caller writes the line.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a line of one kind is written at most.
pub const EVERY: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Tally {
    written_at: Instant,
    unwritten: u64,
}

/// Per kind, when its last line was written and what happened since.
#[derive(Debug)]
pub struct Logbook<K> {
    kinds: Mutex<HashMap<K, Tally>>,
}

impl<K> Default for Logbook<K> {
    fn default() -> Self {
        Logbook {
            kinds: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> Logbook<K> {
    /// A logbook with nothing written yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// One more of `kind`: `Some(n)` when a line is to be written now, `n`
    /// being how many of that kind were not written since the last line.
    pub fn note(&self, kind: K) -> Option<u64> {
        self.note_at(kind, Instant::now())
    }

    /// One more of `kind`, at `now`; calls `write` with what the line adds
    /// of the events it did not write ([`since`]) when a line is due.
    pub fn log(&self, kind: K, write: impl FnOnce(&str)) {
        if let Some(unwritten) = self.note(kind) {
            write(&since(unwritten));
        }
    }

    fn note_at(&self, kind: K, now: Instant) -> Option<u64> {
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
pub fn since(unwritten: u64) -> String {
    match unwritten {
        0 => String::new(),
        n => format!(" ({n} more since the last such line)"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Kind {
        WrongSecret,
        Misbehaved,
    }

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

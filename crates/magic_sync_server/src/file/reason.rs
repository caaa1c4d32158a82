//! Why a row was refused, as `sync.inbox` keeps it and an operator reads
//! it: what a replica sent may be quoted in it (PostgreSQL's detail quotes
//! the failing row; a table name is the replica's), so every reason is
//! made plain where it is made:
//!
//! - no control character: each is written as its escape (`\u{1b}`), so
//!   nothing a replica sent can move an operator's terminal, and what was
//!   there still shows;
//! - at most [`REASON_CHARS`] characters, the last a `…` when cut.
//!
//! A reason begins with its kind, in the engine's own words, which hold
//! nothing a replica chose; what is particular to the row follows `: ` or
//! ` (`. PostgreSQL's refusals are `PostgreSQL refused it: ` with its
//! message and detail, which quote the row, and end with their SQLSTATE,
//! which is their kind (`[SQLSTATE 23514]`). The operator's health groups
//! refused rows by kind ([`crate::store::filing::refusal_kind`]), so a
//! replica sending many rows that differ lengthens no list.

/// The most characters a reason has.
pub const REASON_CHARS: usize = 1_000;

/// What PostgreSQL's refusals begin with.
pub(crate) const POSTGRES: &str = "PostgreSQL refused it: ";

/// `text` as a reason keeps it: control characters escaped, at most
/// `most` characters.
pub(crate) fn plain(text: &str, most: usize) -> String {
    let mut out = String::new();
    let mut count = 0;
    for c in text.chars() {
        if c.is_control() {
            for e in c.escape_unicode() {
                out.push(e);
                count += 1;
            }
        } else {
            out.push(c);
            count += 1;
        }
        if count > most {
            let mut cut: String = out.chars().take(most.saturating_sub(1)).collect();
            cut.push('…');
            return cut;
        }
    }
    out
}

/// A reason, made plain.
pub(crate) fn reason(text: &str) -> String {
    plain(text, REASON_CHARS)
}

/// The reason a row PostgreSQL refused is refused for: the database's own
/// words (which constraint, which value), not the client's "db error",
/// and its SQLSTATE.
pub(crate) fn postgres(e: &tokio_postgres::Error) -> String {
    let (said, code) = match e.as_db_error() {
        Some(db) => (
            match db.detail() {
                Some(detail) => format!("{} ({detail})", db.message()),
                None => db.message().to_string(),
            },
            Some(db.code().code()),
        ),
        None => (e.to_string(), e.code().map(|c| c.code())),
    };
    let kind = code.map_or(String::new(), |c| format!(" [SQLSTATE {c}]"));
    let room = REASON_CHARS - POSTGRES.len() - kind.chars().count();
    format!("{POSTGRES}{}{kind}", plain(&said, room))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_escapes_control_characters_and_keeps_the_rest() {
        assert_eq!(reason("plain words: `t1`"), "plain words: `t1`");
        assert_eq!(
            reason("a \u{1b}]0;owned\u{7} b\nc \u{9b}"),
            "a \\u{1b}]0;owned\\u{7} b\\u{a}c \\u{9b}"
        );
        assert_eq!(reason("é ü 中"), "é ü 中");
    }

    #[test]
    fn a_reason_is_cut_to_its_bound() {
        let exact = "x".repeat(REASON_CHARS);
        assert_eq!(reason(&exact), exact);
        let long = reason(&"y".repeat(400 << 10));
        assert_eq!(long.chars().count(), REASON_CHARS);
        assert!(long.ends_with('…'));
        // An escape counts as what it is written as.
        let escapes = reason(&"\u{1b}".repeat(REASON_CHARS));
        assert_eq!(escapes.chars().count(), REASON_CHARS);
        assert!(!escapes.chars().any(char::is_control));
    }
}

//! Quoting for SQL written by the engine. Every identifier and literal that
//! reaches a statement goes through here; identifiers and plain literals
//! are quoted by `postgres-protocol` (libpq's own rules).

use postgres_protocol::escape::{escape_identifier, escape_literal};

/// A quoted identifier: `"name"`, with inner quotes doubled.
pub fn ident(name: &str) -> String {
    escape_identifier(name)
}

/// A quoted string literal: `'text'`, with inner quotes doubled; text with
/// a backslash becomes ` E'...'`, read the same under either setting of
/// `standard_conforming_strings`.
pub fn literal(text: &str) -> String {
    escape_literal(text)
}

/// A string literal safe under either setting of
/// `standard_conforming_strings`: `E'text'`, with backslashes and quotes
/// escaped. For text that comes from outside the engine (replica ids).
pub fn escaped(text: &str) -> String {
    format!("E'{}'", text.replace('\\', "\\\\").replace('\'', "''"))
}

/// `ARRAY[...]::text[]` of [`escaped`] literals.
pub fn text_array<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    let items: Vec<String> = items.into_iter().map(escaped).collect();
    format!("ARRAY[{}]::text[]", items.join(", "))
}

/// `ARRAY[...]::int8[]`.
pub fn int8_array(items: impl IntoIterator<Item = i64>) -> String {
    let items: Vec<String> = items.into_iter().map(|n| n.to_string()).collect();
    format!("ARRAY[{}]::int8[]", items.join(", "))
}

/// `E'\\x..'::bytea`, hex, read the same under either setting of
/// `standard_conforming_strings`.
pub fn bytea(bytes: &[u8]) -> String {
    format!("E'\\\\x{}'::bytea", hex::encode(bytes))
}

/// `"schema"."name"`.
pub fn qualified(schema: &str, name: &str) -> String {
    format!("{}.{}", ident(schema), ident(name))
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_what_would_break_out() {
        assert_eq!(
            super::ident(r#"a"; DROP TABLE x; --"#),
            r#""a""; DROP TABLE x; --""#
        );
        assert_eq!(super::literal("it's"), "'it''s'");
        assert_eq!(super::literal(r"a\'b"), r" E'a\\''b'");
        assert_eq!(super::qualified("public", "Order"), r#""public"."Order""#);
        assert_eq!(super::escaped(r"a\'; --"), r"E'a\\''; --'");
        assert_eq!(
            super::text_array(["r1", "o'k"]),
            "ARRAY[E'r1', E'o''k']::text[]"
        );
        assert_eq!(super::int8_array([1, -2]), "ARRAY[1, -2]::int8[]");
        assert_eq!(super::bytea(&[0, 255]), r"E'\\x00ff'::bytea");
    }
}

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

/// `statement` run with the setting `name` at `value` for the
/// transaction (`SET LOCAL`), the setting then put back as the session had
/// it. `SET LOCAL name TO DEFAULT` would not: `DEFAULT` is the value the
/// server would give a session that set nothing, so a session's own
/// setting (the runner's statement timeout, its JIT off) would be lost to
/// the transaction's end. The session's value is kept meanwhile in a
/// placeholder setting of the engine's own, `magic_sync.saved_<name>`.
/// `name` and `value` are the engine's, never a host's.
pub fn with_setting(name: &str, value: &str, statement: &str) -> String {
    format!(
        "SELECT set_config('magic_sync.saved_{name}', current_setting('{name}'), true); \
         SET LOCAL {name} = {value}; {statement}; \
         SELECT set_config('{name}', current_setting('magic_sync.saved_{name}'), true);"
    )
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

    #[test]
    fn a_setting_for_one_statement_is_put_back_from_where_it_was_saved() {
        assert_eq!(
            super::with_setting("statement_timeout", "'5ms'", "LOCK TABLE t"),
            "SELECT set_config('magic_sync.saved_statement_timeout', \
             current_setting('statement_timeout'), true); \
             SET LOCAL statement_timeout = '5ms'; LOCK TABLE t; \
             SELECT set_config('statement_timeout', \
             current_setting('magic_sync.saved_statement_timeout'), true);"
        );
    }
}

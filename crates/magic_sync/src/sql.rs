//! Quoting for SQL written by the engine. Every identifier and literal that
//! reaches a statement goes through here.

/// A quoted identifier: `"name"`, with inner quotes doubled.
pub fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// A quoted string literal: `'text'`, with inner quotes doubled.
pub fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
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
        assert_eq!(super::qualified("public", "Order"), r#""public"."Order""#);
    }
}

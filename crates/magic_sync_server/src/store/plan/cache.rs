//! Statements kept prepared on the relay's connection, so that a small
//! pass runs each by the plan PostgreSQL made the first time instead of
//! parsing and planning it again: most of a one-row pass was that
//! (decisions 142 and 178).

use crate::error::Result;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio_postgres::Transaction;

/// Statements named in this process so far ([`Cache::name`]).
static NAMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most statements a [`Cache`] keeps, of either kind.
const CACHED_STATEMENTS: usize = 1_000;

/// The statements prepared on one connection, by their text: the
/// planner's, run one at a time ([`Cache::statement`]), and the closing's,
/// run by name in its one batch ([`Batch`]). A statement without
/// parameters keeps one plan; a planner table dropped and made again, or
/// truncated, makes PostgreSQL plan it again by itself.
#[derive(Debug, Default)]
pub(crate) struct Cache {
    statements: Mutex<HashMap<String, tokio_postgres::Statement>>,
    /// The name each statement was prepared under by `PREPARE`.
    named: Mutex<HashMap<String, String>>,
}

impl Cache {
    /// `sql` prepared: once, the first time it is asked for (up to
    /// [`CACHED_STATEMENTS`] statements; beyond, each time).
    pub(crate) async fn statement(
        &self,
        tx: &Transaction<'_>,
        sql: &str,
    ) -> Result<tokio_postgres::Statement> {
        if let Some(s) = self.statements.lock().expect("not poisoned").get(sql) {
            return Ok(s.clone());
        }
        let statement = tx.prepare(sql).await?;
        let mut statements = self.statements.lock().expect("not poisoned");
        if statements.len() < CACHED_STATEMENTS {
            statements.insert(sql.to_string(), statement.clone());
        }
        Ok(statement)
    }

    /// The name `sql` is prepared under on this connection, preparing it
    /// the first time (`None` once [`CACHED_STATEMENTS`] are named). A
    /// statement `PREPARE`d stays prepared when its transaction rolls back.
    async fn name(&self, tx: &Transaction<'_>, sql: &str) -> Result<Option<String>> {
        let name = {
            let named = self.named.lock().expect("not poisoned");
            if let Some(name) = named.get(sql) {
                return Ok(Some(name.clone()));
            }
            if named.len() >= CACHED_STATEMENTS {
                return Ok(None);
            }
            // Unique in the process: a connection may outlive a cache, and
            // a new one on it must not name a statement as the old one did.
            let n = NAMED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("_ms_kept_{n}")
        };
        tx.batch_execute(&format!("PREPARE {name} AS {sql}"))
            .await?;
        self.named
            .lock()
            .expect("not poisoned")
            .insert(sql.to_string(), name.clone());
        Ok(Some(name))
    }
}

/// Statements to run in one batch, one round trip. Those whose text is the
/// same pass after pass ([`Batch::keep`]) run by name, prepared once on
/// the connection: a closing's statements cost more to plan than to run
/// (0.1–0.5 ms each against a few hundredths, measured).
#[derive(Debug, Default)]
pub(crate) struct Batch {
    parts: Vec<(String, bool)>,
}

impl Batch {
    /// `sql` (one statement or more), planned each time it runs.
    pub fn push(&mut self, sql: impl Into<String>) {
        let sql = sql.into();
        if !sql.trim().is_empty() {
            self.parts.push((sql, false));
        }
    }

    /// `sql`, one statement whose text repeats pass after pass, run by the
    /// plan made the first time when the batch runs with a cache. Nothing
    /// when empty.
    pub fn keep(&mut self, sql: impl Into<String>) {
        let sql = sql.into();
        let sql = sql.trim().trim_end_matches(';').trim_end();
        if !sql.is_empty() {
            debug_assert!(one_statement(sql), "one statement is kept: {sql}");
            self.parts.push((sql.to_string(), true));
        }
    }

    /// The batch as one text, the statements kept run by name when `cache`
    /// is given (each prepared first, the first time: a round trip).
    pub async fn sql(self, tx: &Transaction<'_>, cache: Option<&Cache>) -> Result<String> {
        let mut sql = String::new();
        for (part, kept) in self.parts {
            match (kept, cache) {
                (true, Some(cache)) => match cache.name(tx, &part).await? {
                    Some(name) => sql.push_str(&format!("EXECUTE {name};")),
                    None => written(&mut sql, &part, kept),
                },
                _ => written(&mut sql, &part, kept),
            }
        }
        Ok(sql)
    }

    /// The batch as one text, every statement planned as it runs.
    pub fn text(self) -> String {
        let mut sql = String::new();
        for (part, kept) in self.parts {
            written(&mut sql, &part, kept);
        }
        sql
    }
}

/// `part` added to `sql` as written: a kept statement is stored without
/// its closing semicolon.
fn written(sql: &mut String, part: &str, kept: bool) {
    sql.push_str(part);
    if kept {
        sql.push(';');
    }
}

/// Whether `sql` is one statement: no `;` outside quotes.
fn one_statement(sql: &str) -> bool {
    let mut quote = None;
    for c in sql.chars() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';') => return false,
            _ => {}
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_semicolon_in_quotes_is_not_a_second_statement() {
        assert!(one_statement("SELECT 'a;b', \"c;d\" FROM t"));
        assert!(!one_statement("SELECT 1; SELECT 2"));
        assert!(one_statement("SELECT 'it''s; here'"));
    }

    #[test]
    fn a_batch_without_a_cache_runs_every_statement_as_written_in_order() {
        let mut batch = Batch::default();
        batch.push("SET LOCAL jit = off;");
        batch.keep("  DELETE FROM a;  ");
        batch.keep("");
        batch.push("   ");
        batch.keep("UPDATE b SET c = 1");
        assert_eq!(
            batch.text(),
            "SET LOCAL jit = off;DELETE FROM a;UPDATE b SET c = 1;"
        );
    }
}

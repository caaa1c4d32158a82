//! Rows set aside because they cannot go down (`sync.quarantine`), and the
//! rows blocked for a replica because they lean on one (`sync.blocked`):
//! how they are recorded, noted again when a relay starts, and read by the
//! operator's reads. How a plan goes around them is `store::plan::quarantine`'s.

use crate::error::Result;
use crate::graph::{key_match, Graph};
use crate::sql::literal;
use crate::trigger::Noted;
use tokio_postgres::GenericClient;

/// A row to set aside: its table, its key as the record keeps it (the text
/// of its `jsonb` array), the newest note of it the plan saw, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetAside {
    pub table: String,
    pub key: String,
    pub version: i64,
    pub reason: String,
}

/// Puts `rows` in quarantine, not settled: the next plan takes them back
/// from wherever they are held. With the rows a rule gives left to it
/// (`by_rule`, the graph), the holders its rule gave a row to, at their
/// position, no longer hold it by the reading: their sums of the rows held
/// by the rule alone move in the same statements.
pub(crate) async fn set_aside(
    client: &impl GenericClient,
    rows: &[SetAside],
    by_rule: Option<&Graph>,
) -> Result<()> {
    use crate::sql::{int8_array, text_array};
    if rows.is_empty() {
        return Ok(());
    }
    let tables = text_array(rows.iter().map(|r| r.table.as_str()));
    let keys = text_array(rows.iter().map(|r| r.key.as_str()));
    let moved = match by_rule {
        Some(graph) => crate::store::by_rule::moved_with(
            graph,
            &format!("SELECT t, k::jsonb, NULL::text FROM unnest({tables}, {keys}) AS u (t, k)"),
            -1,
        ),
        None => String::new(),
    };
    // One batch, so one transaction whatever the client.
    client
        .batch_execute(&format!(
            "{moved}
             INSERT INTO sync.quarantine AS z (table_name, key, version, reason)
             SELECT * FROM unnest({tables}, {keys}, {versions}, {reasons})
             ON CONFLICT (table_name, key) DO UPDATE
             SET version = greatest(z.version, excluded.version), reason = excluded.reason,
                 at = now(), settled = false",
            versions = int8_array(rows.iter().map(|r| r.version)),
            reasons = text_array(rows.iter().map(|r| r.reason.as_str())),
        ))
        .await?;
    Ok(())
}

/// Notes every row in quarantine, and every row blocked by one, again: the
/// next pass tries each as if it had changed. A relay does this as it
/// starts, so a fix deployed lets through what the build before it could
/// not send.
///
/// A note written again says what the row is now, as a trigger's note says
/// what it was: its `parents` are the row's columns its table's notes keep
/// (`Noted::before`), read from the row by its key, and NULL when the row
/// is gone or its key no longer fits the table's columns (no such row can
/// be there). So every pending note is the row as it was before its change,
/// whoever wrote it (decision 176).
#[derive(Debug, Clone, Default)]
pub(crate) struct NoteAgain {
    /// One statement per table that goes down.
    declared: Vec<String>,
    /// The names of the tables that go down: the rows of any other table
    /// (a group's) are noted again with `parents` NULL, as they keep none.
    names: Vec<&'static str>,
}

impl NoteAgain {
    /// The statements for `graph`'s tables, whose notes keep the columns
    /// `noted` names.
    pub(crate) fn new(graph: &Graph, noted: &[Noted]) -> Self {
        let mut declared = Vec::new();
        for shape in &graph.shapes {
            let Some(noted) = noted.iter().find(|n| n.table == shape.table.name) else {
                continue;
            };
            let key = "s.key::jsonb";
            let mut fits = vec![
                format!("jsonb_typeof({key}) <> 'array'"),
                format!("jsonb_array_length({key}) <> {}", shape.key_types.len()),
            ];
            fits.extend(
                shape
                    .key_types
                    .iter()
                    .enumerate()
                    .map(|(i, ty)| format!("NOT sync.castable({key}->>{i}, {})", literal(ty))),
            );
            // A CASE is evaluated in order, so no key is cast before it is
            // known to fit.
            let before = format!(
                "CASE {} ELSE (SELECT {} FROM {} r WHERE {} OFFSET 0) END",
                fits.iter()
                    .map(|f| format!("WHEN {f} THEN NULL"))
                    .collect::<Vec<_>>()
                    .join(" "),
                noted.before_of("r"),
                shape.relation,
                key_match("r", shape, key),
            );
            declared.push(again(&before, &format!("= {}", literal(shape.table.name))));
        }
        let names = graph.shapes.iter().map(|s| s.table.name).collect();
        NoteAgain { declared, names }
    }

    /// Writes the notes. Returns the rows noted.
    pub(crate) async fn run(&self, client: &impl GenericClient) -> Result<u64> {
        let mut noted = 0;
        for sql in &self.declared {
            noted += client.execute(sql.as_str(), &[]).await?;
        }
        let others = again("NULL", "<> ALL ($1::text[])");
        Ok(noted + client.execute(others.as_str(), &[&self.names]).await?)
    }
}

/// The statement that notes again the rows set aside or blocked of the
/// tables whose name is `table` (`= 'x'`, `<> ALL (...)`), their `parents`
/// being `before`, over `s`.
fn again(before: &str, table: &str) -> String {
    format!(
        "INSERT INTO sync.notes (table_name, source, key, parents, op)
         SELECT s.table_name, s.table_name, s.key::jsonb, {before}, {again} FROM (
             SELECT table_name, key FROM sync.quarantine WHERE table_name {table}
             UNION
             SELECT table_name, key FROM sync.blocked WHERE table_name {table}) s",
        again = super::notes::Op::Again.literal(),
    )
}

/// One row in quarantine, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Quarantined {
    /// The table.
    pub table: String,
    /// The row's key (a JSON array).
    pub key: String,
    /// Why it cannot go.
    pub reason: String,
    /// Since when.
    pub since: chrono::DateTime<chrono::Utc>,
    /// Rows blocked because they lean on it, over the replicas in scope.
    pub blocked: i64,
}

/// Records every row set aside, and every row blocked behind one, as taken
/// back from wherever it was held: for a pass's closing batch.
pub(crate) const SETTLE: &str = "UPDATE sync.quarantine SET settled = true WHERE NOT settled;
     UPDATE sync.blocked SET settled = true WHERE NOT settled;";

//! Filing an upload: what a replica wrote, written into the server's tables
//! under the replica the transport authenticated, in one transaction, and
//! answered with `Filed` once that transaction commits.
//!
//! Per table of the upload:
//!
//! - **Up tables** (records). A row is inserted with its origin column set
//!   to the sender, whatever the row says. A record is kept from its first
//!   delivery; with a version column, a newer report of the sender's own
//!   record replaces it. A record of the same key written by another
//!   replica is refused. A key gone is deleted, only from a table keyed by
//!   its origin, and only the sender's own record.
//! - **Two-way tables.** Only the columns the replica owns are taken, and
//!   only for a row the server has and records the sender holding
//!   (`sync.held`), and only from an upload newer than the last that gave
//!   them (`Up::sequence`, recorded in `sync.filed`), so an upload
//!   delivered late never puts an older value back. A row the server no
//!   longer has is dropped: its change won. A row it has but does not record the sender holding, while the
//!   sender is being provisioned (its snapshot began, and dropped that
//!   record until it ends), makes the whole upload wait: nothing is filed,
//!   nothing answered, and the replica sends it again. Otherwise such a row
//!   (never sent to the sender, or another replica's) is refused.
//! - **Catalogs** (down tables), and tables the server does not declare,
//!   are refused.
//!
//! A refused row is kept, with why, in `sync.inbox` (the bytes as they
//! came), and the upload is still answered: the row is the server's to
//! show, and to file again once a fix is deployed. Why is made plain where
//! it is made (`file/reason.rs`): no control character, a bounded length,
//! and a kind the operator's health groups by. A row PostgreSQL refuses
//! (a constraint, a value it cannot take) is refused alone, behind a
//! savepoint. Any other failure (the connection, a deadlock) files nothing
//! and is returned: the replica sends the upload again.
//!
//! The backlog an upload carries (what the replica has that the server has
//! not filed, per table) is recorded with the filing, in
//! `sync.backlogs`. An upload with no rows and no send id only says
//! that, and needs no answer.
//!
//! Rows are turned into the table's row type by `jsonb_populate_record`,
//! from the JSON of their values, so every column gets its own type's input
//! conversion, whatever types the host chose.

use crate::engine::Engine;
use crate::envelope::{Filed, RowData, Up, UpRows};
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::row::{Mirror, Table};
use crate::sql::ident;
use crate::store;
use crate::value::{canonical_key, Kind, Value};
use magic_sync_core::link::upload_rows;
use magic_sync_core::ReplicaId;
use std::collections::{BTreeMap, HashMap};
use tokio_postgres::{Client, Transaction};

mod reason;
pub use reason::REASON_CHARS;

/// What became of an upload.
#[derive(Debug, Clone, PartialEq)]
pub enum Filing {
    /// Filed and committed: the answer to send back.
    Filed {
        /// The answer for the replica, signed by the server.
        answer: Filed,
        /// Rows written or deleted as the upload asked.
        taken: usize,
        /// Rows that changed nothing: already filed (a resend), an older
        /// version, or an edit of a row the server no longer has.
        unchanged: usize,
        /// Rows refused, kept in `sync.inbox` with why.
        refused: Vec<Refusal>,
    },
    /// The sender is being provisioned and edits rows it holds: nothing
    /// filed, no answer; the upload comes again.
    Waits {
        /// Why it waits.
        reason: String,
    },
}

/// A row of an upload the server refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The table the row names.
    pub table: String,
    /// Its key, as it came.
    pub key: String,
    /// Why: without control characters, at most [`REASON_CHARS`]
    /// characters.
    pub reason: String,
}

impl Refusal {
    /// The row of `key` in `table`, refused for `why`, made plain.
    fn new(table: &str, key: &[u8], why: &str) -> Refusal {
        Refusal {
            table: table.to_string(),
            key: String::from_utf8_lossy(key).into_owned(),
            reason: reason::reason(why),
        }
    }
}

/// What one row came to.
enum Outcome {
    Taken,
    Unchanged,
    Refused(String),
    Waits(String),
}

/// Files `up`, sent by `replica` (as the transport authenticated it: never
/// what the upload or its rows say), in one transaction on `client`.
pub async fn file(
    client: &mut Client,
    engine: &Engine,
    replica: &ReplicaId,
    up: &Up,
) -> Result<Filing> {
    let uploads = [(replica.clone(), up.clone())];
    let mut filings = file_all(client, engine, &uploads).await?;
    filings.pop().expect("one filing per upload")
}

/// Slow-path filings (a savepoint each, and one per row) in one
/// transaction before it commits and the next begins: past 64 written
/// subtransactions, every other session's snapshot has to look them up
/// on disk, and a fleet's uploads slowed the passes and the filing alike.
const SAVEPOINTS_PER_TRANSACTION: usize = 32;

/// Files several uploads, each as [`file`](fn@file) would. Uploads that carry only
/// records (the common case: a till's sales) are filed together, a
/// statement per table for all of them; the others one by one, each behind
/// a savepoint of its own, so one that waits files nothing of its own and
/// leaves the others filed. An upload from a replica the server does not
/// know is that upload's error. A failure of the database itself (the
/// connection, a deadlock) is returned: what committed before it is filed,
/// and filing again what comes again changes nothing. Answers go only once
/// this returned.
pub async fn file_all(
    client: &mut Client,
    engine: &Engine,
    uploads: &[(ReplicaId, Up)],
) -> Result<Vec<Result<Filing>>> {
    file_with(client, engine, uploads, true).await
}

/// [`file_all`], with a full inbox making an upload wait when `bounded`:
/// what is filed again out of the inbox itself is not held back by it.
async fn file_with(
    client: &mut Client,
    engine: &Engine,
    uploads: &[(ReplicaId, Up)],
    bounded: bool,
) -> Result<Vec<Result<Filing>>> {
    let mut filings: Vec<Option<Result<Filing>>> = uploads.iter().map(|_| None).collect();
    let by_rule = by_rule_graph(client, engine, uploads).await?;
    let mut tx = client.transaction().await?;
    let (known, signer, mut full) = tokio::try_join!(
        known_replicas(&tx, uploads),
        crate::store::keys::current(&tx),
        full_inboxes(&tx, uploads)
    )?;
    if !bounded {
        full.clear();
    }
    let mut savepoints = 0;
    let mut i = 0;
    while i < uploads.len() {
        let (replica, up) = &uploads[i];
        if !known.contains(replica.as_str()) {
            filings[i] = Some(Err(unknown(replica)));
            i += 1;
            continue;
        }
        // A full inbox holds back each upload of its replica that carries
        // rows: checked for every upload, those of a run included.
        let held_back = |(replica, up): &(ReplicaId, Up)| {
            full.get(replica.as_str()).filter(|_| carries_rows(up))
        };
        if let Some(reason) = held_back(&uploads[i]) {
            filings[i] = Some(Ok(Filing::Waits {
                reason: reason.clone(),
            }));
            i += 1;
            continue;
        }
        if records_only(engine, up) {
            // The run of such uploads from here, filed together; in order
            // with the others, so a record filed and then deleted stays
            // deleted.
            let from = i;
            while i < uploads.len()
                && known.contains(uploads[i].0.as_str())
                && records_only(engine, &uploads[i].1)
                && held_back(&uploads[i]).is_none()
            {
                i += 1;
            }
            let run = &uploads[from..i];
            savepoints += file_records(&mut tx, engine, run, &mut filings[from..i]).await?;
        } else {
            let filing = file_in(&mut tx, engine, by_rule.as_ref(), replica, up).await;
            filings[i] = Some(kept(filing)?);
            savepoints += 1 + up
                .tables
                .iter()
                .map(|t| t.rows.len() + t.gone.len())
                .sum::<usize>();
            i += 1;
        }
        if savepoints >= SAVEPOINTS_PER_TRANSACTION {
            record_filed(&tx, engine, uploads, &filings).await?;
            tx.commit().await?;
            tx = client.transaction().await?;
            savepoints = 0;
        }
    }
    record_filed(&tx, engine, uploads, &filings).await?;
    tx.commit().await?;
    Ok(filings
        .into_iter()
        .zip(uploads)
        .map(|(f, (replica, _))| {
            f.expect("every upload has its filing")
                .map(|filing| signed(filing, &signer, replica))
        })
        .collect())
}

/// Files `run`, uploads that carry only records, together: a statement
/// per table for all of them. When PostgreSQL refuses a row, each upload
/// alone, so that only that row is refused. Returns the savepoints taken.
async fn file_records(
    tx: &mut Transaction<'_>,
    engine: &Engine,
    run: &[(ReplicaId, Up)],
    filings: &mut [Option<Result<Filing>>],
) -> Result<usize> {
    if let Some(filed) = records_all(tx, engine, run).await? {
        for (slot, filing) in filings.iter_mut().zip(filed) {
            *slot = Some(Ok(filing));
        }
        return Ok(0);
    }
    let mut savepoints = 0;
    for ((replica, up), slot) in run.iter().zip(filings.iter_mut()) {
        // Records only: whether a replica holds a row is never asked.
        *slot = Some(kept(file_in(tx, engine, None, replica, up).await)?);
        savepoints += 1 + up.tables.iter().map(|t| t.rows.len()).sum::<usize>();
    }
    Ok(savepoints)
}

/// The filing with its answer signed for `replica`, as the replica checks
/// it: the key read in the filing's first transaction, so a key rotated
/// since the last batch signs this one.
fn signed(filing: Filing, signer: &magic_sync_core::sign::Signer, replica: &str) -> Filing {
    match filing {
        Filing::Filed {
            answer,
            taken,
            unchanged,
            refused,
        } => Filing::Filed {
            answer: signer.filed(replica, answer.send_id),
            taken,
            unchanged,
            refused,
        },
        waits => waits,
    }
}

/// A filing as [`file_all`] keeps it: a failure of the database itself
/// ends the call, any other is that upload's alone.
fn kept(filing: Result<Filing>) -> Result<Result<Filing>> {
    match filing {
        Err(e) if e.is_transient() => Err(e),
        other => Ok(other),
    }
}

/// Rows filed again from the inbox per upload made of them: well within
/// what one upload may carry.
const REFILE_ROWS: usize = 1_000;

/// What [`refile`] came to.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Refiled {
    /// Rows filed (or found to change nothing) and let go of.
    pub filed: usize,
    /// Rows refused again, kept with the reason they were refused for now.
    pub refused: usize,
    /// Rows whose filing waits (their replica is being provisioned): kept
    /// as they were, for the next relay to start.
    pub waiting: usize,
}

/// Files again every row the inbox holds, as the upload it came in would
/// be filed now: a relay starting does this once, so that a fix deployed
/// (a constraint dropped, a table declared, a trigger mended) takes what
/// the build before it refused, with no one replaying anything by hand.
/// Each row keeps the sequence of the upload it came in, so a two-way
/// row's owned columns never go back to a value older than one filed
/// since. A row filed leaves the inbox; one refused again stays, with the
/// reason it was refused for now. A full inbox holds back its replica's
/// uploads, not this.
pub async fn refile(client: &mut Client, engine: &Engine) -> Result<Refiled> {
    // Entries refused again are written at this filing's time, later than
    // this: they stay, and only those filed go.
    let (began, rows) = store::filing::inbox(client).await?;
    let mut refiled = Refiled::default();
    if rows.is_empty() {
        return Ok(refiled);
    }
    // One upload per replica and sequence (a chunk of them at a time),
    // each naming the rows it carries.
    let mut uploads: Vec<(ReplicaId, Up)> = Vec::new();
    let mut carried: Vec<Vec<(String, String)>> = Vec::new();
    for kept in rows {
        let store::filing::Kept {
            replica,
            table,
            key,
            data,
            sequence,
        } = kept;
        let sequence = u64::try_from(sequence).unwrap_or(0);
        let fits = uploads.last().is_some_and(|(r, up)| {
            *r == replica && up.sequence == sequence && upload_rows(up) < REFILE_ROWS
        });
        if !fits {
            uploads.push((
                ReplicaId::from(&replica),
                Up {
                    sequence,
                    ..Up::default()
                },
            ));
            carried.push(Vec::new());
        }
        let (_, up) = uploads.last_mut().expect("just pushed");
        let at = match up.tables.iter().position(|t| t.table == table) {
            Some(at) => at,
            None => {
                up.tables.push(UpRows {
                    table: table.clone(),
                    ..UpRows::default()
                });
                up.tables.len() - 1
            }
        };
        let rows = &mut up.tables[at];
        match data {
            Some(data) => rows.rows.push(RowData {
                key: key.clone().into_bytes(),
                data,
            }),
            None => rows.gone.push(key.clone().into_bytes()),
        }
        carried.last_mut().expect("just pushed").push((table, key));
    }
    let filings = file_with(client, engine, &uploads, false).await?;
    let (mut replicas, mut tables, mut keys) = (Vec::new(), Vec::new(), Vec::new());
    for (((replica, up), rows), filing) in uploads.iter().zip(&carried).zip(filings) {
        match filing {
            Ok(Filing::Filed { refused, .. }) => {
                refiled.refused += refused.len();
                refiled.filed += upload_rows(up).saturating_sub(refused.len());
                for (table, key) in rows {
                    replicas.push(replica.as_str());
                    tables.push(table.as_str());
                    keys.push(key.as_str());
                }
            }
            Ok(Filing::Waits { .. }) | Err(_) => refiled.waiting += upload_rows(up),
        }
    }
    store::filing::let_go(client, &replicas, &tables, &keys, began).await?;
    Ok(refiled)
}

/// Rows of refused uploads one replica's inbox holds at most. Past this,
/// or past [`INBOX_BYTES`], its uploads wait, unanswered (it keeps their
/// rows and sends them again), until a fix files what the inbox holds: a
/// replica sending what cannot be filed holds back only itself, and costs
/// the server a bounded amount.
pub const INBOX_ROWS: i64 = 10_000;

/// Bytes (keys, rows and reasons) one replica's inbox holds at most.
pub const INBOX_BYTES: i64 = 16 << 20;

/// Whether an upload carries rows (or keys gone) to file.
fn carries_rows(up: &Up) -> bool {
    up.tables
        .iter()
        .any(|t| !t.rows.is_empty() || !t.gone.is_empty())
}

/// The replicas among the uploads' whose inbox is full, each with why its
/// uploads wait.
async fn full_inboxes(
    tx: &Transaction<'_>,
    uploads: &[(ReplicaId, Up)],
) -> Result<std::collections::HashMap<String, String>> {
    let ids: Vec<&str> = uploads.iter().map(|(r, _)| r.as_str()).collect();
    let full = store::filing::full_inboxes(tx, &ids, INBOX_ROWS, INBOX_BYTES).await?;
    Ok(full
        .into_iter()
        .map(|(replica, rows, bytes)| {
            let reason = format!(
                "the inbox of replica `{replica}` is full ({rows} refused rows, {bytes} bytes; \
                 at most {INBOX_ROWS} rows, {INBOX_BYTES} bytes): its uploads wait until a fix \
                 files what is there"
            );
            (replica, reason)
        })
        .collect())
}

/// The replicas the uploads name that the server knows.
async fn known_replicas(
    tx: &Transaction<'_>,
    uploads: &[(ReplicaId, Up)],
) -> Result<std::collections::HashSet<String>> {
    let ids: Vec<&str> = uploads.iter().map(|(r, _)| r.as_str()).collect();
    store::filing::known(tx, &ids).await
}

/// An upload from a replica the server does not know.
fn unknown(replica: &ReplicaId) -> Error {
    Error::UnknownReplica {
        replica: replica.clone(),
    }
}

/// The graph filing reads by ([`Graph::while_by_rule`]) when one of
/// `uploads` carries rows that are not records: a two-way row's owned
/// columns are filed only from a replica holding it. Read once per call,
/// outside its transaction.
async fn by_rule_graph(
    client: &Client,
    engine: &Engine,
    uploads: &[(ReplicaId, Up)],
) -> Result<Option<Graph>> {
    if uploads.iter().all(|(_, up)| records_only(engine, up)) {
        return Ok(None);
    }
    Graph::while_by_rule(client, engine).await
}

/// Whether every row `up` carries is a record of a table that names its
/// origin (no key gone, no two-way row, nothing the server does not
/// declare): such uploads are filed together.
fn records_only(engine: &Engine, up: &Up) -> bool {
    up.tables.iter().all(|rows| {
        rows.gone.is_empty()
            && engine.codec(&rows.table).is_some_and(|codec| {
                let table = codec.table();
                table.mirror == Mirror::Up && table.origin.is_some()
            })
    })
}

/// Records the backlog each filed upload carried (`sync.backlogs`), the
/// last one per replica, in one statement; the filings are those so far.
/// Only tables the engine declares count: a name the replica made up (one
/// with a NUL in it, which no PostgreSQL text may hold, say) would fail
/// the statement for every upload in it.
async fn record_backlogs(
    tx: &Transaction<'_>,
    engine: &Engine,
    uploads: &[(ReplicaId, Up)],
    filings: &[Option<Result<Filing>>],
) -> Result<()> {
    let mut last: std::collections::BTreeMap<&str, serde_json::Value> = Default::default();
    for ((replica, up), filing) in uploads.iter().zip(filings) {
        let (Some(backlog), Some(Ok(Filing::Filed { .. }))) = (&up.backlog, filing) else {
            continue;
        };
        let tables: serde_json::Map<String, serde_json::Value> = backlog
            .tables
            .iter()
            .filter(|t| engine.codec(&t.table).is_some())
            .map(|t| {
                (
                    t.table.clone(),
                    serde_json::json!({"unsent": t.unsent, "unfiled": t.unfiled}),
                )
            })
            .collect();
        last.insert(replica, serde_json::Value::Object(tables));
    }
    if last.is_empty() {
        return Ok(());
    }
    let (replicas, tables): (Vec<&str>, Vec<serde_json::Value>) = last.into_iter().unzip();
    store::filing::backlogs(tx, &replicas, &tables).await
}

/// What a filing transaction records of its uploads before it commits:
/// each replica's backlog and the newest upload it answers, sent together
/// (one round trip).
async fn record_filed(
    tx: &Transaction<'_>,
    engine: &Engine,
    uploads: &[(ReplicaId, Up)],
    filings: &[Option<Result<Filing>>],
) -> Result<()> {
    tokio::try_join!(
        record_backlogs(tx, engine, uploads, filings),
        record_answered(tx, uploads, filings)
    )?;
    Ok(())
}

/// Records, per replica, the newest of `uploads` the filing answers
/// (`sync.uploads_answered`), in the transaction that files them: no
/// answer leaves unless it is recorded, so a replica never says it was
/// answered more than the record holds unless the database forgot (see
/// [`crate::relay::acknowledge_all`]).
async fn record_answered(
    tx: &Transaction<'_>,
    uploads: &[(ReplicaId, Up)],
    filings: &[Option<Result<Filing>>],
) -> Result<()> {
    let mut newest: BTreeMap<&str, i64> = BTreeMap::new();
    for ((replica, up), filing) in uploads.iter().zip(filings) {
        if matches!(filing, Some(Ok(Filing::Filed { .. }))) && !up.send_id.is_empty() {
            let sequence = i64::try_from(up.sequence).unwrap_or(i64::MAX);
            let at = newest.entry(replica.as_str()).or_insert(sequence);
            *at = (*at).max(sequence);
        }
    }
    if newest.is_empty() {
        return Ok(());
    }
    let (replicas, sequences): (Vec<&str>, Vec<i64>) = newest.into_iter().unzip();
    store::filing::answered(tx, &replicas, &sequences).await
}

/// Records, for each upload filed with a send id, that its replica waits
/// to read its own writes (`sync.checkpoints`): after the filing committed
/// and before the answers go, so that the pass which sees the record sees
/// every change committed before the answer. That pass writes the replica
/// a `Reached` message after everything it planned for it.
pub async fn checkpoint(
    client: &Client,
    uploads: &[(ReplicaId, Up)],
    filings: &[Result<Filing>],
) -> Result<()> {
    let (replicas, send_ids): (Vec<&str>, Vec<&[u8]>) = uploads
        .iter()
        .zip(filings)
        .filter(|((_, up), filing)| {
            matches!(filing, Ok(Filing::Filed { .. })) && !up.send_id.is_empty()
        })
        .map(|((replica, up), _)| (replica.as_str(), up.send_id.as_slice()))
        .unzip();
    if replicas.is_empty() {
        return Ok(());
    }
    store::checkpoints::record(client, &replicas, &send_ids).await
}

/// Files `up` within `outer`, behind a savepoint: a filing that waits, or
/// fails, is rolled back to where it began, and nothing of it stays.
async fn file_in(
    outer: &mut Transaction<'_>,
    engine: &Engine,
    by_rule: Option<&Graph>,
    replica: &ReplicaId,
    up: &Up,
) -> Result<Filing> {
    let mut tx = outer.savepoint("magic_sync_filing").await?;
    // Read here, not with the call's first statement: a call commits
    // every few savepoints, and a snapshot may have begun since.
    let provisioning = match store::filing::provisioning(&tx, replica).await? {
        Some(provisioning) => provisioning,
        None => {
            tx.rollback().await?;
            return Err(unknown(replica));
        }
    };
    let sequence = i64::try_from(up.sequence).unwrap_or(i64::MAX);
    let mut tally = Tally::default();
    for rows in &up.tables {
        let filing = TableFiling {
            engine,
            by_rule,
            replica,
            provisioning,
            sequence,
            rows,
        };
        if let Some(reason) = filing.file(&mut tx, &mut tally).await? {
            tx.rollback().await?;
            return Ok(Filing::Waits { reason });
        }
    }
    tx.commit().await?;
    Ok(Filing::Filed {
        answer: Filed {
            send_id: up.send_id.clone(),
            ..Filed::default()
        },
        taken: tally.taken,
        unchanged: tally.unchanged,
        refused: tally.refused,
    })
}

/// What an upload's rows came to so far.
#[derive(Debug, Default)]
struct Tally {
    taken: usize,
    unchanged: usize,
    refused: Vec<Refusal>,
}

/// One table's rows of an upload, and what filing them needs to know.
struct TableFiling<'a> {
    engine: &'a Engine,
    /// The graph, while the record leaves the rows a rule gives to it
    /// (`store::held::Ruled::ByRule`): whether the replica holds a row is
    /// then read by its rule too.
    by_rule: Option<&'a Graph>,
    replica: &'a str,
    /// Whether the replica is being provisioned again.
    provisioning: bool,
    /// The upload's sequence.
    sequence: i64,
    rows: &'a UpRows,
}

impl TableFiling<'_> {
    /// Files the table's rows: in bulk where the table takes them so, else
    /// one by one. Returns why the upload waits, if a row makes it wait.
    async fn file(&self, tx: &mut Transaction<'_>, tally: &mut Tally) -> Result<Option<String>> {
        let rows = self.rows;
        if self.engine.codec(&rows.table).is_none() {
            // Nothing of it can be filed: every row is refused, in one
            // statement rather than one a row.
            let reason = format!("the server declares no table `{}`", rows.table);
            self.refuse_all(tx, tally, reason).await?;
            return Ok(None);
        }
        let bulk = records_in_bulk(tx, self.engine, self.replica, rows).await?;
        let one_by_one = match &bulk {
            Some(_) => &[][..],
            None => &rows.rows[..],
        };
        if let Some(bulk) = bulk {
            tally.taken += bulk.taken;
            tally.unchanged += bulk.unchanged;
            for (key, data, reason) in bulk.refused {
                self.refuse(tx, tally, &key, Some(&data), reason).await?;
            }
        }
        let items = one_by_one
            .iter()
            .map(|r| (r.key.as_slice(), Some(r.data.as_slice())))
            .chain(rows.gone.iter().map(|k| (k.as_slice(), None)));
        for (key, data) in items {
            let outcome = self.file_row(tx, key, data).await?;
            match outcome {
                Outcome::Taken => tally.taken += 1,
                Outcome::Unchanged => tally.unchanged += 1,
                Outcome::Refused(reason) => self.refuse(tx, tally, key, data, reason).await?,
                Outcome::Waits(reason) => return Ok(Some(reason)),
            }
        }
        Ok(None)
    }

    /// Keeps every row (and key gone) of the table refused with `reason`,
    /// and counts them: one statement, a key's last row kept.
    async fn refuse_all(
        &self,
        tx: &Transaction<'_>,
        tally: &mut Tally,
        reason: String,
    ) -> Result<()> {
        let mut last: std::collections::BTreeMap<String, Option<&[u8]>> = Default::default();
        for row in &self.rows.rows {
            last.insert(
                String::from_utf8_lossy(&row.key).into_owned(),
                Some(row.data.as_slice()),
            );
        }
        for key in &self.rows.gone {
            last.insert(String::from_utf8_lossy(key).into_owned(), None);
        }
        let (keys, data): (Vec<String>, Vec<Option<&[u8]>>) = last.into_iter().unzip();
        let reason = reason::reason(&reason);
        store::filing::refused(
            tx,
            self.replica,
            &self.rows.table,
            &keys,
            &data,
            &reason,
            self.sequence,
        )
        .await?;
        tally.refused.extend(keys.into_iter().map(|key| Refusal {
            table: self.rows.table.clone(),
            key,
            reason: reason.clone(),
        }));
        Ok(())
    }

    /// Keeps a refused row with why, and counts it.
    async fn refuse(
        &self,
        tx: &Transaction<'_>,
        tally: &mut Tally,
        key: &[u8],
        data: Option<&[u8]>,
        reason: String,
    ) -> Result<()> {
        let refusal = Refusal::new(&self.rows.table, key, &reason);
        keep_refused(tx, self.replica, self.sequence, &refusal, data).await?;
        tally.refused.push(refusal);
        Ok(())
    }
}

/// Keeps a refused row in `sync.inbox`, as it came in the upload of
/// `sequence`, with why.
async fn keep_refused(
    tx: &Transaction<'_>,
    replica: &str,
    sequence: i64,
    refusal: &Refusal,
    data: Option<&[u8]>,
) -> Result<()> {
    store::filing::refused_one(
        tx,
        replica,
        sequence,
        &refusal.table,
        &refusal.key,
        data,
        &refusal.reason,
    )
    .await
}

impl TableFiling<'_> {
    /// Files one row (`data`, or `None` for a key gone) behind a savepoint,
    /// so that a row PostgreSQL refuses is refused alone.
    async fn file_row(
        &self,
        tx: &mut Transaction<'_>,
        key: &[u8],
        data: Option<&[u8]>,
    ) -> Result<Outcome> {
        let (replica, rows) = (self.replica, self.rows);
        let Some(codec) = self.engine.codec(&rows.table) else {
            return Ok(Outcome::Refused(format!(
                "the server declares no table `{}`",
                rows.table
            )));
        };
        let table = codec.table();
        if table.mirror == Mirror::Down {
            return Ok(Outcome::Refused(
                "a catalog: replicas do not write the server's tables".into(),
            ));
        }
        let json = match prepare(codec, replica, key, data) {
            Ok(json) => json,
            Err(reason) => return Ok(Outcome::Refused(reason)),
        };
        let savepoint = tx.savepoint("magic_sync_row").await?;
        let outcome = match (table.mirror, data.is_some()) {
            (Mirror::Up, true) => record(&savepoint, table, replica, &json).await,
            (Mirror::Up, false) => gone(&savepoint, table, replica, &json).await,
            (Mirror::Both, true) => self.owned(&savepoint, table, &json).await,
            (Mirror::Both, false) => Ok(Outcome::Refused(
                "a two-way row is the server's to delete".into(),
            )),
            (Mirror::Down, _) => unreachable!("refused above"),
        };
        match outcome {
            Ok(outcome) => {
                savepoint.commit().await?;
                Ok(outcome)
            }
            Err(Error::Postgres(e)) if crate::error::refuses_the_row(&e) => {
                savepoint.rollback().await?;
                Ok(Outcome::Refused(reason::postgres(&e)))
            }
            Err(e) => Err(e),
        }
    }
}

/// The row (`data`, or `None` for a key gone) as the JSON object
/// `jsonb_populate_record` reads, its origin set to `replica`; or why it is
/// refused: it does not decode, or its key is not the one it came under.
fn prepare(
    codec: &crate::wire::Codec,
    replica: &str,
    key: &[u8],
    data: Option<&[u8]>,
) -> std::result::Result<serde_json::Value, String> {
    let table = codec.table();
    let key_values = key_values(table, key)?;
    let json = match data {
        Some(bytes) => {
            let values = codec
                .decode(bytes)
                .map_err(|e| format!("the row does not decode: {e}"))?;
            let own: Vec<Value> = table
                .key_positions()
                .into_iter()
                .map(|i| values[i].clone())
                .collect();
            if canonical_key(&own).as_bytes() != key {
                return Err(format!(
                    "the row's key is not the key it came under: it is {}",
                    canonical_key(&own)
                ));
            }
            let mut json = object(table.columns.iter().map(|c| c.name).zip(values.iter()));
            if let (Some(stamp), serde_json::Value::Object(map)) = (codec.stamp(), &mut json) {
                stamp(replica, map).map_err(|e| format!("the host's stamp refused it: {e}"))?;
            }
            json
        }
        None => object(table.key.iter().copied().zip(key_values.iter())),
    };
    Ok(stamp_origin(table, json, replica))
}

/// Files the records of a run of uploads that carry nothing else
/// ([`records_only`]): per table, one statement for all of them, behind one
/// savepoint, that says which rows it took and which keys another replica
/// wrote first. `None` when PostgreSQL refused a row, or when two replicas
/// sent the same key: the run is then filed upload by upload, so that the
/// refusal falls on the right row.
async fn records_all(
    tx: &mut Transaction<'_>,
    engine: &Engine,
    run: &[(ReplicaId, Up)],
) -> Result<Option<Vec<Filing>>> {
    let mut by_table: BTreeMap<&str, Vec<(usize, &RowData)>> = BTreeMap::new();
    for (u, (_, up)) in run.iter().enumerate() {
        for rows in &up.tables {
            let table = by_table.entry(rows.table.as_str()).or_default();
            table.extend(rows.rows.iter().map(|row| (u, row)));
        }
    }
    let mut outcome = RunOutcome {
        taken: vec![0usize; run.len()],
        refusals: Vec::new(),
    };
    let savepoint = tx.savepoint("magic_sync_records").await?;
    for (name, rows) in by_table {
        if !outcome.table(&savepoint, engine, run, name, rows).await? {
            savepoint.rollback().await?;
            return Ok(None);
        }
    }
    // Kept within the savepoint: a refusal the inbox cannot take (a key
    // text cannot hold) sends the run upload by upload too.
    let mut refused: Vec<Vec<Refusal>> = run.iter().map(|_| Vec::new()).collect();
    for (u, refusal, data) in outcome.refusals {
        let sequence = i64::try_from(run[u].1.sequence).unwrap_or(i64::MAX);
        match keep_refused(&savepoint, &run[u].0, sequence, &refusal, Some(data)).await {
            Ok(()) => refused[u].push(refusal),
            Err(e) if e.is_transient() => return Err(e),
            Err(_) => {
                savepoint.rollback().await?;
                return Ok(None);
            }
        }
    }
    savepoint.commit().await?;
    Ok(Some(
        run.iter()
            .zip(outcome.taken)
            .zip(refused)
            .map(|(((_, up), taken), refused)| {
                let rows: usize = up.tables.iter().map(|t| t.rows.len()).sum();
                Filing::Filed {
                    answer: Filed {
                        send_id: up.send_id.clone(),
                        ..Filed::default()
                    },
                    taken,
                    unchanged: rows.saturating_sub(taken + refused.len()),
                    refused,
                }
            })
            .collect(),
    ))
}

/// What a run of uploads' records came to: per upload, the rows taken;
/// and (upload, refusal, the row as it came), kept once the rows are in.
struct RunOutcome<'r> {
    taken: Vec<usize>,
    refusals: Vec<(usize, Refusal, &'r [u8])>,
}

impl<'r> RunOutcome<'r> {
    /// Writes the run's records of table `name` in one statement. `false`
    /// when the run must go upload by upload instead: two replicas wrote
    /// one key, or PostgreSQL (or a host's trigger) refused a row.
    async fn table(
        &mut self,
        savepoint: &Transaction<'_>,
        engine: &Engine,
        run: &'r [(ReplicaId, Up)],
        name: &str,
        rows: Vec<(usize, &'r RowData)>,
    ) -> Result<bool> {
        let codec = engine.codec(name).expect("a declared table: records_only");
        let table = codec.table();
        let mut senders: HashMap<&[u8], &str> = HashMap::new();
        for (u, row) in &rows {
            let sender = run[*u].0.as_str();
            if *senders.entry(row.key.as_slice()).or_insert(sender) != sender {
                return Ok(false);
            }
        }
        let mut docs = Vec::with_capacity(rows.len());
        let mut kept = Vec::with_capacity(rows.len());
        for (u, row) in rows {
            match prepare(codec, &run[u].0, &row.key, Some(&row.data)) {
                Ok(json) => {
                    docs.push(json);
                    kept.push((u, row));
                }
                Err(reason) => self
                    .refusals
                    .push((u, refusal(name, &row.key, reason), &row.data)),
            }
        }
        if docs.is_empty() {
            return Ok(true);
        }
        let written = match insert_records(savepoint, table, docs)
            .await
            .map_err(Error::from)
        {
            Ok(rows) => rows,
            Err(e) if e.is_transient() => return Err(e),
            // PostgreSQL refused a row (a constraint, a value, a key twice
            // in a versioned table), or a host's trigger did: upload by
            // upload, the error lands on its own.
            Err(_) => return Ok(false),
        };
        for (i, owner) in written {
            let (u, data) = kept[i];
            match owner {
                None => self.taken[u] += 1,
                Some(owner) => self.refusals.push((
                    u,
                    refusal(
                        name,
                        &data.key,
                        format!("a record of this key was written by another replica (`{owner}`)"),
                    ),
                    &data.data,
                )),
            }
        }
        Ok(true)
    }
}

/// A refusal of the row of `key` in `table`.
fn refusal(table: &str, key: &[u8], reason: String) -> Refusal {
    Refusal::new(table, key, &reason)
}

/// What filing a table's records in bulk came to.
struct Bulk {
    taken: usize,
    unchanged: usize,
    /// (key, row, why) of each row refused.
    refused: Vec<(Vec<u8>, Vec<u8>, String)>,
}

/// Files the records of `rows` (not its keys gone) in one statement
/// ([`insert_records`]), behind a savepoint. `None` when they are not records, or when PostgreSQL refused
/// the insert (a row it cannot take, or a key twice): they are then filed
/// row by row, so that only the row it refuses is refused.
async fn records_in_bulk(
    tx: &mut Transaction<'_>,
    engine: &Engine,
    replica: &str,
    rows: &UpRows,
) -> Result<Option<Bulk>> {
    let Some(codec) = engine.codec(&rows.table) else {
        return Ok(None);
    };
    let table = codec.table();
    let (Mirror::Up, Some(_), true) = (table.mirror, table.origin, rows.rows.len() > 1) else {
        return Ok(None);
    };
    let mut bulk = Bulk {
        taken: 0,
        unchanged: 0,
        refused: Vec::new(),
    };
    let mut docs = Vec::new();
    let mut kept = Vec::new();
    for row in &rows.rows {
        match prepare(codec, replica, &row.key, Some(&row.data)) {
            Ok(json) => {
                docs.push(json);
                kept.push(row);
            }
            Err(reason) => bulk
                .refused
                .push((row.key.clone(), row.data.clone(), reason)),
        }
    }
    if docs.is_empty() {
        return Ok(Some(bulk));
    }
    let refused_before = bulk.refused.len();
    let savepoint = tx.savepoint("magic_sync_records").await?;
    match insert_records(&savepoint, table, docs).await {
        Ok(written) => {
            savepoint.commit().await?;
            for (i, owner) in written {
                let Some(owner) = owner else {
                    bulk.taken += 1;
                    continue;
                };
                let row = kept[i];
                bulk.refused.push((
                    row.key.clone(),
                    row.data.clone(),
                    format!("a record of this key was written by another replica (`{owner}`)"),
                ));
            }
            let others = bulk.refused.len() - refused_before;
            bulk.unchanged = kept.len().saturating_sub(bulk.taken + others);
            Ok(Some(bulk))
        }
        Err(e) if crate::error::refuses_a_row_of_many(&e) => {
            savepoint.rollback().await?;
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// Inserts the records `docs` (JSON objects of `table`'s columns, origin
/// stamped) in one statement, which says, by each doc's index: taken
/// (`None`; a key sent twice counts for its first doc), or refused because
/// another replica wrote the key first (`Some(owner)`, read in the
/// statement's own snapshot, before its insert). A doc in neither was
/// filed before, or is an older version.
async fn insert_records(
    tx: &Transaction<'_>,
    table: &Table,
    docs: Vec<serde_json::Value>,
) -> std::result::Result<Vec<(usize, Option<String>)>, tokio_postgres::Error> {
    let origin = table.origin.expect("records name their origin");
    let cols = columns(table).join(", ");
    let key: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
    let rows = tx
        .query(
            &format!(
                "WITH input AS (
                     SELECT e.{n}, r.* FROM jsonb_array_elements($1) WITH ORDINALITY AS e (doc, {n})
                     CROSS JOIN LATERAL jsonb_populate_record(NULL::{rel}, e.doc) r),
                 others AS (
                     SELECT input.{n}, t.{o}::text AS owner FROM input JOIN {rel} t ON {on_t}
                     WHERE t.{o}::text <> input.{o}::text),
                 written AS (
                     INSERT INTO {rel} AS t ({cols}) SELECT {cols} FROM input ORDER BY {n}
                     ON CONFLICT ({key}) {on_conflict} RETURNING {key})
                 SELECT min(input.{n}), NULL::text FROM written w JOIN input ON {on_w}
                 GROUP BY {w_key}
                 UNION ALL SELECT {n}, owner FROM others",
                n = ident("magic_sync ordinal"),
                rel = table.qualified(),
                o = ident(origin),
                on_t = key_match(table, "t", "input"),
                on_w = key_match(table, "w", "input"),
                key = key.join(", "),
                w_key = key
                    .iter()
                    .map(|k| format!("w.{k}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                on_conflict = on_conflict(table),
            ),
            &[&serde_json::Value::Array(docs)],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| {
            let ordinal: i64 = row.get(0);
            (usize::try_from(ordinal - 1).unwrap_or(0), row.get(1))
        })
        .collect())
}

/// What a record's insert does when its key is there already: nothing, or,
/// with a version column, take a newer version of the sender's own record.
fn on_conflict(table: &Table) -> String {
    match (table.version, table.origin) {
        (Some(version), Some(origin)) => {
            let set: Vec<String> = columns(table)
                .iter()
                .map(|c| format!("{c} = EXCLUDED.{c}"))
                .collect();
            format!(
                "DO UPDATE SET {} WHERE t.{o} = EXCLUDED.{o} AND t.{v} < EXCLUDED.{v}",
                set.join(", "),
                o = ident(origin),
                v = ident(version)
            )
        }
        _ => "DO NOTHING".into(),
    }
}

/// The values of a canonical key, by the key columns' kinds.
fn key_values(table: &Table, key: &[u8]) -> std::result::Result<Vec<Value>, String> {
    let json: serde_json::Value =
        serde_json::from_slice(key).map_err(|e| format!("the key is not a JSON array: {e}"))?;
    let serde_json::Value::Array(items) = json else {
        return Err("the key is not a JSON array".into());
    };
    if items.len() != table.key.len() {
        return Err(format!(
            "a key of the wrong number of values: {}, where `{}` is keyed by {}",
            items.len(),
            table.name,
            table.key.len()
        ));
    }
    table
        .key
        .iter()
        .zip(items)
        .map(|(k, item)| {
            let kind = table.column(k).map_or(Kind::Text, |c| c.kind);
            Value::from_json(kind, item).map_err(|e| format!("the key: {}", e.in_column(k)))
        })
        .collect()
}

/// The JSON object `jsonb_populate_record` reads: each value in the form
/// PostgreSQL's input of its column's type takes.
fn object<'v>(values: impl Iterator<Item = (&'static str, &'v Value)>) -> serde_json::Value {
    let mut map = serde_json::Map::new();
    for (name, value) in values {
        let json = match value {
            // bytea's input takes hex.
            Value::Bytes(b) => serde_json::Value::String(format!("\\x{}", hex::encode(b))),
            v => v.to_json(),
        };
        map.insert(name.to_string(), json);
    }
    serde_json::Value::Object(map)
}

/// The row with its origin column set to the sender.
fn stamp_origin(table: &Table, mut json: serde_json::Value, replica: &str) -> serde_json::Value {
    if let (Some(origin), serde_json::Value::Object(map)) = (table.origin, &mut json) {
        map.insert(
            origin.to_string(),
            serde_json::Value::String(replica.to_string()),
        );
    }
    json
}

fn columns(table: &Table) -> Vec<String> {
    table.columns.iter().map(|c| ident(c.name)).collect()
}

fn key_match(table: &Table, left: &str, right: &str) -> String {
    table
        .key
        .iter()
        .map(|k| format!("{left}.{k} = {right}.{k}", k = ident(k)))
        .collect::<Vec<_>>()
        .join(" AND ")
}

/// A record: kept from its first delivery, or replaced by a newer version
/// of the sender's own.
async fn record(
    tx: &Transaction<'_>,
    table: &Table,
    replica: &str,
    json: &serde_json::Value,
) -> Result<Outcome> {
    let cols = columns(table);
    let key: Vec<String> = table.key.iter().map(|k| ident(k)).collect();
    let on_conflict = on_conflict(table);
    let written = tx
        .execute(
            &format!(
                "INSERT INTO {rel} AS t ({list})
                 SELECT {list} FROM jsonb_populate_record(NULL::{rel}, $1)
                 ON CONFLICT ({key}) {on_conflict}",
                rel = table.qualified(),
                list = cols.join(", "),
                key = key.join(", "),
            ),
            &[json],
        )
        .await?;
    if written > 0 {
        return Ok(Outcome::Taken);
    }
    // Filed before, an older version, or another replica's record.
    let Some(origin) = table.origin else {
        return Ok(Outcome::Unchanged);
    };
    let owner: Option<String> = tx
        .query_opt(
            &format!(
                "SELECT t.{o}::text FROM {rel} t, jsonb_populate_record(NULL::{rel}, $1) r WHERE {m}",
                o = ident(origin),
                rel = table.qualified(),
                m = key_match(table, "t", "r"),
            ),
            &[json],
        )
        .await?
        .map(|r| r.get(0));
    Ok(match owner {
        Some(owner) if owner != replica => Outcome::Refused(format!(
            "a record of this key was written by another replica (`{owner}`)"
        )),
        _ => Outcome::Unchanged,
    })
}

/// A record the sender deleted: only from a table keyed by its origin, and
/// only its own.
async fn gone(
    tx: &Transaction<'_>,
    table: &Table,
    replica: &str,
    json: &serde_json::Value,
) -> Result<Outcome> {
    let Some(origin) = table.origin.filter(|o| table.key.contains(o)) else {
        return Ok(Outcome::Refused(format!(
            "a deleted record of `{}`, whose key does not name the replica that wrote it: \
             its records are not a replica's to delete",
            table.name
        )));
    };
    let deleted = tx
        .execute(
            &format!(
                "DELETE FROM {rel} t USING jsonb_populate_record(NULL::{rel}, $1) r
                 WHERE {m} AND t.{o}::text = $2",
                rel = table.qualified(),
                m = key_match(table, "t", "r"),
                o = ident(origin),
            ),
            &[json, &replica],
        )
        .await?;
    Ok(if deleted > 0 {
        Outcome::Taken
    } else {
        Outcome::Unchanged
    })
}

impl TableFiling<'_> {
    /// The columns the sender owns of a two-way row it holds, unless an
    /// upload of its newer than the upload's sequence already gave them (0:
    /// an upload that does not say, taken as it comes).
    async fn owned(
        &self,
        tx: &Transaction<'_>,
        table: &Table,
        json: &serde_json::Value,
    ) -> Result<Outcome> {
        let replica = self.replica;
        let held_key: Vec<String> = table
            .key
            .iter()
            .map(|k| format!("r.{}", ident(k)))
            .collect();
        let held_key = held_key.join(", ");
        let held = store::filing::holds(
            tx,
            &table.qualified(),
            table.name,
            &held_key,
            json,
            replica,
            self.by_rule,
        )
        .await?;
        if held {
            return owned_of_held(tx, table, replica, self.sequence, json, &held_key).await;
        }
        let exists: bool = tx
            .query_one(
                &format!(
                    "SELECT EXISTS (SELECT 1 FROM {rel} t, jsonb_populate_record(NULL::{rel}, $1) r WHERE {m})",
                    rel = table.qualified(),
                    m = key_match(table, "t", "r"),
                ),
                &[json],
            )
            .await?
            .get(0);
        Ok(if !exists {
            // Deleted on the server: its change wins.
            Outcome::Unchanged
        } else if self.provisioning {
            Outcome::Waits(format!(
                "replica `{replica}` is being provisioned: what it holds of `{}` is not recorded yet",
                table.name
            ))
        } else {
            Outcome::Refused(
                "a row the replica does not hold: never sent to it, or taken back".into(),
            )
        })
    }
}

/// The owned columns of a row the server records `replica` holding: taken,
/// unless a newer upload of the row was filed first (by `sequence`), or the
/// server deleted the row meanwhile (its change wins).
async fn owned_of_held(
    tx: &Transaction<'_>,
    table: &Table,
    replica: &str,
    sequence: i64,
    json: &serde_json::Value,
    held_key: &str,
) -> Result<Outcome> {
    if sequence > 0 {
        let newest = store::filing::filed_newest(
            tx,
            &table.qualified(),
            table.name,
            held_key,
            json,
            replica,
            sequence,
        )
        .await?;
        if !newest {
            // Filed after a newer upload of the same row.
            return Ok(Outcome::Unchanged);
        }
    }
    let set: Vec<String> = table
        .owned
        .iter()
        .map(|c| format!("{c} = r.{c}", c = ident(c)))
        .collect();
    let updated = tx
        .execute(
            &format!(
                "UPDATE {rel} t SET {set} FROM jsonb_populate_record(NULL::{rel}, $1) r WHERE {m}",
                rel = table.qualified(),
                set = set.join(", "),
                m = key_match(table, "t", "r"),
            ),
            &[json],
        )
        .await?;
    // None updated: deleted on the server, whose change wins.
    Ok(if updated > 0 {
        Outcome::Taken
    } else {
        Outcome::Unchanged
    })
}

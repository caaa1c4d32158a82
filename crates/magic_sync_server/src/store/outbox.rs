//! The outbox (`sync.outbox`, its bodies shared in `sync.bodies`): each
//! replica's messages, numbered from `sync.message_seq`, kept until the
//! replica acknowledged them. `crate::relay::outbox` numbers, chains and
//! seals what a pass writes here; `crate::relay::publish` sends it.

use crate::error::{Error, Result};
use crate::sql;
use crate::store::cohorts::OWED;

/// About the bytes a member's head and seal add to a cohort's message
/// body: what counting its owed messages against the bound adds for each.
pub(crate) const HEAD_AND_SEAL: i64 = 160;
use std::time::Duration;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{GenericClient, SimpleQueryMessage, Statement, Transaction};

/// The statements that write messages, prepared once per pass: each then
/// runs in one round trip instead of two (prepare, then run), and the two
/// of a batch go together.
#[derive(Debug)]
pub(crate) struct Statements {
    bodies: Statement,
    outbox: Statement,
}

impl Statements {
    pub async fn prepare(tx: &Transaction<'_>) -> Result<Statements> {
        Ok(Statements {
            bodies: tx
                .prepare(
                    "INSERT INTO sync.bodies (hash, bytes) SELECT * FROM unnest($1::bytea[], $2::bytea[])
                     ON CONFLICT (hash) DO NOTHING",
                )
                .await?,
            outbox: tx
                .prepare(
                    "INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
                     SELECT o.replica, o.number, o.nonce, o.head, b.id, o.seal
                     FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bytea[], $5::bytea[], $6::bytea[])
                          AS o (replica, number, nonce, head, hash, seal)
                     JOIN sync.bodies b ON b.hash = o.hash",
                )
                .await?,
        })
    }
}

/// Messages to write, column by column; each names its body by hash.
#[derive(Default)]
pub(crate) struct Rows {
    pub replica: Vec<String>,
    pub number: Vec<i64>,
    pub nonce: Vec<Vec<u8>>,
    pub head: Vec<Vec<u8>>,
    pub hash: Vec<Vec<u8>>,
    pub seal: Vec<Vec<u8>>,
}

/// Writes the bodies (`hashes`, `bytes`; one already kept is kept once)
/// and the messages naming them, sent together and run in order: the
/// messages find their bodies.
pub(crate) async fn insert(
    tx: &Transaction<'_>,
    statements: &Statements,
    hashes: &[Vec<u8>],
    bytes: &[Vec<u8>],
    rows: &Rows,
) -> Result<()> {
    let body_params: [&(dyn ToSql + Sync); 2] = [&hashes, &bytes];
    let outbox_params: [&(dyn ToSql + Sync); 6] = [
        &rows.replica,
        &rows.number,
        &rows.nonce,
        &rows.head,
        &rows.hash,
        &rows.seal,
    ];
    tokio::try_join!(
        tx.execute(&statements.bodies, &body_params),
        tx.execute(&statements.outbox, &outbox_params)
    )?;
    Ok(())
}

/// Forgets the bodies no message carries any more, for a pass's closing
/// batch. Not where messages are published: publishing runs beside a
/// pass, and could delete a body the pass is pointing a new message at,
/// unseen until it commits.
///
/// A body stays while a message or a cohort's batch carries it. Only the
/// bodies of messages and batches deleted since the last pass are looked at
/// (`sync.freed`, filled by a trigger on each), each by its key: a
/// pass costs the messages that went, not the outbox's size. What the
/// pass's view holds of `sync.freed` is what it deletes there; bodies
/// freed by a transaction that committed after the view was taken wait for
/// the next pass.
pub(crate) const FORGET_UNCARRIED_BODIES: &str = "DELETE FROM sync.bodies b
     WHERE b.id = ANY (ARRAY (SELECT DISTINCT body FROM sync.freed))
       AND NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.body = b.id)
       AND NOT EXISTS (SELECT 1 FROM sync.batches c WHERE c.body = b.id);
     DELETE FROM sync.freed;";

/// The next `n` message numbers, in order.
pub(crate) async fn draw(tx: &Transaction<'_>, n: usize) -> Result<Vec<i64>> {
    let mut numbers: Vec<i64> = Vec::with_capacity(n);
    let sql = format!("SELECT nextval('sync.message_seq') FROM generate_series(1, {n})");
    for message in tx.simple_query(&sql).await? {
        if let SimpleQueryMessage::Row(row) = message {
            let number = row
                .get(0)
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| Error::Damaged {
                    what: "sync.message_seq gave no number".into(),
                })?;
            numbers.push(number);
        }
    }
    numbers.sort_unstable();
    Ok(numbers)
}

/// Where one replica's chain stands after a pass wrote to it.
pub(crate) struct Moved<'a> {
    pub id: String,
    /// Its last message.
    pub number: i64,
    pub nonce: &'a [u8],
    /// The first message of the snapshot written this pass, if one was.
    pub snapshot: Option<i64>,
}

/// The statement recording where each chain in `moved` now stands, for the
/// pass's closing batch; empty when nothing moved. A snapshot is written
/// whole in one pass: its last message is the replica's last of the pass.
pub(crate) fn chains_moved(moved: &[Moved<'_>]) -> String {
    if moved.is_empty() {
        return String::new();
    }
    let values: Vec<String> = moved
        .iter()
        .map(|m| {
            format!(
                "({}, {}::int8, {}, {}::int8)",
                sql::escaped(&m.id),
                m.number,
                sql::bytea(m.nonce),
                m.snapshot.map_or("NULL".to_string(), |n| n.to_string())
            )
        })
        .collect();
    format!(
        "UPDATE sync.replicas r SET last_number = u.number, last_nonce = u.nonce,
             snapshot_number = coalesce(u.snapshot, r.snapshot_number),
             snapshot_last = CASE WHEN u.snapshot IS NULL THEN r.snapshot_last ELSE u.number END,
             provision = r.provision AND u.snapshot IS NULL
         FROM (VALUES {}) AS u (id, number, nonce, snapshot)
         WHERE r.id = u.id;",
        values.join(", ")
    )
}

/// Marks every live replica whose outbox beyond the snapshot it begins with
/// holds more than `messages` messages or `bytes` bytes to be provisioned
/// again, with an alarm saying why. Returns those replicas. A member of a
/// cohort counts the cohort's messages it is owed too: one away holds them
/// back from being forgotten, until it is provisioned again.
pub(crate) async fn past_bound(
    tx: &Transaction<'_>,
    messages: i64,
    bytes: i64,
) -> Result<Vec<String>> {
    let rows = tx
        .query(
            &format!(
                "WITH owed AS (
                 SELECT replica, count(*) AS messages, sum(bytes)::int8 AS bytes FROM (
                     SELECT o.replica,
                            octet_length(o.head) + octet_length(o.seal) + octet_length(b.bytes) AS bytes
                     FROM sync.outbox o
                     JOIN sync.replicas r ON r.id = o.replica
                     JOIN sync.bodies b ON b.id = o.body
                     WHERE o.number > r.snapshot_last AND r.live AND NOT r.provision
                     UNION ALL
                     -- A cohort's messages a member is owed, each with
                     -- about as much head and seal as one of its own.
                     SELECT w.replica, {HEAD_AND_SEAL} + octet_length(b.bytes)
                     FROM ({OWED}) w
                     JOIN sync.replicas r ON r.id = w.replica
                     JOIN sync.bodies b ON b.id = w.body
                     WHERE r.live AND NOT r.provision) w
                 GROUP BY replica)
             UPDATE sync.replicas r SET provision = true, alarm_at = now(),
                 alarm = format('its outbox outgrew its bound: %s messages, %s bytes beyond the snapshot it begins with '
                     '(at most %s messages, %s bytes); dropped, and the replica provisioned again',
                     owed.messages, owed.bytes, $1::int8, $2::int8)
             FROM owed
             WHERE owed.replica = r.id AND (owed.messages > $1::int8 OR owed.bytes > $2::int8)
             RETURNING r.id"
            ),
            &[&messages, &bytes],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Marks to be provisioned again every replica whose snapshot's end seems
/// lost on the way: its chain runs past what it acknowledged, nothing it is
/// owed past that (of its outbox, or of a cohort it joined meanwhile) is
/// there to show a gap, and it said nothing new for `after` since the
/// snapshot ended. Returns those replicas.
pub(crate) async fn snapshot_end_lost(
    tx: &Transaction<'_>,
    after: Duration,
) -> Result<Vec<String>> {
    let rows = tx
        .query(
            &format!(
                "UPDATE sync.replicas r SET provision = true,
                     last_error = 'the end of its snapshot was lost on the way: provisioned again'
                 FROM sync.replicas s LEFT JOIN sync.acks a ON a.replica = s.id
                 WHERE s.id = r.id AND r.live AND NOT r.provision AND r.snapshot_attempt IS NULL
                   AND r.snapshot_last > coalesce(a.number, 0) AND r.last_number > coalesce(a.number, 0)
                   AND greatest(a.at, r.snapshot_ended_at) < now() - $1::float8 * interval '1 second'
                   AND NOT EXISTS (SELECT 1 FROM sync.outbox o
                                   WHERE o.replica = r.id AND o.number > coalesce(a.number, 0))
                   AND NOT EXISTS (SELECT 1 FROM ({OWED}) w WHERE w.replica = r.id)
                 RETURNING r.id"
            ),
            &[&after.as_secs_f64()],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// One message as it waits in the outbox.
pub(crate) struct Waiting {
    pub replica: magic_sync_core::ReplicaId,
    pub number: i64,
    pub nonce: Vec<u8>,
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    pub hash: Vec<u8>,
    pub seal: Vec<u8>,
    /// Its replica said it verifies messages signed in a batch.
    pub reads_batches: bool,
    /// Sent before, and not acknowledged since.
    pub resent: bool,
    /// A cohort's message, stamped for this member of it as it is sent.
    pub batched: bool,
}

/// The outbox's page: `$1`, `$2` where the open range begins (replica,
/// number), `$3` the most messages, `$4` the most bytes before the last,
/// `$5` the resend interval in seconds, `$6`–`$8` the ranges before each
/// replica passed over (low replica, low number, high replica).
const PAGE: &str = "SELECT replica, number, nonce, head, bytes, hash, seal, reads_batches, resent FROM (
                 SELECT o.replica, o.number, o.nonce, o.head, b.bytes, b.hash, o.seal, o.resent,
                        coalesce((SELECT a.reads_batches FROM sync.acks a
                                  WHERE a.replica = o.replica), false) AS reads_batches,
                        sum(length(b.bytes)) OVER (ORDER BY o.replica, o.number) - length(b.bytes) AS before
                 FROM (
                     SELECT w.* FROM unnest($6::text[], $7::int8[], $8::text[]) AS r (low, number, high)
                     CROSS JOIN LATERAL (
                         SELECT o.replica, o.number, o.nonce, o.head, o.body, o.seal,
                                o.sent_at IS NOT NULL AS resent
                         FROM sync.outbox o
                         WHERE (o.replica, o.number) > (r.low, r.number) AND o.replica < r.high
                           AND (o.sent_at IS NULL OR o.sent_at < now() - $5::float8 * interval '1 second')
                         ORDER BY o.replica, o.number LIMIT $3) w
                     UNION ALL
                     (SELECT o.replica, o.number, o.nonce, o.head, o.body, o.seal,
                             o.sent_at IS NOT NULL AS resent
                      FROM sync.outbox o
                      WHERE (o.replica, o.number) > ($1, $2)
                        AND (o.sent_at IS NULL OR o.sent_at < now() - $5::float8 * interval '1 second')
                      ORDER BY o.replica, o.number LIMIT $3)
                 ) o
                 CROSS JOIN LATERAL (SELECT b.bytes, b.hash FROM sync.bodies b
                                     WHERE b.id = o.body OFFSET 0) b
                 ORDER BY o.replica, o.number LIMIT $3) page
             WHERE before < $4";

/// The messages after `after` (replica, number) in order that were never
/// sent, or were sent more than `resend` ago and are still not
/// acknowledged: at most `limit`, and whole messages until their bytes
/// pass `bytes` (at least one). The replicas in `skip` are passed over
/// without reading a row of theirs: the outbox is read in ranges of the
/// primary key between them, each by the index, in one statement.
pub(crate) async fn page(
    client: &impl GenericClient,
    after: &(String, i64),
    limit: i64,
    bytes: i64,
    resend: Duration,
    skip: &std::collections::BTreeSet<String>,
) -> Result<Vec<Waiting>> {
    let resend = resend.as_secs_f64();
    let ranges = Ranges::of(after, skip);
    // Typed, so parsed and run in one round trip.
    let params: [(&(dyn ToSql + Sync), Type); 8] = [
        (&ranges.low.0, Type::TEXT),
        (&ranges.low.1, Type::INT8),
        (&limit, Type::INT8),
        (&bytes, Type::INT8),
        (&resend, Type::FLOAT8),
        (&ranges.lows, Type::TEXT_ARRAY),
        (&ranges.numbers, Type::INT8_ARRAY),
        (&ranges.highs, Type::TEXT_ARRAY),
    ];
    let rows = client.query_typed(PAGE, &params).await?;
    Ok(rows.iter().map(Waiting::read).collect())
}

/// The ranges of the outbox's key a page reads, between the replicas it
/// passes over, from `after` on: `low` begins the last, open one.
struct Ranges {
    low: (String, i64),
    lows: Vec<String>,
    numbers: Vec<i64>,
    highs: Vec<String>,
}

impl Ranges {
    fn of(after: &(String, i64), skip: &std::collections::BTreeSet<String>) -> Ranges {
        let (mut lows, mut numbers, mut highs) = (Vec::new(), Vec::new(), Vec::new());
        let mut low = after.clone();
        for replica in skip.range(after.0.clone()..) {
            lows.push(low.0);
            numbers.push(low.1);
            highs.push(replica.clone());
            low = (replica.clone(), i64::MAX);
        }
        Ranges {
            low,
            lows,
            numbers,
            highs,
        }
    }
}

impl Waiting {
    /// One row of [`PAGE`].
    fn read(row: &tokio_postgres::Row) -> Waiting {
        Waiting {
            replica: row.get::<_, String>(0).into(),
            number: row.get(1),
            nonce: row.get(2),
            head: row.get(3),
            body: row.get(4),
            hash: row.get(5),
            seal: row.get(6),
            reads_batches: row.get(7),
            resent: row.get(8),
            batched: false,
        }
    }
}

/// Marks sent each replica's messages up to the number beside it: they
/// stay until the replica acknowledges them, and are sent again once
/// `resend` passed.
pub(crate) async fn mark_sent(
    client: &impl GenericClient,
    replicas: &[String],
    numbers: &[i64],
    resend: Duration,
) -> Result<()> {
    client
        .query_typed(
            // Each replica's messages looked up by the key, in a fenced
            // lateral: a join PostgreSQL might hash would scan the outbox
            // whole, and with it whatever waits for replicas away.
            "UPDATE sync.outbox o SET sent_at = now()
             WHERE o.ctid = ANY (ARRAY (
                 SELECT m.ctid FROM unnest($1::text[], $2::int8[]) AS t (replica, number)
                 CROSS JOIN LATERAL (
                     SELECT w.ctid FROM sync.outbox w
                     WHERE w.replica = t.replica AND w.number <= t.number
                       AND (w.sent_at IS NULL OR w.sent_at < now() - $3::float8 * interval '1 second')
                     OFFSET 0) m))",
            &[
                (&replicas, Type::TEXT_ARRAY),
                (&numbers, Type::INT8_ARRAY),
                (&resend.as_secs_f64(), Type::FLOAT8),
            ],
        )
        .await?;
    Ok(())
}

/// Records why sends to `ids` failed (`errors`, beside them) in
/// `sync.replicas.last_error`. A replica still failing for the same reason
/// keeps its row as it is: the relay may be recording on another
/// connection, and a row rewritten under its snapshot would make that pass
/// fail.
pub(crate) async fn failed(
    client: &impl GenericClient,
    ids: &[&str],
    errors: &[String],
) -> Result<()> {
    if !ids.is_empty() {
        client
            .execute(
                "UPDATE sync.replicas r SET last_error = f.error
                 FROM unnest($1::text[], $2::text[]) AS f (id, error)
                 WHERE r.id = f.id AND r.last_error IS DISTINCT FROM f.error",
                &[&ids, &errors],
            )
            .await?;
    }
    Ok(())
}

/// Clears the send error of the replicas `sent` (every send to them in a
/// publish went through), unless they wait for a snapshot. By their keys:
/// nothing of a replica away is read, however much waits for it.
pub(crate) async fn recovered(client: &impl GenericClient, sent: &[&str]) -> Result<()> {
    if sent.is_empty() {
        return Ok(());
    }
    client
        .query_typed(
            "UPDATE sync.replicas SET last_error = NULL
             WHERE id = ANY($1) AND last_error IS NOT NULL
               AND NOT provision AND snapshot_attempt IS NULL",
            &[(&sent, Type::TEXT_ARRAY)],
        )
        .await?;
    Ok(())
}

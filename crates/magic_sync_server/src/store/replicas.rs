//! The replicas as the relay last saw them (`sync.replicas`): live or not,
//! their partition, whether each waits for a snapshot or streams one, and
//! where its chain of messages stands. The host's list is compared with it
//! at every pass (`crate::relay::observe`).

use crate::error::Result;
use crate::sql::{bytea, text_array};
use std::collections::HashMap;
use tokio_postgres::{GenericClient, Transaction};

/// Per replica recorded: whether it is live, and its partition.
pub(crate) async fn known(tx: &Transaction<'_>) -> Result<HashMap<String, (bool, Option<String>)>> {
    Ok(tx
        .query_typed("SELECT id, live, partition_id FROM sync.replicas", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect())
}

/// Records `id` live in `partition` and waiting for a snapshot; a snapshot
/// of it that streams (for a partition it left) is ended: its worker will
/// find its attempt gone.
pub(crate) async fn wait_for_snapshot(
    tx: &Transaction<'_>,
    id: &str,
    partition: Option<&str>,
) -> Result<()> {
    tx.execute(
        "INSERT INTO sync.replicas (id, live, partition_id, provision) VALUES ($1, true, $2, true)
         ON CONFLICT (id) DO UPDATE SET live = true, partition_id = $2, provision = true,
             snapshot = NULL, snapshot_attempt = NULL, snapshot_began_at = NULL,
             observed_at = now()",
        &[&id, &partition],
    )
    .await?;
    Ok(())
}

/// Records `id` listed but not live: provisioned afresh should it be live
/// again.
pub(crate) async fn quiet(tx: &Transaction<'_>, id: &str) -> Result<()> {
    tx.execute(
        "INSERT INTO sync.replicas (id, live, provision) VALUES ($1, false, true)
         ON CONFLICT (id) DO UPDATE SET live = false, provision = true,
             snapshot = NULL, snapshot_attempt = NULL, snapshot_began_at = NULL,
             observed_at = now()",
        &[&id],
    )
    .await?;
    Ok(())
}

/// Drops the replicas the host no longer lists.
pub(crate) async fn drop(tx: &Transaction<'_>, gone: &[String]) -> Result<()> {
    if !gone.is_empty() {
        tx.execute("DELETE FROM sync.replicas WHERE id = ANY($1)", &[&gone])
            .await?;
    }
    Ok(())
}

/// Forgets everything recorded for `ids`: nothing held by them, nothing
/// owed to them.
pub(crate) async fn forget(tx: &Transaction<'_>, ids: &[String]) -> Result<()> {
    if ids.is_empty() {
        return Ok(());
    }
    tx.batch_execute(&format!(
        "DELETE FROM sync.held WHERE replica = ANY({ids});
         DELETE FROM sync.left_to_rule WHERE replica = ANY({ids});
         DELETE FROM sync.let_go WHERE replica = ANY({ids});
         DELETE FROM sync.outbox WHERE replica = ANY({ids});
         DELETE FROM sync.deferred WHERE replica = ANY({ids});
         DELETE FROM sync.backlogs WHERE replica = ANY({ids});
         DELETE FROM sync.filed WHERE replica = ANY({ids});
         DELETE FROM sync.checkpoints WHERE replica = ANY({ids});
         DELETE FROM sync.blocked WHERE replica = ANY({ids});
         DELETE FROM sync.members WHERE replica = ANY({ids});",
        ids = text_array(ids.iter().map(String::as_str))
    ))
    .await?;
    Ok(())
}

/// A live replica as recorded.
pub(crate) struct Live {
    pub id: String,
    pub partition: Option<String>,
    /// Waiting for a snapshot.
    pub provision: bool,
    /// A snapshot of it streams.
    pub streaming: bool,
    pub last_number: i64,
    pub last_nonce: Vec<u8>,
    /// It takes the rows of the `all` tables from their cohort
    /// (`sync.members`).
    pub member: bool,
    /// The cohort's newest message and its own nonce, when that is the
    /// newest message of the replica's chain: sent it in the cohort's
    /// messages, past its own last.
    pub part: Option<(i64, Vec<u8>)>,
}

/// Records the chains of `replicas` standing at `numbers`, with `nonces`.
pub(crate) async fn chains_at(
    client: &impl tokio_postgres::GenericClient,
    replicas: &[&str],
    numbers: &[i64],
    nonces: &[Vec<u8>],
) -> Result<()> {
    if replicas.is_empty() {
        return Ok(());
    }
    client
        .execute(
            "UPDATE sync.replicas r SET last_number = u.number, last_nonce = u.nonce
             FROM unnest($1::text[], $2::int8[], $3::bytea[]) AS u (id, number, nonce)
             WHERE r.id = u.id",
            &[&replicas, &numbers, &nonces],
        )
        .await?;
    Ok(())
}

/// The live replicas, by id.
pub(crate) async fn live(tx: &Transaction<'_>) -> Result<Vec<Live>> {
    Ok(tx
        .query_typed(
            "SELECT id, partition_id, provision, snapshot_attempt IS NOT NULL, last_number, last_nonce,
                    c.member IS NOT NULL, c.newest, c.newest_nonce
             FROM sync.replicas r
             LEFT JOIN LATERAL (
                 SELECT true AS member,
                        CASE WHEN c.newest > greatest(m.since, r.last_number) THEN c.newest END AS newest,
                        c.newest_nonce
                 FROM sync.members m JOIN sync.cohorts c ON c.id = m.cohort
                 WHERE m.replica = r.id) c ON true
             WHERE live ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|row| Live {
            id: row.get(0),
            partition: row.get(1),
            provision: row.get(2),
            streaming: row.get(3),
            last_number: row.get(4),
            last_nonce: row.get(5),
            member: row.get(6),
            part: row
                .get::<_, Option<i64>>(7)
                .zip(row.get::<_, Option<Vec<u8>>>(8)),
        })
        .collect())
}

/// Marks replicas to be provisioned again: those recorded holding a row of
/// `holding` when given, else every one. Serialises with the relay's
/// passes, which rewrite these rows. Returns the ids marked.
pub(crate) async fn provision_again(
    tx: &impl GenericClient,
    holding: Option<&str>,
) -> Result<Vec<String>> {
    tx.batch_execute("LOCK TABLE sync.replicas IN SHARE ROW EXCLUSIVE MODE")
        .await?;
    // A cohort holding such rows is made again too.
    crate::store::cohorts::forget(tx, holding, None).await?;
    let rows = match holding {
        None => {
            tx.query(
                "UPDATE sync.replicas SET provision = true WHERE NOT provision RETURNING id",
                &[],
            )
            .await?
        }
        Some(table) => {
            tx.query(
                "UPDATE sync.replicas SET provision = true
                 WHERE NOT provision AND id IN (SELECT replica FROM sync.held WHERE table_name = $1)
                 RETURNING id",
                &[&table],
            )
            .await?
        }
    };
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// What a replica is told of the declarations.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Told {
    /// What they make of its tables.
    Described,
    /// That it holds them whole.
    Configured,
}

impl Told {
    fn column(self) -> &'static str {
        match self {
            Told::Described => "described",
            Told::Configured => "configured",
        }
    }
}

/// Of `kept`, the replicas not told `what` of the declarations whose
/// fingerprint is `schema`, by id.
pub(crate) async fn not_told(
    tx: &Transaction<'_>,
    kept: &[&str],
    what: Told,
    schema: &[u8],
) -> Result<Vec<String>> {
    let rows = tx
        .query(
            &format!(
                "SELECT id FROM sync.replicas
                 WHERE id = ANY($1) AND {} IS DISTINCT FROM $2 ORDER BY id",
                what.column()
            ),
            &[&kept, &schema],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// The statement recording that `replicas` were told `what` of the
/// declarations whose fingerprint is `print`, for a pass's closing batch.
pub(crate) fn told(replicas: &[String], what: Told, print: &[u8]) -> String {
    format!(
        "UPDATE sync.replicas SET {} = {} WHERE id = ANY({});",
        what.column(),
        bytea(print),
        text_array(replicas.iter().map(String::as_str))
    )
}

/// Has each of `replicas`, which could not follow the message numbered
/// beside it in `numbers` of the epoch beside it in `epochs`, provisioned
/// again, unless a snapshot that began after that message (of the
/// installation's epoch) is already on its way: one statement for all of
/// them. A replica already waiting for a snapshot keeps waiting as it was:
/// one the server is to provision for its own reasons (a new epoch) is not
/// held back to the pace of a replica's asking, and its row is not written
/// again (a replica saying gaps as fast as it can would otherwise have it
/// rewritten hundreds of times a second). Returns those it marked.
pub(crate) async fn provision_after_gaps(
    client: &impl GenericClient,
    replicas: &[&str],
    epochs: &[&[u8]],
    numbers: &[i64],
) -> Result<Vec<String>> {
    let rows = client
        .query(
            "UPDATE sync.replicas r SET provision = true,
                 provision_asked = r.provision_asked OR NOT r.provision
             FROM unnest($1::text[], $2::bytea[], $3::int8[]) AS g (id, epoch, number),
                  sync.epoch e
             WHERE r.id = g.id AND r.live AND NOT r.provision
               AND NOT (g.epoch = e.id AND r.snapshot_number > g.number)
             RETURNING r.id",
            &[&replicas, &epochs, &numbers],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

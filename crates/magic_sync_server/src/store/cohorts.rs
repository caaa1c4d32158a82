//! The cohorts (`sync.cohorts`, how-it-works §20): rows many replicas hold
//! alike, recorded once. A cohort is a holder in `sync.held` under an id no
//! replica can have: it begins with a control character, which the relay
//! refuses in a replica's id.
//!
//! The first one is the cohort of the tables whose rule is `all`
//! ([`ALL`]), recorded while `Settings::record_by_rule` is on. It is made
//! between passes from one view of the database (`relay::cohort`), then
//! planned by every pass like a replica, its difference recorded at the
//! pass's last number. Replicas [`join`] it once a pass recorded what they
//! hold; each member is then sent what the cohort is, in its own messages,
//! and its own record holds its own rows alone.

use crate::error::Result;
use tokio_postgres::GenericClient;

/// The cohort of the tables whose rule is `all`, as a holder.
pub(crate) const ALL: &str = "\u{1}all";

/// Whether `holder` is a cohort's id rather than a replica's.
pub(crate) fn is_cohort(holder: &str) -> bool {
    holder.starts_with('\u{1}')
}

/// Whether the cohort [`ALL`] is recorded.
pub(crate) async fn exists(client: &impl GenericClient) -> Result<bool> {
    Ok(client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sync.cohorts WHERE id = $1)",
            &[&ALL],
        )
        .await?
        .get(0))
}

/// Clears what is recorded under [`ALL`] before it is made: nothing, unless
/// its row in `sync.cohorts` was deleted by hand.
pub(crate) async fn clear(client: &impl GenericClient) -> Result<()> {
    client
        .execute("DELETE FROM sync.held WHERE replica = $1", &[&ALL])
        .await?;
    client
        .execute("DELETE FROM sync.blocked WHERE replica = $1", &[&ALL])
        .await?;
    Ok(())
}

/// Records the cohort [`ALL`] as made, in the transaction that recorded
/// its rows.
pub(crate) async fn record(client: &impl GenericClient) -> Result<()> {
    client
        .execute(
            "INSERT INTO sync.cohorts (id, kind) VALUES ($1, 'all')",
            &[&ALL],
        )
        .await?;
    Ok(())
}

/// Forgets the cohort [`ALL`], rows, blocks and all, when it holds a row of
/// `holding` (any table when `None`); the relay makes it again before its
/// next pass. Its members hold its rows again themselves first: each is
/// recorded holding every row the cohort holds, carried by the message the
/// cohort's was, or by the one it joined at when later, and held back
/// from what the cohort was. Returns whether it was forgotten.
///
/// What makes a replica provisioned again makes the cohort again: a
/// changed key or encoding of a table it holds, triggers found missing, a
/// restore; its members, holding those rows again, are provisioned again
/// with the other holders.
pub(crate) async fn forget(client: &impl GenericClient, holding: Option<&str>) -> Result<bool> {
    let forgotten = client
        .query_one(
            "WITH gone AS (
                 DELETE FROM sync.cohorts c WHERE c.id = $1
                   AND ($2::text IS NULL
                        OR EXISTS (SELECT 1 FROM sync.held h
                                   WHERE h.table_name = $2 AND h.replica = c.id))
                 RETURNING id),
             members AS (
                 SELECT m.replica, m.since FROM sync.members m
                 WHERE m.cohort IN (SELECT id FROM gone)),
             held_back AS (
                 INSERT INTO sync.held (replica, table_name, key, version, message, ruled, ptrs, refs)
                 SELECT m.replica, h.table_name, h.key, h.version, greatest(h.message, m.since),
                        h.ruled, h.ptrs, h.refs
                 FROM sync.held h CROSS JOIN members m
                 WHERE h.replica IN (SELECT id FROM gone)),
             blocked_back AS (
                 INSERT INTO sync.blocked (replica, table_name, key, root_table, root_key, settled)
                 SELECT m.replica, b.table_name, b.key, b.root_table, b.root_key, b.settled
                 FROM sync.blocked b CROSS JOIN members m
                 WHERE b.replica IN (SELECT id FROM gone)
                 ON CONFLICT DO NOTHING),
             held AS (DELETE FROM sync.held WHERE replica IN (SELECT id FROM gone)),
             blocked AS (DELETE FROM sync.blocked WHERE replica IN (SELECT id FROM gone))
             SELECT count(*) FROM gone",
            &[&ALL, &holding],
        )
        .await?
        .get::<_, i64>(0);
    Ok(forgotten > 0)
}

/// Makes those of `replicas` members of the cohort [`ALL`] whose record
/// holds exactly what the cohort holds of `tables` (the tables it holds
/// rows of): their rows and blocks of those tables are forgotten, the
/// cohort's standing for them, and each joins at the message its chain
/// stands at. Run at the end of a pass, once the record is the pass's.
/// Returns those that joined.
pub(crate) async fn join(
    client: &impl GenericClient,
    replicas: &[String],
    tables: &[&str],
) -> Result<Vec<String>> {
    if replicas.is_empty() {
        return Ok(Vec::new());
    }
    let alike: Vec<String> = client
        .query(
            "WITH c AS (SELECT table_name, key FROM sync.held WHERE replica = $1),
                  m AS (SELECT replica, table_name, key FROM sync.held
                        WHERE replica = ANY ($2) AND table_name = ANY ($3))
             SELECT r FROM unnest($2::text[]) r
             WHERE NOT EXISTS (SELECT table_name, key FROM m WHERE m.replica = r
                               EXCEPT SELECT table_name, key FROM c)
               AND NOT EXISTS (SELECT table_name, key FROM c
                               EXCEPT SELECT table_name, key FROM m WHERE m.replica = r)",
            &[&ALL, &replicas, &tables],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    if alike.is_empty() {
        return Ok(alike);
    }
    client
        .execute(
            "WITH held AS (DELETE FROM sync.held WHERE replica = ANY ($2) AND table_name = ANY ($3)),
                  blocked AS (DELETE FROM sync.blocked
                              WHERE replica = ANY ($2) AND table_name = ANY ($3))
             INSERT INTO sync.members (replica, cohort, since, since_nonce)
             SELECT id, $1, last_number, last_nonce FROM sync.replicas WHERE id = ANY ($2)",
            &[&ALL, &alike, &tables],
        )
        .await?;
    Ok(alike)
}

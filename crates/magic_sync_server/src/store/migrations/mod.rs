//! The `sync` schema: the engine's own tables in the server database,
//! installed and upgraded by numbered migrations.

use crate::error::{Error, Result};
use tokio_postgres::Client;

/// The migrations, in order. A migration is never edited once released:
/// changes come as a new one.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("001_notes.sql")),
    (2, include_str!("002_epoch.sql")),
    (3, include_str!("003_down.sql")),
    (4, include_str!("004_held_room.sql")),
    (5, include_str!("005_acks.sql")),
    (6, include_str!("006_outbox_bound.sql")),
    (7, include_str!("007_held_reasons.sql")),
    (8, include_str!("008_snapshots.sql")),
    (9, include_str!("009_held_key_text.sql")),
    (10, include_str!("010_inbox.sql")),
    (11, include_str!("011_backlog.sql")),
    (12, include_str!("012_filed.sql")),
    (13, include_str!("013_checkpoints.sql")),
    (14, include_str!("014_credentials.sql")),
    (15, include_str!("015_held_carried.sql")),
    (16, include_str!("016_keys.sql")),
    (17, include_str!("017_credentials_proved.sql")),
    (18, include_str!("018_tables.sql")),
    (19, include_str!("019_provision_asked.sql")),
    (20, include_str!("020_quarantine.sql")),
    (21, include_str!("021_digests.sql")),
    (22, include_str!("022_outbox_sent.sql")),
    (23, include_str!("023_inbox_sequence.sql")),
    (24, include_str!("024_parked.sql")),
    (25, include_str!("025_deployments.sql")),
    (26, include_str!("026_described.sql")),
    (27, include_str!("027_figures.sql")),
    (28, include_str!("028_uploads_answered.sql")),
    (29, include_str!("029_snapshot_ended.sql")),
    (30, include_str!("030_wake.sql")),
    (31, include_str!("031_bodies_freed.sql")),
    (32, include_str!("032_broker_keys.sql")),
    (33, include_str!("033_sealed_seeds.sql")),
    (34, include_str!("034_ordered_epochs.sql")),
    (35, include_str!("035_reads_batches.sql")),
    (36, include_str!("036_cohorts.sql")),
    (37, include_str!("037_blocked_by_holder.sql")),
    (38, include_str!("038_note_ops.sql")),
    (39, include_str!("039_record_form.sql")),
    (40, include_str!("040_deferred_by_holder.sql")),
    (41, include_str!("041_record_form_waits.sql")),
    (42, include_str!("042_ruled_out.sql")),
    (43, include_str!("043_left_to_rule.sql")),
];

/// The version this build brings the schema to.
pub const CURRENT: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Serialises concurrent migrations of one database (an arbitrary constant).
const MIGRATION_LOCK: i64 = 0x6d61_6769_6373_796e;

const BOOTSTRAP: &str = "
CREATE SCHEMA IF NOT EXISTS sync;
CREATE TABLE IF NOT EXISTS sync.schema_version (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   integer NOT NULL
);
";

/// The schema version the database is at (0 when it has no `sync` schema).
pub async fn version(client: &Client) -> Result<i32> {
    let exists = client
        .query_one("SELECT to_regclass('sync.schema_version') IS NOT NULL", &[])
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(0);
    }
    let row = client
        .query_opt("SELECT version FROM sync.schema_version", &[])
        .await?;
    Ok(row.map(|r| r.get(0)).unwrap_or(0))
}

/// Brings the `sync` schema to [`CURRENT`]. Refuses a database at a newer
/// version than this build knows. Safe to run concurrently.
pub async fn migrate(client: &mut Client) -> Result<i32> {
    migrate_to(client, CURRENT).await
}

/// Brings the schema to `target` (tests use it to leave a database behind).
#[doc(hidden)]
pub async fn migrate_to(client: &mut Client, target: i32) -> Result<i32> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(BOOTSTRAP).await?;
    let found: i32 = tx
        .query_opt("SELECT version FROM sync.schema_version", &[])
        .await?
        .map(|r| r.get(0))
        .unwrap_or(0);
    if found > CURRENT {
        return Err(Error::SchemaTooNew {
            found,
            known: CURRENT,
        });
    }
    for (number, sql) in MIGRATIONS {
        if *number > found && *number <= target {
            tx.batch_execute(sql).await?;
        }
    }
    let now = found.max(target.min(CURRENT));
    tx.execute(
        "INSERT INTO sync.schema_version (version) VALUES ($1)
         ON CONFLICT (singleton) DO UPDATE SET version = EXCLUDED.version",
        &[&now],
    )
    .await?;
    tx.commit().await?;
    Ok(now)
}

/// Refuses a database not at exactly [`CURRENT`].
pub async fn require_current(client: &Client) -> Result<()> {
    let found = version(client).await?;
    if found > CURRENT {
        return Err(Error::SchemaTooNew {
            found,
            known: CURRENT,
        });
    }
    if found < CURRENT {
        return Err(Error::SchemaBehind {
            found,
            needed: CURRENT,
        });
    }
    Ok(())
}

//! Whether the fleet is settled: every live replica caught up, no note
//! pending, nothing waiting for a fix, no deployment under way, and a relay
//! has started. Read from
//! the record alone, exactly, in one transaction (see [`overview`]).

use super::{overview, Result, Scope};
use chrono::{DateTime, Utc};
use serde::Serialize;

/// Where the fleet stands against "settled", with what holds it back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settled {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// Every live replica caught up, no note pending, nothing waiting for a
    /// fix, no deployment under way, and a relay has started.
    pub settled: bool,
    /// Every live replica caught up (pending notes aside).
    pub caught_up: bool,
    /// Whether a relay has started on this database: before one has, no
    /// replica is recorded and nothing can be settled.
    pub relay_started: bool,
    /// Live replicas in the scope.
    pub replicas: i64,
    /// Those not caught up.
    pub behind: i64,
    /// Those with something waiting for a fix.
    pub waiting_on_fix: i64,
    /// Notes not planned by a pass yet, in the whole database.
    pub pending_notes: i64,
    /// Rows that cannot go down, in quarantine until they change or a fix
    /// is deployed (the whole database's: no replica is sent them).
    pub quarantined: i64,
    /// Notes the planner cannot plan, parked until a fix is deployed.
    pub parked: i64,
    /// Tables a deployment of changed declarations still works through.
    pub deploying: i64,
    /// The state in words.
    pub says: String,
}

/// Whether the fleet in `scope` is settled.
pub async fn settled(client: &mut tokio_postgres::Client, scope: &Scope) -> Result<Settled> {
    // The overview first: it says plainly when the sync schema is missing
    // or of another version.
    let read = overview(client, scope, 0).await?;
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM sync.tables), (SELECT count(*) FROM sync.quarantine),
                    (SELECT count(*) FROM sync.parked)",
            &[],
        )
        .await?;
    let (relay_started, quarantined, parked): (bool, i64, i64) =
        (row.get(0), row.get(1), row.get(2));
    let deploying = read.deployment.iter().filter(|d| !d.done).count() as i64;
    let behind = read.replicas - read.states.caught_up;
    let waiting_on_fix = read.states.waiting_on_fix;
    let caught_up = relay_started && behind == 0;
    let settled = caught_up
        && read.pending_notes == 0
        && waiting_on_fix == 0
        && quarantined == 0
        && parked == 0
        && deploying == 0;
    let says = if !relay_started {
        "no relay has started on this database yet: nothing is recorded".to_string()
    } else if parked > 0 {
        format!("{parked} notes cannot be planned and wait for a fix (see health)")
    } else if quarantined > 0 {
        format!("{quarantined} rows cannot go down and wait for a fix (see health)")
    } else if waiting_on_fix > 0 {
        format!(
            "{waiting_on_fix} of {} replicas wait for a fix",
            read.replicas
        )
    } else if behind > 0 {
        format!("{behind} of {} replicas are not caught up", read.replicas)
    } else if deploying > 0 {
        let (done, total) = read
            .deployment
            .iter()
            .filter(|d| !d.done)
            .fold((0, 0), |(d, t), p| (d + p.rows_done, t + p.rows_total));
        format!(
            "a deployment is under way: {deploying} tables, {done} of about {total} rows worked through"
        )
    } else if read.pending_notes > 0 {
        format!(
            "all {} replicas caught up; {} notes pending",
            read.replicas, read.pending_notes
        )
    } else {
        format!(
            "settled: all {} replicas caught up, no note pending",
            read.replicas
        )
    };
    Ok(Settled {
        now: read.now,
        settled,
        caught_up,
        relay_started,
        replicas: read.replicas,
        behind,
        waiting_on_fix,
        pending_notes: read.pending_notes,
        quarantined,
        parked,
        deploying,
        says,
    })
}

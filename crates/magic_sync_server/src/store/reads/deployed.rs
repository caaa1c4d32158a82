//! Whether the newest build's deployment is complete on every live replica
//! of a scope: the declarations the server last started with (or those a
//! host names, by fingerprint) are the ones it runs, nothing of their
//! deployment is left to work through, and every replica was told it holds
//! them whole (`Configured`, or a snapshot's end) and acknowledged every
//! message written for it since.
//!
//! The declarations a relay runs are recorded only table by table
//! (`sync.tables`, written as it starts, in the transaction that queues
//! the deployment): their fingerprint is taken again from the tables'
//! fingerprints, as [`Schema::fingerprint`] takes it, so the read needs no
//! declaration. A replica's `sync.replicas.configured` is the fingerprint
//! it was last told, recorded with the message that told it; once it
//! acknowledged every message written for it, it applied that one too.
//!
//! [`Schema::fingerprint`]: magic_sync_core::schema::Schema::fingerprint

use super::{begin, check_scope, Result, Scope, IN_SCOPE};
use chrono::{DateTime, Utc};
use magic_sync_core::schema::Fingerprint;
use serde::Serialize;

/// Where the newest build's deployment stands over a scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Deployed {
    /// The server's time of the read.
    pub now: DateTime<Utc>,
    /// The declarations waited for are the ones the server runs, their
    /// deployment is done, and every live replica of the scope was told so
    /// and acknowledged it.
    pub complete: bool,
    /// Whether a relay has started on this database: before one has, no
    /// declarations are recorded.
    pub relay_started: bool,
    /// The fingerprint (hex) of the declarations the server last started
    /// with, as a replica of that build prints its own
    /// (`Configuration::own`); `None` before a relay started.
    pub running: Option<String>,
    /// The fingerprint (hex) waited for, when one was named.
    pub wanted: Option<String>,
    /// Tables the deployment still works through.
    pub deploying: i64,
    /// Rows of those tables worked through.
    pub rows_done: i64,
    /// Rows of those tables to work through, as estimated when it began.
    pub rows_total: i64,
    /// Live replicas in the scope.
    pub replicas: i64,
    /// Those not told yet that they hold the running declarations whole.
    pub not_told: i64,
    /// Those told, that have not acknowledged every message written for
    /// them yet (the one that told them among them).
    pub not_acknowledged: i64,
    /// Those with something waiting for a fix (refused uploads).
    pub waiting_on_fix: i64,
    /// Rows that cannot go down, in the whole database.
    pub quarantined: i64,
    /// Notes the planner cannot plan, in the whole database.
    pub parked: i64,
    /// The state in words.
    pub says: String,
}

impl Deployed {
    /// Whether anything waits for a fix to be deployed.
    pub fn waits_for_fix(&self) -> bool {
        self.waiting_on_fix > 0 || self.quarantined > 0 || self.parked > 0
    }
}

/// Whether the deployment of the declarations whose fingerprint is `wanted`
/// (by default, those the server last started with) is complete on every
/// live replica of `scope`.
pub async fn deployed(
    client: &mut tokio_postgres::Client,
    scope: &Scope,
    wanted: Option<&Fingerprint>,
) -> Result<Deployed> {
    let (tx, now) = begin(client).await?;
    check_scope(&tx, scope).await?;
    let tables: Vec<(String, Vec<u8>)> = tx
        .query("SELECT name, fingerprint FROM sync.tables", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let running = (!tables.is_empty()).then(|| {
        Fingerprint::of_tables(
            tables
                .iter()
                .map(|(name, print)| (name.as_str(), print.as_slice())),
        )
    });
    let work = tx
        .query_one(
            "SELECT count(*), coalesce(sum(rows_done), 0)::int8, coalesce(sum(rows_total), 0)::int8
             FROM sync.deployment WHERE done_at IS NULL",
            &[],
        )
        .await?;
    let print: Option<&[u8]> = running.as_ref().map(|f| &f.0[..]);
    let head = crate::store::cohorts::head("r");
    let fleet = tx
        .query_one(
            &format!(
                "SELECT count(*),
                        count(*) FILTER (WHERE r.configured IS DISTINCT FROM $3),
                        count(*) FILTER (WHERE r.configured = $3
                            AND (r.provision OR r.snapshot_attempt IS NOT NULL
                                 OR coalesce(a.number, 0) < {head})),
                        count(*) FILTER (WHERE EXISTS (SELECT 1 FROM sync.inbox i
                                                       WHERE i.replica = r.id)),
                        (SELECT count(*) FROM sync.quarantine),
                        (SELECT count(*) FROM sync.parked)
                 FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id
                 WHERE {IN_SCOPE}"
            ),
            &[&scope.ids(), &scope.partition(), &print],
        )
        .await?;
    tx.commit().await?;
    let mut read = Deployed {
        now,
        complete: false,
        relay_started: running.is_some(),
        running: running.map(|f| f.to_string()),
        wanted: wanted.map(ToString::to_string),
        deploying: work.get(0),
        rows_done: work.get(1),
        rows_total: work.get(2),
        replicas: fleet.get(0),
        not_told: fleet.get(1),
        not_acknowledged: fleet.get(2),
        waiting_on_fix: fleet.get(3),
        quarantined: fleet.get(4),
        parked: fleet.get(5),
        says: String::new(),
    };
    read.complete = read.relay_started
        && (read.wanted.is_none() || read.wanted == read.running)
        && read.deploying == 0
        && read.not_told == 0
        && read.not_acknowledged == 0;
    read.says = says(&read);
    Ok(read)
}

/// The first digits of a fingerprint, as the words name it.
fn short(print: &str) -> &str {
    print.get(..12).unwrap_or(print)
}

fn says(read: &Deployed) -> String {
    let state = match (&read.running, &read.wanted) {
        (None, _) => "no relay has started on this database yet: nothing is recorded".to_string(),
        (Some(running), Some(wanted)) if running != wanted => format!(
            "the server runs the declarations {}, not {} yet: a relay of that build has not \
             started",
            short(running),
            short(wanted)
        ),
        (Some(running), _) if read.deploying > 0 => format!(
            "the deployment of {} is under way: {} tables, {} of about {} rows worked through",
            short(running),
            read.deploying,
            read.rows_done,
            read.rows_total
        ),
        (Some(running), _) if read.not_told > 0 => format!(
            "{} of {} replicas not told yet that they hold {} whole",
            read.not_told,
            read.replicas,
            short(running)
        ),
        (Some(running), _) if read.not_acknowledged > 0 => format!(
            "{} of {} replicas told they hold {} whole have not acknowledged it yet",
            read.not_acknowledged,
            read.replicas,
            short(running)
        ),
        (Some(running), _) => format!(
            "deployed: all {} replicas hold {} whole",
            read.replicas,
            short(running)
        ),
    };
    let fix = if read.parked > 0 {
        format!("{} notes cannot be planned", read.parked)
    } else if read.quarantined > 0 {
        format!("{} rows cannot go down", read.quarantined)
    } else if read.waiting_on_fix > 0 {
        format!(
            "{} of {} replicas wait for a fix",
            read.waiting_on_fix, read.replicas
        )
    } else {
        return state;
    };
    format!("{state}; {fix} (see health)")
}

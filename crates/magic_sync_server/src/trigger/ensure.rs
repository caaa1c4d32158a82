//! Installing or repairing the triggers: a deploy step of its own, run by
//! the host before it starts the runner, that never freezes the
//! application.
//!
//! Creating a trigger locks its table against writes. Taken as an ordinary
//! lock request, it waits behind any transaction on the table, and every
//! write that comes after waits behind the request: one long transaction
//! (a relay statement left running, a report) and the application stops.
//! Taken in one transaction over many tables, in whatever order, it
//! deadlocks with writers that lock the same tables in another order.
//!
//! So [`ensure`] reads what is installed (the catalogue only: no lock), and
//! touches only the tables whose triggers are not as the engine writes them,
//! each in a transaction of its own, in a fixed order (by schema and name; a
//! partitioned table's partitions are locked by PostgreSQL, after it). Each
//! takes its locks with a short `lock_timeout`, and when it cannot have them
//! in time, or meets a deadlock, it gives way: rolls back, lets the writers
//! through, and tries again after a backoff with jitter. A write is held up
//! at most about one `lock_timeout` per attempt.
//!
//! When a trigger was missing or disabled (not merely different), writes
//! made meanwhile left no note, and the replicas may lack them for good. In
//! the same transaction that installs the trigger, the replicas that may be
//! concerned are marked to be provisioned again: a table missing its row
//! trigger concerns every replica (an unnoted insert may be owed to any of
//! them, and the rows it points at with it); one missing only its TRUNCATE
//! trigger, those holding its rows (a TRUNCATE only takes rows away), or
//! every replica while the record leaves the rows a rule gives to that rule
//! (decision 176: who held a row taken with no note is then nowhere). The
//! next pass of the relay sends them a snapshot taken after the trigger was
//! in place, so nothing written before or after is missed.

use super::{inspect, noted, refuse_truncate_sql, Fault, Finding, Noted, REFUSE_TRUNCATE_BODY};
use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::{Error, Result, TriggerProblem};
use crate::sql::{qualified, with_setting};
use std::time::Duration;
use tokio_postgres::Client;

/// How [`ensure`] takes its locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallSettings {
    /// How long installing one table waits for its locks before it gives
    /// way (the `lock_timeout` of each lock, and the `statement_timeout` of
    /// the statement that takes them all). Writes to the table queue behind
    /// the request meanwhile, so this bounds how long one is held up. Keep
    /// it below the server's `deadlock_timeout` (1 s by default), so that in
    /// a deadlock it is the installation that gives way, not a writer.
    /// Default 200 ms.
    pub lock_timeout: Duration,
    /// Attempts per table before `ensure` gives up with
    /// [`Error::InstallGaveWay`]. Default 50.
    pub attempts: u32,
    /// The wait after the first attempt that gave way, doubled after each
    /// one up to `backoff_max`, with jitter ([`crate::backoff::Backoff`]),
    /// so installers on two hosts do not keep meeting. Default 50 ms.
    pub backoff_min: Duration,
    /// The longest wait between attempts. Default 2 s.
    pub backoff_max: Duration,
}

impl Default for InstallSettings {
    fn default() -> Self {
        InstallSettings {
            lock_timeout: Duration::from_millis(200),
            attempts: 50,
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
        }
    }
}

/// What [`ensure`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ensured {
    /// Whether the function every TRUNCATE trigger calls was installed or
    /// replaced (it takes no lock on any table).
    pub refuse_truncate: bool,
    /// The tables repaired, in the order done. Empty when every trigger was
    /// already as the engine writes it: then no table was locked.
    pub installed: Vec<Installed>,
    /// Attempts that gave way to the application and were tried again, in
    /// all.
    pub retries: u32,
    /// Replicas marked to be provisioned again, because writes to a table
    /// they may hold rows of went unnoted (see [`Installed::unnoted`]).
    /// The relay's next pass sends each a snapshot.
    pub provisioned: Vec<String>,
}

impl Ensured {
    /// Whether anything was changed.
    pub fn is_empty(&self) -> bool {
        !self.refuse_truncate && self.installed.is_empty()
    }
}

/// One table whose triggers [`ensure`] repaired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    /// Its schema.
    pub schema: String,
    /// Its name.
    pub table: String,
    /// What was wrong, trigger by trigger.
    pub problems: Vec<TriggerProblem>,
    /// Whether a trigger was missing or disabled (not merely different), so
    /// that writes made meanwhile may have left no note: the replicas
    /// concerned were marked to be provisioned again.
    pub unnoted: bool,
    /// Whether its triggers were created again, under a lock on the table.
    /// False when only its note function's body differed: replacing the
    /// function takes no lock on the table.
    pub triggers: bool,
    /// Attempts that gave way to the application and were tried again.
    pub retries: u32,
}

/// Which replicas a table's repair marks to be provisioned again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reprovision {
    Nobody,
    /// Those holding a row of the table. While the record leaves the rows
    /// a rule gives to it (`sync.record_form`) and the table's rule reads
    /// its rows' columns (`left_to_rule`), every replica: rows taken or
    /// moved with no note left no trace of who held them, and the rule on
    /// the rows as they are now cannot say it.
    Holders {
        left_to_rule: bool,
    },
    Everyone,
}

const REFUSE_TRUNCATE_SOURCE: &str = "SELECT p.prosrc FROM pg_proc p
     JOIN pg_namespace n ON n.oid = p.pronamespace
     WHERE n.nspname = 'sync' AND p.proname = $1";

/// Installs or repairs every trigger the engine needs, taking locks only on
/// the tables whose triggers are missing or not as the engine writes them,
/// one table at a time, giving way to the application's writes. The `sync`
/// schema must be current (run the migrations first). Run it before the
/// runner starts: the runner refuses to start while a trigger is wrong.
pub async fn ensure(
    engine: &Engine,
    client: &mut Client,
    settings: &InstallSettings,
) -> Result<Ensured> {
    crate::schema::require_current(client).await?;
    let catalog = Catalog::read(client, engine).await?;
    crate::check::declarations(engine, &catalog)?;
    let mut ensured = Ensured {
        refuse_truncate: ensure_refuse_truncate(client).await?,
        ..Ensured::default()
    };
    ensured.retries += record_whole_before(engine, client, &catalog, settings).await?;
    let mut noted = noted(engine, &catalog);
    noted.sort_by(|a, b| (&a.schema, &a.table).cmp(&(&b.schema, &b.table)));
    let findings = inspect(&noted, client).await?;
    // Relations the last build did not note: writes to them before their
    // trigger are owed to no one through notes, and the deployment plans
    // every row of the tables they decide once the relay starts.
    let noted_before = crate::store::tables::noted_before(client).await?;
    // Whether a note function of an earlier build, writing notes in its
    // way, was replaced.
    let mut replaced = false;
    for (index, table) in noted.iter().enumerate() {
        let found: Vec<&Finding> = findings.iter().filter(|f| f.table == index).collect();
        if found.is_empty() {
            continue;
        }
        let declared = engine.codec(&table.table).is_some();
        let new_to_the_sync = noted_before
            .as_ref()
            .is_some_and(|before| !before.contains(&table.table));
        let left_to_rule = engine.codec(&table.table).is_some_and(|codec| {
            matches!(
                codec.table().rule,
                crate::row::Rule::All
                    | crate::row::Rule::Replica(_)
                    | crate::row::Rule::Partition(_)
            )
        });
        let reprovision = match new_to_the_sync {
            true => Reprovision::Nobody,
            false => reprovision(&found, declared, left_to_rule),
        };
        let triggers = found.iter().any(|f| f.fault != Fault::Body);
        replaced |= found.iter().any(|f| f.notes && f.fault != Fault::Silenced);
        let (marked, retries) = repair(client, table, triggers, reprovision, settings).await?;
        ensured.retries += retries;
        ensured.provisioned.extend(marked);
        ensured.installed.push(Installed {
            schema: table.schema.clone(),
            table: table.table.clone(),
            problems: found.iter().map(|f| f.problem.clone()).collect(),
            unnoted: reprovision != Reprovision::Nobody,
            triggers,
            retries,
        });
    }
    if replaced {
        crate::store::held::note_functions_replaced(&*client).await?;
    }
    ensured.provisioned.sort();
    ensured.provisioned.dedup();
    Ok(ensured)
}

/// Installs the function every TRUNCATE trigger calls when it is missing or
/// differs. Replacing a function takes no lock on the tables that use it.
async fn ensure_refuse_truncate(client: &Client) -> Result<bool> {
    let installed = client
        .query_opt(REFUSE_TRUNCATE_SOURCE, &[&super::REFUSE_TRUNCATE])
        .await?
        .map(|row| row.get::<_, String>(0));
    if installed.as_deref().map(str::trim) == Some(REFUSE_TRUNCATE_BODY.trim()) {
        return Ok(false);
    }
    client.batch_execute(&refuse_truncate_sql()).await?;
    Ok(true)
}

/// Whose replicas must be provisioned again after these findings on one
/// table: see the module's documentation. A group table's rows are never
/// held themselves (they decide which rows of another table are), so a
/// TRUNCATE of one concerns every replica.
fn reprovision(found: &[&Finding], declared: bool, left_to_rule: bool) -> Reprovision {
    let silenced = |notes: bool| {
        found
            .iter()
            .any(|f| f.fault == Fault::Silenced && f.notes == notes)
    };
    if silenced(true) {
        Reprovision::Everyone
    } else if silenced(false) {
        if declared {
            Reprovision::Holders { left_to_rule }
        } else {
            Reprovision::Everyone
        }
    } else {
        Reprovision::Nobody
    }
}

/// With the record of the rows a rule gives thinned (decision 176), each
/// table whose rule this build changes from one that reads its rows'
/// columns is recorded whole first (`store::by_rule::record_whole`): what
/// its old rule gives each holder, read from the rows and their notes while
/// the old triggers still note the old rule's column, the table locked
/// against writes for that one statement. Until the deployment of the table
/// is done, no relay (this build's, or the one still running) reads it by
/// a rule. Returns the attempts that gave way.
async fn record_whole_before(
    engine: &Engine,
    client: &mut Client,
    catalog: &Catalog,
    settings: &InstallSettings,
) -> Result<u32> {
    use crate::store::held::Ruled;
    if Ruled::stored(&*client).await? == Ruled::Recorded {
        return Ok(0);
    }
    let before = crate::store::tables::recorded(client).await?;
    let declared = crate::store::deployment::declared(engine, catalog)?;
    let tables: Vec<&'static crate::row::Table> = engine.down_tables().collect();
    let graph = crate::graph::Graph::new(&tables, catalog)?;
    let owed = crate::deploy::owed_whole(&*client, &before, &declared, &graph, catalog).await?;
    let mut retries = 0;
    for owed in owed {
        let shape = graph.shape(&owed.table);
        let relation = shape.relation.clone();
        let (came, gave_way) = giving_way(settings, &relation, async || {
            let tx = client.transaction().await?;
            let timeout = settings.lock_timeout.as_millis().max(1);
            let lock = format!("LOCK TABLE {relation} IN SHARE ROW EXCLUSIVE MODE");
            tx.batch_execute(&format!(
                "SET LOCAL lock_timeout = '{timeout}ms'; {}",
                with_setting("statement_timeout", &format!("'{timeout}ms'"), &lock),
            ))
            .await?;
            let came = crate::store::by_rule::record_whole(
                &tx,
                &graph,
                shape,
                &owed.old,
                owed.old_type.as_deref(),
            )
            .await?;
            tx.commit().await?;
            Ok(came)
        })
        .await?;
        retries += gave_way;
        tracing::info!(
            table = owed.table,
            ?came,
            "the old rule's rows are recorded whole"
        );
    }
    Ok(retries)
}

/// Runs `attempt` again, after a backoff, while it gives way to the
/// application (a lock not had in time, a deadlock), at most
/// `settings.attempts` times. Returns what it came to and the attempts that
/// gave way.
async fn giving_way<T>(
    settings: &InstallSettings,
    relation: &str,
    mut attempt: impl AsyncFnMut() -> Result<T>,
) -> Result<(T, u32)> {
    let mut retries = 0;
    let mut backoff = crate::backoff::Backoff::new(settings.backoff_min, settings.backoff_max);
    loop {
        let e = match attempt().await {
            Ok(done) => return Ok((done, retries)),
            Err(Error::Postgres(e)) if crate::error::gave_way(&e) => e,
            Err(e) => return Err(e),
        };
        if retries + 1 >= settings.attempts.max(1) {
            return Err(Error::InstallGaveWay {
                relation: relation.to_string(),
                attempts: retries + 1,
                source: e,
            });
        }
        retries += 1;
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// Repairs one table, attempt after attempt while it gives way. Returns the
/// replicas marked and the attempts that gave way.
async fn repair(
    client: &mut Client,
    table: &Noted,
    triggers: bool,
    reprovision: Reprovision,
    settings: &InstallSettings,
) -> Result<(Vec<String>, u32)> {
    let relation = format!("{}.{}", table.schema, table.table);
    giving_way(settings, &relation, async || {
        if triggers {
            install(client, table, reprovision, settings).await
        } else {
            // Only the function's body differs: nothing to lock.
            client.batch_execute(&table.function_sql()).await?;
            Ok(Vec::new())
        }
    })
    .await
}

/// One attempt at one table, in one transaction: the replicas to provision
/// again first (waiting for a relay's pass, if need be, holds up no writer),
/// then the table's locks, bounded by the lock timeout, then the function
/// and triggers. Nothing is visible before the commit, so the replicas are
/// provisioned from a snapshot that sees the trigger in place.
async fn install(
    client: &mut Client,
    table: &Noted,
    reprovision: Reprovision,
    settings: &InstallSettings,
) -> Result<Vec<String>> {
    let tx = client.transaction().await?;
    let marked = match reprovision {
        Reprovision::Nobody => Vec::new(),
        Reprovision::Holders { left_to_rule } => {
            use crate::store::held::Ruled;
            let thinned = left_to_rule && Ruled::stored(&tx).await? == Ruled::ByRule;
            let holding = (!thinned).then_some(table.table.as_str());
            crate::store::replicas::provision_again(&tx, holding).await?
        }
        Reprovision::Everyone => crate::store::replicas::provision_again(&tx, None).await?,
    };
    let timeout = settings.lock_timeout.as_millis().max(1);
    // The statement timeout bounds the lock alone; the session's is put
    // back for the installation.
    let lock = format!(
        "LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE",
        qualified(&table.schema, &table.table)
    );
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = '{timeout}ms';
         {}
         {}",
        with_setting("statement_timeout", &format!("'{timeout}ms'"), &lock),
        table.install_sql()
    ))
    .await?;
    tx.commit().await?;
    Ok(marked)
}

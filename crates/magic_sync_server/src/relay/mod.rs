//! The relay: the server side of the down path.
//!
//! A pass ([`Relay::record`]) reads like the reference, a module a step:
//!
//! - `observe`: what became of the replicas the host lists;
//! - `plan`: how each kept-up replica's wanted set moved, for every pending
//!   note and every change kept for it while its snapshot streamed;
//! - `load`: every row sent read once, encoded once, packed per replica;
//! - record: the messages numbered, chained and sealed into the outbox
//!   (`outbox`), what each replica now holds (`held`), the notes done, in
//!   the one `REPEATABLE READ` transaction the pass planned in;
//! - [`publish`]: each replica's outbox, in order, through the host's
//!   [`Transport`], beside the passes, on a connection of its own.
//!
//! A replica provisioned from scratch is not a pass's: its snapshot
//! (`snapshot`) streams on a connection of its own, begun between passes
//! ([`Relay::begin_snapshot`]), while the passes go on for every other.
//! What replicas say back comes in through [`acknowledge_all`] and [`gap`],
//! with the replica named by whoever authenticated it.

mod cohort;
mod configured;
mod digests;
mod load;
mod observe;
mod outbox;
mod pace;
mod pass;
pub use magic_sync_core::link::{LinkError, LinkErrorKind};
use magic_sync_core::pack;
pub use magic_sync_core::ReplicaId;
use pass::MAX_PLAN_ATTEMPTS;
mod publish;
mod reached;
mod rehearse;
mod replies;
mod settings;
mod snapshot;
mod transport;

pub use crate::store::plan::Planned;
pub use bytesize::ByteSize;
pub(crate) use deployment::declared;
pub use digests::{compare_digest, Compared, Heard};
pub use pace::SnapshotPace;
pub use publish::{publish, publish_beside, Away, BATCH_FROM, RESEND_AFTER};
pub(crate) use rehearse::{rehearse, Owed};
pub use rehearse::{Moves, Rehearsal};
pub(crate) use replies::{acknowledge, gaps};
pub use replies::{acknowledge_all, gap};
pub use settings::Settings;
pub use snapshot::{Failed, Snapshot, Streamed};
pub use transport::{ReplicaInfo, Replicas, SendError, Transport};

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::row::{Rule, Table};
use crate::sql::qualified;
use crate::store::plan;
use crate::store::{self, deployment, held, parked};
use std::sync::Arc;
use tokio_postgres::Client;

/// The advisory lock one relay per database holds while it relays (an
/// arbitrary constant: "magic_sync relay").
pub const RELAY_LOCK: i64 = 0x6d73_5f72_656c_6179;

/// What one [`Relay::record`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The plan.
    pub planned: Planned,
    /// Replicas waiting for a snapshot after the pass
    /// ([`Relay::begin_snapshot`]).
    pub waiting: Vec<ReplicaId>,
    /// Replicas whose snapshot streams: the pass kept for them what it
    /// planned.
    pub streaming: Vec<ReplicaId>,
    /// Replicas forgotten (no longer live, or gone).
    pub forgotten: Vec<ReplicaId>,
    /// Replicas whose outbox outgrew its bound (dropped), or whose
    /// snapshot's end was lost on the way: waiting for a snapshot (they
    /// are among `waiting` too).
    pub dropped: Vec<ReplicaId>,
    /// Messages written to the outbox.
    pub messages: u64,
    /// Per replica the pass wrote to, the number of the last message it
    /// wrote: an acknowledgement of it covers everything the pass planned
    /// for that replica.
    pub written: Vec<(ReplicaId, i64)>,
    /// When the oldest change the pass planned was committed, with
    /// PostgreSQL's `track_commit_timestamp` on; otherwise when the pass
    /// began (a change committed before it). `None` when it planned no
    /// change.
    pub oldest_change: Option<std::time::SystemTime>,
    /// Replicas told, in a `Configured` message, that they hold the running
    /// build's declarations whole: once a deployment is done, or at a
    /// relay's start for replicas an older build provisioned.
    pub configured: Vec<ReplicaId>,
    /// How many replicas it sent the declarations' description.
    pub described: usize,
    /// The table a deployment worked on in this pass, and how many of its
    /// rows (`crate::deploy`).
    pub deployed: Option<(String, u64)>,
}

/// What one [`publish`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Published {
    /// Messages the transport took.
    pub sent: u64,
    /// Replicas a send failed to, with why; their messages wait.
    pub failed: Vec<(ReplicaId, String)>,
}

/// What became of an acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acknowledged {
    /// Recorded: rows carried by this message and before count as held.
    Recorded,
    /// Of another epoch, or saying what the server cannot check (that it
    /// was answered uploads the server has no record of answering, with no
    /// receipt to show for it): the replica, and it alone, is provisioned
    /// again.
    Provisioning,
    /// Showing, under the server's own seal or receipt, what the server has
    /// no record of: a message beyond what it records sending, a message of
    /// an epoch it began after its own, an answer beyond what it records
    /// answering. The server's database was restored from an older copy. A
    /// new epoch begins and every replica is provisioned again.
    ServerRestored,
    /// Of an earlier message than the replica said before: it was restored
    /// from an older copy, and is provisioned again with its filing state
    /// (`sync.filed`) started afresh.
    Restored,
    /// The replica is unknown or not live: nothing recorded.
    Unknown,
}

/// The server side of the down path over one database.
#[derive(Debug)]
pub struct Relay {
    /// What snapshots share with the passes, with the settings the relay
    /// works by now: as given, but for the record's form while it waits
    /// ([`Relay::settle_form`]).
    context: Arc<snapshot::Context>,
    /// The settings as given.
    settings: Settings,
    /// Whether the record's form is not yet the one the settings want, and
    /// is settled again at every pass until it is.
    form_waits: bool,
    groups: Vec<plan::Group>,
    prepared: bool,
    /// Whether a pass ran yet: the first one ends the snapshots a relay
    /// before this one left under way.
    started: bool,
    /// What the planner's tables hold between passes.
    leftovers: plan::Leftovers,
    /// The planner's statements, prepared on the relay's connection.
    plan_cache: plan::Cache,
    /// The outbox's statements, prepared on the relay's connection.
    statements: Option<crate::store::outbox::Statements>,
    /// When a pass last measured the outboxes against their bound.
    outbox_checked: Option<std::time::Instant>,
    /// Whether PostgreSQL records commit times, read with the first pass.
    commit_times: Option<bool>,
    /// Whether this relay noted again the rows set aside by the build before
    /// it (`store::quarantine::NoteAgain`) and filed again what its inbox
    /// holds (`file::refile`), once, before its first pass.
    noted_again: bool,
    /// The statements that do it.
    note_again: store::quarantine::NoteAgain,
    /// Whether a deployment may have work left (`crate::deploy`): read at
    /// every pass until one finds none.
    deploying: bool,
    /// Whether replicas may be due a `Configured`: read once no deployment
    /// is under way, until a pass finds none due.
    configuring: bool,
    /// Whether replicas may be due the declarations' description: read at
    /// every pass until one finds none due.
    describing: bool,
    /// Rows of a deployment's next chunk, paced by the passes before.
    deploy_chunk: i64,
    /// Whether the cohort of the `all` tables is recorded, as the last
    /// pass saw it (`None` before one looked): while the relay records by
    /// rule, a pass that found it missing has it made before the next.
    cohort: Option<bool>,
    /// The tables that cohort holds rows of, as joining it reads them.
    cohort_tables: store::cohorts::Tables,
    /// Replicas kept up whose record of those tables differed from the
    /// cohort's when they were to join it: left as they are while they stay
    /// kept up.
    apart: std::collections::HashSet<String>,
}

impl Relay {
    /// A relay for `engine` over the database `client` is connected to.
    /// Runs the start-up checks: schema, declarations, indexes, triggers.
    pub async fn new(client: &Client, engine: Engine, settings: Settings) -> Result<Relay> {
        let catalog = crate::check::startup(&engine, client).await?;
        let sealed = store::keys::seal(client).await?;
        if sealed > 0 {
            tracing::info!(
                seeds = sealed,
                "the signing seeds are sealed under the key {} names",
                store::keys::SEED_KEY
            );
        }
        let mut relay = Self::with_catalog(&catalog, engine, settings)?;
        let declared = deployment::declared(&relay.context.engine, &catalog)?;
        let deployment = crate::deploy::begin(
            client,
            &relay.context.engine,
            &declared,
            &relay.context.graph,
            &catalog,
        )
        .await?;
        if !deployment.is_empty() {
            tracing::info!(
                changes = deployment.changes.len(),
                reused = deployment.reused.len(),
                "a deployment begins:\n{deployment}"
            );
        }
        relay.deploying = store::deployment::owed_by(client, &relay.context.schema).await?;
        Ok(relay)
    }

    fn with_catalog(catalog: &Catalog, engine: Engine, settings: Settings) -> Result<Relay> {
        let settings_chunk = settings.deploy_chunk_rows;
        let tables: Vec<&'static Table> = engine.down_tables().collect();
        let graph = Graph::new(&tables, catalog)?;
        let mut groups = Vec::new();
        for t in &tables {
            if let Rule::Group(g) = t.rule {
                let group_type = catalog
                    .relation(t.schema, g.members)
                    .and_then(|r| r.column(g.group))
                    .map(|c| c.type_name.clone())
                    .ok_or_else(|| {
                        Error::Declarations(vec![crate::error::Mismatch {
                            table: t.name.to_string(),
                            column: Some(g.group.to_string()),
                            problem: format!("its group table `{}` has no such column", g.members),
                        }])
                    })?;
                groups.push(plan::Group {
                    table: t,
                    members: qualified(t.schema, g.members),
                    members_name: g.members,
                    grants_name: g.grants,
                    group_type,
                    member_columns: g.member,
                });
            }
        }
        let described = catalog.schema(&engine).described();
        let cohort_tables = store::cohorts::Tables::of(&graph, store::held::Ruled::of(&settings));
        let note_again =
            store::quarantine::NoteAgain::new(&graph, &crate::trigger::noted(&engine, catalog));
        Ok(Relay {
            context: Arc::new(snapshot::Context {
                schema: described.fingerprint.clone(),
                described,
                engine,
                graph,
                settings: settings.clone(),
                plan_first: Default::default(),
            }),
            settings,
            form_waits: false,
            groups,
            prepared: false,
            started: false,
            leftovers: plan::Leftovers::default(),
            plan_cache: Default::default(),
            statements: None,
            outbox_checked: None,
            commit_times: None,
            noted_again: false,
            note_again,
            deploying: false,
            configuring: true,
            describing: true,
            deploy_chunk: settings_chunk.clamp(1, 1_000),
            cohort: None,
            cohort_tables,
            apart: Default::default(),
        })
    }

    /// Brings the record to the form the settings want, or as near as it
    /// can be yet (`held::settle_form`), and records in that form from this
    /// pass on.
    async fn settle_form(&mut self, client: &mut Client) -> Result<()> {
        let wanted = held::Ruled::of(&self.settings);
        let tx = client.transaction().await?;
        let settled = held::settle_form(&tx, wanted).await?;
        tx.commit().await?;
        if !settled.again.is_empty() {
            tracing::warn!(
                replicas = settled.again.len(),
                "every row held is recorded again, where the record left the rows a rule \
                 gives to it: every replica is provisioned again"
            );
        }
        let waits = settled.ruled != wanted;
        if waits && !self.form_waits {
            tracing::info!(
                "every row held is recorded until the notes an earlier build's triggers \
                 wrote are planned and the transactions that wrote them have ended"
            );
        }
        self.form_waits = waits;
        if held::Ruled::of(&self.context.settings) != settled.ruled {
            let mut settings = self.settings.clone();
            settings.record_ruled_rows = settled.ruled == held::Ruled::Recorded;
            let context = &self.context;
            self.cohort_tables = store::cohorts::Tables::of(&context.graph, settled.ruled);
            self.context = Arc::new(snapshot::Context {
                engine: context.engine.clone(),
                graph: context.graph.clone(),
                settings,
                schema: context.schema.clone(),
                described: context.described.clone(),
                plan_first: context
                    .plan_first
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .into(),
            });
        }
        Ok(())
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.context.engine
    }

    /// The settings, as given.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Takes the relay's lock on this connection's session, if no other
    /// session holds it. Every [`record`](Self::record) must run on the
    /// connection that holds it.
    pub async fn lock(client: &Client) -> Result<bool> {
        Ok(client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&RELAY_LOCK])
            .await?
            .get(0))
    }

    /// One pass: observes `replicas`, plans every pending note (and every
    /// change kept for a replica while its snapshot streamed) for the
    /// replicas kept up, and writes the outbox, what each replica now holds
    /// and the notes done, in one transaction. Replicas that need a
    /// snapshot are left waiting for one ([`Recorded::waiting`]).
    /// `max_message_bytes` is the transport's limit. A pass that fails on a
    /// note that no longer fits its table parks that note (`sync.parked`)
    /// and runs again without it.
    pub async fn record(
        &mut self,
        client: &mut Client,
        replicas: &[ReplicaInfo],
        max_message_bytes: usize,
    ) -> Result<Recorded> {
        if !self.noted_again || self.form_waits {
            self.settle_form(client).await?;
        }
        if !self.noted_again {
            // This build may send what the one before it could not, and
            // file what it refused.
            let noted = self.note_again.run(&*client).await?;
            if noted > 0 {
                tracing::info!(
                    rows = noted,
                    "rows set aside by the last build are tried again"
                );
            }
            let unparked = parked::unpark(&*client).await?;
            if unparked > 0 {
                tracing::info!(
                    notes = unparked,
                    "notes parked by the last build are planned again"
                );
            }
            let refiled = crate::file::refile(client, &self.context.engine).await?;
            if refiled != crate::file::Refiled::default() {
                tracing::info!(
                    filed = refiled.filed,
                    refused = refiled.refused,
                    waiting = refiled.waiting,
                    "rows the inbox held are filed again"
                );
            }
            if !self.context.settings.record_by_rule
                && cohort::forget(client, &self.cohort_tables).await?
            {
                // Not kept up while the relay does not record by rule: made
                // again, whole, when it does.
                tracing::info!("the record by rule is off: the cohorts recorded are forgotten");
            }
            self.noted_again = true;
        }
        if self.context.settings.record_by_rule && self.cohort != Some(true) {
            // Each attempt that meets rows that cannot go sets them aside,
            // and the next plans around them.
            for _ in 0..MAX_PLAN_ATTEMPTS {
                let context = &self.context;
                let made =
                    cohort::make(client, context, &mut self.leftovers, max_message_bytes).await?;
                self.cohort = Some(made);
                if made {
                    break;
                }
            }
        }
        match self.pass(client, replicas, max_message_bytes).await {
            // A value PostgreSQL refuses: what a note that no longer fits
            // its table makes a pass fail with.
            Err(e) if e.is_data_exception() => {
                // A note that no longer fits its table would fail every
                // pass: parked, the others are planned without it.
                let found = parked::park(
                    client,
                    &self.context.graph,
                    held::Ruled::of(&self.context.settings),
                )
                .await?;
                if found == 0 {
                    return Err(e);
                }
                tracing::error!(
                    notes = found,
                    error = %e,
                    "notes the planner cannot plan are parked until a build that can starts"
                );
                metrics::counter!("magic_sync_notes_parked_total").increment(found);
                self.pass(client, replicas, max_message_bytes).await
            }
            recorded => recorded,
        }
    }

    /// The replicas waiting for a snapshot, oldest first.
    pub async fn waiting(&self, client: &Client) -> Result<Vec<String>> {
        snapshot::waiting(client).await
    }

    /// Begins the snapshot of `replica`, which waits for one: on `client`,
    /// the connection holding the relay's lock, between passes. From then
    /// on every pass keeps for the replica what it plans, until the
    /// snapshot is recorded. `None` when the replica no longer waits. The
    /// snapshot streams on a connection of its own ([`Snapshot::stream`]).
    pub async fn begin_snapshot(
        &self,
        client: &mut Client,
        replica: &str,
    ) -> Result<Option<Snapshot>> {
        snapshot::begin(self.context.clone(), client, replica).await
    }

    /// Puts the replica of a failed snapshot back to waiting for one
    /// (unless another attempt took it up meanwhile). [`Snapshot::stream`]
    /// does it itself when its connection still works.
    pub async fn abandon_snapshot(&self, client: &Client, failed: &Failed) -> Result<()> {
        snapshot::abandon(client, failed).await
    }

    /// Checks the record of what replicas hold (`sync.held`) against
    /// itself and the database: every row recorded exists, is recorded as
    /// its rule sends it and as pointing at what it points at now, and with
    /// as many of the replica's rows pointing at it as do; and every row a
    /// holder's own rule gives it is recorded so ([`Self::audit_rules`]).
    /// Returns one line per disagreement, none when the record is sound. It
    /// reads the whole record: for tests, and for an operator in doubt;
    /// exact only while no note is pending.
    pub async fn audit(&self, client: &Client) -> Result<Vec<String>> {
        let ruled = crate::store::held::Ruled::of(&self.context.settings);
        let mut problems = held::audit(client, &self.context.graph, ruled).await?;
        problems.extend(self.audit_rules(client).await?);
        Ok(problems)
    }

    /// The keys `holder` (a replica or a cohort) holds of `table`, as JSON
    /// arrays: by its record, and by its rule at its position where the
    /// record leaves the rows a rule gives to it
    /// (`Settings::record_ruled_rows` off). Not a member's cohort's rows.
    /// It reads the table whole: for tests and an operator in doubt.
    pub async fn holds(
        &self,
        client: &Client,
        holder: &str,
        table: &str,
    ) -> Result<Vec<serde_json::Value>> {
        crate::store::by_rule::holds(
            client,
            &self.context.graph,
            crate::store::held::Ruled::of(&self.context.settings),
            holder,
            table,
        )
        .await
    }

    /// Checks that the rows the record says each holder holds by its own
    /// rule are the rows its rule gives it at its position, read from the
    /// host's rows and the pending notes alone (decision 176), pointing at
    /// the same parents; exact whether notes are pending or not. Returns
    /// one line per disagreement. It reads every table whole: for tests.
    pub async fn audit_rules(&self, client: &Client) -> Result<Vec<String>> {
        crate::store::by_rule::audit(
            client,
            &self.context.graph,
            crate::store::held::Ruled::of(&self.context.settings),
        )
        .await
    }
}

/// Says, at trace level (target `magic_sync::load`), how long one chunk's
/// step of a load took.
pub(crate) fn trace_sum(step: &str, since: std::time::Instant) {
    tracing::trace!(
        target: "magic_sync::load",
        step,
        ms = since.elapsed().as_secs_f64() * 1e3
    );
}

/// Says, at debug level (target `magic_sync::pass`), how long a step of the
/// pass took: `RUST_LOG=magic_sync=debug` under a host's subscriber.
pub fn trace(step: &str, since: std::time::Instant) {
    tracing::debug!(
        target: "magic_sync::pass",
        step,
        ms = since.elapsed().as_secs_f64() * 1e3
    );
}

/// Replicas as the relay's callers see them.
fn ids(replicas: &[String]) -> Vec<ReplicaId> {
    replicas.iter().map(ReplicaId::from).collect()
}

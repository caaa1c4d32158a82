//! Snapshots: a replica provisioned from scratch, on a connection of its
//! own, beside the passes that keep every other replica up.
//!
//! A snapshot reads one `REPEATABLE READ` snapshot of the database, and
//! what it sees is recorded with it (`sync.replicas.snapshot`, from
//! `pg_current_snapshot()`). A change belongs to it exactly when the
//! transaction that made it is visible in that snapshot. While a replica's
//! snapshot streams, every pass that plans notes keeps, for that replica,
//! the rows they changed with the newest note's transaction
//! (`sync.deferred`); the first pass after the snapshot is recorded plans
//! for the replica those whose transaction the snapshot does not see, in
//! order with whatever changed since, and lets go of the others: they are
//! in the snapshot. A transaction open when the snapshot began and
//! committed while it streams is one it does not see. (A row's notes are
//! numbered in the order its writers committed, so if the snapshot sees the
//! newest one kept, it sees them all.)
//!
//! Its rows are read straight from the host's tables, each table by its
//! query in closed form (`store::plan::closed`), parents first, after what
//! those queries read of the tables they depend on is kept, once each, in
//! temporary tables of the view (`closed::Kept`); encoded,
//! packed, numbered, chained and sealed as a pass does, and handed to the
//! transport as they fill, from `begins_snapshot` to `EndSnapshot`: nothing
//! is staged in the outbox, and nothing is planned before the first row
//! goes. Then, in the same view, it is planned as a pass plans a snapshot
//! (`_ms_f`): the same rows, which is checked, and the record. Once the
//! transport took the end, what it sent is recorded as held, in bulk, at
//! the versions the snapshot saw, carried by the `EndSnapshot`: it counts
//! once the replica acknowledges that. While rows are set aside the plan
//! comes first, and the rows are read by it, around them.
//!
//! A snapshot that fails anywhere (a send refused, the connection
//! lost, the relay gone) is begun again from the start; the replica's
//! `EndSnapshot` deletes whatever an earlier attempt left that this one did
//! not name.
//!
//! Beginning a snapshot is the relay's, between passes, on the connection
//! holding its lock: from then on every pass keeps what it plans for the
//! replica, so the snapshot may take its own view of the database whenever
//! its worker starts. Streaming it is the worker's, on a connection of its
//! own, for as long as it takes, while passes go on.

use super::load::{Loader, Sink, Source};
use super::outbox::{message_id, stamp, whole, Chain, Epoch};
use super::pace::Pacer;
use super::pack::Packed;
use super::{held, ReplicaId, Settings, Transport, RELAY_LOCK};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::graph::Graph;
use crate::store;
use crate::store::held::{Ruled, Staged};
use crate::store::outbox::draw;
use crate::store::plan::closed::Closed;
use crate::store::plan::scratch::{Filled, Scratch};
use crate::store::plan::JOINS_AS_THEY_WERE;
use crate::store::plan::{self, quarantine, Planner};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio_postgres::{Client, IsolationLevel, Transaction};

/// What a snapshot needs of its relay.
#[derive(Debug)]
pub(crate) struct Context {
    pub engine: Engine,
    pub graph: Graph,
    pub settings: Settings,
    /// The fingerprint of the declarations (`Schema::fingerprint`): what a
    /// snapshot's end and a `Configured` tell a replica it holds whole.
    pub schema: Vec<u8>,
    /// What the declarations make of a replica's tables, as a snapshot's
    /// end and a `ReplicaSchema` tell it.
    pub described: crate::envelope::ReplicaSchema,
    /// Whether snapshots plan before they stream: set for good once one
    /// streamed by the queries in closed form disagreed with its plan, or
    /// one of those queries failed.
    pub plan_first: std::sync::atomic::AtomicBool,
}

/// A snapshot sent and recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Streamed {
    /// The replica.
    pub replica: ReplicaId,
    /// Rows sent.
    pub rows: u64,
    /// Messages sent, the `EndSnapshot` included.
    pub messages: u64,
    /// Whether what it sent is recorded as held. `false` when the replica
    /// was observed to move, leave or need another snapshot while it
    /// streamed: its attempt was ended, and what it sent is not recorded
    /// (another snapshot follows).
    pub recorded: bool,
    /// Whether its rows were planned before they streamed: when rows are
    /// set aside (the plan works around them), or after a snapshot
    /// streamed by the queries in closed form disagreed with its plan or
    /// one of those queries failed.
    /// Otherwise its first rows went as soon as they were read.
    pub planned_first: bool,
}

/// A snapshot that failed: the replica waits for another.
#[derive(Debug, thiserror::Error)]
#[error("the snapshot of replica `{replica}` failed: {source}")]
pub struct Failed {
    /// The replica.
    pub replica: ReplicaId,
    attempt: Vec<u8>,
    /// Why.
    #[source]
    pub source: Error,
}

impl Failed {
    /// Whether trying again unchanged may succeed (see
    /// [`Error::is_transient`]).
    pub fn is_transient(&self) -> bool {
        self.source.is_transient()
    }
}

pub(crate) use crate::store::snapshots::waiting;

/// A replica's snapshot, begun: the replica is recorded as streaming, under
/// an attempt of its own. [`Snapshot::stream`] sends it.
#[derive(Debug)]
pub struct Snapshot {
    context: Arc<Context>,
    replica: ReplicaId,
    partition: Option<String>,
    attempt: Vec<u8>,
    /// The number of its first message, drawn when it began.
    first: i64,
    /// Where the replica's chain stood when it began.
    chain: Chain,
}

/// Begins the snapshot of `replica`, waiting for one, on `client`: the
/// connection holding the relay's lock (a relay that lost it begins
/// nothing), between passes. The replica's record, outbox and kept changes
/// go: the snapshot replaces what it held and was owed. `None` when the
/// replica no longer waits.
pub(crate) async fn begin(
    context: Arc<Context>,
    client: &mut Client,
    replica: &str,
) -> Result<Option<Snapshot>> {
    let mut attempt = vec![0u8; 16];
    rand::thread_rng().fill_bytes(&mut attempt);
    let tx = client.transaction().await?;
    let begun = store::snapshots::begin(
        &tx,
        replica,
        &attempt,
        RELAY_LOCK,
        context.settings.provision_asked_every,
    )
    .await?;
    let Some(begun) = begun else {
        tx.rollback().await?;
        return Ok(None);
    };
    tx.commit().await?;
    Ok(Some(Snapshot {
        context,
        replica: replica.into(),
        partition: begun.partition,
        attempt,
        first: begun.first,
        chain: Chain {
            last_number: begun.last_number,
            last_nonce: begun.last_nonce,
            begins_snapshot: true,
            snapshot_number: None,
        },
    }))
}

/// Puts the replica of a failed snapshot back to waiting for one, with why
/// in `last_error`, unless another attempt took it up meanwhile.
pub(crate) async fn abandon(client: &Client, failed: &Failed) -> Result<()> {
    let why = format!("its snapshot: {}", failed.source);
    store::snapshots::abandon(client, &failed.replica, &failed.attempt, &why).await?;
    Ok(())
}

impl Snapshot {
    /// The replica it provisions.
    pub fn replica(&self) -> &ReplicaId {
        &self.replica
    }

    /// The snapshot, failed before it streamed (its worker could not
    /// connect): the replica is to wait for another (`abandon`).
    pub fn fail(self, source: Error) -> Failed {
        Failed {
            replica: self.replica,
            attempt: self.attempt,
            source,
        }
    }

    /// Streams the snapshot on `worker`, a connection of its own: takes a
    /// `REPEATABLE READ` view of the database, plans the replica's whole set
    /// in it, sends it through `transport` from `begins_snapshot` to
    /// `EndSnapshot`, then records it as held, what the snapshot saw, and
    /// the replica as kept up. On failure the replica waits for another
    /// snapshot (marked so on `worker` when it still works; the caller may
    /// also `abandon` it on a connection of its own).
    pub async fn stream<T: Transport>(
        self,
        worker: &mut Client,
        transport: &T,
    ) -> Result<Streamed, Failed> {
        match self.run(worker, transport).await {
            Ok(streamed) => Ok(streamed),
            Err(source) => {
                let failed = Failed {
                    replica: self.replica,
                    attempt: self.attempt,
                    source,
                };
                // Best effort: the connection may be what failed.
                let _ = abandon(worker, &failed).await;
                Err(failed)
            }
        }
    }

    async fn run<T: Transport>(&self, worker: &mut Client, transport: &T) -> Result<Streamed> {
        let context = &self.context;
        let mut pacer = Pacer::new(context.settings.snapshot_pace);
        worker.batch_execute(&setup()).await?;
        let tx = worker
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .start()
            .await?;
        // What the snapshot sees is fixed by its first statement.
        let seen: String = tx
            .query_one("SELECT pg_current_snapshot()::text", &[])
            .await?
            .get(0);
        let closed = self.closed_form(&tx).await?;
        let planned = match closed {
            Some(_) => None,
            None => Some(self.plan(&tx, &Default::default()).await?),
        };
        let epoch = Epoch::read(&tx).await?;
        let mut sender = Sender {
            transport,
            epoch: &epoch,
            replica: &self.replica,
            chain: self.chain.clone(),
            first: Some(self.first),
            sent: 0,
            pacer: &mut pacer,
        };
        let loaded = self.load(&tx, closed.as_ref(), &mut sender).await?;
        // What it sent is recorded from the plan, made now if not before:
        // the same view, so the same rows. A table its rule's filter alone
        // read nothing of is not scanned by that rule again (a replica of a
        // few rows beside a table of millions that has none for it, its
        // rule's column without an index).
        let rows = match planned {
            Some(rows) => rows,
            None => {
                let ruled_out = match (&closed, &loaded) {
                    (Some(closed), Ok(read)) => closed.ruled_out(&context.graph, read),
                    _ => Default::default(),
                };
                self.plan(&tx, &ruled_out).await?
            }
        };
        let streamed = match loaded {
            Ok(read) => read.iter().sum::<u64>(),
            Err(unsendable) => {
                let found = self.leaning_on(tx, &unsendable).await?;
                let by_rule = (Ruled::of(&self.context.settings) == Ruled::ByRule)
                    .then_some(&self.context.graph);
                crate::store::quarantine::set_aside(worker, &found, by_rule).await?;
                metrics::counter!("magic_sync_rows_quarantined_total")
                    .increment(unsendable.len() as u64);
                return Err(Error::Unsendable(unsendable));
            }
        };
        if closed.is_some() && streamed != rows {
            return Err(self.disagreed(streamed, rows));
        }
        let (chain, sent) = (sender.chain, sender.sent);
        // Nothing shared was written: the view ends here.
        tx.commit().await?;
        let t0 = std::time::Instant::now();
        let recorded = self.record(worker, &chain, &seen, &mut pacer).await?;
        super::trace("snapshot/record", t0);
        if pacer.paced() {
            tracing::debug!(
                target: "magic_sync::pass",
                replica = %self.replica,
                waited_ms = pacer.waited.as_millis() as u64,
                "the snapshot kept to its pace"
            );
        }
        Ok(Streamed {
            replica: self.replica.clone(),
            rows,
            messages: sent,
            recorded,
            planned_first: closed.is_none(),
        })
    }

    /// The replica's queries in closed form, to stream by before anything
    /// is planned; `None` when it plans first: rows are set aside (a plan
    /// works around them), or a snapshot before it disagreed with its plan.
    async fn closed_form(&self, tx: &Transaction<'_>) -> Result<Option<Closed>> {
        let context = &self.context;
        if quarantine::Blocks::read(tx).await?.any || context.plan_first.load(Ordering::Relaxed) {
            return Ok(None);
        }
        Ok(Closed::new(
            &context.graph,
            &self.replica,
            self.partition.as_deref(),
        ))
    }

    /// Reads, encodes and sends the replica's rows, by their queries in
    /// closed form or by its plan, to `sender`. Returns the rows read of
    /// each table, or the rows it could not send; any other failure ends
    /// the snapshot.
    async fn load<T: Transport>(
        &self,
        tx: &Transaction<'_>,
        closed: Option<&Closed>,
        sender: &mut Sender<'_, T>,
    ) -> Result<std::result::Result<Vec<u64>, Vec<crate::error::Unsendable>>> {
        let context = &self.context;
        let loader = Loader {
            graph: &context.graph,
            engine: &context.engine,
            settings: &context.settings,
            max_message_bytes: sender.transport.max_message_bytes(),
            removed: None,
            described: &context.described,
            cache: None,
            members: &[],
            batches: false,
            shared: &[],
        };
        let t0 = std::time::Instant::now();
        let source = match closed {
            Some(closed) => {
                tx.batch_execute(Closed::SETTINGS).await?;
                Source::Closed(closed)
            }
            None => Source::Snapshot,
        };
        let loaded = async {
            if let Some(closed) = closed {
                keep(tx, closed).await?;
            }
            loader
                .load(tx, source, &[self.replica.to_string()], sender)
                .await
        }
        .await;
        super::trace("snapshot/load and send", t0);
        let loaded = match loaded {
            Err(Error::Unsendable(unsendable)) => Err(unsendable),
            // A send the transport refused is not the query's.
            Err(e) if closed.is_some() && !e.is_transient() && !matches!(e, Error::Send { .. }) => {
                // A query in closed form (or a table kept for them)
                // PostgreSQL refused is the engine's to fix: snapshots plan
                // first until a build that has.
                context.plan_first.store(true, Ordering::Relaxed);
                tracing::error!(
                    error = %e,
                    "a snapshot's query in closed form failed; snapshots plan first from now on"
                );
                return Err(e);
            }
            Err(e) => return Err(e),
            Ok(read) => Ok(read),
        };
        if closed.is_some() {
            tx.batch_execute(JOINS_AS_THEY_WERE).await?;
        }
        Ok(loaded)
    }

    /// What leans, in the snapshot's plan, on the rows it could not send:
    /// to be set aside with them, so the next attempt plans around them
    /// (and the passes take them back from replicas holding older
    /// versions). The view ends.
    async fn leaning_on(
        &self,
        tx: Transaction<'_>,
        unsendable: &[crate::error::Unsendable],
    ) -> Result<Vec<crate::store::quarantine::SetAside>> {
        let graph = &self.context.graph;
        let found = quarantine::resolve(&tx, graph, quarantine::From::Fresh, unsendable).await?;
        tx.rollback().await?;
        Ok(found)
    }

    /// A snapshot that streamed `streamed` rows by its queries in closed
    /// form where its plan holds `planned`: an engine bug, after which
    /// every snapshot plans first.
    fn disagreed(&self, streamed: u64, planned: u64) -> Error {
        self.context.plan_first.store(true, Ordering::Relaxed);
        let e = Error::Disagreed {
            replica: self.replica.clone(),
            streamed,
            planned,
        };
        tracing::error!(error = %e, "a snapshot's rows disagreed with its plan");
        e
    }

    /// Plans the replica's whole set in the snapshot's view (not scanning
    /// the tables `ruled_out` by their rule); returns its rows. The
    /// planner's tables are made here, not before the stream: its first
    /// rows need none of them.
    async fn plan(
        &self,
        tx: &Transaction<'_>,
        ruled_out: &std::collections::BTreeSet<&'static str>,
    ) -> Result<u64> {
        let t0 = std::time::Instant::now();
        plan::prepare(tx).await?;
        let rows = plan_snapshot(
            tx,
            &self.context,
            &self.replica,
            self.partition.as_deref(),
            plan::Kind::Full,
            ruled_out,
        )
        .await?;
        super::trace("snapshot/plan", t0);
        Ok(rows)
    }

    /// Records what the snapshot sent as held, what it saw, and the replica
    /// as kept up, if its attempt is still the one under way. The rows go
    /// in first and the replica's record last: a pass that observes the
    /// replica meanwhile (moved, gone) ends its attempt without waiting on
    /// this transaction, and this one then finds the attempt over and
    /// rolls back. A paced snapshot records its rows a chunk at a time,
    /// waiting between chunks as it waited between the chunks it sent.
    async fn record(
        &self,
        worker: &mut Client,
        chain: &Chain,
        seen: &str,
        pacer: &mut Pacer,
    ) -> Result<bool> {
        let tx = worker.transaction().await?;
        // Counting what points at each row groups a million pointers whose
        // number the planner cannot guess: hashed, never sorted on disk.
        tx.batch_execute("SET LOCAL enable_sort = off").await?;
        let graph = &self.context.graph;
        if pacer.paced() {
            let staged = Staged::stage(
                &tx,
                graph,
                &self.replica,
                chain.last_number,
                Ruled::of(&self.context.settings),
            )
            .await?;
            let per_page = (staged.rows as f64 / staged.pages.max(1) as f64).max(1.0);
            let pages = ((pacer.chunk_rows() as f64 / per_page) as u64).max(1);
            let mut from = 0;
            while from < staged.pages {
                let to = (from + pages).min(staged.pages);
                let rows = Staged::record(&tx, from, to).await?;
                pacer.went(rows).await;
                from = to;
            }
            Staged::left_to_rule(
                &tx,
                &self.replica,
                chain.last_number,
                Ruled::of(&self.context.settings),
            )
            .await?;
        } else {
            let last = HashMap::from([(self.replica.to_string(), chain.last_number)]);
            let filled = Filled::only([Scratch::Fresh]);
            tx.batch_execute(
                &held::closing(graph, &last, &filled, Ruled::of(&self.context.settings)).text(),
            )
            .await?;
        }
        // Notes the view saw that no pass planned yet: the record alone
        // says what the replica holds of their rows until one does.
        let seen_by_view = format!(
            "pg_visible_in_snapshot(n.xid, {}::pg_snapshot)",
            crate::sql::literal(seen)
        );
        let ruled = Ruled::of(&self.context.settings);
        if let Some(kept) = held::kept_as_seen(
            graph,
            &crate::sql::literal(&self.replica),
            &seen_by_view,
            ruled,
        ) {
            tx.batch_execute(&kept).await?;
        }
        let ended = store::snapshots::Ended {
            replica: &self.replica,
            attempt: &self.attempt,
            seen,
            last_number: chain.last_number,
            last_nonce: &chain.last_nonce,
            first: self.first,
            schema: &self.context.schema,
        };
        if !store::snapshots::ended(&tx, &ended).await? {
            tx.rollback().await?;
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }
}

/// What a snapshot's worker session is set to before its view is taken:
/// its planner tables made afresh (no statistics of another snapshot's
/// size), its time zone as the relay's, no JIT; and, its joins and counts
/// being over every row of the snapshot, memory enough to hash them in one
/// batch (a snapshot of a million rows takes about 70 MB at its peak, in
/// the worker's backend only).
fn setup() -> String {
    let mut setup = String::from("SET TIME ZONE 'UTC'; SET work_mem = '64MB'; SET jit = off;");
    for table in [Scratch::Replicas, Scratch::Changed, Scratch::Fresh] {
        setup.push_str(&format!("DROP TABLE IF EXISTS {table};"));
    }
    setup
}

/// Works out, in the snapshot's view, what the queries in closed form read
/// of the tables they depend on: each once, into a temporary table of the
/// view, each after those it reads. They are not analysed: with every join
/// hashed, the queries reading them were planned alike either way, and
/// `ANALYZE` cost more than it saved.
async fn keep(tx: &Transaction<'_>, closed: &Closed) -> Result<()> {
    let t0 = std::time::Instant::now();
    for kept in closed.kept() {
        let t1 = std::time::Instant::now();
        let rows = tx.execute(kept.make.as_str(), &[]).await?;
        tracing::trace!(
            target: "magic_sync::pass",
            kept = %kept.table,
            rows,
            ms = t1.elapsed().as_secs_f64() * 1e3
        );
    }
    super::trace("snapshot/keep", t0);
    Ok(())
}

/// Plans the snapshot of `replica` (a holder of `kind`) in the worker's
/// tables: its whole set (`_ms_f`), and the newest note the snapshot sees
/// of each changed row (`_ms_changed`), the versions its rows are recorded
/// at. Returns the rows.
pub(super) async fn plan_snapshot(
    tx: &Transaction<'_>,
    context: &Context,
    replica: &str,
    partition: Option<&str>,
    kind: plan::Kind,
    ruled_out: &std::collections::BTreeSet<&'static str>,
) -> Result<u64> {
    tx.execute(
        "INSERT INTO _ms_r (r, part, fresh, kind) VALUES ($1, $2, true, $3)",
        &[&replica, &partition, &kind.as_str()],
    )
    .await?;
    plan::changed_for_snapshot(tx, &context.graph).await?;
    // A set that would hold a row pointing at one set aside is planned
    // again from here, with that row blocked too.
    tx.batch_execute("SAVEPOINT fresh").await?;
    let blocks = quarantine::Blocks::read(tx).await?;
    loop {
        let planner = Planner {
            tx,
            graph: &context.graph,
            groups: Vec::new(),
            filled: Default::default(),
            analysed: Default::default(),
            blocks,
            deployment: None,
            worked: Default::default(),
            ruled_out: ruled_out.clone(),
            ruled: Ruled::of(&context.settings),
            cache: None,
            rehearsing: false,
        };
        let rows = planner.provision().await?;
        if !blocks.any {
            return Ok(rows);
        }
        let blocked = planner.newly_blocked_fresh().await?;
        if blocked.is_empty() {
            return Ok(rows);
        }
        tx.batch_execute("ROLLBACK TO SAVEPOINT fresh").await?;
        // Never sent this replica, so never held by it.
        // Its replica is no holder the rule's reading counts yet.
        quarantine::block(tx, &blocked, true, None).await?;
        tx.batch_execute("RELEASE SAVEPOINT fresh; SAVEPOINT fresh")
            .await?;
    }
}

/// Where a snapshot's messages go: numbered, chained and sealed, then
/// straight to the transport, in order.
struct Sender<'a, T: Transport> {
    transport: &'a T,
    epoch: &'a Epoch,
    replica: &'a ReplicaId,
    chain: Chain,
    /// The number drawn for the first message when the snapshot began.
    first: Option<i64>,
    sent: u64,
    /// How fast it may go.
    pacer: &'a mut Pacer,
}

impl<T: Transport> Sink for Sender<'_, T> {
    async fn read(&mut self, rows: usize) -> Result<()> {
        self.pacer.went(rows as u64).await;
        Ok(())
    }

    async fn take(&mut self, tx: &Transaction<'_>, packed: Vec<Packed>) -> Result<()> {
        if packed.is_empty() {
            return Ok(());
        }
        let mut numbers: Vec<i64> = self.first.take().into_iter().collect();
        if packed.len() > numbers.len() {
            numbers.extend(draw(tx, packed.len() - numbers.len()).await?);
        }
        for (message, number) in packed.into_iter().zip(numbers) {
            let stamped = stamp(self.epoch, &mut self.chain, self.replica, number);
            let id = message_id(self.epoch, number, &stamped.nonce);
            let hash = Sha256::digest(&message.body);
            let bytes = whole(
                self.epoch,
                &stamped.head,
                &message.body,
                &hash,
                stamped.seal,
            );
            self.transport
                .send(self.replica, &id, bytes)
                .await
                .map_err(|e| Error::Send {
                    replica: self.replica.clone(),
                    number: u64::try_from(number).unwrap_or(0),
                    reason: e,
                })?;
            self.sent += 1;
            // Part of a snapshot sent: it is begun again from the start.
            fail::fail_point!("snapshot-mid-stream", |_| Err(Error::Injected(
                "snapshot-mid-stream"
            )));
        }
        Ok(())
    }
}

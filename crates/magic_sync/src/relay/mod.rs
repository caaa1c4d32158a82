//! The relay: the server side of the down path.
//!
//! A pass has two steps, and the runner ([`crate::run::server`]) repeats them:
//!
//! - [`Relay::record`], in one REPEATABLE READ transaction on the connection
//!   that holds the relay's lock: observe the replicas, read every pending
//!   note, plan (`plan`), load and encode each row sent once, pack each
//!   replica's rows into messages (`pack`), number, chain and seal them,
//!   and write the outbox, what each replica now holds, and the notes done.
//! - [`Relay::publish`], with no transaction open: each replica's outbox, in
//!   order, through the host's [`Transport`]; a message leaves the outbox
//!   once the transport took it.
//!
//! What replicas say back comes in through [`Relay::acknowledge`] and
//! [`Relay::gap`], with the replica named by whoever authenticated it.

mod graph;
mod held;
mod outbox;
mod pack;
mod plan;

pub use plan::Planned;

use crate::catalog::Catalog;
use crate::engine::Engine;
use crate::envelope::{Ack, Gap, RowData};
use crate::error::{Error, Result};
use crate::row::{Rule, Table};
use crate::sql::{literal, qualified};
use crate::value::{canonical_key, Kind, Value};
use graph::{key_match, Graph};
use pack::Packer;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::time::Duration;
use tokio_postgres::{Client, IsolationLevel, Transaction};

/// The advisory lock one relay per database holds while it relays (an
/// arbitrary constant: "magic_sync relay").
pub const RELAY_LOCK: i64 = 0x6d73_5f72_656c_6179;

/// A replica as the host describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaInfo {
    /// Its id: what rules compare a replica column with.
    pub id: String,
    /// Whether it takes part now. A replica that is not live holds nothing
    /// as far as the server records, and is sent nothing.
    pub live: bool,
    /// Its partition: what partition rules compare with.
    pub partition: Option<String>,
}

impl ReplicaInfo {
    /// A live replica.
    pub fn live(id: impl Into<String>, partition: Option<&str>) -> Self {
        ReplicaInfo {
            id: id.into(),
            live: true,
            partition: partition.map(str::to_string),
        }
    }
}

/// Where the replicas are: the host says, before every pass.
pub trait Replicas: Send + Sync {
    /// Every replica the host knows, live or not.
    fn replicas(&self) -> impl Future<Output = Result<Vec<ReplicaInfo>>> + Send;
}

/// A send the transport could not make; the message stays in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SendError(pub String);

/// How bytes reach replicas. The transport moves bytes and never looks inside.
pub trait Transport: Send + Sync {
    /// The most bytes one message may have.
    fn max_message_bytes(&self) -> usize;
    /// Hands `message` (a whole `ToReplica`) to the replica `replica`. `id`
    /// names the message for de-duplication: it is the same however often
    /// the message goes. Ok means the transport took it.
    fn send(
        &self,
        replica: &str,
        id: &str,
        message: Vec<u8>,
    ) -> impl Future<Output = Result<(), SendError>> + Send;
}

/// How the relay works.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Replicas published to at once.
    pub concurrency: usize,
    /// Rows loaded per round trip.
    pub chunk_rows: i32,
    /// Message bytes buffered before they are written to the outbox.
    pub flush_bytes: usize,
    /// How long the runner waits between passes when there was nothing to do.
    pub idle: Duration,
    /// The first wait after a failed pass; doubled up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest wait after failed passes.
    pub backoff_max: Duration,
    /// The most messages a replica's outbox may hold beyond the snapshot it
    /// begins with. Past it (or past `outbox_bytes`), the outbox is dropped
    /// and the replica provisioned again: a replica out of reach for long
    /// costs one snapshot, not storage without end.
    pub outbox_messages: i64,
    /// The most bytes (heads, bodies and seals) a replica's outbox may hold
    /// beyond the snapshot it begins with.
    pub outbox_bytes: i64,
    /// How often a pass measures the outboxes against their bound.
    pub outbox_check_every: Duration,
    /// How the runner's sessions are set up and ended (see
    /// [`crate::session`]).
    pub session: crate::session::SessionSettings,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            concurrency: 16,
            chunk_rows: 2_000,
            flush_bytes: 1 << 20,
            idle: Duration::from_millis(5),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(10),
            outbox_messages: 50_000,
            outbox_bytes: 512 << 20,
            outbox_check_every: Duration::from_secs(10),
            session: crate::session::SessionSettings::default(),
        }
    }
}

/// What one [`Relay::record`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The plan.
    pub planned: Planned,
    /// Replicas provisioned from scratch.
    pub provisioned: Vec<String>,
    /// Replicas forgotten (no longer live, or gone).
    pub forgotten: Vec<String>,
    /// Replicas whose outbox outgrew its bound: dropped, and provisioned
    /// again (they are among `provisioned` too).
    pub dropped: Vec<String>,
    /// Messages written to the outbox.
    pub messages: u64,
}

/// What one [`Relay::publish`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Published {
    /// Messages the transport took.
    pub sent: u64,
    /// Replicas a send failed to, with why; their messages wait.
    pub failed: Vec<(String, String)>,
}

/// What became of an acknowledgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acknowledged {
    /// Recorded: rows carried by this message and before count as held.
    Recorded,
    /// Of an earlier message than the replica said before, or of one the
    /// server has no record of sending, or of another epoch: the replica is
    /// provisioned again.
    Provisioning,
    /// The replica is unknown or not live: nothing recorded.
    Unknown,
}

/// The server side of the down path over one database.
#[derive(Debug)]
pub struct Relay {
    engine: Engine,
    graph: Graph,
    groups: Vec<GroupShape>,
    settings: Settings,
    prepared: bool,
    /// What the planner's tables hold between passes.
    leftovers: plan::Leftovers,
    /// The outbox's statements, prepared on the relay's connection.
    statements: Option<outbox::Statements>,
    /// When a pass last measured the outboxes against their bound.
    outbox_checked: Option<std::time::Instant>,
}

#[derive(Debug, Clone)]
struct GroupShape {
    table: &'static Table,
    members: String,
    members_name: &'static str,
    grants_name: &'static str,
    group_type: String,
    member_columns: &'static [&'static str],
}

impl Relay {
    /// A relay for `engine` over the database `client` is connected to.
    /// Runs the start-up checks: schema, declarations, triggers.
    pub async fn new(client: &Client, engine: Engine, settings: Settings) -> Result<Relay> {
        let catalog = crate::check::startup(&engine, client).await?;
        Self::with_catalog(&catalog, engine, settings)
    }

    fn with_catalog(catalog: &Catalog, engine: Engine, settings: Settings) -> Result<Relay> {
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
                        Error::Invalid(format!(
                            "table `{}`: group table `{}` has no column `{}`",
                            t.name, g.members, g.group
                        ))
                    })?;
                groups.push(GroupShape {
                    table: t,
                    members: qualified(t.schema, g.members),
                    members_name: g.members,
                    grants_name: g.grants,
                    group_type,
                    member_columns: g.member,
                });
            }
        }
        Ok(Relay {
            engine,
            graph,
            groups,
            settings,
            prepared: false,
            leftovers: plan::Leftovers::default(),
            statements: None,
            outbox_checked: None,
        })
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The settings.
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

    /// One record step: observes `replicas`, plans every pending note, and
    /// writes the outbox, what each replica now holds and the notes done, in
    /// one transaction. `max_message_bytes` is the transport's limit.
    pub async fn record(
        &mut self,
        client: &mut Client,
        replicas: &[ReplicaInfo],
        max_message_bytes: usize,
    ) -> Result<Recorded> {
        let tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .start()
            .await?;
        if !self.prepared {
            plan::prepare(&tx).await?;
            self.statements = Some(outbox::Statements::prepare(&tx).await?);
        }
        let t0 = std::time::Instant::now();
        // Three independent statements, sent together: one round trip.
        let holds_lock = async {
            let row = tx
                .query_one(
                    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory'
                       AND pid = pg_backend_pid() AND granted
                       AND ((classid::int8 << 32) | objid::int8) = $1)",
                    &[&RELAY_LOCK],
                )
                .await?;
            Ok::<bool, Error>(row.get(0))
        };
        let (holds_lock, (), epoch) = tokio::try_join!(
            holds_lock,
            self.leftovers.clear(&tx),
            outbox::Epoch::read(&tx)
        )?;
        if !holds_lock {
            return Err(Error::Invalid(
                "the relay records only on the connection that holds its lock (Relay::lock)".into(),
            ));
        }
        trace("clear", t0);
        let t0 = std::time::Instant::now();
        let due = match self.outbox_checked {
            None => true,
            Some(at) => at.elapsed() >= self.settings.outbox_check_every,
        };
        let dropped = if due {
            let dropped = outbox::bound(&tx, &self.settings).await?;
            self.outbox_checked = Some(std::time::Instant::now());
            dropped
        } else {
            Vec::new()
        };
        let observed = observe(&tx, replicas).await?;
        trace("observe", t0);
        let mut recorded = Recorded {
            forgotten: observed.forgotten,
            dropped,
            ..Recorded::default()
        };
        let listed: Vec<plan::Listed> = observed
            .live
            .iter()
            .map(|o| (o.id.clone(), o.partition.clone(), o.fresh))
            .collect();
        self.leftovers.list(&tx, listed).await?;
        let planner = plan::Planner {
            tx: &tx,
            graph: &self.graph,
            groups: self
                .groups
                .iter()
                .map(|g| plan::Group {
                    table: g.table,
                    members: g.members.clone(),
                    members_name: g.members_name,
                    grants_name: g.grants_name,
                    group_type: g.group_type.clone(),
                    member_columns: g.member_columns,
                })
                .collect(),
            filled: Default::default(),
            analysed: Default::default(),
        };
        let any_fresh = observed.live.iter().any(|o| o.fresh);
        let t0 = std::time::Instant::now();
        recorded.planned = planner.plan(any_fresh).await?;
        let filled = planner.filled();
        let analysed = planner.analysed();
        trace("plan", t0);
        recorded.provisioned = observed
            .live
            .iter()
            .filter(|o| o.fresh)
            .map(|o| o.id.clone())
            .collect();
        let mut closing = String::new();
        let nothing = recorded.planned.sends == 0 && recorded.planned.deletes == 0;
        if !nothing || any_fresh {
            let chains = observed
                .live
                .iter()
                .map(|o| (o.id.clone(), o.chain()))
                .collect();
            let statements = self
                .statements
                .as_ref()
                .expect("prepared with the planner's tables");
            let mut writer = outbox::Writer::new(statements, &epoch, chains);
            let t0 = std::time::Instant::now();
            let deletes = recorded.planned.deletes > 0;
            self.load(&tx, &mut writer, &observed.live, max_message_bytes, deletes)
                .await?;
            trace("load", t0);
            if tracing() {
                for (step, ms) in SUMS.lock().unwrap().drain(..) {
                    eprintln!("{ms:>8.1} ms  load/{step}");
                }
            }
            recorded.messages = writer.written();
            let (last, chains) = writer.finish();
            closing.push_str(&chains);
            closing.push_str(&held::closing(&self.graph, &last, &filled));
        }
        if recorded.planned.notes > 0 {
            closing.push_str(
                "DELETE FROM sync.notes WHERE ctid = ANY (ARRAY (SELECT at FROM _ms_notes));",
            );
        }
        // Where the chains stand, what each replica now holds, the notes
        // done: one round trip. Bodies no message carries any more go with
        // them, here and not where messages are published: publishing runs
        // beside a pass, and could delete a body the pass is pointing a new
        // message at, unseen until it commits.
        if !closing.is_empty() {
            closing.push_str(
                "DELETE FROM sync.bodies b
                 WHERE NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.body = b.id);",
            );
            let t0 = std::time::Instant::now();
            tx.batch_execute(&closing).await?;
            trace("close (chains, held, notes done)", t0);
        }
        let t0 = std::time::Instant::now();
        tx.commit().await?;
        trace("commit", t0);
        self.prepared = true;
        self.leftovers.left(filled, analysed);
        Ok(recorded)
    }

    /// Reads every row sent, once, a chunk at a time; packs each replica's
    /// rows and deletes into messages; writes them as they fill.
    async fn load(
        &self,
        tx: &Transaction<'_>,
        writer: &mut outbox::Writer<'_>,
        live: &[Observed],
        max_message_bytes: usize,
        deletes: bool,
    ) -> Result<()> {
        // The replicas and tables with both deletes and upserts this pass:
        // each side on its own, then matched here (no join of the two for
        // PostgreSQL to misjudge).
        let both: HashSet<(String, &'static str)> = if deletes {
            let pairs = |sql: &'static str| async move {
                Ok::<_, Error>(
                    tx.query(sql, &[])
                        .await?
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                        .collect::<HashSet<(String, String)>>(),
                )
            };
            let (deleted, sent) = tokio::try_join!(
                pairs("SELECT DISTINCT r, t FROM _ms_del"),
                pairs("SELECT DISTINCT r, t FROM _ms_send")
            )?;
            deleted
                .intersection(&sent)
                .map(|(r, t)| (r.clone(), self.graph.shape(t).table.name))
                .collect()
        } else {
            HashSet::new()
        };
        let self_referencing = self
            .graph
            .shapes
            .iter()
            .filter(|s| s.self_referencing)
            .map(|s| s.table.name)
            .collect();
        // Room for the head (ids, numbers, nonces) and the seal around a body.
        let limit = max_message_bytes.saturating_sub(256).max(1024);
        let mut packer = Packer::new(limit, both, self_referencing);
        for shape in &self.graph.shapes {
            self.load_upserts(tx, shape, &mut packer, writer, limit, live)
                .await?;
            packer.upserts_done(shape.table.name);
        }
        for shape in self.graph.shapes.iter().rev() {
            if deletes {
                self.load_deletes(tx, shape.table, &mut packer, writer)
                    .await?;
            }
            packer.deletes_done(shape.table.name);
        }
        packer.end_all();
        let tables: Vec<String> = self
            .graph
            .shapes
            .iter()
            .map(|s| s.table.name.to_string())
            .collect();
        for o in live.iter().filter(|o| o.fresh) {
            packer.end_snapshot(&o.id, tables.clone());
        }
        writer.write(tx, packer.take()).await
    }

    async fn load_upserts(
        &self,
        tx: &Transaction<'_>,
        shape: &graph::Shape,
        packer: &mut Packer,
        writer: &mut outbox::Writer<'_>,
        limit: usize,
        live: &[Observed],
    ) -> Result<()> {
        let table = shape.table;
        // Rows to send to replicas kept up, and the snapshots' rows.
        let t = literal(table.name);
        let snapshots = live.iter().any(|o| o.fresh);
        let rows = if snapshots {
            format!(
                "SELECT r, k FROM _ms_send WHERE t = {t} UNION ALL SELECT r, k FROM _ms_f WHERE t = {t}"
            )
        } else {
            format!("SELECT r, k FROM _ms_send WHERE t = {t}")
        };
        // Each row once, with every replica it goes to; with one replica
        // planned there is nothing to gather.
        let sent = if live.len() == 1 {
            format!("SELECT k, ARRAY[r] AS rs FROM ({rows}) u")
        } else {
            format!("SELECT k, array_agg(r) AS rs FROM ({rows}) u GROUP BY k")
        };
        let cols = crate::pg::select_list("a", table);
        let sql = if snapshots {
            // A snapshot reads much of the table: joined in bulk.
            format!(
                "SELECT s.rs, {cols} FROM ({sent}) s JOIN {rel} a ON {m}",
                rel = shape.relation,
                m = key_match("a", shape, "s.k"),
            )
        } else {
            // A steady pass reads the rows it sends, each by its key, and
            // nothing else of the table, whatever PostgreSQL guesses of
            // their number.
            format!(
                "SELECT s.rs, a.* FROM ({sent}) s
                 CROSS JOIN LATERAL (SELECT {cols} FROM {rel} a WHERE {m} OFFSET 0) a",
                rel = shape.relation,
                m = key_match("a", shape, "s.k"),
            )
        };
        let portal = tx.bind(sql.as_str(), &[]).await?;
        let chunk = self.settings.chunk_rows.max(1);
        let mut rows = tx.query_portal(&portal, chunk).await?;
        loop {
            if rows.is_empty() {
                return Ok(());
            }
            // A full chunk may have more behind it: the next one is asked for
            // before this one is encoded, so PostgreSQL reads while the
            // relay encodes. A short chunk is the last.
            let next = if rows.len() == chunk as usize {
                let t_fetch = std::time::Instant::now();
                let (next, packed) = tokio::join!(tx.query_portal(&portal, chunk), async {
                    self.pack_rows(table, &rows, packer, limit)
                });
                trace_sum("fetch+encode", t_fetch);
                packed?;
                next?
            } else {
                self.pack_rows(table, &rows, packer, limit)?;
                Vec::new()
            };
            if packer.pending_bytes() >= self.settings.flush_bytes {
                let t_write = std::time::Instant::now();
                writer.write(tx, packer.take()).await?;
                trace_sum("write", t_write);
            }
            rows = next;
        }
    }

    /// Encodes each row read once, and hands it to the packer for every
    /// replica it goes to (the first column).
    fn pack_rows(
        &self,
        table: &'static Table,
        rows: &[tokio_postgres::Row],
        packer: &mut Packer,
        limit: usize,
    ) -> Result<()> {
        let codec = self
            .engine
            .codec(table.name)
            .expect("every table that goes down has a codec");
        let key_positions = table.key_positions();
        for row in rows {
            let replicas: Vec<String> = row.get(0);
            let values = crate::pg::read_row(row, 1, table).map_err(|e| {
                Error::Invalid(format!(
                    "table `{}`: a row read from PostgreSQL does not fit its declaration: {e}",
                    table.name
                ))
            })?;
            let key = canonical_key(
                &key_positions
                    .iter()
                    .map(|&i| values[i].clone())
                    .collect::<Vec<_>>(),
            );
            let data = codec.encode(values).map_err(|source| Error::Codec {
                table: table.name.to_string(),
                key: key.clone(),
                source,
            })?;
            if data.len() + key.len() + 16 > limit {
                return Err(Error::RowTooLarge {
                    table: table.name.to_string(),
                    key,
                    bytes: data.len(),
                    limit,
                });
            }
            let key = key.into_bytes();
            for r in &replicas {
                packer.upsert(
                    r,
                    table.name,
                    RowData {
                        key: key.clone(),
                        data: data.clone(),
                    },
                );
            }
        }
        Ok(())
    }

    async fn load_deletes(
        &self,
        tx: &Transaction<'_>,
        table: &'static Table,
        packer: &mut Packer,
        writer: &mut outbox::Writer<'_>,
    ) -> Result<()> {
        let sql = format!(
            "SELECT k, array_agg(r) FROM _ms_del WHERE t = {} GROUP BY k",
            literal(table.name)
        );
        let portal = tx.bind(sql.as_str(), &[]).await?;
        loop {
            let rows = tx.query_portal(&portal, self.settings.chunk_rows).await?;
            if rows.is_empty() {
                return Ok(());
            }
            for row in &rows {
                let key = wire_key(table, row.get(0))?.into_bytes();
                let replicas: Vec<String> = row.get(1);
                for r in &replicas {
                    packer.delete(r, table.name, key.clone());
                }
            }
            if packer.pending_bytes() >= self.settings.flush_bytes {
                writer.write(tx, packer.take()).await?;
            }
            if rows.len() < self.settings.chunk_rows.max(1) as usize {
                return Ok(());
            }
        }
    }

    /// Publishes every outbox, up to [`Settings::concurrency`] replicas at
    /// once; see [`publish_outbox`].
    pub async fn publish<T: Transport>(&self, client: &Client, transport: &T) -> Result<Published> {
        publish_outbox(client, transport, self.settings.concurrency).await
    }

    /// The replica `replica` says it applied the message `ack` names; see
    /// [`acknowledge_all`].
    pub async fn acknowledge(
        &self,
        client: &Client,
        replica: &str,
        ack: &Ack,
    ) -> Result<Acknowledged> {
        outbox::acknowledge(client, replica, ack).await
    }

    /// See [`acknowledge_all`].
    pub async fn acknowledge_all(
        &self,
        client: &Client,
        acks: &[(String, Ack)],
    ) -> Result<Vec<Result<Acknowledged>>> {
        acknowledge_all(client, acks).await
    }

    /// Checks the record of what replicas hold (`sync.held`) against
    /// itself and the database: every row recorded exists, is recorded as
    /// its rule sends it and as pointing at what it points at now, and with
    /// as many of the replica's rows pointing at it as do. Returns one line
    /// per disagreement, none when the record is sound. It reads the whole
    /// record: for tests, and for an operator in doubt; exact only while no
    /// note is pending.
    pub async fn audit(&self, client: &Client) -> Result<Vec<String>> {
        held::audit(client, &self.graph).await
    }

    /// See [`gap`].
    pub async fn gap(&self, client: &Client, replica: &str, gap: &Gap) -> Result<bool> {
        self::gap(client, replica, gap).await
    }
}

/// Acknowledgements, each with the replica that sent it as the transport
/// authenticated it (never as the message says): one outcome per
/// acknowledgement, in order. A seal that does not verify is refused with an
/// error of its own, changes nothing and holds back no other. Needs no lock:
/// acknowledgements live in `sync.acks`, which passes write only to forget a
/// replica the host no longer lists, so they can be recorded on a connection
/// of their own while the relay records.
pub async fn acknowledge_all(
    client: &Client,
    acks: &[(String, Ack)],
) -> Result<Vec<Result<Acknowledged>>> {
    outbox::acknowledge_all(client, acks).await
}

/// The replica `replica` could not follow a message and waits for a
/// snapshot: it is provisioned again at the next pass, unless a snapshot
/// that began after that message is already on its way. Returns whether it
/// will be.
pub async fn gap(client: &Client, replica: &str, gap: &Gap) -> Result<bool> {
    outbox::gap(client, replica, gap).await
}

/// Publishes every outbox over `client`, up to `concurrency` replicas at
/// once, each replica's messages in order; a replica a send fails to keeps
/// the rest of its outbox and holds back no other. Needs no lock, and can run
/// on a connection of its own while the relay records.
pub async fn publish_outbox<T: Transport>(
    client: &Client,
    transport: &T,
    concurrency: usize,
) -> Result<Published> {
    outbox::publish(client, transport, concurrency).await
}

static SUMS: std::sync::Mutex<Vec<(String, f64)>> = std::sync::Mutex::new(Vec::new());

/// Adds to a running total, printed by [`trace`] with the same name.
pub(crate) fn trace_sum(step: &str, since: std::time::Instant) {
    if tracing() {
        let mut sums = SUMS.lock().unwrap();
        let ms = since.elapsed().as_secs_f64() * 1e3;
        match sums.iter_mut().find(|(s, _)| s == step) {
            Some((_, total)) => *total += ms,
            None => sums.push((step.to_string(), ms)),
        }
    }
}

/// Whether MAGIC_SYNC_TRACE is set, read once: the planner asks per statement.
pub(crate) fn tracing() -> bool {
    static TRACING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACING.get_or_init(|| std::env::var_os("MAGIC_SYNC_TRACE").is_some())
}

/// With MAGIC_SYNC_TRACE set, says on standard error how long a step of the
/// pass took.
pub fn trace(step: &str, since: std::time::Instant) {
    if tracing() {
        eprintln!("{:>8.1} ms  {step}", since.elapsed().as_secs_f64() * 1e3);
    }
}

/// The wire key of a key read back from the planner's tables.
fn wire_key(table: &Table, json: serde_json::Value) -> Result<String> {
    let bad = |why: String| {
        Error::Invalid(format!(
            "table `{}`: recorded key {json}: {why}",
            table.name
        ))
    };
    let serde_json::Value::Array(items) = json.clone() else {
        return Err(bad("not an array".into()));
    };
    if items.len() != table.key.len() {
        return Err(bad("not as many values as key columns".into()));
    }
    let mut values = Vec::with_capacity(items.len());
    for (item, name) in items.into_iter().zip(table.key) {
        let kind = table.column(name).map_or(Kind::Text, |c| c.kind);
        let item = match (kind, item) {
            // PostgreSQL writes numerics as JSON numbers; they travel as text.
            (Kind::Numeric, serde_json::Value::Number(n)) => {
                serde_json::Value::String(n.to_string())
            }
            (_, item) => item,
        };
        values.push(Value::from_json(kind, item).map_err(|e| bad(e.to_string()))?);
    }
    Ok(canonical_key(&values))
}

/// A live replica as this pass sees it.
#[derive(Debug, Clone)]
pub(crate) struct Observed {
    pub id: String,
    pub partition: Option<String>,
    /// Provisioned from scratch this pass.
    pub fresh: bool,
    pub last_number: i64,
    pub last_nonce: Vec<u8>,
}

impl Observed {
    fn chain(&self) -> outbox::Chain {
        outbox::Chain {
            last_number: self.last_number,
            last_nonce: self.last_nonce.clone(),
            begins_snapshot: self.fresh,
            snapshot_number: None,
        }
    }
}

struct Observation {
    live: Vec<Observed>,
    forgotten: Vec<String>,
}

/// Compares the replicas the host lists with what the relay saw last: a
/// replica that became live or moved partition is provisioned from scratch;
/// one no longer live, or gone, is forgotten.
async fn observe(tx: &Transaction<'_>, replicas: &[ReplicaInfo]) -> Result<Observation> {
    let mut seen = HashSet::new();
    for r in replicas {
        if r.id.is_empty() {
            return Err(Error::Invalid(
                "the host lists a replica with an empty id".into(),
            ));
        }
        if !seen.insert(r.id.as_str()) {
            return Err(Error::Invalid(format!(
                "the host lists replica `{}` twice",
                r.id
            )));
        }
    }
    let known: HashMap<String, (bool, Option<String>)> = tx
        .query("SELECT id, live, partition_id FROM sync.replicas", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), (r.get(1), r.get(2))))
        .collect();
    let mut forget: Vec<String> = Vec::new();
    let mut provision: Vec<(&str, Option<&str>)> = Vec::new();
    let mut quiet: Vec<&str> = Vec::new();
    for r in replicas {
        let before = known.get(&r.id);
        match (r.live, before) {
            (true, Some((true, part))) if *part == r.partition => {}
            (true, _) => provision.push((r.id.as_str(), r.partition.as_deref())),
            (false, Some((true, _))) => {
                forget.push(r.id.clone());
                quiet.push(&r.id);
            }
            (false, Some((false, _))) => {}
            (false, None) => quiet.push(&r.id),
        }
    }
    let gone: Vec<String> = known
        .keys()
        .filter(|id| !seen.contains(id.as_str()))
        .cloned()
        .collect();
    forget.extend(gone.iter().cloned());
    for (id, part) in &provision {
        tx.execute(
            "INSERT INTO sync.replicas (id, live, partition_id, provision) VALUES ($1, true, $2, true)
             ON CONFLICT (id) DO UPDATE SET live = true, partition_id = $2, provision = true,
                 observed_at = now()",
            &[id, part],
        )
        .await?;
    }
    for id in &quiet {
        tx.execute(
            "INSERT INTO sync.replicas (id, live, provision) VALUES ($1, false, true)
             ON CONFLICT (id) DO UPDATE SET live = false, provision = true, observed_at = now()",
            &[id],
        )
        .await?;
    }
    if !gone.is_empty() {
        tx.execute("DELETE FROM sync.replicas WHERE id = ANY($1)", &[&gone])
            .await?;
    }
    let live: Vec<Observed> = tx
        .query(
            "SELECT id, partition_id, provision, last_number, last_nonce FROM sync.replicas WHERE live ORDER BY id",
            &[],
        )
        .await?
        .iter()
        .map(|r| Observed {
            id: r.get(0),
            partition: r.get(1),
            fresh: r.get(2),
            last_number: r.get(3),
            last_nonce: r.get(4),
        })
        .collect();
    // A replica provisioned from scratch holds nothing and is owed nothing
    // until the snapshot is written: forget its record and its outbox.
    let mut clear: Vec<String> = live
        .iter()
        .filter(|o| o.fresh)
        .map(|o| o.id.clone())
        .collect();
    clear.extend(forget.iter().cloned());
    if !clear.is_empty() {
        tx.execute("DELETE FROM sync.held WHERE replica = ANY($1)", &[&clear])
            .await?;
        tx.execute("DELETE FROM sync.outbox WHERE replica = ANY($1)", &[&clear])
            .await?;
    }
    Ok(Observation {
        live,
        forgotten: forget,
    })
}

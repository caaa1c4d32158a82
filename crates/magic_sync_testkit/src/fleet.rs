//! A server database with the test shop, the relay on a connection holding
//! its lock, and replicas on real SQLite files behind the in-process network.
//! [`Fleet::sync`] runs passes until nothing moves; [`Fleet::check`] is the
//! invariant every down-path test ends with.

use crate::shop;
use crate::wanted;
use magic_sync::catalog::Catalog;
use magic_sync::relay::{Recorded, Relay, ReplicaInfo, Settings, Snapshot};
use magic_sync::replica::{self, Replica};
use magic_sync::run::{self, memory::Network};
use magic_sync::sql::ident;
use magic_sync::{Engine, ReplicaId, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use tokio_postgres::Client;

/// A replica of the fleet.
pub struct Unit {
    pub info: ReplicaInfo,
    pub replica: Replica,
    /// Cut off by the network: sends fail, its messages wait in the outbox.
    pub cut: bool,
    /// Its SQLite file.
    pub path: std::path::PathBuf,
}

/// What one step of the fleet did: the pass, and the snapshots recorded.
#[derive(Debug)]
pub struct Step {
    pub recorded: Recorded,
    /// Replicas provisioned from scratch, their snapshots recorded.
    pub provisioned: Vec<ReplicaId>,
}

impl std::ops::Deref for Step {
    type Target = Recorded;

    fn deref(&self) -> &Recorded {
        &self.recorded
    }
}

/// From how many messages to replicas that read batches a page of the
/// test fleet's outbox is signed together.
pub const BATCHED_FROM: usize = 2;

pub struct Fleet {
    pub db: magic_sync_testdb::TestDb,
    /// The relay's connection, holding the lock.
    pub client: Client,
    /// The connection snapshots stream on.
    pub snapshots: Client,
    /// The host's connection, for its writes.
    pub writer: Client,
    pub engine: Engine,
    pub catalog: Catalog,
    pub relay: Relay,
    /// The server's key, as a replica is given it when it is enrolled.
    pub key: magic_sync::sign::ServerKey,
    pub network: Network,
    pub dir: tempfile::TempDir,
    pub units: BTreeMap<String, Unit>,
    /// Snapshots recorded so far, over every step: how often a replica
    /// was provisioned from scratch.
    pub provisionings: usize,
    /// Replicas passes found past their outbox's bound, or whose
    /// snapshot's end was lost, over every pass: each provisioned again.
    pub dropped: usize,
    /// What publishing remembers between calls, as a runner keeps it: the
    /// cohorts' messages sent each member, sent again only once
    /// `RESEND_AFTER` passed, like the outbox's; a replica a send failed
    /// to, passed over while the network cuts it off. A relay started
    /// again forgets it.
    pub away: magic_sync::relay::Away,
}

/// What publishing remembers, as a relay starting with `settings` knows it.
fn fresh_memory(settings: &Settings) -> magic_sync::relay::Away {
    let wait = magic_sync::relay::RESEND_AFTER;
    magic_sync::relay::Away::new(wait, wait).by_rule(settings.record_by_rule)
}

/// Messages of at most this many bytes: small, so plans span several messages.
pub const MAX_MESSAGE: usize = 4096;

impl Fleet {
    /// The shop, installed, with `rows` written before the relay starts.
    pub async fn new(rows: &str) -> Fleet {
        Self::with(rows, MAX_MESSAGE).await
    }

    pub async fn with(rows: &str, max_message: usize) -> Fleet {
        let (db, writer) = shop::installed().await;
        if !rows.is_empty() {
            writer
                .batch_execute(rows)
                .await
                .expect("the fixture's rows");
        }
        Self::on(db, writer, shop::engine(), max_message).await
    }

    /// The shop, with `rows`, relayed by `relay_engine`: the shop's
    /// declarations with codecs of a test's own. Replicas and the reference
    /// use the shop's engine.
    pub async fn with_relay_engine(rows: &str, relay_engine: Engine) -> Fleet {
        let mut fleet = Self::new(rows).await;
        fleet.deploy(relay_engine).await;
        fleet
    }

    /// A new build of the relay: `engine` (with the same declarations) in
    /// place of the running one's, on the same lock.
    pub async fn deploy(&mut self, engine: Engine) {
        let settings = self.relay.settings().clone();
        self.relay = Relay::new(&self.client, engine, settings)
            .await
            .expect("the relay starts");
        self.away = fresh_memory(self.relay.settings());
    }

    /// A relay whose session was lost (and its lock with it) replaced by
    /// one on a new session: it takes the lock as a relay starting does,
    /// and the snapshots' session is new too.
    pub async fn reconnect(&mut self) {
        let client = self.db.connect().await;
        self.reconnect_on(client).await;
    }

    /// [`reconnect`](Self::reconnect), the relay's new session on `client`
    /// (one whose traffic is counted, say).
    pub async fn reconnect_on(&mut self, client: Client) {
        let engine = self.relay.engine().clone();
        let settings = self.relay.settings().clone();
        // A session still alive is ended first, and waited for: its lock
        // goes with it.
        if let Ok(row) = self.client.query_one("SELECT pg_backend_pid()", &[]).await {
            let pid: i32 = row.get(0);
            self.writer
                .execute("SELECT pg_terminate_backend($1, 10000)", &[&pid])
                .await
                .unwrap();
        }
        self.client = client;
        self.away = fresh_memory(self.relay.settings());
        self.client
            .batch_execute("SET TIME ZONE 'UTC'")
            .await
            .unwrap();
        assert!(
            Relay::lock(&self.client).await.unwrap(),
            "the new relay takes the lock"
        );
        self.relay = Relay::new(&self.client, engine, settings)
            .await
            .expect("the relay starts");
        self.snapshots = self.db.connect().await;
    }

    /// `id`'s SQLite file replaced by the copy at `path`, as a till restored
    /// from a backup starts.
    pub fn restore(&mut self, id: &str, path: std::path::PathBuf) {
        let (info, cut) = {
            let unit = self.unit(id);
            (unit.info.clone(), unit.cut)
        };
        self.units.remove(id);
        self.add_at(id, info.partition.as_deref(), path);
        let unit = self.unit(id);
        unit.info = info;
        unit.cut = cut;
    }

    /// A fleet on a database of another schema than the shop's: `schema`
    /// (tables and rows) is made, the `sync` schema installed and
    /// `engine`'s triggers.
    pub async fn of(schema: &str, engine: Engine) -> Fleet {
        Self::of_sized(schema, engine, MAX_MESSAGE).await
    }

    /// [`of`](Self::of), with messages of at most `max_message` bytes.
    pub async fn of_sized(schema: &str, engine: Engine, max_message: usize) -> Fleet {
        let db = magic_sync_testdb::database().await;
        let mut writer = db.connect().await;
        writer.batch_execute(schema).await.expect("the schema");
        magic_sync::schema::migrate(&mut writer)
            .await
            .expect("migrate");
        magic_sync::trigger::install(&engine, &mut writer)
            .await
            .expect("install triggers");
        Self::on(db, writer, engine, max_message).await
    }

    async fn on(
        db: magic_sync_testdb::TestDb,
        writer: Client,
        engine: Engine,
        max_message: usize,
    ) -> Fleet {
        let client = db.connect().await;
        client.batch_execute("SET TIME ZONE 'UTC'").await.unwrap();
        // Small chunks and flushes, so a pass reads its rows over several
        // round trips (the next asked for while one is encoded) and writes
        // its messages over several batches, as a large one does.
        let settings = Settings {
            chunk_rows: 3,
            flush_bytes: 2048,
            // And deployments over several passes: four rows a pass from
            // the first (the most, and what a deployment begins with).
            deploy_chunk_rows: 4,
            deploy_pass_budget: std::time::Duration::from_secs(3600),
            // The outboxes, and snapshots whose end was lost, looked at
            // every pass: the tests' time is not the wall clock's.
            outbox_check_every: std::time::Duration::ZERO,
            // `MAGIC_SYNC_RECORD_BY_RULE=0` runs a suite with the record by
            // rule off (a test may pin either for itself).
            record_by_rule: crate::bench::record_by_rule(),
            ..Settings::default()
        };
        let relay = Relay::new(&client, engine.clone(), settings)
            .await
            .expect("the relay starts");
        assert!(
            Relay::lock(&client).await.unwrap(),
            "the relay takes its lock"
        );
        let catalog = Catalog::read(&client, &engine).await.unwrap();
        let snapshots = db.connect().await;
        let key = magic_sync::store::keys::public(&client).await.unwrap();
        let away = fresh_memory(relay.settings());
        Fleet {
            db,
            client,
            snapshots,
            writer,
            engine,
            catalog,
            relay,
            key,
            network: Network::new(max_message),
            dir: tempfile::tempdir().unwrap(),
            units: BTreeMap::new(),
            provisionings: 0,
            dropped: 0,
            away,
        }
    }

    /// The foreign keys the server describes to replicas.
    pub fn foreign_keys(&self) -> Vec<replica::ForeignKey> {
        self.catalog.replica_foreign_keys()
    }

    /// Adds a live replica with a fresh SQLite file.
    pub fn add(&mut self, id: &str, partition: Option<&str>) {
        let path = self.dir.path().join(format!("{id}.sqlite"));
        self.add_at(id, partition, path);
    }

    pub fn add_at(&mut self, id: &str, partition: Option<&str>, path: std::path::PathBuf) {
        let replica = self.open_replica(id, &path);
        self.enlist(id, partition, path, replica);
    }

    /// A replica with no declarations of its own
    /// (`Replica::open_described`): its tables are what the server
    /// describes.
    pub fn add_described(&mut self, id: &str, partition: Option<&str>) {
        let path = self.dir.path().join(format!("{id}.sqlite"));
        let mut replica = Replica::open_described(&path, id).unwrap();
        replica.trust(&self.key).unwrap();
        self.enlist(id, partition, path, replica);
    }

    fn enlist(
        &mut self,
        id: &str,
        partition: Option<&str>,
        path: std::path::PathBuf,
        replica: Replica,
    ) {
        self.units.insert(
            id.to_string(),
            Unit {
                info: ReplicaInfo::live(id, partition),
                replica,
                cut: false,
                path,
            },
        );
    }

    /// `id`'s replica opened on the file at `path` with the fleet's engine.
    fn open_replica(&self, id: &str, path: &std::path::Path) -> Replica {
        let mut replica = Replica::open(path, id, &self.engine).unwrap();
        replica.trust(&self.key).unwrap();
        if self
            .engine
            .tables()
            .any(|t| t.name == "products" && t.column("barcode").is_some())
        {
            // As on the server, a barcode belongs to one product at a time.
            replica
                .connection()
                .execute_batch(
                    "CREATE UNIQUE INDEX IF NOT EXISTS products_barcode ON products (barcode)",
                )
                .unwrap();
        }
        replica
    }

    /// Whether every replica holds the configuration its build runs whole
    /// (`Replica::configuration`).
    pub fn configured(&self) -> bool {
        self.units.values().all(|u| {
            u.replica
                .configuration()
                .expect("read the configuration")
                .complete
        })
    }

    /// A new build deployed, declarations and all: its triggers ensured,
    /// the relay started with `engine` on the same lock, and every replica
    /// opened again on its file with `engine` (as a till's new build
    /// starts). The reference follows `engine` from then on.
    pub async fn redeploy(&mut self, engine: Engine) -> magic_sync::trigger::Ensured {
        let ensured = self.redeploy_server(engine).await;
        let ids: Vec<String> = self.units.keys().cloned().collect();
        for id in ids {
            let path = self.units[&id].path.clone();
            let replica = self.open_replica(&id, &path);
            self.unit(&id).replica = replica;
        }
        ensured
    }

    /// A new build of the server alone: its triggers ensured and the relay
    /// started with `engine`; the replicas keep the build they run. The
    /// reference follows `engine` from then on.
    pub async fn redeploy_server(&mut self, engine: Engine) -> magic_sync::trigger::Ensured {
        let ensured = magic_sync::trigger::ensure(
            &engine,
            &mut self.writer,
            &magic_sync::trigger::InstallSettings::default(),
        )
        .await
        .expect("the new build's triggers");
        self.catalog = Catalog::read(&self.client, &engine).await.unwrap();
        let settings = self.relay.settings().clone();
        self.relay = Relay::new(&self.client, engine.clone(), settings)
            .await
            .expect("the new build's relay starts");
        self.engine = engine;
        ensured
    }

    /// The relay again, its settings changed by `change`.
    pub async fn reconfigure(&mut self, change: impl FnOnce(&mut Settings)) {
        let mut settings = self.relay.settings().clone();
        change(&mut settings);
        self.relay = Relay::new(&self.client, self.engine.clone(), settings)
            .await
            .expect("the relay starts");
        self.away = fresh_memory(self.relay.settings());
    }

    /// What publishing remembers, as a few minutes' wait leaves it: the
    /// cohort's messages sent lately may go again, and replicas away are
    /// tried again. For tests that stand in for the wall clock by moving
    /// the record's clocks back.
    pub fn minutes_pass(&mut self) {
        self.away = fresh_memory(self.relay.settings());
    }

    /// The relay again, recording every replica's rows and messages
    /// for it alone, whatever `MAGIC_SYNC_RECORD_BY_RULE` says: for the
    /// tests that read the per-replica outbox and record themselves (their
    /// cohort counterparts are in `down/batches.rs`), and the walk and storm
    /// seeds that keep the setting's off side exercised.
    pub async fn per_replica(&mut self) {
        self.reconfigure(|s| s.record_by_rule = false).await;
    }

    pub fn unit(&mut self, id: &str) -> &mut Unit {
        self.units.get_mut(id).expect("a replica of the fleet")
    }

    pub fn set_live(&mut self, id: &str, live: bool) {
        self.unit(id).info.live = live;
    }

    pub fn move_to(&mut self, id: &str, partition: Option<&str>) {
        self.unit(id).info.partition = partition.map(str::to_string);
    }

    pub fn cut(&mut self, id: &str, cut: bool) {
        self.network.cut(id, cut);
        self.unit(id).cut = cut;
    }

    fn infos(&self) -> Vec<ReplicaInfo> {
        self.units.values().map(|u| u.info.clone()).collect()
    }

    pub async fn write(&self, sql: &str) {
        self.writer
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// A write, then passes until nothing moves, then the check.
    pub async fn settle(&mut self, sql: &str) {
        self.write(sql).await;
        self.sync().await;
        self.check().await;
    }

    /// One step that provisions exactly `unit` from scratch; then passes
    /// until nothing moves, and the check.
    pub async fn provisions(&mut self, unit: &str) {
        let step = self.record().await;
        assert_eq!(step.provisioned, vec![unit.to_string()]);
        self.deliver().await;
        self.sync().await;
        self.check().await;
    }

    /// One step: a pass, then the snapshot of every replica waiting for
    /// one, each streamed to the network on the snapshots' connection (a
    /// replica cut off fails its snapshot, and waits for the next step).
    pub async fn record(&mut self) -> Step {
        let recorded = self.pass().await;
        let mut provisioned = Vec::new();
        for replica in recorded.waiting.clone() {
            if let Some(streamed) = self.snapshot(&replica).await {
                provisioned.push(streamed);
            }
        }
        self.provisionings += provisioned.len();
        Step {
            recorded,
            provisioned,
        }
    }

    /// One step whose snapshots stream while the server writes: for each
    /// replica waiting for one, a transaction doing `open` is begun before
    /// the snapshot takes its view and committed while it streams, `during`
    /// is written beside it, and a pass plans both for the others, all while
    /// the snapshot stands still after taking its view. A write the schema
    /// refuses changes nothing.
    pub async fn record_amid(&mut self, open: &str, during: &str) -> Step {
        let recorded = self.pass().await;
        let mut provisioned = Vec::new();
        for replica in recorded.waiting.clone() {
            let Some(snapshot) = self.begin_snapshot(&replica).await else {
                continue;
            };
            let other = self.db.connect().await;
            let opened = other
                .batch_execute(&format!("BEGIN; {open};"))
                .await
                .is_ok();
            let gate = crate::gate::Gate::new(&self.network, &replica, 0);
            let mut worker = self.db.connect().await;
            let streaming = snapshot.stream(&mut worker, &gate);
            tokio::pin!(streaming);
            tokio::select! {
                () = gate.reached() => {}
                done = &mut streaming => {
                    // Out of reach, or nothing to hold it at.
                    if let Ok(s) = done {
                        if s.recorded {
                            provisioned.push(s.replica);
                        }
                    }
                    continue;
                }
            }
            let end = if opened { "COMMIT" } else { "ROLLBACK" };
            if other.batch_execute(end).await.is_err() {
                other.batch_execute("ROLLBACK").await.ok();
            }
            self.writer.batch_execute(during).await.ok();
            self.pass().await;
            gate.open();
            match streaming.await {
                Ok(s) if s.recorded => provisioned.push(s.replica),
                Ok(_) => {}
                Err(failed) => assert!(
                    self.network.is_cut(&replica),
                    "a snapshot failed with its replica in reach: {failed}"
                ),
            }
        }
        self.provisionings += provisioned.len();
        Step {
            recorded,
            provisioned,
        }
    }

    /// One pass, and nothing else.
    pub async fn pass(&mut self) -> Recorded {
        let infos = self.infos();
        let recorded = self
            .relay
            .record(&mut self.client, &infos, self.network.max_message_bytes())
            .await
            .expect("a pass records");
        self.dropped += recorded.dropped.len();
        recorded
    }

    /// Begins the snapshot of `replica`, waiting for one.
    pub async fn begin_snapshot(&mut self, replica: &str) -> Option<Snapshot> {
        self.relay
            .begin_snapshot(&mut self.client, replica)
            .await
            .expect("a snapshot begins")
    }

    /// Streams the snapshot of `replica` to the network, begun now; its
    /// replica if it was recorded.
    pub async fn snapshot(&mut self, replica: &str) -> Option<ReplicaId> {
        let snapshot = self.begin_snapshot(replica).await?;
        match snapshot.stream(&mut self.snapshots, &self.network).await {
            Ok(streamed) => streamed.recorded.then_some(streamed.replica),
            Err(failed) => {
                // A row it met that cannot go is set aside; the next
                // attempt goes around it.
                // One a test made die midway is begun again too.
                assert!(
                    self.network.is_cut(replica)
                        || matches!(
                            failed.source,
                            magic_sync::Error::Unsendable(_) | magic_sync::Error::Injected(_)
                        ),
                    "a snapshot failed with its replica in reach: {failed}"
                );
                None
            }
        }
    }

    /// Publishes every outbox to the network: a page's messages signed
    /// together whenever two or more go to replicas that read batches, so
    /// that every walk and storm runs the batches' signatures, which the
    /// relay uses only from [`magic_sync::relay::BATCH_FROM`] by default.
    pub async fn publish(&mut self) {
        magic_sync::relay::publish_beside(
            &self.client,
            &self.network,
            16,
            BATCHED_FROM,
            &mut self.away,
        )
        .await
        .expect("publishing");
    }

    /// Publishes, delivers every message to every replica that is live and
    /// reachable, and brings back what they say.
    pub async fn deliver(&mut self) -> usize {
        self.publish().await;
        let mut applied = 0;
        for (id, unit) in &mut self.units {
            if !unit.info.live || unit.cut {
                continue;
            }
            for message in self.network.take(id) {
                applied += 1;
                if let Some(report) = run::replica::deliver(&mut unit.replica, &message).unwrap() {
                    self.network.report(id, report);
                }
            }
        }
        self.heed().await;
        applied
    }

    /// Hands what replicas said to the relay.
    pub async fn heed(&mut self) {
        let reports = self.network.reports();
        run::server::heed(&mut self.client, &self.engine, &self.network, reports)
            .await
            .expect("the relay heeds what replicas say");
    }

    /// Every reachable live replica sends up what is due of what its host
    /// wrote (an upload unanswered for `patience` is due again); the server
    /// files it and answers, and each replica lets go of what was filed.
    /// Returns the uploads sent.
    pub async fn upload(&mut self, patience: std::time::Duration) -> usize {
        let max = self.network.max_message_bytes();
        let mut sent = 0;
        for (id, unit) in &mut self.units {
            if !unit.info.live || unit.cut {
                continue;
            }
            while let Some(up) = unit
                .replica
                .upload(max, patience)
                .expect("the replica gathers its writes")
            {
                self.network.report(id, run::Report::Upload(up));
                sent += 1;
                if patience.is_zero() {
                    // Everything due again at once: one upload each.
                    break;
                }
            }
        }
        self.heed().await;
        let mut told = false;
        for (id, unit) in &mut self.units {
            let mut released = 0;
            for filed in self.network.take_answers(id) {
                released += unit.replica.filed(&filed).expect("the replica lets go");
            }
            if released > 0 {
                let report = run::replica::progress(&unit.replica).expect("its progress");
                self.network.report(id, report);
                told = true;
            }
        }
        if told {
            self.heed().await;
        }
        sent
    }

    /// Steps until nothing moves; returns the messages applied.
    pub async fn sync(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..100 {
            let step = self.record().await;
            let applied = self.deliver().await;
            total += applied;
            let moved = step.messages > 0
                || step.planned.notes > 0
                || step.planned.sends > 0
                || step.deployed.is_some()
                || !step.provisioned.is_empty();
            if !moved && applied == 0 {
                return total;
            }
        }
        panic!("the fleet did not settle in 100 steps");
    }

    /// The invariant: every live replica the network reaches holds exactly
    /// what the reference says it should, row for row, and no replica holds
    /// a row without the rows it points at.
    /// No replica holds a row without the rows it points at.
    pub fn check_orphans(&self) {
        let mut problems = String::new();
        for unit in self.units.values() {
            orphans(self, unit, &mut problems);
        }
        assert!(
            problems.is_empty(),
            "a replica holds rows without their parents:\n{problems}"
        );
    }

    /// The rows in quarantine, as (table, compact key).
    pub async fn quarantined(&self) -> BTreeSet<(String, String)> {
        self.writer
            .query("SELECT table_name, key FROM sync.quarantine", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| {
                let key: serde_json::Value = serde_json::from_str(row.get(1)).unwrap();
                (row.get(0), key.to_string())
            })
            .collect()
    }

    pub async fn check(&self) {
        let mut problems = String::new();
        // Rows in quarantine are held by no replica, and nor is anything
        // that leans on them: the reference leaves them out.
        let set_aside = self.quarantined().await;
        // The counts per message the operator's reads sum agree with the
        // record they count, whatever path wrote it.
        for row in self
            .writer
            .query(
                "SELECT replica, message, table_name, h.rows, c.rows
                 FROM (SELECT replica, message, table_name, count(*) AS rows
                       FROM sync.held GROUP BY 1, 2, 3) h
                 FULL JOIN sync.held_carried c USING (replica, message, table_name)
                 WHERE h.rows IS DISTINCT FROM c.rows",
                &[],
            )
            .await
            .unwrap()
        {
            let (replica, message, table): (String, i64, String) =
                (row.get(0), row.get(1), row.get(2));
            let (held, counted): (Option<i64>, Option<i64>) = (row.get(3), row.get(4));
            let _ = writeln!(
                problems,
                "  {replica} holds {held:?} rows of {table} from message {message}, counted {counted:?}"
            );
        }
        for (id, unit) in &self.units {
            orphans(self, unit, &mut problems);
            if !unit.info.live || unit.cut {
                continue;
            }
            for refused in unit.replica.refused().unwrap() {
                let _ = writeln!(
                    problems,
                    "  {id} refused {} {} from message {}: {}",
                    refused.table,
                    String::from_utf8_lossy(&refused.key),
                    refused.number,
                    refused.reason
                );
            }
            let should = wanted::wanted_around(
                &self.writer,
                &self.engine,
                &self.catalog,
                &wanted::Replica {
                    id,
                    partition: unit.info.partition.as_deref(),
                },
                &set_aside,
            )
            .await;
            for table in self.engine.down_tables() {
                let server = server_rows(&self.writer, table).await;
                let expected: BTreeMap<String, String> = should[table.name]
                    .iter()
                    .map(|k| (k.clone(), server.get(k).cloned().unwrap_or_default()))
                    .collect();
                let held = replica_rows(&unit.replica, table);
                compare(id, table.name, &expected, &held, &mut problems);
            }
        }
        self.check_cohort(&set_aside, &mut problems).await;
        // What the relay records of them agrees with itself and the
        // database: the reasons each row is held, and the counts of what
        // points at it, kept up pass by pass, are what they would be if
        // worked out afresh.
        for line in self.relay.audit(&self.client).await.expect("the audit") {
            let _ = writeln!(problems, "  record: {line}");
        }
        assert!(problems.is_empty(), "the fleet diverged:\n{problems}");
    }
}

impl Fleet {
    /// The cohort of the `all` tables, when the relay records one, is
    /// recorded holding exactly what the reference gives a holder that no
    /// rule names but `all`: every row of those tables but what is set
    /// aside, and the rows they point at.
    async fn check_cohort(&self, set_aside: &BTreeSet<(String, String)>, problems: &mut String) {
        let cohort = "\u{1}all";
        let recorded: bool = self
            .writer
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM sync.cohorts WHERE id = $1)",
                &[&cohort],
            )
            .await
            .unwrap()
            .get(0);
        if !recorded {
            return;
        }
        let holder = wanted::Replica {
            id: cohort,
            partition: None,
        };
        let should = wanted::wanted_around(
            &self.writer,
            &self.engine,
            &self.catalog,
            &holder,
            set_aside,
        )
        .await;
        for table in self.engine.down_tables() {
            let held: BTreeSet<String> = self
                .writer
                .query(
                    "SELECT key FROM sync.held WHERE replica = $1 AND table_name = $2",
                    &[&cohort, &table.name],
                )
                .await
                .unwrap()
                .iter()
                .map(|row| {
                    let key: serde_json::Value = serde_json::from_str(row.get(0)).unwrap();
                    key.to_string()
                })
                .collect();
            let want = &should[table.name];
            for k in want.difference(&held) {
                let _ = writeln!(
                    problems,
                    "  the `all` cohort should hold {} {k}, but is not recorded holding it",
                    table.name
                );
            }
            for k in held.difference(want) {
                let _ = writeln!(
                    problems,
                    "  the `all` cohort is recorded holding {} {k}, which it should not",
                    table.name
                );
            }
        }
    }
}

/// A row as compared: its values but the columns the replica owns, as JSON.
fn shown(table: &magic_sync::Table, values: &[Value]) -> String {
    let kept: Vec<serde_json::Value> = table
        .columns
        .iter()
        .zip(values)
        .filter(|(c, _)| !table.owns(c.name))
        .map(|(_, v)| v.to_json())
        .collect();
    serde_json::Value::Array(kept).to_string()
}

fn key_of(table: &magic_sync::Table, values: &[Value]) -> String {
    let key: Vec<Value> = table
        .key_positions()
        .iter()
        .map(|&i| values[i].clone())
        .collect();
    magic_sync::value::canonical_key(&key)
}

/// Every row of `table` on the server, by key.
pub async fn server_rows(client: &Client, table: &magic_sync::Table) -> BTreeMap<String, String> {
    let sql = format!(
        "SELECT {} FROM {} a",
        magic_sync::pg::select_list("a", table),
        table.qualified()
    );
    client
        .query(&sql, &[])
        .await
        .unwrap()
        .iter()
        .map(|row| {
            let values = magic_sync::pg::read_row(row, 0, table).unwrap();
            (key_of(table, &values), shown(table, &values))
        })
        .collect()
}

/// Every live (not retired) row of `table` a replica holds, by key.
pub fn replica_rows(replica: &Replica, table: &magic_sync::Table) -> BTreeMap<String, String> {
    rows_in(replica.connection(), table)
}

/// Every live (not retired) row of `table` in a replica's database, read
/// on a connection of the caller's, by key.
pub fn rows_in(conn: &rusqlite::Connection, table: &magic_sync::Table) -> BTreeMap<String, String> {
    let cols: Vec<String> = table.columns.iter().map(|c| ident(c.name)).collect();
    let live = table
        .retired
        .map(|r| format!(" WHERE {} IS NULL", ident(r)))
        .unwrap_or_default();
    let sql = format!(
        "SELECT {} FROM {}{live}",
        cols.join(", "),
        ident(table.name)
    );
    let mut stmt = conn.prepare(&sql).unwrap();
    let rows = stmt
        .query_map([], |row| {
            let values = magic_sync::lite::read_row(row, 0, table).unwrap();
            Ok((key_of(table, &values), shown(table, &values)))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn compare(
    replica: &str,
    table: &str,
    expected: &BTreeMap<String, String>,
    held: &BTreeMap<String, String>,
    problems: &mut String,
) {
    let want: BTreeSet<&String> = expected.keys().collect();
    let have: BTreeSet<&String> = held.keys().collect();
    for k in want.difference(&have) {
        let _ = writeln!(problems, "  {replica} lacks {table} {k}");
    }
    for k in have.difference(&want) {
        let _ = writeln!(
            problems,
            "  {replica} holds {table} {k}, which it should not"
        );
    }
    for k in want.intersection(&have) {
        if expected[*k] != held[*k] {
            let _ = writeln!(
                problems,
                "  {replica} holds {table} {k} as {}, the server has {}",
                held[*k], expected[*k]
            );
        }
    }
}

/// Rows of the replica pointing at a row it does not hold.
fn orphans(fleet: &Fleet, unit: &Unit, problems: &mut String) {
    let conn = unit.replica.connection();
    for fk in &fleet.catalog.foreign_keys {
        let present: Vec<String> = fk
            .child_columns
            .iter()
            .map(|c| format!("c.{} IS NOT NULL", ident(c)))
            .collect();
        let matches: Vec<String> = fk
            .child_columns
            .iter()
            .zip(&fk.parent_columns)
            .map(|(c, p)| format!("p.{} = c.{}", ident(p), ident(c)))
            .collect();
        let sql = format!(
            "SELECT count(*) FROM {} c WHERE {} AND NOT EXISTS (SELECT 1 FROM {} p WHERE {})",
            ident(fk.child),
            present.join(" AND "),
            ident(fk.parent),
            matches.join(" AND ")
        );
        let n: i64 = conn.query_row(&sql, [], |r| r.get(0)).unwrap();
        if n > 0 {
            let _ = writeln!(
                problems,
                "  {} holds {n} row(s) of {} pointing at {} rows it lacks ({})",
                unit.info.id, fk.child, fk.parent, fk.name
            );
        }
    }
}

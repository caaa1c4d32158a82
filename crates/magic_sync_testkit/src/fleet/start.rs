//! Starting a fleet: a server database (the shop's, or a schema of a
//! test's own) with the relay on its lock, and replicas added on fresh
//! SQLite files, trusting the server's key; and a replica of it found,
//! set live or moved to another partition.

use super::{fresh_memory, Fleet, Unit, MAX_MESSAGE};
use crate::shop;
use magic_sync::catalog::Catalog;
use magic_sync::relay::{Relay, ReplicaInfo, Settings};
use magic_sync::replica::{self, Replica};
use magic_sync::run::memory::Network;
use magic_sync::Engine;
use std::collections::BTreeMap;
use tokio_postgres::Client;

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
            flush_bytes: magic_sync::relay::ByteSize::b(2048),
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
            // And `MAGIC_SYNC_RECORD_RULED=0` with the record of rows a
            // holder's rule gives thinned.
            record_ruled_rows: crate::bench::record_ruled_rows(),
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
    pub(super) fn open_replica(&self, id: &str, path: &std::path::Path) -> Replica {
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

    pub fn unit(&mut self, id: &str) -> &mut Unit {
        self.units.get_mut(id).expect("a replica of the fleet")
    }

    pub fn set_live(&mut self, id: &str, live: bool) {
        self.unit(id).info.live = live;
    }

    pub fn move_to(&mut self, id: &str, partition: Option<&str>) {
        self.unit(id).info.partition = partition.map(str::to_string);
    }
}

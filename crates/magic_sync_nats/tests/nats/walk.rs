//! The random walk through the broker: seeded server writes over the whole
//! shop while the relay and every replica's loop run as in production, the
//! replicas' hosts writing sales beside them. Midway one replica goes
//! offline, the broker is killed and started again, and the replica comes
//! back only after. At each checkpoint every replica holds exactly what the
//! reference says (and no row without the rows it points at), and every
//! sale written on a replica is filed under that replica.
//!
//! `MAGIC_SYNC_SEED=n` replays one seed; `MAGIC_SYNC_SEEDS` and
//! `MAGIC_SYNC_STEPS` change the budget.

use magic_sync::catalog::Catalog;
use magic_sync::relay::{ReplicaInfo, Settings as RelaySettings};
use magic_sync::replica::Replica;
use magic_sync::Engine;
use magic_sync_nats::broker::{Broker, Settings};
use magic_sync_nats::mailbox::{self, Mailbox};
use magic_sync_testkit::nats::Nats;
use magic_sync_testkit::walk::{env, pick, seeds, write, REGIONS};
use magic_sync_testkit::{fleet, shop, wanted};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

const UNITS: [&str; 4] = ["u1", "u2", "u3", "u4"];

/// A replica's loop on a thread of its own, over its mailbox.
struct Running {
    mailbox: Arc<Mailbox>,
    thread: std::thread::JoinHandle<()>,
}

struct Walk {
    nats: Nats,
    engine: Engine,
    catalog: Catalog,
    client: tokio_postgres::Client,
    key: magic_sync::sign::ServerKey,
    dir: tempfile::TempDir,
    running: BTreeMap<&'static str, Running>,
    /// Sales written on each replica, by id.
    sales: BTreeMap<String, &'static str>,
    broker: Broker,
    relay: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    _db: magic_sync_testdb::TestDb,
}

impl Walk {
    fn path(&self, unit: &str) -> PathBuf {
        self.dir.path().join(format!("{unit}.sqlite"))
    }

    fn start(&mut self, unit: &'static str) {
        let settings = mailbox::Settings {
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            heartbeat: Duration::from_secs(1),
            ..mailbox::Settings::new(self.nats.url(), unit, self.nats.seed(unit))
        };
        let mailbox = Arc::new(Mailbox::open(settings).unwrap());
        let (path, link, key, engine) = (
            self.path(unit),
            mailbox.clone(),
            self.key,
            self.engine.clone(),
        );
        let thread = std::thread::spawn(move || {
            let mut replica = Replica::open(&path, unit, &engine).unwrap();
            replica.trust(&key).unwrap();
            magic_sync::run::replica::replica(&mut replica, &*link).unwrap();
        });
        self.running.insert(unit, Running { mailbox, thread });
    }

    fn stop(&mut self, unit: &'static str) {
        let running = self.running.remove(unit).expect("running");
        running.mailbox.close();
        running.thread.join().unwrap();
    }

    /// A sale written by `unit`'s host, beside its loop.
    fn sell(&mut self, unit: &'static str, n: usize) {
        let id = format!("{unit}-s{n}");
        let conn = rusqlite::Connection::open(self.path(unit)).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn.execute(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES (?1, ?2, NULL, '1.50', 1)",
            [&id, unit],
        )
        .unwrap();
        if let Some(running) = self.running.get(unit) {
            running.mailbox.nudger().nudge();
        }
        self.sales.insert(id, unit);
    }

    /// What is wrong with the fleet now; empty when every replica is exact.
    async fn problems(&self) -> String {
        let mut problems = String::new();
        for (i, unit) in UNITS.iter().enumerate() {
            let Ok(conn) = rusqlite::Connection::open(self.path(unit)) else {
                let _ = writeln!(problems, "  {unit} has no database yet");
                continue;
            };
            let ready = magic_sync::replica::status(&conn).is_ok_and(|s| s.ready);
            if !ready {
                let _ = writeln!(problems, "  {unit} is not ready");
                continue;
            }
            let should = wanted::wanted(
                &self.client,
                &self.engine,
                &self.catalog,
                &wanted::Replica {
                    id: unit,
                    partition: Some(REGIONS[i % 2]),
                },
            )
            .await;
            for table in self.engine.down_tables() {
                let server = fleet::server_rows(&self.client, table).await;
                let held = fleet::rows_in(&conn, table);
                let expected: BTreeMap<&String, Option<&String>> = should[table.name]
                    .iter()
                    .map(|k| (k, server.get(k)))
                    .collect();
                let have: BTreeMap<&String, Option<&String>> =
                    held.iter().map(|(k, v)| (k, Some(v))).collect();
                if expected != have {
                    let _ = writeln!(
                        problems,
                        "  {unit} {}: holds {have:?}, should {expected:?}",
                        table.name
                    );
                }
            }
        }
        let filed: BTreeMap<String, String> = self
            .client
            .query("SELECT id, unit_id FROM sales", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        for (id, unit) in &self.sales {
            if filed.get(id).map(String::as_str) != Some(*unit) {
                let _ = writeln!(
                    problems,
                    "  sale {id} of {unit} filed as {:?}",
                    filed.get(id)
                );
            }
        }
        problems
    }

    /// Waits until every replica is exact; fails after a minute, saying
    /// what differs.
    async fn settle(&self, seed: u64, when: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let problems = self.problems().await;
            if problems.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "seed {seed}, {when}: the fleet did not converge:\n{problems}\nthe broker's log:\n{}",
                self.nats.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_stays_exact_through_the_broker_across_its_restart() {
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(30);
    for seed in seeds(2, 0x4a75) {
        println!("broker walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        walk(seed, steps).await;
    }
}

impl Walk {
    /// The shop, its relay through a new broker, and every unit's loop;
    /// `keep_for` bounds how long the broker keeps a message not taken.
    async fn begin(keep_for: Option<Duration>) -> Walk {
        let (db, client) = shop::installed().await;
        client.batch_execute(shop::ROWS).await.unwrap();
        let engine = shop::engine();
        let catalog = Catalog::read(&client, &engine).await.unwrap();
        let key = magic_sync::store::keys::public(&client).await.unwrap();
        let nats = Nats::start(&UNITS);
        let mut settings = Settings {
            // A message handed to a loop stopped midway comes again soon.
            replica_ack_wait: Duration::from_secs(5),
            ..Settings::new(nats.url())
        };
        if let Some(keep_for) = keep_for {
            settings.keep_for = keep_for;
        }
        let broker = Broker::connect(settings, nats.server.seed()).await.unwrap();
        let fleet: Vec<ReplicaInfo> = UNITS
            .iter()
            .enumerate()
            .map(|(i, u)| ReplicaInfo::live(*u, Some(REGIONS[i % 2])))
            .collect();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let relay = {
            let (config, engine, broker) = (db.config(), engine.clone(), broker.clone());
            tokio::spawn(async move {
                let settings = RelaySettings {
                    chunk_rows: 50,
                    backoff_max: Duration::from_millis(500),
                    ..RelaySettings::default()
                };
                magic_sync::run::server::server(
                    config,
                    engine,
                    settings,
                    &fleet,
                    &broker,
                    &broker,
                    async {
                        let _ = stopped.await;
                    },
                )
                .await
                .unwrap();
            })
        };
        let mut walk = Walk {
            nats,
            engine,
            catalog,
            client,
            key,
            dir: tempfile::tempdir().unwrap(),
            running: BTreeMap::new(),
            sales: BTreeMap::new(),
            broker,
            relay: Some((stop, relay)),
            _db: db,
        };
        for unit in UNITS {
            walk.start(unit);
        }
        walk
    }

    /// Stops every loop and the relay.
    async fn end(mut self) {
        let running: Vec<&str> = self.running.keys().copied().collect();
        for unit in running {
            self.stop(unit);
        }
        if let Some((stop, relay)) = self.relay.take() {
            let _ = stop.send(());
            relay.await.unwrap();
        }
    }
}

async fn walk(seed: u64, steps: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut walk = Walk::begin(None).await;
    let broker = walk.broker.clone();
    walk.settle(seed, "provisioned").await;
    let away = pick(&mut rng, &UNITS);
    let mut provisioned = 0;
    let (gone, restart, back) = (steps / 3, steps / 2, 2 * steps / 3);
    for step in 0..steps {
        let mut done = Vec::new();
        if step == gone {
            walk.stop(away);
            provisioned = snapshot_number(&walk.client, away).await;
            // Something for it to find waiting: every till holds products.
            walk.client
                .batch_execute("UPDATE products SET name = name || '!'")
                .await
                .unwrap();
            done.push(format!("{away} goes offline; every product renamed"));
        }
        if step == restart {
            // The message is in the broker before it dies.
            let deadline = Instant::now() + Duration::from_secs(30);
            while waiting(&broker, away).await == 0 {
                assert!(
                    Instant::now() < deadline,
                    "seed {seed}: nothing waits for {away}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            walk.nats.restart();
            done.push("the broker is killed and started again".to_string());
        }
        if step == back {
            // Asked until the server's client is back with the broker.
            let deadline = Instant::now() + Duration::from_secs(30);
            let kept = loop {
                match waiting(&broker, away).await {
                    0 if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    kept => break kept,
                }
            };
            assert!(
                kept > 0,
                "seed {seed}: what waited for {away} was lost with the broker"
            );
            walk.start(away);
            done.push(format!("{away} comes back to {kept} messages waiting"));
        }
        for _ in 0..rng.gen_range(1..=3) {
            let sql = write(&mut rng, &UNITS);
            // A write the schema refuses (a foreign key) changes nothing.
            let ok = walk.client.batch_execute(&sql).await.is_ok();
            done.push(format!("{sql} [{}]", if ok { "ok" } else { "refused" }));
        }
        if rng.gen_bool(0.3) {
            let unit = pick(&mut rng, &UNITS);
            walk.sell(unit, walk.sales.len());
            done.push(format!("{unit} sells"));
        }
        println!("seed {seed} step {step}: {}", done.join(" | "));
        if step == gone - 1 || step == steps - 1 {
            walk.settle(seed, &format!("step {step}")).await;
        }
    }
    walk.settle(seed, "the end").await;
    for (unit, running) in &walk.running {
        assert!(
            running.mailbox.is_reading(),
            "seed {seed}: {unit} is not reading"
        );
        assert_eq!(
            running.mailbox.last_error(),
            None,
            "seed {seed}: {unit} reads, and still says what went wrong before"
        );
    }
    // What waited for the replica away was kept across the restart: it
    // followed on from it, and was not provisioned again.
    assert_eq!(
        snapshot_number(&walk.client, away).await,
        provisioned,
        "seed {seed}: {away} was provisioned again"
    );
    walk.end().await;
}

/// The snapshot a replica was last provisioned with.
async fn snapshot_number(client: &tokio_postgres::Client, unit: &str) -> i64 {
    client
        .query_one(
            "SELECT snapshot_number FROM sync.replicas WHERE id = $1",
            &[&unit],
        )
        .await
        .unwrap()
        .get(0)
}

/// Messages waiting in `unit`'s stream on the broker.
async fn waiting(broker: &Broker, unit: &str) -> u64 {
    let js = async_nats::jetstream::new(broker.client().clone());
    match js.get_stream(magic_sync_nats::stream_of(unit)).await {
        Ok(mut stream) => stream.info().await.map_or(0, |i| i.state.messages),
        Err(_) => 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_away_longer_than_the_broker_keeps_its_messages_is_provisioned_again() {
    let mut walk = Walk::begin(Some(Duration::from_secs(2))).await;
    walk.settle(0, "provisioned").await;
    let before = snapshot_number(&walk.client, "u1").await;
    walk.stop("u1");
    walk.client
        .batch_execute("UPDATE products SET name = name || '!'")
        .await
        .unwrap();
    // The message waits for u1, then outlives what the broker keeps.
    let deadline = Instant::now() + Duration::from_secs(30);
    while waiting(&walk.broker, "u1").await == 0 {
        assert!(Instant::now() < deadline, "nothing waits for u1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while waiting(&walk.broker, "u1").await > 0 {
        assert!(Instant::now() < deadline, "the broker keeps u1's message");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Back, it finds the next message after a gap, and is provisioned
    // again: exact, with nothing of the lost message missing.
    walk.client
        .batch_execute("UPDATE customers SET name = name || '!'")
        .await
        .unwrap();
    walk.start("u1");
    walk.settle(0, "back after its messages expired").await;
    let after = snapshot_number(&walk.client, "u1").await;
    assert!(
        after > before,
        "u1 was not provisioned again: {before} then {after}"
    );
    walk.end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_process_run_from_its_command_line_follows_on_through_the_broker() {
    use clap::Parser;
    use magic_sync_nats::cli::{self, ReplicaArgs};
    let mut walk = Walk::begin(None).await;
    walk.settle(0, "provisioned").await;
    let provisioned = snapshot_number(&walk.client, "u1").await;
    walk.stop("u1");

    // The host's binary, as an operator starts it: the seed in a file.
    let seed_file = walk.dir.path().join("u1.seed");
    std::fs::write(&seed_file, format!("{}\n", walk.nats.seed("u1"))).unwrap();
    let (url, key, db) = (walk.nats.url(), walk.key.to_string(), walk.path("u1"));
    let parse = |seed_file: &std::path::Path| {
        ReplicaArgs::try_parse_from([
            "till".as_ref(),
            "--broker".as_ref(),
            url.as_ref(),
            "--id".as_ref(),
            "u1".as_ref(),
            "--seed-file".as_ref(),
            seed_file.as_os_str(),
            "--server-key".as_ref(),
            key.as_ref(),
            "--db".as_ref(),
            db.as_os_str(),
        ])
        .expect("the arguments parse")
    };
    // A seed file that is not there, and one that holds no seed: refused
    // before anything connects, naming the file and never its content.
    let missing = walk.dir.path().join("no.seed");
    let err = cli::open(&parse(&missing).replica, &walk.engine).expect_err("no seed file");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let garbled = walk.dir.path().join("garbled.seed");
    std::fs::write(&garbled, "SUAGARBLEDSEED\n").unwrap();
    let err = cli::open(&parse(&garbled).replica, &walk.engine).expect_err("not a seed");
    assert!(!err.contains("SUAGARBLEDSEED"), "{err}");
    // As a process's body, it tells its operator why, and fails.
    let told = Told::default();
    let operator = cli::Operator::new(told.clone());
    let exit = magic_sync::run::process::run_opened(
        cli::open(&parse(&missing).replica, &walk.engine),
        "u1",
        &url,
        &operator,
    );
    assert_eq!(
        format!("{exit:?}"),
        format!("{:?}", std::process::ExitCode::FAILURE)
    );
    let said = told.text();
    assert!(
        said.starts_with("magic-sync-replica: ") && said.contains(&missing.display().to_string()),
        "{said}"
    );

    let args = parse(&seed_file);
    let (mut replica, mailbox) = cli::open(&args.replica, &walk.engine).expect("it opens");
    let mailbox = Arc::new(mailbox);
    let process = {
        let (link, url) = (mailbox.clone(), url.clone());
        let operator = operator.clone();
        std::thread::spawn(move || {
            magic_sync::run::process::serve(&mut replica, &link, "u1", &url, &operator)
        })
    };
    // What the server writes reaches it, and what its host writes goes up.
    walk.client
        .batch_execute("UPDATE products SET name = name || '?'")
        .await
        .unwrap();
    {
        let conn = rusqlite::Connection::open(walk.path("u1")).unwrap();
        conn.busy_timeout(Duration::from_secs(10)).unwrap();
        conn.execute(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('u1-cli', 'u1', NULL, '2.00', 1)",
            [],
        )
        .unwrap();
        mailbox.nudger().nudge();
        walk.sales.insert("u1-cli".to_string(), "u1");
    }
    walk.settle(0, "the process followed on").await;
    assert_eq!(
        snapshot_number(&walk.client, "u1").await,
        provisioned,
        "the process resumed the replica's file, with no new snapshot"
    );
    assert_eq!(mailbox.last_error(), None);

    // Closing the link (what SIGTERM does) ends the process with success.
    mailbox.close();
    let exit = process.join().unwrap();
    assert_eq!(
        format!("{exit:?}"),
        format!("{:?}", std::process::ExitCode::SUCCESS)
    );
    walk.end().await;
}

/// What a replica process told its operator, kept to be read.
#[derive(Debug, Clone, Default)]
struct Told(Arc<std::sync::Mutex<Vec<u8>>>);

impl Told {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Told {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

//! One hostile replica among honest ones (issues 20 and 41): each attack in
//! turn, what it costs the others' latency and the server's memory, and
//! whether anything was lost.
//!
//! cargo bench -p magic_sync_http --bench hostile
//!
//! Three processes, so that the memory measured is the server's own:
//!
//! - **this one, the server**: one database, the relay's runner, a `Hub`
//!   with its default settings served on loopback, and the writer of the
//!   load. It runs itself again first with glibc's threshold for giving
//!   large blocks back fixed at 128 KiB (`GLIBC_TUNABLES`, as the idle
//!   benchmark runs its server), so that its RSS is what it holds, not
//!   every Argon2 block it ever freed (MAGIC_SYNC_BENCH_MALLOC=default
//!   keeps glibc's defaults);
//! - **the fleet**: MAGIC_SYNC_BENCH_REPLICAS honest replicas (default 99),
//!   each a real replica loop (`run::replica`) over a `client::Socket` of
//!   its own into a SQLite file of its own, in a child process (the
//!   testkit's fleet, as the steady benchmark runs it), telling this process
//!   every row it applied and when it had. In a process of their own, 99
//!   real loops are light enough to measure (about a quarter of a core
//!   here), so no stand-in replica is used;
//! - **the attacker**: this program again, started afresh for each phase
//!   and speaking as the hundredth replica, `hostile`, with its own secret
//!   from its own addresses (127.0.66.x), or as strangers from all over
//!   127/8. It keeps what it learnt from one phase to the next (its newest
//!   and first messages, its receipt), as one attacker would. It runs at
//!   nice MAGIC_SYNC_BENCH_ATTACKER_NICE (default 19): its CPU would be its
//!   own machine's, so here it takes what the server and the fleet leave
//!   idle rather than their share; its CPU is printed, since on two cores
//!   it still competes with them.
//!
//! The load: every MAGIC_SYNC_BENCH_EVERY_MS (default 100) ms the server
//! writes one new row per partition (MAGIC_SYNC_BENCH_REGIONS, default 10),
//! stamped with the time of its write. Honest replica i holds partition
//! i mod regions, the attacker partition 0, each partition starting with
//! MAGIC_SYNC_BENCH_SEED_ROWS rows (default 1,000), so that a snapshot is
//! not nothing. Commit-to-applied is the row's stamp to the moment the
//! replica's loop reported the message holding it applied.
//!
//! Phases, MAGIC_SYNC_BENCH_SECONDS each (default 30), the attacker doing
//! one thing for the whole of it (MAGIC_SYNC_BENCH_ATTACKS, a comma list,
//! picks some; the baseline always runs first):
//!
//! - `quiet`, the baseline: the attacker connected, acknowledging what it is
//!   sent, as any replica;
//! - `burn`, the control: as `quiet`, while the attacker's process spins
//!   two threads at its nice level. On this machine the attacker shares
//!   the server's two cores; this is what its CPU alone costs the honest
//!   replicas, whatever it sends, and the other phases are read against it
//!   as well as against `quiet`;
//! - `gaps`: `Up.gap` in every frame, its own epoch, numbers ever higher,
//!   as fast as the hub reads;
//! - `acks`: acknowledgements at their extremes, in turn: number 0 and the
//!   largest, an honest replica's whole (read from its file), its own with
//!   that replica's seal, an epoch of the largest generation, a random
//!   epoch, `answered` the largest with no receipt, with its own receipt and
//!   with a forged one;
//! - `uploads`: uploads near `max_message_bytes` (5,000 rows to a table it
//!   makes up each time), the same 5,000 rows again and again (same send id),
//!   50,000 empty rows, 50,000 empty refusals, 5,000 empty rows;
//! - `reconnects`: connect, send one frame (its newest acknowledgement),
//!   drop, on four connections at once, as fast as they go;
//! - `strangers`: ids holding a NUL byte and ids of 299,000 bytes (400 KB
//!   of credentials, past the 16 KiB of HTTP head the hub reads), wrong secrets,
//!   64 at once, each from a random address of 127.16-250.x.y;
//! - `reprovision`: re-provisioning asked for and asked again: a gap, its
//!   own older acknowledgement, an acknowledgement of another epoch, a
//!   digest that differs, in turn, as fast as the hub reads;
//! - `guesses` (beyond the issue's list): wrong secrets for real replicas'
//!   ids and made-up ones, 16 at once, from random addresses: the Argon2
//!   checks strangers can make the server run.
//!
//! `uploads-oversized`, `uploads-repeated` and `uploads-empty` make each
//! kind of upload alone, when named.
//!
//! After each phase the attacker stops and the phase's rows are given up to
//! MAGIC_SYNC_BENCH_SETTLE_SECONDS (default 20) to reach every honest
//! replica; then the next phase waits until the server is back to normal
//! (the hub's queue empty and a probe row per partition applied everywhere
//! within a second), so that what one attack left behind is not counted
//! against the next, and how long that took is printed. Printed per phase: the honest replicas' commit-to-applied p50
//! and p99 and the p99's ratio to the baseline's; this process's RSS at the
//! start and its peak in the phase (`VmHWM`, reset at the start through
//! `/proc/self/clear_refs`) against the bounds the hub's settings give; the
//! rows late (not applied when the phase settled); snapshots begun for
//! honest replicas (must be 0) and for the attacker; CPU of this process,
//! its PostgreSQL backends, the fleet and the attacker; what the attacker
//! sent and how the hub answered. At the end, every row the server wrote is
//! looked for in every honest replica's file: what is missing was lost.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::envelope::Ack;
use magic_sync::relay::{ReplicaInfo, Settings as RelaySettings};
use magic_sync::sign::ServerKey;
use magic_sync::{Engine, Row};
use magic_sync_http::credentials::{self, Credentials};
use magic_sync_http::server::{serve, Hub, Security, Settings};
use magic_sync_testkit::bench::{self as support, env_u64, now_micros, show, Latencies};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    stamp: i64,
}

fn engine() -> &'static Engine {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    ENGINE.get_or_init(|| Engine::builder().table::<Item>().build().unwrap())
}

/// The hostile replica's id.
const HOSTILE: &str = "hostile";

/// What the hostile replica does in a phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attack {
    Quiet,
    /// The control: as quiet, while the attacker's process spins two
    /// threads, at its nice level, on whatever CPU the machine leaves.
    Burn,
    Gaps,
    Acks,
    Uploads,
    Reconnects,
    Strangers,
    Reprovision,
    Guesses,
    /// The uploads' kinds alone, to see which costs what (not in
    /// [`Attack::ALL`]: named in MAGIC_SYNC_BENCH_ATTACKS).
    UploadsOversized,
    UploadsRepeated,
    UploadsEmpty,
}

impl Attack {
    /// Every attack, in the order they run.
    const ALL: [Attack; 8] = [
        Attack::Burn,
        Attack::Gaps,
        Attack::Acks,
        Attack::Uploads,
        Attack::Reconnects,
        Attack::Strangers,
        Attack::Reprovision,
        Attack::Guesses,
    ];

    fn name(self) -> &'static str {
        match self {
            Attack::Quiet => "quiet",
            Attack::Burn => "burn",
            Attack::Gaps => "gaps",
            Attack::Acks => "acks",
            Attack::Uploads => "uploads",
            Attack::Reconnects => "reconnects",
            Attack::Strangers => "strangers",
            Attack::Reprovision => "reprovision",
            Attack::Guesses => "guesses",
            Attack::UploadsOversized => "uploads-oversized",
            Attack::UploadsRepeated => "uploads-repeated",
            Attack::UploadsEmpty => "uploads-empty",
        }
    }

    fn parse(name: &str) -> Option<Attack> {
        [
            Attack::Quiet,
            Attack::UploadsOversized,
            Attack::UploadsRepeated,
            Attack::UploadsEmpty,
        ]
        .into_iter()
        .chain(Attack::ALL)
        .find(|a| a.name() == name.trim())
    }

    fn describe(self) -> &'static str {
        match self {
            Attack::Quiet => "no attacker: it acknowledges what it is sent, as any replica",
            Attack::Burn => {
                "the control: quiet, while its process spins two threads on the CPU the machine leaves (what an attacker on this machine costs, whatever it sends)"
            }
            Attack::Gaps => "a flood of gaps, one in every frame, as fast as the hub reads",
            Attack::Acks => "acknowledgements at their extremes, in turn, as fast as the hub reads",
            Attack::Uploads => {
                "uploads near max_message_bytes, the same rows again and again, 50k-entry frames of empty entries"
            }
            Attack::Reconnects => "a reconnect storm: connect, one frame, drop, on 4 connections at once",
            Attack::Strangers => {
                "strangers: ids with a NUL byte and ids of 299,000 bytes, wrong secrets, 64 at once from random 127/8 addresses"
            }
            Attack::Reprovision => {
                "endless re-provisioning requests: gaps, older and other-epoch acks, differing digests"
            }
            Attack::Guesses => {
                "wrong secrets for real and made-up ids, 16 at once from random 127/8 addresses (beyond the issue's list)"
            }
            Attack::UploadsOversized => "uploads of 5,000 rows near max_message_bytes alone",
            Attack::UploadsRepeated => "the same 5,000 rows again and again alone",
            Attack::UploadsEmpty => "50k-entry frames of empty entries, and 5,000 empty rows, alone",
        }
    }
}

/// What the run is asked to do, from the environment.
#[derive(Debug, Clone)]
struct Plan {
    honest: usize,
    regions: i64,
    seed_rows: i64,
    seconds: u64,
    every: Duration,
    settle: Duration,
    nice: u64,
    attacks: Vec<Attack>,
}

impl Plan {
    fn from_env() -> Plan {
        let honest = env_u64("MAGIC_SYNC_BENCH_REPLICAS", 99).max(1) as usize;
        let attacks = match std::env::var("MAGIC_SYNC_BENCH_ATTACKS") {
            Ok(list) => list
                .split(',')
                .filter(|n| !n.trim().is_empty())
                .map(|n| {
                    Attack::parse(n).unwrap_or_else(|| {
                        panic!(
                            "MAGIC_SYNC_BENCH_ATTACKS: `{n}` is none of {:?}",
                            Attack::ALL.map(Attack::name)
                        )
                    })
                })
                .filter(|a| *a != Attack::Quiet)
                .collect(),
            Err(_) => Attack::ALL.to_vec(),
        };
        Plan {
            honest,
            regions: (env_u64("MAGIC_SYNC_BENCH_REGIONS", 10) as i64).clamp(1, honest as i64),
            seed_rows: env_u64("MAGIC_SYNC_BENCH_SEED_ROWS", 1_000) as i64,
            seconds: env_u64("MAGIC_SYNC_BENCH_SECONDS", 30),
            every: Duration::from_millis(env_u64("MAGIC_SYNC_BENCH_EVERY_MS", 100).max(1)),
            settle: Duration::from_secs(env_u64("MAGIC_SYNC_BENCH_SETTLE_SECONDS", 20)),
            nice: env_u64("MAGIC_SYNC_BENCH_ATTACKER_NICE", 19),
            attacks,
        }
    }

    /// The honest replicas' ids.
    fn ids(&self) -> Vec<String> {
        (0..self.honest).map(|i| format!("h{i:02}")).collect()
    }

    /// The partition of honest replica `i`.
    fn region_of(&self, i: usize) -> i64 {
        i as i64 % self.regions
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    held_memory_only();
    // This program is also the fleet's process and the attacker's.
    support::child_if_asked(engine());
    if let Some(attack) = attacker::asked() {
        attacker::run(attack).await;
        return;
    }
    support::logs();
    let plan = Plan::from_env();
    let server = Server::start(&plan).await;
    println!(
        "one hostile replica among {} honest ones: {} partitions, one row each every {:?} ({} deliveries a second), {} s a phase; \
         the fleet's real replica loops in a child process over WebSocket on loopback, the attacker in another at nice {}",
        plan.honest,
        plan.regions,
        plan.every,
        (plan.honest as f64 / plan.every.as_secs_f64()).round(),
        plan.seconds,
        plan.nice,
    );
    let bounds = Bounds::of(&Settings::default(), plan.honest + 1);
    println!("{}", bounds.describe());

    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet::Fleet::start(&server.url, &server.key, dir.path(), &server.secrets);
    let mut writer = Writer::new(&server.db, &plan).await;
    let ready = Instant::now();
    // The attacker's first connection: it is provisioned as the others are.
    let mut learnt = attacker::Learnt::default();
    let setup = attacker::Attacker::start(Attack::Quiet, &plan, &server, None, &learnt).await;
    server.until_provisioned(plan.honest + 1).await;
    setup.stop(&mut learnt).await;
    println!(
        "{} replicas connected and provisioned in {:.1} s",
        plan.honest + 1,
        ready.elapsed().as_secs_f64()
    );

    let mut phases: Vec<Phase> = Vec::new();
    for attack in std::iter::once(Attack::Quiet).chain(plan.attacks.iter().copied()) {
        let phase = run_phase(
            &plan,
            &server,
            &fleet,
            dir.path(),
            attack,
            &mut writer,
            &mut learnt,
        )
        .await;
        phase.print(phases.first(), &bounds);
        phases.push(phase);
    }

    // Every row the server wrote, in every honest replica's file.
    let settled = settle(&fleet, &plan, &writer.rows, Duration::from_secs(60)).await;
    let lost = lost(&server, &plan, dir.path(), &writer).await;
    for phase in &mut phases {
        phase.lost = lost.in_phase.get(phase.attack.name()).copied().unwrap_or(0);
    }
    println!(
        "\nat the end ({}): {} rows written, {} missing from the honest replicas' files ({} rows held that the server does not)",
        if settled == 0 {
            "every delivery applied".to_string()
        } else {
            format!("{settled} deliveries not applied after 60 s")
        },
        writer.rows.len() + (plan.seed_rows * plan.regions) as usize,
        lost.missing,
        lost.extra,
    );
    summary(&phases, &bounds);
    inbox(&server).await;

    fleet.quit();
    server.stop().await;
}

/// Runs this program again (its children after it) with glibc's threshold
/// for giving large blocks back fixed at 128 KiB, as the idle benchmark
/// runs its server: each Argon2 check allocates 19 MiB, and glibc, whose
/// threshold grows with the blocks it sees, would keep every such block
/// once freed, so that the RSS would count what was ever held rather than
/// what is. MAGIC_SYNC_BENCH_MALLOC=default keeps glibc's defaults.
fn held_memory_only() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os("GLIBC_TUNABLES").is_some()
        || std::env::var("MAGIC_SYNC_BENCH_MALLOC").as_deref() == Ok("default")
    {
        return;
    }
    let error = std::process::Command::new(std::env::current_exe().unwrap())
        .args(std::env::args_os().skip(1))
        .env("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072")
        .exec();
    panic!("running again with a fixed mmap threshold: {error}");
}

/// The server: the database, the hub, the relay, and what the replicas need.
struct Server {
    db: magic_sync_testdb::TestDb,
    client: tokio_postgres::Client,
    hub: Hub,
    url: String,
    addr: SocketAddr,
    key: ServerKey,
    /// Each honest replica's id and secret.
    secrets: Vec<(String, String)>,
    hostile_secret: String,
    stop: tokio::sync::watch::Sender<bool>,
    relay: tokio::task::JoinHandle<magic_sync::Result<()>>,
    serving: tokio::task::JoinHandle<magic_sync_http::Result<()>>,
}

impl Server {
    async fn start(plan: &Plan) -> Server {
        let db = magic_sync_testdb::database().await;
        let mut client = db.connect().await;
        client
            .batch_execute(&format!(
                "CREATE TABLE items (id bigint PRIMARY KEY, region bigint NOT NULL, stamp bigint NOT NULL);
                 INSERT INTO items SELECT i, i % {regions}, 0 FROM generate_series(1, {rows}) i;",
                regions = plan.regions,
                rows = plan.seed_rows * plan.regions,
            ))
            .await
            .unwrap();
        magic_sync::schema::migrate(&mut client).await.unwrap();
        magic_sync::trigger::ensure(engine(), &mut client, &Default::default())
            .await
            .unwrap();
        let mut secrets = Vec::new();
        for id in plan.ids() {
            let secret = credentials::issue(&client, &id).await.unwrap();
            secrets.push((id, secret));
        }
        let hostile_secret = credentials::issue(&client, HOSTILE).await.unwrap();
        let key = magic_sync::store::keys::public(&client).await.unwrap();
        let hub = Hub::new(Settings::default(), Credentials::new(db.config()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let stopped = move || {
            let mut rx = stopped.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let serving = tokio::spawn(serve(hub.clone(), listener, Security::Plain, stopped()));
        let mut fleet: Vec<ReplicaInfo> = plan
            .ids()
            .iter()
            .enumerate()
            .map(|(i, id)| ReplicaInfo::live(id.as_str(), Some(&plan.region_of(i).to_string())))
            .collect();
        fleet.push(ReplicaInfo::live(HOSTILE, Some("0")));
        let relay = {
            let (hub, config, stopped) = (hub.clone(), db.config(), stopped());
            tokio::spawn(async move {
                magic_sync::run::server::server(
                    config,
                    engine().clone(),
                    RelaySettings::default(),
                    &fleet,
                    &hub,
                    &hub,
                    stopped,
                )
                .await
            })
        };
        Server {
            db,
            client,
            hub,
            url: format!("ws://{addr}"),
            addr,
            key,
            secrets,
            hostile_secret,
            stop,
            relay,
            serving,
        }
    }

    /// Waits until `replicas` replicas are known, provisioned and have
    /// acknowledged the last message written for them.
    async fn until_provisioned(&self, replicas: usize) {
        let started = Instant::now();
        loop {
            let row = self
                .client
                .query_one(
                    "SELECT count(*), count(*) FILTER (WHERE provision OR coalesce(a.number, 0) < last_number OR last_number = 0)
                     FROM sync.replicas r LEFT JOIN sync.acks a ON a.replica = r.id",
                    &[],
                )
                .await
                .unwrap();
            let (known, waiting): (i64, i64) = (row.get(0), row.get(1));
            if known == replicas as i64 && waiting == 0 {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{known} replicas known, {waiting} of them not provisioned, after 300 s ({} connected)",
                self.hub.connected().len()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Each replica's latest snapshot, as the server records it.
    async fn snapshots(&self) -> HashMap<String, i64> {
        self.client
            .query("SELECT id, snapshot_number FROM sync.replicas", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }

    async fn epoch(&self) -> Vec<u8> {
        self.client
            .query_one("SELECT id FROM sync.epoch", &[])
            .await
            .unwrap()
            .get(0)
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        self.relay.await.unwrap().unwrap();
        self.serving.await.unwrap().unwrap();
    }
}

/// What the hub's settings bound the server's memory by.
struct Bounds {
    settings: Settings,
    replicas: usize,
}

impl Bounds {
    fn of(settings: &Settings, replicas: usize) -> Bounds {
        Bounds {
            settings: settings.clone(),
            replicas,
        }
    }

    /// One replica's reports, as the settings name them: its share of the
    /// hub's queue, one frame read and decoded beside it (the hub holds
    /// both while it waits for room), and what the relay drained of that
    /// share. Filing's own copies of what it drained come on top: no
    /// setting names them.
    fn one_replica(&self) -> usize {
        let s = &self.settings;
        s.max_queued_bytes + 2 * s.max_message_bytes + s.max_queued_bytes.max(s.max_message_bytes)
    }

    /// Every replica's reports: the queue's total, and a frame read and
    /// decoded per connection.
    fn fleet(&self) -> usize {
        self.settings.max_queued_total + 2 * self.settings.max_message_bytes * self.replicas
    }

    fn describe(&self) -> String {
        let s = &self.settings;
        format!(
            "memory, as the hub's default settings bound it: one replica's reports {} MiB \
             (max_queued_bytes {} + a frame read and decoded, 2 x max_message_bytes {}, + what the relay drained of its share, {}; \
             filing's copies of that on top, which no setting names); \
             every replica's {} MiB (max_queued_total {} + 2 x max_message_bytes per connection, {} connections)",
            mib(self.one_replica()),
            mib(s.max_queued_bytes),
            mib(s.max_message_bytes),
            mib(s.max_queued_bytes.max(s.max_message_bytes)),
            mib(self.fleet()),
            mib(s.max_queued_total),
            self.replicas,
        )
    }
}

fn mib(bytes: usize) -> usize {
    bytes >> 20
}

/// This process's memory, from `/proc/self/status`.
mod memory {
    fn status_mib(field: &str) -> f64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    }

    /// Resident now, in MiB.
    pub fn rss() -> f64 {
        status_mib("VmRSS:")
    }

    /// The most resident since the last [`reset_peak`], in MiB.
    pub fn peak() -> f64 {
        status_mib("VmHWM:")
    }

    /// Starts the peak afresh from what is resident now (Linux 4.0 on).
    pub fn reset_peak() -> bool {
        std::fs::write("/proc/self/clear_refs", "5").is_ok()
    }
}

/// A row the writer wrote.
#[derive(Debug, Clone, Copy)]
struct Written {
    id: i64,
    region: i64,
    stamp: i64,
}

/// The load: one row per partition per tick, each stamped with the time of
/// its write.
struct Writer {
    client: tokio_postgres::Client,
    regions: i64,
    next: i64,
    rows: Vec<Written>,
    /// The phase each row was written in, by the index of its first row.
    phases: Vec<(usize, &'static str)>,
}

impl Writer {
    async fn new(db: &magic_sync_testdb::TestDb, plan: &Plan) -> Writer {
        Writer {
            client: db.connect().await,
            regions: plan.regions,
            next: plan.seed_rows * plan.regions + 1,
            rows: Vec::new(),
            phases: Vec::new(),
        }
    }

    async fn tick(&mut self) {
        let stamp = now_micros();
        self.client
            .execute(
                "INSERT INTO items (id, region, stamp)
                 SELECT $1::int8 + r, r, $2::int8 FROM generate_series(0, $3::int8 - 1) r",
                &[&self.next, &stamp, &self.regions],
            )
            .await
            .unwrap();
        for region in 0..self.regions {
            self.rows.push(Written {
                id: self.next + region,
                region,
                stamp,
            });
        }
        self.next += self.regions;
    }

    /// The phase row `id` was written in.
    fn phase_of(&self, id: i64) -> Option<&'static str> {
        let index = self.rows.partition_point(|w| w.id < id);
        self.phases
            .iter()
            .rev()
            .find(|(from, _)| *from <= index)
            .map(|(_, name)| *name)
    }
}

/// The honest replicas that hold each partition, as the fleet numbers them.
fn holders(plan: &Plan) -> Vec<Vec<u16>> {
    let mut by_region = vec![Vec::new(); plan.regions as usize];
    for i in 0..plan.honest {
        by_region[plan.region_of(i) as usize].push(i as u16);
    }
    by_region
}

/// Deliveries of `rows` not applied yet.
fn pending(fleet: &fleet::Fleet, plan: &Plan, rows: &[Written]) -> usize {
    let by_region = holders(plan);
    let applied = fleet.heard.applied.lock().unwrap();
    rows.iter()
        .map(|w| {
            by_region[w.region as usize]
                .iter()
                .filter(|r| !applied.contains_key(&(**r, w.id)))
                .count()
        })
        .sum()
}

/// Waits until every delivery of `rows` applied, for at most `limit`;
/// returns how many had not.
async fn settle(fleet: &fleet::Fleet, plan: &Plan, rows: &[Written], limit: Duration) -> usize {
    let started = Instant::now();
    loop {
        let left = pending(fleet, plan, rows);
        if left == 0 || started.elapsed() >= limit {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Commit-to-applied of every delivery of `rows` (microseconds), and how
/// many never applied.
fn latencies(fleet: &fleet::Fleet, plan: &Plan, rows: &[Written]) -> (Vec<u64>, usize) {
    let by_region = holders(plan);
    let applied = fleet.heard.applied.lock().unwrap();
    let (mut took, mut missing) = (Vec::new(), 0);
    for w in rows {
        for r in &by_region[w.region as usize] {
            match applied.get(&(*r, w.id)) {
                Some(at) => took.push((at - w.stamp).max(0) as u64),
                None => missing += 1,
            }
        }
    }
    (took, missing)
}

/// CPU used so far: this process, its PostgreSQL backends, the fleet.
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    server: Duration,
    backends: Duration,
    fleet: Duration,
}

impl Cpu {
    async fn read(client: &tokio_postgres::Client, fleet: &fleet::Fleet) -> Cpu {
        let (server, backends) = support::cpu_used(client).await;
        Cpu {
            server,
            backends,
            fleet: support::cpu_of(fleet.pid()),
        }
    }

    fn since(self, before: Cpu) -> Cpu {
        Cpu {
            server: self.server.saturating_sub(before.server),
            backends: self.backends.saturating_sub(before.backends),
            fleet: self.fleet.saturating_sub(before.fleet),
        }
    }
}

/// What one phase measured.
struct Phase {
    attack: Attack,
    latencies: Latencies,
    p50: Option<Duration>,
    p99: Option<Duration>,
    deliveries: usize,
    late: usize,
    rss_start: f64,
    peak: f64,
    honest_snapshots: usize,
    honest_ends: usize,
    epoch_changed: bool,
    max_queued: usize,
    max_connections: usize,
    cpu: Cpu,
    attacker_cpu: Duration,
    said: String,
    /// When the server was back to normal, from the attacker's end.
    recovered: Option<Duration>,
    /// Rows of this phase missing from an honest replica at the end.
    lost: usize,
}

async fn run_phase(
    plan: &Plan,
    server: &Server,
    fleet: &fleet::Fleet,
    dir: &Path,
    attack: Attack,
    writer: &mut Writer,
    learnt: &mut attacker::Learnt,
) -> Phase {
    let stolen = stolen_ack(&dir.join(format!("{}.sqlite", server.secrets[0].0)));
    let snapshots = server.snapshots().await;
    let epoch = server.epoch().await;
    let ends = fleet.heard.ends.load(Ordering::Relaxed);
    let cpu = Cpu::read(&server.client, fleet).await;
    let attacker = attacker::Attacker::start(attack, plan, server, stolen.as_ref(), learnt).await;
    memory::reset_peak();
    let rss_start = memory::rss();
    writer.phases.push((writer.rows.len(), attack.name()));
    let from = writer.rows.len();
    let (mut max_queued, mut max_connections) = (0, 0);
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(plan.seconds) {
        let at = Instant::now();
        writer.tick().await;
        max_queued = max_queued.max(server.hub.queued(HOSTILE).0);
        max_connections = max_connections.max(server.hub.connections());
        tokio::time::sleep(plan.every.saturating_sub(at.elapsed())).await;
    }
    let attacker_cpu = attacker.cpu();
    let said = attacker.stop(learnt).await;
    let stopped = Instant::now();
    let rows = writer.rows[from..].to_vec();
    let late = settle(fleet, plan, &rows, plan.settle).await;
    let peak = memory::peak();
    let cpu = Cpu::read(&server.client, fleet).await.since(cpu);
    let (took, missing) = latencies(fleet, plan, &rows);
    let deliveries = took.len() + missing;
    let latencies = Latencies::new(took, missing);
    let recovered = recover(plan, server, fleet, writer)
        .await
        .map(|()| stopped.elapsed());
    let after = server.snapshots().await;
    let honest_snapshots = server
        .secrets
        .iter()
        .filter(|(id, _)| after.get(id) != snapshots.get(id))
        .count();
    Phase {
        attack,
        p50: latencies.quantile(0.5),
        p99: latencies.quantile(0.99),
        latencies,
        deliveries,
        late,
        rss_start,
        peak,
        honest_snapshots,
        honest_ends: fleet.heard.ends.load(Ordering::Relaxed) - ends,
        epoch_changed: server.epoch().await != epoch,
        max_queued,
        max_connections,
        cpu,
        attacker_cpu,
        said,
        recovered,
        lost: 0,
    }
}

/// How long a probe row may take to reach every honest replica for the
/// server to count as back to normal.
const NORMAL: Duration = Duration::from_secs(1);

/// After an attack: waits until the hub's queue is empty and a probe row
/// per partition reaches every honest replica within [`NORMAL`], so that
/// what the attack left behind does not count against the next phase; for
/// at most 120 s. `None` if the server was not back to normal by then.
async fn recover(
    plan: &Plan,
    server: &Server,
    fleet: &fleet::Fleet,
    writer: &mut Writer,
) -> Option<()> {
    let started = Instant::now();
    writer.phases.push((writer.rows.len(), "between phases"));
    while started.elapsed() < Duration::from_secs(120) {
        if server.hub.queued(HOSTILE).0 > 0 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let from = writer.rows.len();
        writer.tick().await;
        let probe = writer.rows[from..].to_vec();
        let late = settle(fleet, plan, &probe, NORMAL).await;
        if late == 0 {
            return Some(());
        }
        settle(fleet, plan, &probe, Duration::from_secs(10)).await;
    }
    None
}

/// An honest replica's last acknowledgement, read from its file: another
/// replica's seal, for the attacker to present as its own.
fn stolen_ack(path: &Path) -> Option<Ack> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .ok()?;
    conn.query_row(
        "SELECT epoch, number, nonce, seal FROM _magic_sync_applied",
        [],
        |r| {
            Ok(Ack {
                reads_batches: false,
                epoch: r.get(0)?,
                number: r.get::<_, i64>(1)? as u64,
                nonce: r.get(2)?,
                seal: r.get(3)?,
                answered: 0,
                receipt: None,
            })
        },
    )
    .ok()
}

impl Phase {
    fn ratio(&self, baseline: Option<&Phase>) -> Option<f64> {
        let (p99, base) = (self.p99?, baseline?.p99?);
        Some(p99.as_secs_f64() / base.as_secs_f64().max(1e-9))
    }

    fn print(&self, baseline: Option<&Phase>, bounds: &Bounds) {
        let ratio = self
            .ratio(baseline)
            .map_or("-".to_string(), |r| format!("{r:.2}x"));
        let base_peak = baseline.map_or(self.peak, |b| b.peak);
        println!("\n{}: {}", self.attack.name(), self.attack.describe());
        println!(
            "  honest commit-to-applied {} over {} deliveries, p99 {} the baseline's; {} late after settling",
            self.latencies.describe(),
            self.deliveries,
            ratio,
            self.late,
        );
        println!(
            "  server RSS {:.1} MiB at the start, peak {:.1} MiB ({:+.1} in the phase, {:+.1} over the baseline's peak; bounds {} / {} MiB); \
             hub queue at most {:.1} MiB, connections at most {}",
            self.rss_start,
            self.peak,
            self.peak - self.rss_start,
            self.peak - base_peak,
            mib(bounds.one_replica()),
            mib(bounds.fleet()),
            self.max_queued as f64 / (1 << 20) as f64,
            self.max_connections,
        );
        println!(
            "  snapshots begun for honest replicas {} (applied {}), epoch {}",
            self.honest_snapshots,
            self.honest_ends,
            if self.epoch_changed {
                "CHANGED"
            } else {
                "unchanged"
            },
        );
        println!(
            "  CPU: server {:.1} s, its PostgreSQL backends {:.1} s, fleet {:.1} s, attacker {:.1} s",
            self.cpu.server.as_secs_f64(),
            self.cpu.backends.as_secs_f64(),
            self.cpu.fleet.as_secs_f64(),
            self.attacker_cpu.as_secs_f64(),
        );
        println!("  the attacker: {}", self.said);
        println!(
            "  back to normal (hub queue empty, a probe row applied everywhere within {NORMAL:?}) {}",
            self.recovered.map_or("not within 120 s".to_string(), |d| format!(
                "{:.1} s after the attacker stopped",
                d.as_secs_f64()
            )),
        );
    }
}

/// The table of every phase, for BENCHMARKS.md.
fn summary(phases: &[Phase], bounds: &Bounds) {
    let baseline = phases.first();
    let base_peak = baseline.map_or(0.0, |b| b.peak);
    println!(
        "\n| phase | honest p50 | honest p99 | p99 / baseline | server peak RSS (MiB) | over baseline | honest snapshots | rows lost |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for p in phases {
        let q = |d: Option<Duration>| d.map_or("not applied".to_string(), show);
        println!(
            "| {} | {} | {} | {} | {:.1} | {:+.1} | {} | {} |",
            p.attack.name(),
            q(p.p50),
            q(p.p99),
            p.ratio(baseline)
                .map_or("-".to_string(), |r| format!("{r:.2}x")),
            p.peak,
            p.peak - base_peak,
            p.honest_snapshots,
            p.lost,
        );
    }
    println!(
        "\nbounds: one replica's reports {} MiB, every replica's {} MiB",
        mib(bounds.one_replica()),
        mib(bounds.fleet())
    );
}

/// What the honest replicas' files lack of what the server holds.
struct Lost {
    missing: usize,
    extra: usize,
    in_phase: HashMap<&'static str, usize>,
}

async fn lost(server: &Server, plan: &Plan, dir: &Path, writer: &Writer) -> Lost {
    let mut by_region: HashMap<i64, HashSet<i64>> = HashMap::new();
    for row in server
        .client
        .query("SELECT id, region FROM items", &[])
        .await
        .unwrap()
    {
        by_region.entry(row.get(1)).or_default().insert(row.get(0));
    }
    let mut lost = Lost {
        missing: 0,
        extra: 0,
        in_phase: HashMap::new(),
    };
    for (i, (id, _)) in server.secrets.iter().enumerate() {
        let held = held(&dir.join(format!("{id}.sqlite")));
        let wanted = by_region
            .get(&plan.region_of(i))
            .cloned()
            .unwrap_or_default();
        for row in wanted.difference(&held) {
            lost.missing += 1;
            if let Some(phase) = writer.phase_of(*row) {
                *lost.in_phase.entry(phase).or_default() += 1;
            }
        }
        lost.extra += held.difference(&wanted).count();
    }
    lost
}

/// The rows a replica's file holds.
fn held(path: &Path) -> HashSet<i64> {
    let conn =
        rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .unwrap();
    let mut statement = conn.prepare("SELECT id FROM items").unwrap();
    let ids = statement
        .query_map([], |r| r.get::<_, i64>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    ids
}

/// What the hostile replica left in the inbox, and in the operator's health.
async fn inbox(server: &Server) {
    let inbox = server
        .client
        .query_one(
            "SELECT count(*), count(DISTINCT table_name) FROM sync.inbox WHERE replica = $1",
            &[&HOSTILE],
        )
        .await
        .unwrap();
    let (rows, tables): (i64, i64) = (inbox.get(0), inbox.get(1));
    let mut ops_client = server.db.connect().await;
    let health = magic_sync::ops::health(&mut ops_client, &magic_sync::ops::Scope::All)
        .await
        .unwrap();
    println!(
        "the inbox holds {rows} rows of {tables} tables from the hostile replica (bound {} rows); health lists {} item(s)",
        magic_sync::file::INBOX_ROWS,
        health.items.len()
    );
}

/// The fleet's process, as this one sees it: the testkit's fleet (this
/// program run again with `MAGIC_SYNC_BENCH_CHILD=fleet`), told the hub's
/// address, the server's key, the directory and each replica's secret,
/// telling back a line per row applied (`r id table micros json`) and per
/// snapshot's end (`e id micros`).
mod fleet {
    use magic_sync::sign::ServerKey;
    use std::collections::HashMap;
    use std::io::{BufRead, BufReader, Write};
    use std::path::Path;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// What the fleet told.
    #[derive(Debug, Default)]
    pub struct Heard {
        /// When each replica (by its index) first applied each row (by
        /// id), in microseconds since 1970.
        pub applied: Mutex<HashMap<(u16, i64), i64>>,
        /// Snapshots' ends applied by any replica.
        pub ends: AtomicUsize,
    }

    #[derive(Debug)]
    pub struct Fleet {
        child: std::process::Child,
        stdin: std::process::ChildStdin,
        reader: std::thread::JoinHandle<()>,
        pub heard: Arc<Heard>,
    }

    impl Fleet {
        pub fn start(
            url: &str,
            key: &ServerKey,
            dir: &Path,
            secrets: &[(String, String)],
        ) -> Fleet {
            let mut child = std::process::Command::new(std::env::current_exe().unwrap())
                .env("MAGIC_SYNC_BENCH_CHILD", "fleet")
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("start the fleet's process");
            let mut stdin = child.stdin.take().unwrap();
            let stdout = BufReader::new(child.stdout.take().unwrap());
            let mut setup = format!("{url} {key} {}\n", dir.display());
            for (id, secret) in secrets {
                setup.push_str(&format!("{id} {secret}\n"));
            }
            setup.push_str("go\n");
            stdin.write_all(setup.as_bytes()).unwrap();
            stdin.flush().unwrap();
            let index: HashMap<String, u16> = secrets
                .iter()
                .enumerate()
                .map(|(i, (id, _))| (id.clone(), i as u16))
                .collect();
            let heard = Arc::new(Heard::default());
            let reader = {
                let heard = heard.clone();
                std::thread::spawn(move || hear(stdout, &index, &heard))
            };
            Fleet {
                child,
                stdin,
                reader,
                heard,
            }
        }

        pub fn pid(&self) -> u32 {
            self.child.id()
        }

        /// Ends the fleet: each replica after the message it is applying.
        pub fn quit(mut self) {
            writeln!(self.stdin, "quit").unwrap();
            self.stdin.flush().unwrap();
            self.reader.join().unwrap();
            let status = self.child.wait().unwrap();
            assert!(status.success(), "the fleet's process: {status}");
        }
    }

    fn hear(
        stdout: BufReader<std::process::ChildStdout>,
        index: &HashMap<String, u16>,
        heard: &Heard,
    ) {
        for line in stdout.lines() {
            let line = line.expect("a line from the fleet");
            let mut parts = line.splitn(5, ' ');
            match parts.next() {
                Some("r") => {
                    let (id, _table, at, json) = (
                        parts.next().unwrap(),
                        parts.next().unwrap(),
                        parts.next().unwrap(),
                        parts.next().unwrap(),
                    );
                    let (Some(replica), Some(row), Ok(at)) =
                        (index.get(id), field(json, "id"), at.parse::<i64>())
                    else {
                        panic!("the fleet said `{line}`");
                    };
                    heard
                        .applied
                        .lock()
                        .unwrap()
                        .entry((*replica, row))
                        .or_insert(at);
                }
                Some("e") => {
                    heard.ends.fetch_add(1, Ordering::Relaxed);
                }
                Some("t") => {}
                Some("bye") => return,
                _ => panic!("the fleet said `{line}`"),
            }
        }
        panic!("the fleet's process ended without saying bye");
    }

    /// The integer `name` of a one-line JSON object.
    fn field(json: &str, name: &str) -> Option<i64> {
        let at = json.find(&format!("\"{name}\":"))? + name.len() + 3;
        let rest = json[at..].trim_start();
        let end = rest
            .char_indices()
            .find(|(i, c)| !(c.is_ascii_digit() || (*i == 0 && *c == '-')))
            .map_or(rest.len(), |(i, _)| i);
        rest[..end].parse().ok()
    }
}

/// The attacker: started by the server's process for a phase
/// ([`Attacker`]), and the attacks themselves, run in the process started.
mod attacker {
    use super::{Attack, Plan, Server, HOSTILE};
    use futures_util::{SinkExt, StreamExt};
    use magic_sync::envelope::{
        Ack, Digest, Gap, Receipt, Refused, RowData, TableDigest, ToReplica, Up, UpRows,
    };
    use magic_sync::run::Delivery;
    use magic_sync::EpochId;
    use prost::Message as _;
    use rand::Rng;
    use std::collections::BTreeMap;
    use std::net::{Ipv4Addr, SocketAddr};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::http::HeaderValue;
    use tokio_tungstenite::tungstenite::{Error as WsError, Message};

    /// The variable that makes this program the attacker, naming the attack.
    const ATTACK: &str = "MAGIC_SYNC_BENCH_ATTACK";

    /// The attack this program was started to make, if it was.
    pub fn asked() -> Option<Attack> {
        let name = std::env::var(ATTACK).ok()?;
        Some(Attack::parse(&name).unwrap_or_else(|| panic!("{ATTACK}: no attack `{name}`")))
    }

    /// What the hostile replica learnt in the phases before, handed to the
    /// next (a process of its own each phase): the newest message it was
    /// sent and the first, as acknowledgements, and its newest receipt.
    #[derive(Debug, Default, Clone)]
    pub struct Learnt {
        latest: Option<Ack>,
        first: Option<Ack>,
        receipt: Option<Receipt>,
    }

    /// A message as one word of a line: base64, or `-` for none.
    fn word<M: prost::Message>(message: Option<&M>) -> String {
        use base64::Engine as _;
        message.map_or("-".to_string(), |m| {
            base64::engine::general_purpose::STANDARD.encode(m.encode_to_vec())
        })
    }

    fn unword<M: prost::Message + Default>(word: &str) -> Option<M> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(word)
            .ok()?;
        M::decode(bytes.as_slice()).ok()
    }

    /// The attacker's process, from the server's side.
    pub struct Attacker {
        child: tokio::process::Child,
        stdin: Option<tokio::process::ChildStdin>,
        pid: u32,
    }

    impl Attacker {
        /// Starts the attacker for `attack` against `server`, with `stolen`
        /// (another replica's acknowledgement) to present and what it
        /// `learnt` before.
        pub async fn start(
            attack: Attack,
            plan: &Plan,
            server: &Server,
            stolen: Option<&Ack>,
            learnt: &Learnt,
        ) -> Attacker {
            let exe = std::env::current_exe().unwrap();
            let mut command = if plan.nice > 0 {
                let mut nice = tokio::process::Command::new("nice");
                nice.arg("-n").arg(plan.nice.to_string()).arg(exe);
                nice
            } else {
                tokio::process::Command::new(exe)
            };
            let mut child = command
                .env(ATTACK, attack.name())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("start the attacker");
            let mut stdin = child.stdin.take().unwrap();
            let line = format!(
                "{} {} {} {} {} {} {} {}\n",
                server.url,
                server.addr,
                server.hostile_secret,
                plan.honest,
                word(stolen),
                word(learnt.latest.as_ref()),
                word(learnt.first.as_ref()),
                word(learnt.receipt.as_ref()),
            );
            stdin.write_all(line.as_bytes()).await.unwrap();
            stdin.flush().await.unwrap();
            let pid = child.id().unwrap_or(0);
            Attacker {
                child,
                stdin: Some(stdin),
                pid,
            }
        }

        /// The CPU it used so far.
        pub fn cpu(&self) -> std::time::Duration {
            magic_sync_testkit::bench::cpu_of(self.pid)
        }

        /// Tells it to stop (its standard input closes) and returns what it
        /// says it did, keeping what it learnt; killed if it has not ended
        /// 30 s on.
        pub async fn stop(mut self, learnt: &mut Learnt) -> String {
            drop(self.stdin.take());
            let stdout = self.child.stdout.take().unwrap();
            let said = tokio::time::timeout(Duration::from_secs(30), async {
                let mut lines = tokio::io::BufReader::new(stdout).lines();
                let mut said = String::from("(nothing)");
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(done) = line.strip_prefix("done ") {
                        said = done.to_string();
                    } else if let Some(own) = line.strip_prefix("learnt ") {
                        let words: Vec<&str> = own.split(' ').collect();
                        if let [latest, first, receipt] = words[..] {
                            learnt.latest = unword(latest).or(learnt.latest.take());
                            learnt.first = learnt.first.take().or(unword(first));
                            learnt.receipt = unword(receipt).or(learnt.receipt.take());
                        }
                    }
                }
                said
            })
            .await;
            match said {
                Ok(said) => {
                    let _ = self.child.wait().await;
                    said
                }
                Err(_) => {
                    let _ = self.child.kill().await;
                    "(killed: it did not stop in 30 s)".to_string()
                }
            }
        }
    }

    /// What the attacker aims at, and what it learnt.
    struct Target {
        url: String,
        addr: SocketAddr,
        secret: String,
        /// The honest replicas' ids are `h00` on, this many.
        honest: usize,
        stolen: Option<Ack>,
        stop: AtomicBool,
        tally: Tally,
        own: Own,
    }

    impl Target {
        fn running(&self) -> bool {
            !self.stop.load(Ordering::Relaxed)
        }
    }

    /// What the attacker did, and how the hub answered.
    #[derive(Default)]
    struct Tally {
        frames: AtomicU64,
        bytes: AtomicU64,
        connections: AtomicU64,
        /// Connections the hub closed with a close frame.
        closed: AtomicU64,
        /// Snapshots begun for it: the numbers of their first messages.
        snapshots: Mutex<std::collections::BTreeSet<u64>>,
        /// Upgrades refused, by status (0: no answer).
        refused: Mutex<BTreeMap<u16, u64>>,
        /// Why the hub closed its connections.
        reasons: Mutex<BTreeMap<String, u64>>,
    }

    impl Tally {
        fn sent(&self, bytes: usize) {
            self.frames.fetch_add(1, Ordering::Relaxed);
            self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        }

        fn refused(&self, status: u16) {
            *self.refused.lock().unwrap().entry(status).or_default() += 1;
        }

        fn closed(&self, reason: &str) {
            self.closed.fetch_add(1, Ordering::Relaxed);
            // The reason without the figures that make each one different.
            let reason: String = reason
                .chars()
                .map(|c| if c.is_ascii_digit() { '#' } else { c })
                .take(70)
                .collect();
            *self.reasons.lock().unwrap().entry(reason).or_default() += 1;
        }

        fn describe(&self) -> String {
            let mut text = format!(
                "{} frames ({:.1} MiB) over {} connections, {} closed by the hub; {} snapshots begun for it",
                self.frames.load(Ordering::Relaxed),
                self.bytes.load(Ordering::Relaxed) as f64 / (1 << 20) as f64,
                self.connections.load(Ordering::Relaxed),
                self.closed.load(Ordering::Relaxed),
                self.snapshots.lock().unwrap().len(),
            );
            let refused = self.refused.lock().unwrap();
            if !refused.is_empty() {
                let statuses: Vec<String> = refused
                    .iter()
                    .map(|(status, n)| match status {
                        0 => format!("no answer x{n}"),
                        s => format!("{s} x{n}"),
                    })
                    .collect();
                text.push_str(&format!("; upgrades refused: {}", statuses.join(", ")));
            }
            let reasons = self.reasons.lock().unwrap();
            let mut reasons: Vec<_> = reasons.iter().collect();
            reasons.sort_by(|a, b| b.1.cmp(a.1));
            if !reasons.is_empty() {
                let top: Vec<String> = reasons
                    .iter()
                    .take(4)
                    .map(|(why, n)| format!("`{why}` x{n}"))
                    .collect();
                text.push_str(&format!("; closed for {}", top.join(", ")));
            }
            text
        }
    }

    /// What the hostile replica was sent, as its own acknowledgements.
    #[derive(Default)]
    struct Own {
        /// The newest message it was sent.
        latest: Mutex<Option<Ack>>,
        /// The first it was sent: an older acknowledgement of its own, under
        /// the server's seal.
        first: Mutex<Option<Ack>>,
        /// The newest receipt it was answered with.
        receipt: Mutex<Option<Receipt>>,
        arrived: tokio::sync::Notify,
    }

    impl Own {
        /// A frame from the hub.
        fn heard(&self, frame: &[u8], tally: &Tally) {
            match Delivery::decode(frame) {
                Ok(Some(Delivery::Message(message))) => {
                    let Ok(message) = ToReplica::decode(message.as_slice()) else {
                        return;
                    };
                    if message.begins_snapshot {
                        tally.snapshots.lock().unwrap().insert(message.number);
                    }
                    let ack = Ack {
                        reads_batches: false,
                        epoch: message.epoch,
                        number: message.number,
                        nonce: message.nonce,
                        seal: message.seal,
                        answered: 0,
                        receipt: None,
                    };
                    let mut latest = self.latest.lock().unwrap();
                    if latest.as_ref().is_none_or(|l| l.number < ack.number) {
                        self.first
                            .lock()
                            .unwrap()
                            .get_or_insert_with(|| ack.clone());
                        *latest = Some(ack);
                    }
                    drop(latest);
                    self.arrived.notify_waiters();
                }
                Ok(Some(Delivery::Filed(filed))) => {
                    if let Some(receipt) = filed.receipt {
                        *self.receipt.lock().unwrap() = Some(receipt);
                    }
                }
                _ => {}
            }
        }

        fn latest(&self) -> Option<Ack> {
            self.latest.lock().unwrap().clone()
        }
    }

    type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

    /// HTTP Basic credentials.
    fn basic(id: &str, secret: &str) -> String {
        use base64::Engine as _;
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"))
        )
    }

    /// An upgrade to the hub from `from` with `authorization`: the socket,
    /// or the status it was refused with (0: none).
    async fn upgrade(t: &Target, from: Ipv4Addr, authorization: &str) -> Result<Ws, u16> {
        let socket = tokio::net::TcpSocket::new_v4().map_err(|_| 0u16)?;
        let _ = socket.set_reuseaddr(true);
        socket.bind(SocketAddr::from((from, 0))).map_err(|_| 0u16)?;
        let tcp = socket.connect(t.addr).await.map_err(|_| 0u16)?;
        let mut request = format!("{}{}", t.url, magic_sync_http::PATH)
            .into_client_request()
            .unwrap();
        let value = HeaderValue::from_str(authorization).map_err(|_| 0u16)?;
        request.headers_mut().insert("authorization", value);
        match tokio::time::timeout(
            Duration::from_secs(15),
            tokio_tungstenite::client_async(request, tcp),
        )
        .await
        {
            Ok(Ok((ws, _))) => Ok(ws),
            Ok(Err(WsError::Http(response))) => Err(response.status().as_u16()),
            _ => Err(0),
        }
    }

    /// A random address of 127/8 outside 127.0.x.y, where the replicas are.
    fn stranger_address() -> Ipv4Addr {
        let mut rng = rand::thread_rng();
        Ipv4Addr::new(
            127,
            rng.gen_range(16..=250),
            rng.gen_range(0..=255),
            rng.gen_range(1..=254),
        )
    }

    /// The hostile replica's address: one device's.
    const HOSTILE_FROM: Ipv4Addr = Ipv4Addr::new(127, 0, 66, 6);

    /// One connection of the hostile replica: it reads everything it is
    /// sent (and so answers pings), and acknowledges the newest message it
    /// was sent before anything else it sends.
    struct Session {
        sink: futures_util::stream::SplitSink<Ws, Message>,
        open: Arc<AtomicBool>,
        reader: tokio::task::JoinHandle<()>,
        /// The number it last acknowledged.
        acked: u64,
        t: Arc<Target>,
    }

    impl Drop for Session {
        fn drop(&mut self) {
            self.reader.abort();
        }
    }

    impl Session {
        async fn open(t: &Arc<Target>) -> Option<Session> {
            let ws = match upgrade(t, HOSTILE_FROM, &basic(HOSTILE, &t.secret)).await {
                Ok(ws) => ws,
                Err(status) => {
                    t.tally.refused(status);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    return None;
                }
            };
            t.tally.connections.fetch_add(1, Ordering::Relaxed);
            let (sink, mut stream) = ws.split();
            let open = Arc::new(AtomicBool::new(true));
            let reader = {
                let (t, open) = (t.clone(), open.clone());
                tokio::spawn(async move {
                    while let Some(Ok(frame)) = stream.next().await {
                        match frame {
                            Message::Binary(bytes) => t.own.heard(&bytes, &t.tally),
                            Message::Close(close) => {
                                let why = close.map_or(String::new(), |c| c.reason.to_string());
                                t.tally.closed(&why);
                                break;
                            }
                            _ => {}
                        }
                    }
                    open.store(false, Ordering::Relaxed);
                })
            };
            Some(Session {
                sink,
                open,
                reader,
                acked: 0,
                t: t.clone(),
            })
        }

        fn live(&self) -> bool {
            self.open.load(Ordering::Relaxed) && self.t.running()
        }

        /// The newest message it was sent, as its acknowledgement, waiting
        /// up to `limit` for a first; without one, the honest replica's it
        /// stole (the same epoch, a number near its own). A replica waiting
        /// to be provisioned again is sent nothing, however long it waits.
        async fn base(&self, limit: Duration) -> Option<Ack> {
            let deadline = tokio::time::Instant::now() + limit;
            loop {
                let arrived = self.t.own.arrived.notified();
                if let Some(ack) = self.t.own.latest() {
                    return Some(ack);
                }
                if !self.live() || tokio::time::timeout_at(deadline, arrived).await.is_err() {
                    return self.t.own.latest().or_else(|| self.t.stolen.clone());
                }
            }
        }

        /// Acknowledges the newest message, if it did not yet.
        async fn ack(&mut self) -> Result<(), ()> {
            let Some(ack) = self.t.own.latest() else {
                return Ok(());
            };
            if ack.number == self.acked {
                return Ok(());
            }
            self.acked = ack.number;
            let frame = Up {
                applied: Some(ack),
                ..Up::default()
            }
            .encode_to_vec();
            self.feed(frame).await?;
            self.sink.flush().await.map_err(|_| ())
        }

        async fn feed(&mut self, frame: Vec<u8>) -> Result<(), ()> {
            let len = frame.len();
            self.sink
                .feed(Message::Binary(frame.into()))
                .await
                .map_err(|_| ())?;
            self.t.tally.sent(len);
            Ok(())
        }

        /// Sends `frames` after its acknowledgement, as one write.
        async fn send(&mut self, frames: Vec<Vec<u8>>) -> Result<(), ()> {
            if !self.live() {
                return Err(());
            }
            self.ack().await?;
            for frame in frames {
                self.feed(frame).await?;
            }
            self.sink.flush().await.map_err(|_| ())
        }
    }

    /// The attacker's process: reads its target from standard input, makes
    /// `attack` until its standard input closes, then says what it did.
    pub async fn run(attack: Attack) {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [url, addr, secret, honest, stolen, latest, first, receipt] = parts[..] else {
            panic!("the attacker was told `{line}`");
        };
        let own = Own {
            latest: Mutex::new(unword(latest)),
            first: Mutex::new(unword(first)),
            receipt: Mutex::new(unword(receipt)),
            ..Own::default()
        };
        let t = Arc::new(Target {
            url: url.to_string(),
            addr: addr.parse().unwrap(),
            secret: secret.to_string(),
            honest: honest.parse().unwrap(),
            stolen: unword(stolen),
            stop: AtomicBool::new(false),
            tally: Tally::default(),
            own,
        });
        {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut rest = String::new();
                let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut rest);
                t.stop.store(true, Ordering::Relaxed);
            });
        }
        let attacking = tokio::spawn(make(attack, t.clone()));
        while t.running() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A send the hub holds back (its pace, its queue) is not waited out.
        let _ = tokio::time::timeout(Duration::from_secs(3), attacking).await;
        println!(
            "learnt {} {} {}",
            word(t.own.latest().as_ref()),
            word(t.own.first.lock().unwrap().as_ref()),
            word(t.own.receipt.lock().unwrap().as_ref()),
        );
        println!("done {}", t.tally.describe());
        std::process::exit(0);
    }

    async fn make(attack: Attack, t: Arc<Target>) {
        match attack {
            Attack::Quiet => quiet(t).await,
            Attack::Burn => burn(t).await,
            Attack::Gaps => gaps(t).await,
            Attack::Acks => acks(t).await,
            Attack::Uploads => uploads(t, Mix::All).await,
            Attack::UploadsOversized => uploads(t, Mix::Oversized).await,
            Attack::UploadsRepeated => uploads(t, Mix::Repeated).await,
            Attack::UploadsEmpty => uploads(t, Mix::Empty).await,
            Attack::Reconnects => at_once(t, 4, reconnects).await,
            Attack::Strangers => at_once(t, 64, strangers).await,
            Attack::Reprovision => reprovision(t).await,
            Attack::Guesses => at_once(t, 16, guesses).await,
        }
    }

    /// `work` on `n` tasks at once, each told its number.
    async fn at_once<F, Fut>(t: Arc<Target>, n: usize, work: F)
    where
        F: Fn(Arc<Target>, usize) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let tasks: Vec<_> = (0..n).map(|i| tokio::spawn(work(t.clone(), i))).collect();
        for task in tasks {
            let _ = task.await;
        }
    }

    /// As any replica, while two threads spin until the phase ends.
    async fn burn(t: Arc<Target>) {
        for _ in 0..2 {
            let t = t.clone();
            std::thread::spawn(move || {
                let mut x = 1u64;
                while t.running() {
                    for _ in 0..100_000 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1),
                        );
                    }
                }
            });
        }
        quiet(t).await
    }

    /// As any replica: acknowledges what it is sent.
    async fn quiet(t: Arc<Target>) {
        while t.running() {
            let Some(mut session) = Session::open(&t).await else {
                continue;
            };
            while session.live() {
                let arrived = t.own.arrived.notified();
                let _ = tokio::time::timeout(Duration::from_millis(500), arrived).await;
                if session.ack().await.is_err() {
                    break;
                }
            }
        }
    }

    /// Frames of as many as this go in one write.
    const BATCH: usize = 256;

    async fn gaps(t: Arc<Target>) {
        let mut n = 0u64;
        while t.running() {
            let Some(mut session) = Session::open(&t).await else {
                continue;
            };
            let Some(base) = session.base(Duration::from_secs(2)).await else {
                continue;
            };
            while session.live() {
                let frames = (0..BATCH)
                    .map(|_| {
                        n += 1;
                        Up {
                            gap: Some(Gap {
                                epoch: base.epoch.clone(),
                                number: base.number + n,
                            }),
                            ..Up::default()
                        }
                        .encode_to_vec()
                    })
                    .collect();
                if session.send(frames).await.is_err() {
                    break;
                }
            }
        }
    }

    /// An upload of one row, to be answered with a receipt.
    fn one_row(sequence: u64) -> Vec<u8> {
        Up {
            send_id: rand::random::<[u8; 16]>().to_vec(),
            tables: vec![UpRows {
                table: "items".into(),
                rows: vec![RowData {
                    key: b"[-1]".to_vec(),
                    data: br#"{"id":-1,"region":0,"stamp":0}"#.to_vec(),
                }],
                ..UpRows::default()
            }],
            sequence,
            takes_receipts: true,
            ..Up::default()
        }
        .encode_to_vec()
    }

    /// Its acknowledgement at its extremes.
    fn extreme_acks(own: &Ack, stolen: Option<&Ack>, receipt: Option<&Receipt>) -> Vec<Ack> {
        let forged = Receipt {
            epoch: own.epoch.clone(),
            sequence: u64::MAX,
            seal: rand::random::<[u8; 32]>().to_vec(),
        };
        let mut cases = vec![
            Ack {
                number: 0,
                ..own.clone()
            },
            Ack {
                number: u64::MAX,
                ..own.clone()
            },
            Ack {
                epoch: EpochId::ordered(u64::MAX, rand::random()).into_bytes(),
                ..own.clone()
            },
            Ack {
                epoch: rand::random::<[u8; 16]>().to_vec(),
                ..own.clone()
            },
            Ack {
                answered: u64::MAX,
                receipt: None,
                ..own.clone()
            },
            Ack {
                answered: u64::MAX,
                receipt: Some(forged),
                ..own.clone()
            },
        ];
        if let Some(receipt) = receipt {
            cases.push(Ack {
                answered: u64::MAX,
                receipt: Some(receipt.clone()),
                ..own.clone()
            });
        }
        if let Some(stolen) = stolen {
            cases.push(stolen.clone());
            cases.push(Ack {
                seal: stolen.seal.clone(),
                ..own.clone()
            });
        }
        cases
    }

    async fn acks(t: Arc<Target>) {
        let mut turn = 0usize;
        let mut sequence = 1u64;
        while t.running() {
            let Some(mut session) = Session::open(&t).await else {
                continue;
            };
            if session.base(Duration::from_secs(2)).await.is_none() {
                continue;
            }
            if t.own.receipt.lock().unwrap().is_none() {
                sequence += 1;
                let _ = session.send(vec![one_row(sequence)]).await;
            }
            while session.live() {
                let Some(own) = t.own.latest().or_else(|| t.stolen.clone()) else {
                    break;
                };
                let receipt = t.own.receipt.lock().unwrap().clone();
                let cases = extreme_acks(&own, t.stolen.as_ref(), receipt.as_ref());
                let ack = cases[turn % cases.len()].clone();
                turn += 1;
                let frame = Up {
                    applied: Some(ack),
                    ..Up::default()
                }
                .encode_to_vec();
                if session.send(vec![frame]).await.is_err() {
                    break;
                }
            }
        }
    }

    /// An upload of about `bytes`, as many rows as one may carry, to a
    /// table named for the round, keys never seen twice.
    fn oversized(round: u64, bytes: usize) -> Vec<u8> {
        let count = magic_sync::run::MAX_UPLOAD_ROWS;
        let filler = "x".repeat(bytes / count - 40);
        let rows = (0..count)
            .map(|i| RowData {
                key: format!("[{round}{i:08}]").into_bytes(),
                data: format!(r#"{{"x":"{filler}"}}"#).into_bytes(),
            })
            .collect();
        Up {
            send_id: round.to_be_bytes().to_vec(),
            tables: vec![UpRows {
                table: format!("made_up_{round}"),
                rows,
                ..UpRows::default()
            }],
            sequence: round,
            ..Up::default()
        }
        .encode_to_vec()
    }

    /// The same 5,000 rows of `items` (a table the server sends down and
    /// takes nothing of), under one send id.
    fn repeated() -> Vec<u8> {
        let rows = (0..magic_sync::run::MAX_UPLOAD_ROWS as i64)
            .map(|i| {
                let id = 1_000_000_000 + i;
                RowData {
                    key: format!("[{id}]").into_bytes(),
                    data: format!(r#"{{"id":{id},"region":0,"stamp":0}}"#).into_bytes(),
                }
            })
            .collect();
        Up {
            send_id: vec![0xEE; 16],
            tables: vec![UpRows {
                table: "items".into(),
                rows,
                ..UpRows::default()
            }],
            sequence: 7,
            takes_receipts: true,
            ..Up::default()
        }
        .encode_to_vec()
    }

    /// `n` empty rows: two bytes each on the wire.
    fn empty_rows(n: usize) -> Vec<u8> {
        Up {
            send_id: rand::random::<[u8; 16]>().to_vec(),
            tables: vec![UpRows {
                table: "items".into(),
                rows: vec![RowData::default(); n],
                ..UpRows::default()
            }],
            ..Up::default()
        }
        .encode_to_vec()
    }

    /// `n` empty refusals beside a digest.
    fn empty_refusals(n: usize) -> Vec<u8> {
        Up {
            send_id: rand::random::<[u8; 16]>().to_vec(),
            refused: vec![Refused::default(); n],
            digest: Some(Digest::default()),
            ..Up::default()
        }
        .encode_to_vec()
    }

    /// Which uploads, in turn: the largest, the same, empty entries.
    #[derive(Debug, Clone, Copy)]
    enum Mix {
        All,
        Oversized,
        Repeated,
        Empty,
    }

    async fn uploads(t: Arc<Target>, mix: Mix) {
        let max = magic_sync_http::server::Settings::default().max_message_bytes;
        let same = repeated();
        let mut round = 0u64;
        while t.running() {
            let Some(mut session) = Session::open(&t).await else {
                continue;
            };
            while session.live() {
                round += 1;
                let turn = match mix {
                    Mix::All => round % 7,
                    Mix::Oversized => 0,
                    Mix::Repeated => 1,
                    Mix::Empty => 4 + round % 3,
                };
                let frame = match turn {
                    0 => oversized(round, max - (64 << 10)),
                    1..=3 => same.clone(),
                    4 => empty_rows(50_000),
                    5 => empty_refusals(50_000),
                    _ => empty_rows(magic_sync::run::MAX_UPLOAD_ROWS),
                };
                if session.send(vec![frame]).await.is_err() {
                    break;
                }
            }
        }
    }

    /// Connects, sends its newest acknowledgement, drops the connection
    /// unclosed; again, from addresses of its own /24 in turn.
    async fn reconnects(t: Arc<Target>, task: usize) {
        let authorization = basic(HOSTILE, &t.secret);
        let mut i = task;
        while t.running() {
            i += 4;
            let from = Ipv4Addr::new(127, 0, 66, 1 + (i % 254) as u8);
            let mut ws = match upgrade(&t, from, &authorization).await {
                Ok(ws) => ws,
                Err(status) => {
                    t.tally.refused(status);
                    continue;
                }
            };
            t.tally.connections.fetch_add(1, Ordering::Relaxed);
            if let Some(ack) = t.own.latest() {
                let frame = Up {
                    applied: Some(ack),
                    ..Up::default()
                }
                .encode_to_vec();
                let len = frame.len();
                if ws.send(Message::Binary(frame.into())).await.is_ok() {
                    t.tally.sent(len);
                }
            }
            // What the hub sent at once (what it sends again first): the
            // newest to acknowledge next time.
            while let Ok(Some(Ok(Message::Binary(frame)))) =
                tokio::time::timeout(Duration::from_millis(2), ws.next()).await
            {
                t.own.heard(&frame, &t.tally);
            }
            drop(ws);
        }
    }

    /// Ids that cannot be a replica's, with wrong secrets: a NUL byte, and
    /// 299,000 bytes (credentials of 400 KB, within the head the server
    /// reads).
    async fn strangers(t: Arc<Target>, task: usize) {
        use base64::Engine as _;
        // Three-byte aligned, so its encoding is a prefix of every long id's.
        let long = base64::engine::general_purpose::STANDARD.encode("x".repeat(299_001));
        let mut n = 0u64;
        while t.running() {
            n += 1;
            let authorization = if n.is_multiple_of(2) {
                basic(&format!("till\0{task}-{n}"), "not the secret, but long")
            } else {
                let tail = base64::engine::general_purpose::STANDARD
                    .encode(format!("{task:02}{n:08}:not the secret, but long"));
                format!("Basic {long}{tail}")
            };
            let status = match upgrade(&t, stranger_address(), &authorization).await {
                Ok(_) => 101,
                Err(status) => status,
            };
            t.tally.refused(status);
            t.tally.sent(authorization.len());
        }
    }

    /// Wrong secrets for the honest replicas' ids and for made-up ones.
    async fn guesses(t: Arc<Target>, task: usize) {
        let mut n = 0u64;
        while t.running() {
            n += 1;
            let id = if n.is_multiple_of(2) {
                format!("h{:02}", rand::thread_rng().gen_range(0..t.honest))
            } else {
                format!("till-{task}-{n}")
            };
            let status = match upgrade(
                &t,
                stranger_address(),
                &basic(&id, "not the secret, but long"),
            )
            .await
            {
                Ok(_) => 101,
                Err(status) => status,
            };
            t.tally.refused(status);
        }
    }

    /// Re-provisioning asked for in every way, in turn: a gap after the
    /// newest message, its own older acknowledgement (a copy restored, under
    /// the server's seal), its own acknowledgement in another epoch, a
    /// digest that differs from the server's record.
    async fn reprovision(t: Arc<Target>) {
        let mut turn = 0u64;
        while t.running() {
            let Some(mut session) = Session::open(&t).await else {
                continue;
            };
            if session.base(Duration::from_secs(2)).await.is_none() {
                continue;
            }
            while session.live() {
                let Some(own) = t.own.latest().or_else(|| t.stolen.clone()) else {
                    break;
                };
                let first = t.own.first.lock().unwrap().clone().unwrap_or(own.clone());
                turn += 1;
                let up = match turn % 4 {
                    0 => Up {
                        gap: Some(Gap {
                            epoch: own.epoch.clone(),
                            number: own.number + 1,
                        }),
                        ..Up::default()
                    },
                    1 => Up {
                        applied: Some(first),
                        ..Up::default()
                    },
                    2 => Up {
                        applied: Some(Ack {
                            epoch: EpochId::ordered(0, rand::random()).into_bytes(),
                            ..own.clone()
                        }),
                        ..Up::default()
                    },
                    _ => Up {
                        send_id: rand::random::<[u8; 16]>().to_vec(),
                        digest: Some(Digest {
                            tables: vec![TableDigest {
                                table: "items".into(),
                                rows: 1,
                                fingerprint: 42,
                                summed: None,
                            }],
                            ..Digest::default()
                        }),
                        applied: Some(own.clone()),
                        ..Up::default()
                    },
                };
                if session.send(vec![up.encode_to_vec()]).await.is_err() {
                    break;
                }
            }
        }
    }
}

//! What the OLTP and hot-parent benchmarks share: a fleet of replicas, each
//! applying on a thread of its own into a SQLite file of its own, behind the
//! relay's runner (`run::server`) and the in-process network; a host that
//! clocks the relay's passes; the backlog in the `sync` tables; and latency
//! figures that count what never arrived.
//!
//! Each benchmark uses a part of it: what one leaves unused is not dead.
//!
//! Only the engine's public API and the `sync` tables a user can read
//! (`sync.notes`, `sync.outbox`, `sync.replicas`, `sync.acks`) are used, so
//! the benchmarks run unchanged against another relay behind the same API.

#![allow(dead_code)]

use crate::apart::Heard;
pub use crate::apart::{child_if_asked, child_if_asked_with, Apart, Device, Host};
use magic_sync::relay::{ReplicaInfo, Replicas, Settings, SnapshotPace, Transport};
use magic_sync::run::server::Reports;
use magic_sync::Engine;
use magic_sync_testdb::TestDb;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the engine logs, to standard error, as the `magic-sync` command
/// has it: warnings and worse, or as `RUST_LOG` says
/// (`RUST_LOG=magic_sync::pass=debug` times every step of a pass, as
/// `MAGIC_SYNC_TRACE=1` did).
pub fn logs() {
    magic_sync_cli::logs();
}

/// A number from the environment, or `default`.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// Microseconds since 1970, the clock every latency here is read on.
pub fn now_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// Sees every row a replica applied: the replica's id, the table, the row
/// in its codec (JSON here), and when the message holding it had applied
/// (microseconds since 1970).
pub type Watch = dyn Fn(&str, &str, &[u8], i64) + Send + Sync;

/// A [`Watch`] shared by the replicas' threads.
pub type Watcher = Arc<Watch>;

/// The host at its plainest: the same replicas before every pass.
#[derive(Debug)]
pub struct Listed(pub Vec<ReplicaInfo>);

impl Replicas for Listed {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(self.0.clone())
    }
}

/// The host: the same replicas before every pass, and the moment of each
/// ask. The runner asks before every pass, so the time between two asks is
/// one pass (plus the runner's idle wait after a pass that found nothing).
#[derive(Debug)]
pub struct ClockedHost {
    replicas: Mutex<Vec<ReplicaInfo>>,
    asked: Mutex<Vec<Instant>>,
}

impl Replicas for ClockedHost {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        self.asked.lock().unwrap().push(Instant::now());
        Ok(self.replicas.lock().unwrap().clone())
    }
}

/// The relay's passes over a stretch of time.
#[derive(Debug)]
pub struct Passes {
    /// Passes that began and ended within the stretch, sorted.
    pub done: Vec<Duration>,
    /// How long the pass under way at the end of the stretch had run.
    pub running: Duration,
}

impl Passes {
    /// The `p` quantile of the passes done.
    pub fn quantile(&self, p: f64) -> Option<Duration> {
        quantile(&self.done, p)
    }

    /// "12 passes, p50 40.1 ms, p99 80.3 ms, longest 90.0 ms; the pass under way has run 1.2 s"
    pub fn describe(&self) -> String {
        let ms = |d: Option<Duration>| d.map_or("-".to_string(), show);
        format!(
            "{} passes, p50 {}, p99 {}, longest {}; the pass under way has run {}",
            self.done.len(),
            ms(self.quantile(0.50)),
            ms(self.quantile(0.99)),
            ms(self.done.last().copied()),
            show(self.running)
        )
    }
}

impl ClockedHost {
    /// Makes the replica `id` live or not from the next pass on.
    pub fn set_live(&self, id: &str, live: bool) {
        for r in self.replicas.lock().unwrap().iter_mut() {
            if r.id == id {
                r.live = live;
            }
        }
    }

    /// The first pass that began after `from`: the time between the first
    /// two asks after it.
    pub fn first_pass(&self, from: Instant) -> Option<Duration> {
        let asked = self.asked.lock().unwrap();
        let mut after = asked.iter().filter(|&&t| t >= from);
        let (first, second) = (after.next()?, after.next()?);
        Some(*second - *first)
    }

    /// The passes between `from` and `to`.
    pub fn passes(&self, from: Instant, to: Instant) -> Passes {
        let asked = self.asked.lock().unwrap();
        let mut done: Vec<Duration> = asked
            .windows(2)
            .filter(|w| w[0] >= from && w[1] <= to)
            .map(|w| w[1] - w[0])
            .collect();
        done.sort_unstable();
        let running = asked
            .iter()
            .rev()
            .find(|&&t| t <= to)
            .map_or(Duration::ZERO, |&t| to - t);
        Passes { done, running }
    }
}

/// The largest message the benchmarks' transports carry, either way.
pub const MAX_MESSAGE: usize = 1 << 20;

/// The replicas, the transport between them and the relay, and the relay's
/// runner on a task of its own. The replicas run in a child process over
/// WebSocket, or on threads of this process over the in-process network, as
/// `MAGIC_SYNC_BENCH_FLEET` says ([`Apart`]).
pub struct Fleet {
    pub host: Arc<ClockedHost>,
    replicas: Side,
    /// The runner, while it runs: how to stop it, and its task.
    relay: Option<(
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    )>,
    /// When the runner last started.
    relay_started: Instant,
    config: tokio_postgres::Config,
    engine: Arc<Engine>,
    /// What the fleet tells: rows applied, snapshots' ends, hosts' lines.
    heard: Heard,
    /// What runs on every device beside its replica, if anything.
    devices: Option<Host>,
    _dir: tempfile::TempDir,
}

/// Where the fleet's replicas run.
enum Side {
    Threads(crate::apart::Threads),
    Process(crate::apart::Process),
}

/// The snapshots' pace a bench's relay runs with: `MAGIC_SYNC_BENCH_PACE`,
/// `unpaced` (the default setting's) or a number of rows a second.
pub fn snapshot_pace() -> SnapshotPace {
    match std::env::var("MAGIC_SYNC_BENCH_PACE").as_deref() {
        Err(_) | Ok("unpaced") => SnapshotPace::Unpaced,
        Ok(rows) => SnapshotPace::Rows(
            rows.parse()
                .expect("MAGIC_SYNC_BENCH_PACE: unpaced or rows a second"),
        ),
    }
}

/// Whether a bench's (or a test fleet's) relay records by rule: as
/// `MAGIC_SYNC_RECORD_BY_RULE` says (`0` or `false` off, anything else
/// on), else the default setting's. Runs with it off and on, one after
/// the other, compare the two records.
pub fn record_by_rule() -> bool {
    match std::env::var("MAGIC_SYNC_RECORD_BY_RULE").as_deref() {
        Ok("0" | "false") => false,
        Ok(_) => true,
        Err(_) => Settings::default().record_by_rule,
    }
}

/// Whether a bench's (or a test fleet's) relay records a row for each row
/// a holder's rule gives it: as `MAGIC_SYNC_RECORD_RULED` says (`0` or
/// `false` off, anything else on), else the default setting's (on).
/// `cargo xtask test` runs the down path's suite with it off too.
pub fn record_ruled_rows() -> bool {
    match std::env::var("MAGIC_SYNC_RECORD_RULED").as_deref() {
        Ok("0" | "false") => false,
        Ok(_) => true,
        Err(_) => Settings::default().record_ruled_rows,
    }
}

impl Fleet {
    /// Opens a SQLite file per replica and starts applying into each, where
    /// `MAGIC_SYNC_BENCH_FLEET` says, and starts the relay's runner with
    /// default settings. `watcher` sees every row a replica applied.
    pub async fn start(
        db: &TestDb,
        engine: &Engine,
        replicas: Vec<ReplicaInfo>,
        watcher: Watcher,
    ) -> Fleet {
        Fleet::start_with(db, engine, replicas, watcher, None).await
    }

    /// As [`start`](Self::start), with `host` to run on every device from
    /// [`load`](Self::load) on. The benchmark's program passes the same
    /// host to [`child_if_asked_with`] first thing.
    pub async fn start_with(
        db: &TestDb,
        engine: &Engine,
        replicas: Vec<ReplicaInfo>,
        watcher: Watcher,
        host: Option<Host>,
    ) -> Fleet {
        assert!(
            std::env::var("MAGIC_SYNC_BENCH_CHILD").is_err(),
            "the fleet's process started a fleet: the benchmark's main must call \
             `child_if_asked` first"
        );
        logs();
        let client = db.connect().await;
        let key = magic_sync::store::keys::public(&client)
            .await
            .expect("read the server's key");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let heard = Heard {
            watcher,
            ends: Default::default(),
            told: Default::default(),
        };
        let side = match Apart::from_env() {
            Apart::Threads => Side::Threads(crate::apart::Threads::start(
                engine,
                &replicas,
                key,
                dir.path(),
                heard.clone(),
            )),
            Apart::Process => Side::Process(
                crate::apart::Process::start(
                    db.config(),
                    &client,
                    &replicas,
                    key,
                    dir.path(),
                    heard.clone(),
                )
                .await,
            ),
        };
        let host_list = Arc::new(ClockedHost {
            replicas: Mutex::new(replicas),
            asked: Mutex::new(Vec::new()),
        });
        let mut fleet = Fleet {
            host: host_list,
            replicas: side,
            relay: None,
            relay_started: Instant::now(),
            config: db.config(),
            engine: Arc::new(engine.clone()),
            heard,
            devices: host,
            _dir: dir,
        };
        fleet.start_relay();
        fleet
    }

    /// Starts the devices' host (the one the fleet started with) on every
    /// device.
    pub fn load(&mut self) {
        let host = self.devices.expect("a fleet started with a host");
        match &mut self.replicas {
            Side::Threads(threads) => threads.load(host),
            Side::Process(process) => process.say("load"),
        }
    }

    /// Tells the devices' hosts to stop; they end on their own.
    pub fn stop_load(&mut self) {
        match &mut self.replicas {
            Side::Threads(threads) => threads.stop_load(),
            Side::Process(process) => process.say("stop"),
        }
    }

    /// Takes the replica `id` away for good, as a device switched off: its
    /// connection closes (or, in this process, the network stops reaching
    /// it) and its loop ends. The relay still lists it, so what it is sent
    /// waits in its outbox.
    pub fn away(&mut self, id: &str) {
        match &mut self.replicas {
            Side::Threads(threads) => threads.network.cut(id, true),
            Side::Process(process) => process.say(&format!("away {id}")),
        }
    }

    /// Every line the devices' hosts told so far.
    pub fn told(&self) -> Vec<String> {
        self.heard.told.lock().expect("not poisoned").clone()
    }

    /// The child process the replicas run in, if they do.
    pub fn child_pid(&self) -> Option<u32> {
        match &self.replicas {
            Side::Threads(_) => None,
            Side::Process(process) => Some(process.pid()),
        }
    }

    /// Starts the relay's runner (with default settings but for the
    /// snapshots' pace, as `MAGIC_SYNC_BENCH_PACE` says), if it is not
    /// running.
    pub fn start_relay(&mut self) {
        if self.relay.is_some() {
            return;
        }
        let (stop_relay, stopped) = tokio::sync::oneshot::channel::<()>();
        let settings = Settings {
            snapshot_pace: snapshot_pace(),
            snapshots: env_u64(
                "MAGIC_SYNC_BENCH_SNAPSHOTS",
                Settings::default().snapshots as u64,
            ) as usize,
            record_by_rule: record_by_rule(),
            record_ruled_rows: record_ruled_rows(),
            ..Settings::default()
        };
        let (config, host, engine) = (self.config.clone(), self.host.clone(), self.engine.clone());
        let relay = match &self.replicas {
            Side::Threads(threads) => serve(
                config,
                engine,
                settings,
                host,
                threads.network.clone(),
                stopped,
            ),
            Side::Process(process) => {
                serve(config, engine, settings, host, process.hub.clone(), stopped)
            }
        };
        self.relay = Some((stop_relay, relay));
        self.relay_started = Instant::now();
    }

    /// When the relay's runner last started: a fleet's provisioning is
    /// clocked from here, its replicas already connected.
    pub fn relay_started(&self) -> Instant {
        self.relay_started
    }

    /// When each replica applied the end of its first snapshot: from then
    /// on it holds its rows, whether or not the server recorded it yet.
    pub fn snapshot_ends(&self) -> BTreeMap<String, Instant> {
        self.heard.ends.lock().expect("not poisoned").clone()
    }

    /// Stops the relay's runner; the replicas go on.
    pub async fn stop_relay(&mut self) {
        if let Some((stop, task)) = self.relay.take() {
            stop.send(()).ok();
            task.await.expect("the relay's task");
        }
    }

    /// Stops the runner and the replicas (each after the message it is
    /// applying; what waits in their inboxes is left).
    pub async fn stop(mut self) {
        self.stop_relay().await;
        match self.replicas {
            Side::Threads(threads) => tokio::task::block_in_place(|| threads.stop()),
            Side::Process(process) => process.stop().await,
        }
    }
}

/// The relay's runner on a task of its own, publishing into `transport`
/// and hearing the replicas through it, until `stopped`.
fn serve<T>(
    config: tokio_postgres::Config,
    engine: Arc<Engine>,
    settings: Settings,
    host: Arc<ClockedHost>,
    transport: T,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> tokio::task::JoinHandle<()>
where
    T: Transport + Reports + Send + Sync + 'static,
{
    tokio::spawn(async move {
        magic_sync::run::server::server(
            config,
            Engine::clone(&engine),
            settings,
            &*host,
            &transport,
            &transport,
            async {
                stopped.await.ok();
            },
        )
        .await
        .expect("the relay's runner");
    })
}

/// What waits in the `sync` tables at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Backlog {
    /// Pending notes.
    pub notes: i64,
    /// Messages written and not yet taken by the transport.
    pub outbox: i64,
    /// Replicas written to that acknowledged their last message: their
    /// own, or their cohort's when that is newer.
    pub caught_up: i64,
}

const BACKLOG: &str = "
SELECT (SELECT count(*) FROM sync.notes),
       (SELECT count(*) FROM sync.outbox),
       (SELECT count(*) FROM sync.replicas r
        WHERE r.last_number > 0
          AND greatest(r.last_number,
                       (SELECT max(c.newest) FROM sync.members m
                        JOIN sync.cohorts c ON c.id = m.cohort
                        WHERE m.replica = r.id AND c.newest > m.since))
              <= coalesce((SELECT a.number FROM sync.acks a WHERE a.replica = r.id), 0))";

impl Backlog {
    /// Read in one statement, so the three counts are of one moment.
    pub async fn read(client: &tokio_postgres::Client) -> Backlog {
        let row = client
            .query_one(BACKLOG, &[])
            .await
            .expect("read the backlog");
        Backlog {
            notes: row.get(0),
            outbox: row.get(1),
            caught_up: row.get(2),
        }
    }

    /// Nothing pending, nothing unsent, and every one of `replicas` has
    /// acknowledged the last message written for it.
    pub fn settled(&self, replicas: usize) -> bool {
        self.notes == 0 && self.outbox == 0 && self.caught_up == replicas as i64
    }
}

/// Waits until the backlog settles, for at most `limit`: how long it took,
/// or `None` with the backlog at the limit.
pub async fn settle(
    client: &tokio_postgres::Client,
    replicas: usize,
    limit: Duration,
) -> Result<Duration, Backlog> {
    let started = Instant::now();
    loop {
        let backlog = Backlog::read(client).await;
        if backlog.settled(replicas) {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= limit {
            return Err(backlog);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// "settled in 1.23 s" or "did not settle in 60 s (12,000 notes pending, ...)"
pub fn describe_settle(
    outcome: &Result<Duration, Backlog>,
    limit: Duration,
    replicas: usize,
) -> String {
    match outcome {
        Ok(took) => format!("settled in {:.2} s", took.as_secs_f64()),
        Err(b) => format!(
            "did not settle in {} s ({} notes pending, {} messages in the outbox, {} of {replicas} replicas caught up)",
            limit.as_secs(),
            b.notes,
            b.outbox,
            b.caught_up
        ),
    }
}

const LONGEST_STATEMENT: &str = "
SELECT extract(epoch FROM now() - query_start)::float8,
       left(regexp_replace(query, '\\s+', ' ', 'g'), 200)
FROM pg_stat_activity
WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()
ORDER BY query_start LIMIT 1";

/// What a backlog that did not settle is waiting for: the statement that
/// has run longest in the database, how long, and how it begins.
pub async fn longest_statement(client: &tokio_postgres::Client) -> String {
    match client.query_opt(LONGEST_STATEMENT, &[]).await {
        Ok(Some(row)) => format!(
            "longest statement running: {}: {}",
            show(Duration::from_secs_f64(row.get::<_, f64>(0).max(0.0))),
            row.get::<_, String>(1)
        ),
        Ok(None) => "no statement running".to_string(),
        Err(e) => format!("pg_stat_activity: {e}"),
    }
}

/// Commit-to-applied latencies, with what had not applied when measuring
/// stopped counted as slower than everything that had.
#[derive(Debug, Default)]
pub struct Latencies {
    applied: Vec<u64>,
    missing: usize,
}

impl Latencies {
    /// Microsecond latencies of what applied, and how many never did.
    pub fn new(mut applied: Vec<u64>, missing: usize) -> Latencies {
        applied.sort_unstable();
        Latencies { applied, missing }
    }

    /// The `p` quantile; `None` when it falls among what never applied.
    pub fn quantile(&self, p: f64) -> Option<Duration> {
        let total = self.applied.len() + self.missing;
        if total == 0 {
            return None;
        }
        let i = ((total as f64 - 1.0) * p).round() as usize;
        self.applied.get(i).map(|&us| Duration::from_micros(us))
    }

    /// "p50 24.1 ms, p99 80.2 ms (30,000 measured)", naming what never applied.
    pub fn describe(&self) -> String {
        let q = |p| self.quantile(p).map_or("not applied".to_string(), show);
        let mut text = format!(
            "p50 {}, p99 {}, max {} ({} applied",
            q(0.50),
            q(0.99),
            self.applied
                .last()
                .map_or("-".to_string(), |&us| show(Duration::from_micros(us))),
            self.applied.len()
        );
        if self.missing > 0 {
            text.push_str(&format!(", {} never applied while measured", self.missing));
        }
        text.push(')');
        text
    }
}

/// The `p` quantile of sorted durations.
pub fn quantile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    Some(sorted[((sorted.len() as f64 - 1.0) * p).round() as usize])
}

/// A duration as people read it: "812.3 ms", "4.20 s".
pub fn show(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.1} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

/// CPU time spent so far (user and system) by this process and by the
/// relay's PostgreSQL backends (`application_name` beginning `magic_sync
/// relay`), read from `/proc`. The backends are the database's on this
/// machine, as the throwaway cluster is; where `/proc` cannot be read the
/// figure is zero.
pub async fn cpu_used(client: &tokio_postgres::Client) -> (Duration, Duration) {
    let pids: Vec<i32> = client
        .query(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'magic_sync relay%'",
            &[],
        )
        .await
        .expect("the relay's backends")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let backends = pids
        .iter()
        .map(|pid| proc_cpu(&format!("/proc/{pid}/stat")))
        .sum();
    (proc_cpu("/proc/self/stat"), backends)
}

/// The CPU time process `pid` used so far (the fleet's child, say).
pub fn cpu_of(pid: u32) -> Duration {
    proc_cpu(&format!("/proc/{pid}/stat"))
}

/// Fields 14 and 15 of a `/proc/<pid>/stat` (utime, stime), in clock ticks
/// of 1/100 s (`CLK_TCK` on Linux).
fn proc_cpu(path: &str) -> Duration {
    let Ok(stat) = std::fs::read_to_string(path) else {
        return Duration::ZERO;
    };
    // The command name may hold spaces; the fields after it do not.
    let Some((_, after)) = stat.rsplit_once(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // `after` begins at field 3 (state): utime is field 14, stime 15.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

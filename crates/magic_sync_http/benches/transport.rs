//! The down path over the WebSocket transport and through NATS JetStream,
//! against the in-process network, in one process, on the same data
//! (issues 13 and 23).
//!
//! cargo bench -p magic_sync_http --bench transport
//!
//! Each scenario runs three times, on a database of its own each time:
//! once with the relay's runner (`run::server`) publishing into the
//! in-process `Network`, whose replicas are threads of this process; once
//! publishing into a `Hub` served on loopback, whose replicas are `Socket`
//! clients; once publishing through a `nats-server` this program starts
//! (Debian's 2.9, JetStream on its file store), whose replicas read their
//! `Mailbox`. Each replica runs the replica's loop (`run::replica::replica`)
//! over its link. The replicas' side is the same code every time: the loop,
//! a SQLite file per replica, and a link wrapped to see what is applied.
//! MAGIC_SYNC_BENCH_KINDS (default `memory,socket,broker`) picks the runs;
//! `socket-tls` and `broker-tls` are the same two over TLS (`wss://` to the
//! hub, `tls://` to a broker requiring it, each under a self-signed
//! certificate its clients trust), and their ratios to the plain runs are
//! what encryption costs.
//!
//! - Provisioning: the clock starts as the runner starts (socket replicas
//!   already connected and authenticated; the time that took is printed
//!   apart) and stops when the last replica has applied its snapshot's end
//!   (`EndSnapshot`). Two scenarios: MAGIC_SYNC_BENCH_REPLICAS replicas
//!   (default 20) of MAGIC_SYNC_BENCH_ROWS_EACH rows each (default 5,000),
//!   each its own partition of one table; and one replica of
//!   MAGIC_SYNC_BENCH_BULK_ROWS rows (default 200,000).
//! - Steady state, on the first scenario's replicas once every one is
//!   caught up: single-row updates at a fixed rate, each wanted by one
//!   replica and carrying its commit clock; latency from the commit to the
//!   moment the replica applied the message holding it (taken by the
//!   replica as it acknowledges). A light load first (20 changes/s for
//!   10 s: a pass carries a change or two, so the transport's share of the
//!   latency is largest), then MAGIC_SYNC_BENCH_RATE changes/s (default
//!   500) for MAGIC_SYNC_BENCH_SECONDS (default 20).
//! - Deliveries a second: single-row updates as fast as two writers can
//!   commit them for MAGIC_SYNC_BENCH_BURST_SECONDS (default 5), then
//!   until every replica applied the last: the changes written over that
//!   time, each held by one replica, so rows delivered a second (a
//!   delivery is a row applied by a replica); and the messages applied,
//!   whose count follows how much each pass gathered, not the transport.
//!
//! The socket replicas run in a child process by default, as a fleet of
//! devices would not share the server's process (both processes share the
//! machine's cores all the same); MAGIC_SYNC_BENCH_CLIENTS=threads runs them
//! as threads of this process instead, exactly as the in-process replicas
//! run. MAGIC_SYNC_BENCH_ROUNDS (default 1) repeats both runs, alternating
//! which goes first; the summary gives each transport's median and the
//! median of the rounds' ratios (a round's two runs ran back to back, on
//! the same machine load). MAGIC_SYNC_BENCH_SCENARIOS=fleet or =bulk runs
//! one scenario only.
//!
//! Beside the times, the CPU time of the server's process and the
//! replicas' (this process, the child when there is one, and the broker's
//! when it carries the messages; PostgreSQL's
//! is not counted, the writers' client side is, alike in every run) while
//! provisioning and in the paced load: what the transport costs where
//! latency hides it.
//!
//! Every transport carries messages of at most 1 MiB (the broker is
//! started with a payload limit of 2 MiB, headers included); the hub's other
//! settings are its defaults (16 MiB unacknowledged per replica), and so
//! are the broker transport's (each replica's stream on disk, the server
//! waiting for the broker to say it stored each message).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync_testkit::bench as support;

use magic_sync::envelope::{to_replica::Body, ToReplica, Up};
use magic_sync::relay::{ReplicaInfo, Replicas, Transport};
use magic_sync::replica::{Replica, UplinkError};
use magic_sync::run::memory::Network;
use magic_sync::run::process::Connecting;
use magic_sync::run::replica::Link;
use magic_sync::run::server::Reports;
use magic_sync::run::{Delivery, Report};
use magic_sync::sign::ServerKey;
use magic_sync::{Engine, Row};
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::server::Security;
use magic_sync_nats::broker::{Broker, Settings as BrokerSettings};
use magic_sync_nats::mailbox::{self, Mailbox};
use prost::Message as _;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use support::{env_u64, now_micros, show, Latencies};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, partition = "region", key(id))]
struct Item {
    id: i64,
    region: i64,
    name: String,
    value: i64,
    stamp: i64,
}

/// Both transports' largest message (the hub's, `serve_hub`).
const MAX_MESSAGE: usize = magic_sync_testkit::bench::MAX_MESSAGE;

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Item>()
            .build()
            .expect("declarations")
    })
}

// ---------------------------------------------------------------------------
// The replicas' side: the same in this process, or in the child.

/// The one field of a `ToReplica` that says a snapshot ends. Decoding only
/// it skips over the rows, so every message can be looked at.
#[derive(Clone, PartialEq, prost::Message)]
struct Peek {
    #[prost(message, optional, tag = "11")]
    end_snapshot: Option<Nothing>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Nothing {}

/// What the replicas applied.
#[derive(Debug, Default)]
struct Seen {
    /// Whether latencies are taken now.
    measuring: AtomicBool,
    /// Commit-to-applied, microseconds.
    latencies: Mutex<Vec<u64>>,
    /// Messages applied while latencies are taken.
    messages: AtomicU64,
    /// Per replica, when it applied its (first) snapshot's end.
    ended: Mutex<HashMap<String, i64>>,
}

/// A replica's link, watched: the loop acknowledges a message right after
/// applying it, so the acknowledgement is when it applied.
struct Watched<'a> {
    link: &'a dyn Link,
    id: &'a str,
    seen: &'a Seen,
    /// The message being applied: whether it ends a snapshot, and its bytes
    /// while latencies are taken.
    applying: Mutex<Option<(bool, Option<Vec<u8>>)>>,
}

impl Link for Watched<'_> {
    fn max_message_bytes(&self) -> usize {
        self.link.max_message_bytes()
    }

    fn next(&self, timeout: Duration) -> Delivery {
        let delivery = self.link.next(timeout);
        if let Delivery::Message(message) = &delivery {
            let ends = Peek::decode(message.as_slice()).is_ok_and(|p| p.end_snapshot.is_some());
            let bytes = self
                .seen
                .measuring
                .load(Ordering::Relaxed)
                .then(|| message.clone());
            *self.applying.lock().unwrap() = Some((ends, bytes));
        }
        delivery
    }

    fn report(&self, report: Report) {
        let applied = matches!(report, Report::Applied(_)).then(now_micros);
        self.link.report(report);
        let Some(applied) = applied else { return };
        let Some((ends, bytes)) = self.applying.lock().unwrap().take() else {
            return;
        };
        if ends {
            self.seen
                .ended
                .lock()
                .unwrap()
                .entry(self.id.to_string())
                .or_insert(applied);
        }
        if let Some(bytes) = bytes {
            let latencies: Vec<u64> = stamps(&bytes)
                .into_iter()
                .map(|stamp| (applied - stamp).max(0) as u64)
                .collect();
            self.seen.latencies.lock().unwrap().extend(latencies);
            self.seen.messages.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        self.link.upload(up)
    }
}

/// The commit clocks of the rows a message carries (rows never changed
/// carry 0, and are left out).
fn stamps(message: &[u8]) -> Vec<i64> {
    let Ok(ToReplica {
        body: Some(Body::Down(down)),
        ..
    }) = ToReplica::decode(message)
    else {
        return Vec::new();
    };
    down.tables
        .iter()
        .flat_map(|t| &t.upserts)
        .filter_map(|row| stamp(&row.data))
        .filter(|&s| s > 0)
        .collect()
}

/// The `stamp` of a row in its JSON form.
fn stamp(json: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(json).ok()?;
    let at = text.find("\"stamp\"")? + "\"stamp\"".len();
    let rest = text[at..].trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// A replica's thread: its loop over `link` until the link closes.
fn run_replica(id: &str, path: &Path, link: &dyn Link, seen: &Seen, key: ServerKey) {
    let mut replica = Replica::open(path, id, engine()).expect("open the replica");
    replica.trust(&key).expect("pin the server's key");
    let watched = Watched {
        link,
        id,
        seen,
        applying: Mutex::new(None),
    };
    magic_sync::run::replica::replica(&mut replica, &watched).expect("the replica's loop");
}

/// Replicas on threads of this process.
struct Local {
    seen: Arc<Seen>,
    network: Option<Network>,
    /// The links over a network, to close when done.
    links: Vec<Arc<dyn Connecting>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Local {
    /// Over the in-process network.
    fn memory(network: &Network, ids: &[String], dir: &Path, key: ServerKey) -> Local {
        let seen = Arc::new(Seen::default());
        let threads = ids
            .iter()
            .map(|id| {
                let (id, path, link, seen) = (
                    id.clone(),
                    dir.join(format!("{id}.sqlite")),
                    network.link(id),
                    seen.clone(),
                );
                std::thread::spawn(move || run_replica(&id, &path, &link, &seen, key))
            })
            .collect();
        Local {
            seen,
            network: Some(network.clone()),
            links: Vec::new(),
            threads,
        }
    }

    /// Each over a socket of its own to `url`: `(id, secret)`.
    fn sockets(
        url: &str,
        replicas: &[(String, String)],
        dir: &Path,
        key: ServerKey,
        trust: Option<&Path>,
    ) -> Local {
        Local::linked(replicas, dir, key, |id, secret| {
            Socket::connect(ClientSettings {
                max_message_bytes: MAX_MESSAGE,
                trust: trust.map(Path::to_path_buf),
                ..ClientSettings::new(url, id, secret)
            })
            .expect("a socket")
        })
    }

    /// Each reading its mailbox on the broker at `url`: `(id, seed)`.
    fn mailboxes(
        url: &str,
        replicas: &[(String, String)],
        dir: &Path,
        key: ServerKey,
        trust: Option<&Path>,
    ) -> Local {
        Local::linked(replicas, dir, key, |id, seed| {
            Mailbox::open(mailbox::Settings {
                max_message_bytes: MAX_MESSAGE,
                trust: trust.map(Path::to_path_buf),
                ..mailbox::Settings::new(url, id, seed)
            })
            .expect("a mailbox")
        })
    }

    /// Each replica's loop on a thread of its own, over the link `open`
    /// makes for it from `(id, secret)`.
    fn linked<L: Connecting>(
        replicas: &[(String, String)],
        dir: &Path,
        key: ServerKey,
        open: impl Fn(&str, &str) -> L,
    ) -> Local {
        let seen = Arc::new(Seen::default());
        let mut links: Vec<Arc<dyn Connecting>> = Vec::new();
        let mut threads = Vec::new();
        for (id, secret) in replicas {
            let link = Arc::new(open(id, secret));
            let (id, path, looped, seen) = (
                id.clone(),
                dir.join(format!("{id}.sqlite")),
                link.clone(),
                seen.clone(),
            );
            threads.push(std::thread::spawn(move || {
                run_replica(&id, &path, &*looped, &seen, key)
            }));
            links.push(link);
        }
        Local {
            seen,
            network: None,
            links,
            threads,
        }
    }

    /// Over sockets to a `ws://` or `wss://` url, or mailboxes on a
    /// `nats://` or `tls://` broker; `trust`, the certificate to trust.
    fn remote(
        url: &str,
        replicas: &[(String, String)],
        dir: &Path,
        key: ServerKey,
        trust: Option<&Path>,
    ) -> Local {
        if url.starts_with("nats://") || url.starts_with("tls://") {
            Local::mailboxes(url, replicas, dir, key, trust)
        } else {
            Local::sockets(url, replicas, dir, key, trust)
        }
    }

    /// Replicas that applied their snapshot's end, and when the last did.
    fn ended(&self) -> (usize, i64) {
        let ended = self.seen.ended.lock().unwrap();
        (ended.len(), ended.values().copied().max().unwrap_or(0))
    }

    fn measure(&self, on: bool) {
        self.seen.measuring.store(on, Ordering::Relaxed);
    }

    /// The latencies taken, and the messages they were taken from.
    fn latencies(&self) -> (Vec<u64>, u64) {
        let messages = self.seen.messages.swap(0, Ordering::Relaxed);
        (
            std::mem::take(&mut *self.seen.latencies.lock().unwrap()),
            messages,
        )
    }

    fn stop(self) {
        if let Some(network) = &self.network {
            network.close();
        }
        for link in &self.links {
            link.close();
        }
        for thread in self.threads {
            thread.join().expect("a replica's thread");
        }
    }
}

/// Replicas in a child process (this program, run with
/// MAGIC_SYNC_BENCH_CHILD set), asked over its standard input and output.
struct Child {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
}

impl Child {
    fn start(
        url: &str,
        replicas: &[(String, String)],
        dir: &Path,
        key: ServerKey,
        trust: Option<&Path>,
    ) -> Child {
        let mut command =
            std::process::Command::new(std::env::current_exe().expect("this program"));
        if let Some(trust) = trust {
            command.env("MAGIC_SYNC_BENCH_TRUST", trust);
        }
        let mut child = command
            .env("MAGIC_SYNC_BENCH_CHILD", "replicas")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the replicas' process");
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut side = Child {
            child,
            stdin,
            stdout,
        };
        let mut setup = format!("{url} {key} {}\n", dir.display());
        for (id, secret) in replicas {
            setup.push_str(&format!("{id} {secret}\n"));
        }
        setup.push_str("go");
        assert_eq!(side.ask(&setup), "started");
        side
    }

    /// Sends a command, returns the answer's line.
    fn ask(&mut self, command: &str) -> String {
        tokio::task::block_in_place(|| {
            writeln!(self.stdin, "{command}").expect("the replicas' process reads");
            self.stdin.flush().expect("flush");
            let mut line = String::new();
            self.stdout
                .read_line(&mut line)
                .expect("the replicas' process answers");
            assert!(!line.is_empty(), "the replicas' process ended");
            line.trim_end().to_string()
        })
    }

    fn ended(&mut self) -> (usize, i64) {
        let answer = self.ask("ended");
        let mut parts = answer.split_whitespace().map(|p| p.parse::<i64>().unwrap());
        (parts.next().unwrap() as usize, parts.next().unwrap())
    }

    fn latencies(&mut self) -> (Vec<u64>, u64) {
        let answer = self.ask("latencies");
        let mut numbers = answer.split_whitespace().map(|p| p.parse().unwrap());
        let messages = numbers.next().expect("the messages");
        (numbers.collect(), messages)
    }

    fn stop(mut self) {
        assert_eq!(self.ask("quit"), "bye");
        let status = self.child.wait().expect("the replicas' process ends");
        assert!(status.success(), "the replicas' process: {status}");
    }
}

/// The child: replicas over sockets or mailboxes, as the parent asks.
fn child_main() {
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines().map(|l| l.expect("a line"));
    let first = lines.next().expect("the server and directory");
    let (url, rest) = first.split_once(' ').expect("`url key dir`");
    let (key, dir) = rest.split_once(' ').expect("`url key dir`");
    let key: ServerKey = key.parse().expect("the server's key");
    let mut replicas = Vec::new();
    for line in lines.by_ref() {
        if line == "go" {
            break;
        }
        let (id, secret) = line.split_once(' ').expect("`id secret`");
        replicas.push((id.to_string(), secret.to_string()));
    }
    let trust = std::env::var_os("MAGIC_SYNC_BENCH_TRUST").map(std::path::PathBuf::from);
    let local = Local::remote(url, &replicas, Path::new(dir), key, trust.as_deref());
    println!("started");
    for command in lines {
        match command.as_str() {
            "ended" => {
                let (n, last) = local.ended();
                println!("{n} {last}");
            }
            "measure on" | "measure off" => {
                local.measure(command == "measure on");
                println!("ok");
            }
            "latencies" => {
                let (latencies, messages) = local.latencies();
                let text: Vec<String> = latencies.iter().map(u64::to_string).collect();
                println!("{messages} {}", text.join(" "));
            }
            "quit" => {
                local.stop();
                println!("bye");
                return;
            }
            other => panic!("unknown command `{other}`"),
        }
    }
}

/// Where the replicas run.
enum Side {
    Local(Local),
    Child(Child),
}

impl Side {
    fn ended(&mut self) -> (usize, i64) {
        match self {
            Side::Local(l) => l.ended(),
            Side::Child(c) => c.ended(),
        }
    }

    fn measure(&mut self, on: bool) {
        match self {
            Side::Local(l) => l.measure(on),
            Side::Child(c) => {
                let answer = c.ask(if on { "measure on" } else { "measure off" });
                assert_eq!(answer, "ok");
            }
        }
    }

    fn latencies(&mut self) -> (Vec<u64>, u64) {
        match self {
            Side::Local(l) => l.latencies(),
            Side::Child(c) => c.latencies(),
        }
    }

    /// CPU time of this process and the replicas' process, if apart.
    fn cpu(&self) -> Duration {
        let own = cpu(std::process::id());
        match self {
            Side::Local(_) => own,
            Side::Child(c) => own + cpu(c.child.id()),
        }
    }

    fn stop(self) {
        match self {
            Side::Local(l) => tokio::task::block_in_place(|| l.stop()),
            Side::Child(c) => c.stop(),
        }
    }
}

/// CPU time (user and system) of process `pid` so far.
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's name, in parentheses: utime and
    // stime are the line's 14th and 15th, in the kernel's USER_HZ (100).
    let Some(at) = stat.rfind(')') else {
        return Duration::ZERO;
    };
    let fields: Vec<u64> = stat[at + 2..]
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    Duration::from_millis((fields[11] + fields[12]) * 10)
}

// ---------------------------------------------------------------------------
// The server's side.

struct Host(Vec<ReplicaInfo>);

impl Replicas for Host {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(self.0.clone())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Memory,
    Socket,
    Broker,
    SocketTls,
    BrokerTls,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Memory,
        Kind::Socket,
        Kind::Broker,
        Kind::SocketTls,
        Kind::BrokerTls,
    ];
    /// What runs unless MAGIC_SYNC_BENCH_KINDS says otherwise.
    const DEFAULT: [Kind; 3] = [Kind::Memory, Kind::Socket, Kind::Broker];
    /// The ratios the summary gives, where both runs ran: each transport
    /// against the one before it, and TLS against plain.
    const RATIOS: [(Kind, Kind); 4] = [
        (Kind::Socket, Kind::Memory),
        (Kind::Broker, Kind::Socket),
        (Kind::SocketTls, Kind::Socket),
        (Kind::BrokerTls, Kind::Broker),
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Memory => "in-process",
            Kind::Socket => "socket",
            Kind::Broker => "broker",
            Kind::SocketTls => "socket TLS",
            Kind::BrokerTls => "broker TLS",
        }
    }

    fn key(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Socket => "socket",
            Kind::Broker => "broker",
            Kind::SocketTls => "socket-tls",
            Kind::BrokerTls => "broker-tls",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Clients {
    Process,
    Threads,
}

/// One scenario's sizes and what it measures.
#[derive(Debug, Clone, Copy)]
struct Scenario {
    name: &'static str,
    replicas: usize,
    rows_each: i64,
    steady: bool,
}

/// What the steady phase's loads are.
#[derive(Debug, Clone, Copy)]
struct Load {
    rate: u64,
    seconds: u64,
}

const LIGHT: Load = Load {
    rate: 20,
    seconds: 10,
};

/// What one run measured.
#[derive(Debug, Default)]
struct Figures {
    /// Socket replicas: from their start until every one is connected.
    connected_in: Option<Duration>,
    provision: Duration,
    /// CPU time of the relay's and the replicas' processes meanwhile (not
    /// PostgreSQL's).
    provision_cpu: Duration,
    light: Option<Latencies>,
    paced: Option<Latencies>,
    /// Changes written in the paced load, per second.
    paced_rate: f64,
    /// CPU time of the relay's and the replicas' processes in the paced
    /// load (not PostgreSQL's).
    paced_cpu: Duration,
    /// Messages the replicas applied in the paced load.
    paced_messages: u64,
    /// Changes written in the burst.
    burst_changes: u64,
    /// Messages the replicas applied from the burst.
    burst_messages: u64,
    /// From the burst's first write until every replica applied its last.
    burst_time: Duration,
}

async fn prepared(scenario: &Scenario) -> magic_sync_testdb::TestDb {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    let total = scenario.replicas as i64 * scenario.rows_each;
    client
        .batch_execute(&format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, region bigint NOT NULL, name text NOT NULL,
                                 value bigint NOT NULL, stamp bigint NOT NULL);
             INSERT INTO items SELECT i, i % {}, 'item number ' || i, 0, 0 FROM generate_series(1, {total}) i;
             ANALYZE items;",
            scenario.replicas
        ))
        .await
        .expect("data");
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    magic_sync::trigger::install(engine(), &mut client)
        .await
        .expect("triggers");
    db
}

/// The relay's runner over `transport`, until the sender is used.
fn start_relay<T>(
    config: tokio_postgres::Config,
    infos: Vec<ReplicaInfo>,
    transport: T,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
)
where
    T: Transport + Reports + Send + Sync + 'static,
{
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let host = Host(infos);
        magic_sync::run::server::server(
            config,
            engine().clone(),
            magic_sync::relay::Settings::default(),
            &host,
            &transport,
            &transport,
            async {
                stopped.await.ok();
            },
        )
        .await
        .expect("the relay's runner");
    });
    (stop, task)
}

/// Single-row updates of random items, `rate` a second from two
/// connections for `seconds`, each carrying the clock just before it
/// commits; returns how many were written.
async fn write(db: &magic_sync_testdb::TestDb, items: i64, load: Load) -> u64 {
    let writers = 2;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let client = db.connect().await;
        tasks.push(tokio::spawn(async move {
            let statement = client
                .prepare("UPDATE items SET value = value + 1, stamp = $2 WHERE id = $1")
                .await
                .unwrap();
            let per_writer = load.rate as f64 / writers as f64;
            let mut rng = rand::rngs::StdRng::seed_from_u64(w as u64 + 1);
            let started = Instant::now();
            let mut done = 0u64;
            while started.elapsed() < Duration::from_secs(load.seconds) {
                let due = (started.elapsed().as_secs_f64() * per_writer) as u64;
                if done >= due {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                let id = rng.gen_range(1..=items);
                client
                    .execute(&statement, &[&id, &now_micros()])
                    .await
                    .unwrap();
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

/// Writes `load`, then waits for it to arrive, and the latencies of every
/// change against those applied.
async fn paced(
    db: &magic_sync_testdb::TestDb,
    client: &tokio_postgres::Client,
    side: &mut Side,
    replicas: usize,
    items: i64,
    load: Load,
) -> (Latencies, u64, u64, Duration) {
    side.latencies();
    side.measure(true);
    let began = Instant::now();
    let changes = write(db, items, load).await;
    let limit = Duration::from_secs(120);
    let settled = support::settle(client, replicas, limit).await;
    let took = began.elapsed();
    // An acknowledgement is sent after the latency is taken.
    tokio::time::sleep(Duration::from_millis(200)).await;
    side.measure(false);
    if settled.is_err() {
        println!(
            "    {}",
            support::describe_settle(&settled, limit, replicas)
        );
    }
    let (applied, messages) = side.latencies();
    // A pass sends a row once however often it changed since the last:
    // two changes of one row in one pass are one delivery. Rare here
    // (thousands of rows a replica), and counted as never applied.
    let missing = (changes as usize).saturating_sub(applied.len());
    (Latencies::new(applied, missing), changes, messages, took)
}

/// A self-signed certificate for `localhost`, and its key, as PEM files in
/// `dir`.
fn self_signed(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).expect("a certificate");
    let (cert_path, key_path) = (dir.join("hub.crt"), dir.join("hub.key"));
    std::fs::write(&cert_path, cert.pem()).expect("the certificate");
    std::fs::write(&key_path, key_pair.serialize_pem()).expect("its key");
    (cert_path, key_path)
}

async fn run(
    scenario: &Scenario,
    kind: Kind,
    clients: Clients,
    load: Load,
    burst: Load,
) -> Figures {
    let db = prepared(scenario).await;
    let client = db.connect().await;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let ids: Vec<String> = (0..scenario.replicas).map(|i| format!("r{i:03}")).collect();
    let infos: Vec<ReplicaInfo> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| ReplicaInfo::live(id, Some(&i.to_string())))
        .collect();
    let mut figures = Figures::default();
    let key = magic_sync::store::keys::public(&client)
        .await
        .expect("the server's key");
    let mut serving = None;
    let mut broker_server = None;
    let (mut side, relay) = match kind {
        Kind::Memory => {
            let network = Network::new(MAX_MESSAGE);
            let side = Side::Local(Local::memory(&network, &ids, dir.path(), key));
            (side, start_relay(db.config(), infos, network))
        }
        Kind::Socket | Kind::SocketTls => {
            let (security, trust) = if kind == Kind::SocketTls {
                let (cert, key) = self_signed(dir.path());
                let acceptor =
                    magic_sync_http::server::tls_acceptor(&cert, &key).expect("a TLS acceptor");
                (Security::Tls(acceptor), Some(cert))
            } else {
                (Security::Plain, None)
            };
            let magic_sync_testkit::apart::Served {
                hub,
                url,
                secrets: replicas,
                serving: served,
            } = magic_sync_testkit::apart::serve_hub_with(db.config(), &client, &ids, security)
                .await;
            serving = Some(served);
            let started = Instant::now();
            let trust = trust.as_deref();
            let side = match clients {
                Clients::Threads => {
                    Side::Local(Local::sockets(&url, &replicas, dir.path(), key, trust))
                }
                Clients::Process => {
                    Side::Child(Child::start(&url, &replicas, dir.path(), key, trust))
                }
            };
            magic_sync_testkit::apart::until_connected(&hub, ids.len()).await;
            figures.connected_in = Some(started.elapsed());
            (side, start_relay(db.config(), infos, hub))
        }
        Kind::Broker | Kind::BrokerTls => {
            let named: Vec<&str> = ids.iter().map(String::as_str).collect();
            let nats = if kind == Kind::BrokerTls {
                magic_sync_testkit::nats::Nats::start_tls(&named)
            } else {
                magic_sync_testkit::nats::Nats::start(&named)
            };
            let trust = nats.certificate.clone();
            let broker = Broker::connect(
                BrokerSettings {
                    max_message_bytes: Some(MAX_MESSAGE),
                    trust: trust.clone(),
                    ..BrokerSettings::new(nats.url())
                },
                nats.server.seed(),
            )
            .await
            .expect("the server connects to the broker");
            // Each replica's stream, so that its mailbox opens at once.
            for id in &ids {
                broker.prepare(id).await.expect("a replica's stream");
            }
            let replicas: Vec<(String, String)> = nats
                .replicas
                .iter()
                .map(|(id, c)| (id.clone(), c.seed().to_string()))
                .collect();
            let side = match clients {
                Clients::Threads => Side::Local(Local::mailboxes(
                    &nats.url(),
                    &replicas,
                    dir.path(),
                    key,
                    trust.as_deref(),
                )),
                Clients::Process => Side::Child(Child::start(
                    &nats.url(),
                    &replicas,
                    dir.path(),
                    key,
                    trust.as_deref(),
                )),
            };
            broker_server = Some(nats);
            (side, start_relay(db.config(), infos, broker))
        }
    };
    let cpu_before = side.cpu() + broker_cpu(&broker_server);
    let started = now_micros();
    let began = Instant::now();
    loop {
        let (ended, last) = side.ended();
        if ended == scenario.replicas {
            figures.provision = Duration::from_micros((last - started).max(0) as u64);
            figures.provision_cpu =
                (side.cpu() + broker_cpu(&broker_server)).saturating_sub(cpu_before);
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(600),
            "{ended} of {} replicas provisioned in 600 s",
            scenario.replicas
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if scenario.steady {
        let items = scenario.replicas as i64 * scenario.rows_each;
        let limit = Duration::from_secs(120);
        let settled = support::settle(&client, scenario.replicas, limit).await;
        assert!(
            settled.is_ok(),
            "{}",
            support::describe_settle(&settled, limit, scenario.replicas)
        );
        let (light, _, _, _) =
            paced(&db, &client, &mut side, scenario.replicas, items, LIGHT).await;
        figures.light = Some(light);
        let cpu_before = side.cpu() + broker_cpu(&broker_server);
        let (latencies, changes, messages, _) =
            paced(&db, &client, &mut side, scenario.replicas, items, load).await;
        figures.paced_cpu = (side.cpu() + broker_cpu(&broker_server)).saturating_sub(cpu_before);
        figures.paced = Some(latencies);
        figures.paced_messages = messages;
        figures.paced_rate = changes as f64 / load.seconds as f64;
        let (_, changes, messages, took) =
            paced(&db, &client, &mut side, scenario.replicas, items, burst).await;
        figures.burst_changes = changes;
        figures.burst_messages = messages;
        figures.burst_time = took;
    }
    let (stop, task) = relay;
    stop.send(()).ok();
    task.await.expect("the relay's task");
    side.stop();
    if let Some((stop, task)) = serving {
        stop.send(()).ok();
        task.await.expect("the server's task");
    }
    drop(broker_server);
    figures
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    if values.is_empty() {
        return f64::NAN;
    }
    values[values.len() / 2]
}

fn ms(d: Option<Duration>) -> f64 {
    d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
}

fn main() {
    if std::env::var("MAGIC_SYNC_BENCH_CHILD").as_deref() == Ok("replicas") {
        child_main();
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(parent());
}

async fn parent() {
    let replicas = env_u64("MAGIC_SYNC_BENCH_REPLICAS", 20) as usize;
    let rows_each = env_u64("MAGIC_SYNC_BENCH_ROWS_EACH", 5_000) as i64;
    let bulk_rows = env_u64("MAGIC_SYNC_BENCH_BULK_ROWS", 200_000) as i64;
    let load = Load {
        rate: env_u64("MAGIC_SYNC_BENCH_RATE", 500),
        seconds: env_u64("MAGIC_SYNC_BENCH_SECONDS", 20),
    };
    // As fast as the writers commit.
    let burst = Load {
        rate: 1_000_000,
        seconds: env_u64("MAGIC_SYNC_BENCH_BURST_SECONDS", 5),
    };
    let rounds = env_u64("MAGIC_SYNC_BENCH_ROUNDS", 1).max(1);
    let clients = match std::env::var("MAGIC_SYNC_BENCH_CLIENTS").as_deref() {
        Ok("threads") => Clients::Threads,
        _ => Clients::Process,
    };
    let picked = std::env::var("MAGIC_SYNC_BENCH_KINDS").unwrap_or_default();
    let kinds: Vec<Kind> = if picked.is_empty() {
        Kind::DEFAULT.to_vec()
    } else {
        Kind::ALL
            .into_iter()
            .filter(|k| picked.split(',').any(|p| p.trim() == k.key()))
            .collect()
    };
    let ratios: Vec<(Kind, Kind)> = Kind::RATIOS
        .into_iter()
        .filter(|(a, b)| kinds.contains(a) && kinds.contains(b))
        .collect();
    let only = std::env::var("MAGIC_SYNC_BENCH_SCENARIOS").unwrap_or_default();
    let scenarios: Vec<Scenario> = [
        Scenario {
            name: "fleet",
            replicas,
            rows_each,
            steady: true,
        },
        Scenario {
            name: "bulk",
            replicas: 1,
            rows_each: bulk_rows,
            steady: false,
        },
    ]
    .into_iter()
    .filter(|s| only.is_empty() || only.split(',').any(|o| o.trim() == s.name))
    .collect();
    println!(
        "transport: {}; remote replicas {}; {rounds} round(s)",
        kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        match clients {
            Clients::Process => "in a child process",
            Clients::Threads => "on threads of this process",
        }
    );
    // Per scenario and transport, each round's figures.
    let mut results: HashMap<(&str, Kind), Vec<Figures>> = HashMap::new();
    for round in 0..rounds {
        for scenario in &scenarios {
            // Each round begins with the next transport.
            let mut order = kinds.clone();
            order.rotate_left(round as usize % kinds.len().max(1));
            for kind in order {
                let f = run(scenario, kind, clients, load, burst).await;
                let mut line = format!(
                    "round {}: {} ({} x {} rows), {}: provisioned in {} ({} CPU in the server's and replicas' processes)",
                    round + 1,
                    scenario.name,
                    scenario.replicas,
                    scenario.rows_each,
                    kind.name(),
                    show(f.provision),
                    show(f.provision_cpu)
                );
                if let Some(c) = f.connected_in {
                    line.push_str(&format!(
                        " (connected and authenticated before, in {})",
                        show(c)
                    ));
                }
                println!("{line}");
                if let (Some(light), Some(paced)) = (&f.light, &f.paced) {
                    println!(
                        "  light {}/s for {} s: {}",
                        LIGHT.rate,
                        LIGHT.seconds,
                        light.describe()
                    );
                    println!(
                        "  paced {}/s for {} s ({:.0}/s written): {}; {} messages; {} CPU in the server's and replicas' processes ({:.0} µs a message)",
                        load.rate,
                        load.seconds,
                        f.paced_rate,
                        paced.describe(),
                        f.paced_messages,
                        show(f.paced_cpu),
                        f.paced_cpu.as_secs_f64() * 1e6 / f.paced_messages.max(1) as f64
                    );
                    println!(
                        "  burst for {} s: {} changes, {} messages applied in {}: {:.0} messages/s, {:.0} rows delivered/s",
                        burst.seconds,
                        f.burst_changes,
                        f.burst_messages,
                        show(f.burst_time),
                        deliveries(&f),
                        f.burst_changes as f64 / f.burst_time.as_secs_f64()
                    );
                }
                results.entry((scenario.name, kind)).or_default().push(f);
            }
        }
    }
    println!();
    // A round's runs ran back to back: each ratio is taken within a round,
    // then the median of the rounds' ratios.
    let heads: Vec<String> = kinds
        .iter()
        .map(|k| k.name().to_string())
        .chain(
            ratios
                .iter()
                .map(|(a, b)| format!("{} / {}", a.name(), b.name())),
        )
        .collect();
    println!("| medians of {rounds} round(s) | {} |", heads.join(" | "));
    println!("| --- |{}", " --- |".repeat(kinds.len() + ratios.len()));
    let row = |scenario: &str, what: String, unit: &str, get: &dyn Fn(&Figures) -> f64| {
        let of = |kind: Kind| -> Vec<f64> {
            results
                .get(&(scenario, kind))
                .map(|fs| fs.iter().map(get).collect())
                .unwrap_or_default()
        };
        let ratio = |over: Kind, under: Kind| {
            let ratios: Vec<f64> = of(over)
                .iter()
                .zip(&of(under))
                .map(|(a, b)| a / b)
                .collect();
            if ratios.is_empty() {
                return "-".to_string();
            }
            let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
            format!("**{:.2}x** ({})", median(ratios.clone()), each.join(", "))
        };
        let medians: Vec<String> = kinds
            .iter()
            .map(|&k| format!("{:.1} {unit}", median(of(k))))
            .collect();
        let cells: Vec<String> = medians
            .into_iter()
            .chain(ratios.iter().map(|&(a, b)| ratio(a, b)))
            .collect();
        println!("| {scenario}: {what} | {} |", cells.join(" | "));
    };
    for scenario in &scenarios {
        row(
            scenario.name,
            format!(
                "provisioning {} x {} rows",
                scenario.replicas, scenario.rows_each
            ),
            "ms",
            &|f| f.provision.as_secs_f64() * 1e3,
        );
        row(
            scenario.name,
            "provisioning, CPU time (relay and replicas)".to_string(),
            "ms",
            &|f| f.provision_cpu.as_secs_f64() * 1e3,
        );
        if scenario.steady {
            for (name, p) in [("p50", 0.50), ("p99", 0.99)] {
                row(
                    scenario.name,
                    format!("light {}/s, latency {name}", LIGHT.rate),
                    "ms",
                    &|f| ms(f.light.as_ref().and_then(|l| l.quantile(p))),
                );
            }
            for (name, p) in [("p50", 0.50), ("p99", 0.99)] {
                row(
                    scenario.name,
                    format!("paced {}/s, latency {name}", load.rate),
                    "ms",
                    &|f| ms(f.paced.as_ref().and_then(|l| l.quantile(p))),
                );
            }
            row(
                scenario.name,
                format!("paced {}/s, CPU time (relay and replicas)", load.rate),
                "ms",
                &|f| f.paced_cpu.as_secs_f64() * 1e3,
            );
            row(
                scenario.name,
                "burst, messages applied a second (a pass's size decides)".to_string(),
                "/s",
                &deliveries,
            );
            row(
                scenario.name,
                "burst, rows delivered a second (a change has one holder)".to_string(),
                "/s",
                &|f| f.burst_changes as f64 / f.burst_time.as_secs_f64(),
            );
        }
    }
}

/// CPU time of the broker's process so far, when there is one: counted
/// with the server's, as the hub is part of the server's process.
fn broker_cpu(broker: &Option<magic_sync_testkit::nats::Nats>) -> Duration {
    broker
        .as_ref()
        .and_then(|b| b.pid())
        .map_or(Duration::ZERO, cpu)
}

/// Messages the replicas applied a second in the burst.
fn deliveries(f: &Figures) -> f64 {
    f.burst_messages as f64 / f.burst_time.as_secs_f64()
}

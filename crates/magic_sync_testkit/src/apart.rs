//! The benchmarks' fleet in a process of its own, as a fleet of devices
//! would be (decision 2 of issue 22): the relay publishes into a WebSocket
//! hub served on loopback, and a child process (the benchmark's own
//! program, run again with `MAGIC_SYNC_BENCH_CHILD=fleet`) runs each
//! replica's production loop (`run::replica::replica`) over a socket of its
//! own, into a SQLite file of its own. Both processes share the machine's
//! cores all the same: what moves is the replicas' threads, allocator and
//! scheduler, out of the server's process.
//!
//! The child tells the parent, one line each on its standard output, every
//! row a replica applied (`r id table applied-micros json`) and every
//! snapshot's end (`e id applied-micros`); the parent hands the rows to the
//! benchmark's [`Watch`](crate::bench::Watch) on a thread of its own. Its standard input takes
//! the hub's address, the server's key, the directory and each replica's
//! secret, then commands: `load` and `stop` start and stop the benchmark's
//! [`Host`] on every device, `away id` closes that replica's socket for
//! good (a device switched off), and `quit` ends the fleet. What a host tells
//! (`t line`) the parent keeps for the benchmark.
//!
//! On threads (`Threads`) the same replica loop and the same hosts run in
//! the benchmark's process, over the in-process network: only the process
//! and the transport differ.

use crate::bench::{now_micros, Watcher};
use magic_sync::envelope::{to_replica::Body, ToReplica, Up};
use magic_sync::relay::ReplicaInfo;
use magic_sync::replica::{Replica, UplinkError};
use magic_sync::run::memory::Network;
use magic_sync::run::replica::Link;
use magic_sync::run::{Delivery, Report};
use magic_sync::sign::ServerKey;
use magic_sync::Engine;
use magic_sync_http::client::{Settings as ClientSettings, Socket};
use magic_sync_http::credentials::{self, Credentials};
use magic_sync_http::server::{serve, Hub, Security, Settings as HubSettings};
use prost::Message as _;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The environment variable that makes a benchmark's program the fleet.
const CHILD: &str = "MAGIC_SYNC_BENCH_CHILD";

/// Where a benchmark's replicas run: `MAGIC_SYNC_BENCH_FLEET=process` (the
/// default) or `threads` (threads of the benchmark's process, over the
/// in-process network, as before decision 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apart {
    Process,
    Threads,
}

impl Apart {
    /// As `MAGIC_SYNC_BENCH_FLEET` says.
    pub fn from_env() -> Apart {
        match std::env::var("MAGIC_SYNC_BENCH_FLEET").as_deref() {
            Err(_) | Ok("process") => Apart::Process,
            Ok("threads") => Apart::Threads,
            Ok(other) => panic!("MAGIC_SYNC_BENCH_FLEET: process or threads, not `{other}`"),
        }
    }

    /// How the benchmark prints it.
    pub fn describe(self) -> &'static str {
        match self {
            Apart::Process => {
                "replicas in a child process, over WebSocket on loopback (MAGIC_SYNC_BENCH_FLEET=threads: in this one)"
            }
            Apart::Threads => {
                "replicas on threads of this process, over the in-process network (MAGIC_SYNC_BENCH_FLEET=threads)"
            }
        }
    }
}

/// A benchmark's first call: when this program was started as the fleet's
/// child, runs the fleet of `engine` until the parent says `quit`, and
/// exits. Otherwise returns at once.
pub fn child_if_asked(engine: &Engine) {
    child_if_asked_with(engine, None);
}

/// As [`child_if_asked`], for a benchmark whose devices also run `host`
/// (the same the parent passes its fleet).
pub fn child_if_asked_with(engine: &Engine, host: Option<Host>) {
    if std::env::var(CHILD).as_deref() != Ok("fleet") {
        return;
    }
    child(engine, host);
    std::process::exit(0);
}

/// What a benchmark runs on each device beside its replica, from `load`
/// until [`Device::stopped`]: writes into the replica's file, say, nudging
/// its loop after each commit. It runs in the fleet's process.
pub type Host = fn(&Device<'_>);

/// A device, as its [`Host`] sees it.
pub struct Device<'a> {
    /// The replica's id.
    pub id: &'a str,
    /// The replica's SQLite file.
    pub path: &'a Path,
    nudge: &'a (dyn Fn() + Sync),
    stop: &'a AtomicBool,
    tell: &'a (dyn Fn(&str) + Sync),
}

impl Device<'_> {
    /// Tells the replica's loop its host wrote something.
    pub fn nudge(&self) {
        (self.nudge)();
    }

    /// Whether the benchmark said stop.
    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Tells the benchmark `line` (one line, no newline).
    pub fn tell(&self, line: &str) {
        debug_assert!(!line.contains('\n'));
        (self.tell)(line);
    }
}

/// Where a host runs: the replica's id, its file, and how to nudge its loop.
type Place = (String, std::path::PathBuf, Box<dyn Fn() + Send + Sync>);

/// The devices' hosts, while they run.
#[derive(Default)]
struct Hosts {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Hosts {
    /// Starts `host` on every device: `(id, path, nudge)`.
    fn load(&mut self, host: Host, devices: Vec<Place>, tell: Arc<dyn Fn(&str) + Send + Sync>) {
        self.stop.store(false, Ordering::Relaxed);
        for (id, path, nudge) in devices {
            let (stop, tell) = (self.stop.clone(), tell.clone());
            self.threads.push(std::thread::spawn(move || {
                host(&Device {
                    id: &id,
                    path: &path,
                    nudge: &*nudge,
                    stop: &stop,
                    tell: &*tell,
                })
            }));
        }
    }

    /// Says stop; the hosts end on their own.
    fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Says stop and waits for every host to end.
    fn join(&mut self) {
        self.stop();
        for thread in self.threads.drain(..) {
            thread.join().expect("a host's thread");
        }
    }
}

/// Opens a replica's SQLite file in `dir`, trusting `key`. With
/// `MAGIC_SYNC_BENCH_REPLICA_SYNC=normal`, the file runs with
/// `synchronous = NORMAL`: a hundred replicas on one disk queue behind each
/// other's fsync, where in a fleet each has a disk of its own.
pub(crate) fn open(dir: &Path, id: &str, engine: &Engine, key: &ServerKey) -> Replica {
    let mut replica =
        Replica::open(dir.join(format!("{id}.sqlite")), id, engine).expect("open the replica");
    replica.trust(key).expect("pin the server's key");
    if std::env::var("MAGIC_SYNC_BENCH_REPLICA_SYNC").as_deref() == Ok("normal") {
        replica
            .connection()
            .pragma_update(None, "synchronous", "NORMAL")
            .expect("pragma");
    }
    replica
}

/// What the fleet tells the benchmark: every row applied to the watcher,
/// when each replica applied its first snapshot's end, and the hosts'
/// lines.
#[derive(Clone)]
pub(crate) struct Heard {
    pub(crate) watcher: Watcher,
    pub(crate) ends: Arc<Mutex<BTreeMap<String, Instant>>>,
    pub(crate) told: Arc<Mutex<Vec<String>>>,
}

impl Heard {
    /// A replica applied `message` at `applied` (microseconds since 1970).
    fn applied(&self, id: &str, message: &[u8], applied: i64) {
        match ToReplica::decode(message).map(|m| m.body) {
            Ok(Some(Body::Down(down))) => {
                for table in &down.tables {
                    for row in &table.upserts {
                        (self.watcher)(id, &table.table, &row.data, applied);
                    }
                }
            }
            Ok(Some(Body::EndSnapshot(_))) => self.ended(id, applied),
            _ => {}
        }
    }

    fn ended(&self, id: &str, applied: i64) {
        // The child's clock is the wall's; the fleet keeps instants.
        let ago = Duration::from_micros((now_micros() - applied).max(0) as u64);
        let at = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
        self.ends
            .lock()
            .expect("not poisoned")
            .entry(id.to_string())
            .or_insert(at);
    }

    fn told(&self, line: &str) {
        self.told
            .lock()
            .expect("not poisoned")
            .push(line.to_string());
    }
}

/// The replicas on threads of the benchmark's process, over the in-process
/// network, each running the production loop as in the child.
pub(crate) struct Threads {
    pub(crate) network: Network,
    replicas: Vec<std::thread::JoinHandle<()>>,
    devices: Vec<(String, std::path::PathBuf)>,
    hosts: Hosts,
    heard: Heard,
}

impl Threads {
    pub(crate) fn start(
        engine: &Engine,
        replicas: &[ReplicaInfo],
        key: ServerKey,
        dir: &Path,
        heard: Heard,
    ) -> Threads {
        let network = Network::new(crate::bench::MAX_MESSAGE);
        let mut threads = Vec::new();
        let mut devices = Vec::new();
        for info in replicas {
            let id = info.id.to_string();
            let mut replica = open(dir, &id, engine, &key);
            devices.push((id.clone(), dir.join(format!("{id}.sqlite"))));
            let (link, heard) = (network.link(&id), heard.clone());
            threads.push(std::thread::spawn(move || {
                let applied = |id: &str, message: &[u8], at: i64| heard.applied(id, message, at);
                run_replica(&mut replica, &link, &applied);
            }));
        }
        Threads {
            network,
            replicas: threads,
            devices,
            hosts: Hosts::default(),
            heard,
        }
    }

    pub(crate) fn load(&mut self, host: Host) {
        let devices = self
            .devices
            .iter()
            .map(|(id, path)| {
                let (network, id2) = (self.network.clone(), id.clone());
                let nudge: Box<dyn Fn() + Send + Sync> = Box::new(move || network.nudge(&id2));
                (id.clone(), path.clone(), nudge)
            })
            .collect();
        let heard = self.heard.clone();
        self.hosts
            .load(host, devices, Arc::new(move |line: &str| heard.told(line)));
    }

    pub(crate) fn stop_load(&self) {
        self.hosts.stop();
    }

    /// Stops the hosts, then the replicas (each after the message it is
    /// applying; what waits in their inboxes is left).
    pub(crate) fn stop(mut self) {
        self.hosts.join();
        self.network.close();
        for thread in self.replicas {
            thread.join().expect("a replica's thread");
        }
    }
}

/// A hub served on loopback, and what replicas need to reach it.
pub struct Served {
    pub hub: Hub,
    /// `ws://127.0.0.1:port`.
    pub url: String,
    /// Each replica's id and the secret issued to it.
    pub secrets: Vec<(String, String)>,
    /// How to stop serving, and the serving task.
    pub serving: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
}

/// Waits until `replicas` replicas are connected to `hub`; panics after
/// 120 s, saying how many were.
pub async fn until_connected(hub: &Hub, replicas: usize) {
    let started = Instant::now();
    while hub.connected().len() < replicas {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{} of {replicas} replicas connected in 120 s",
            hub.connected().len(),
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Issues each of `ids` a secret and serves a hub on loopback (plain
/// WebSocket, messages of at most [`crate::bench::MAX_MESSAGE`], the rest
/// by default) until told to stop.
pub async fn serve_hub(
    config: tokio_postgres::Config,
    client: &tokio_postgres::Client,
    ids: &[String],
) -> Served {
    serve_hub_with(config, client, ids, Security::Plain).await
}

/// As [`serve_hub`], over `security`: with TLS, the url is `wss://localhost`
/// (the name a certificate for the test would carry).
pub async fn serve_hub_with(
    config: tokio_postgres::Config,
    client: &tokio_postgres::Client,
    ids: &[String],
    security: Security,
) -> Served {
    let mut secrets = Vec::new();
    for id in ids {
        let secret = credentials::issue(client, id)
            .await
            .expect("issue a secret");
        secrets.push((id.clone(), secret));
    }
    let hub = Hub::new(
        HubSettings {
            max_message_bytes: crate::bench::MAX_MESSAGE,
            ..HubSettings::default()
        },
        Credentials::new(config),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port");
    let port = listener.local_addr().expect("an address").port();
    let url = if matches!(security, Security::Plain) {
        format!("ws://127.0.0.1:{port}")
    } else {
        format!("wss://localhost:{port}")
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = {
        let hub = hub.clone();
        tokio::spawn(async move {
            serve(hub, listener, security, async {
                stopped.await.ok();
            })
            .await
            .expect("serve the hub");
        })
    };
    Served {
        hub,
        url,
        secrets,
        serving: (stop, task),
    }
}

/// The replicas in a child process: the hub, its serving task, the child,
/// and the thread hearing what the child tells.
pub(crate) struct Process {
    pub(crate) hub: Hub,
    serving: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
    ),
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    reader: std::thread::JoinHandle<()>,
    bye: std::sync::mpsc::Receiver<()>,
}

impl Process {
    /// Issues each replica a secret, serves a hub on loopback, starts the
    /// child and waits until every replica is connected.
    pub(crate) async fn start(
        config: tokio_postgres::Config,
        client: &tokio_postgres::Client,
        replicas: &[ReplicaInfo],
        key: ServerKey,
        dir: &Path,
        heard: Heard,
    ) -> Process {
        let ids: Vec<String> = replicas.iter().map(|r| r.id.to_string()).collect();
        let Served {
            hub,
            url,
            secrets,
            serving,
        } = serve_hub(config, client, &ids).await;
        let mut child = std::process::Command::new(std::env::current_exe().expect("this program"))
            .env(CHILD, "fleet")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the fleet's process");
        let mut stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut setup = format!("{url} {key} {}\n", dir.display());
        for (id, secret) in &secrets {
            setup.push_str(&format!("{id} {secret}\n"));
        }
        setup.push_str("go\n");
        stdin.write_all(setup.as_bytes()).expect("the fleet reads");
        stdin.flush().expect("flush");
        let (said_bye, bye) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || hear(stdout, &heard, said_bye));
        until_connected(&hub, replicas.len()).await;
        Process {
            hub,
            serving,
            child,
            stdin,
            reader,
            bye,
        }
    }

    /// The child's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends the child a command.
    pub(crate) fn say(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("the fleet reads");
        self.stdin.flush().expect("flush");
    }

    /// Stops the child (its hosts, then each replica after the message it
    /// is applying), then the hub.
    pub(crate) async fn stop(mut self) {
        self.say("quit");
        let Process {
            serving: (stop, task),
            mut child,
            reader,
            bye,
            ..
        } = self;
        tokio::task::block_in_place(|| {
            bye.recv().expect("the fleet says bye");
            reader.join().expect("the reader");
            let status = child.wait().expect("the fleet ends");
            assert!(status.success(), "the fleet's process: {status}");
        });
        stop.send(()).ok();
        task.await.expect("the hub's task");
    }
}

/// The parent's reader: every line the child tells, until it says bye.
fn hear(
    stdout: BufReader<std::process::ChildStdout>,
    heard: &Heard,
    said_bye: std::sync::mpsc::Sender<()>,
) {
    for line in stdout.lines() {
        let line = line.expect("a line from the fleet");
        let mut parts = line.splitn(5, ' ');
        match parts.next() {
            Some("r") => {
                let (id, table, applied, json) = (
                    parts.next().expect("an id"),
                    parts.next().expect("a table"),
                    parts.next().expect("when"),
                    parts.next().expect("a row"),
                );
                let applied: i64 = applied.parse().expect("microseconds");
                (heard.watcher)(id, table, json.as_bytes(), applied);
            }
            Some("e") => {
                let id = parts.next().expect("an id");
                let applied: i64 = parts.next().expect("when").parse().expect("microseconds");
                heard.ended(id, applied);
            }
            Some("t") => heard.told(line.split_once(' ').expect("`t line`").1),
            Some("bye") => {
                said_bye.send(()).ok();
                return;
            }
            _ => panic!("the fleet said `{line}`"),
        }
    }
    panic!("the fleet's process ended without saying bye");
}

/// The child: a thread and a socket per replica, and the hosts as the
/// parent asks.
fn child(engine: &Engine, host: Option<Host>) {
    let engine = Arc::new(engine.clone());
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines().map(|l| l.expect("a line"));
    let first = lines.next().expect("`url key dir`");
    let mut parts = first.splitn(3, ' ');
    let (url, key, dir) = (
        parts.next().expect("the hub's address").to_string(),
        parts.next().expect("the server's key"),
        parts.next().expect("the directory").to_string(),
    );
    let key: ServerKey = key.parse().expect("the server's key");
    let out = Arc::new(Mutex::new(std::io::BufWriter::new(std::io::stdout())));
    let mut sockets = Vec::new();
    let mut threads = Vec::new();
    let mut devices = Vec::new();
    for line in lines.by_ref() {
        if line == "go" {
            break;
        }
        let (id, secret) = line.split_once(' ').expect("`id secret`");
        let socket = Arc::new(
            Socket::connect(ClientSettings {
                max_message_bytes: crate::bench::MAX_MESSAGE,
                ..ClientSettings::new(&url, id, secret)
            })
            .expect("a socket"),
        );
        devices.push((id.to_string(), socket.nudger()));
        let (id, dir, link, out) = (id.to_string(), dir.clone(), socket.clone(), out.clone());
        let engine = engine.clone();
        threads.push(std::thread::spawn(move || {
            let mut replica = open(Path::new(&dir), &id, &engine, &key);
            let applied = |id: &str, message: &[u8], at: i64| tell_applied(&out, id, message, at);
            run_replica(&mut replica, &*link, &applied);
        }));
        let added = devices.last().expect("just added").0.clone();
        sockets.push((added, socket));
    }
    let tell: Arc<dyn Fn(&str) + Send + Sync> = {
        let out = out.clone();
        Arc::new(move |line: &str| {
            let mut out = out.lock().expect("not poisoned");
            writeln!(out, "t {line}").expect("the parent reads");
            out.flush().expect("flush");
        })
    };
    let mut hosts = Hosts::default();
    // Until `quit`, or the parent gone (its end of the pipe closed).
    for command in lines {
        match command.as_str() {
            "load" => {
                let host = host.expect("a fleet loaded has a host");
                let devices = devices
                    .iter()
                    .map(|(id, nudger)| {
                        let nudger = nudger.clone();
                        let nudge: Box<dyn Fn() + Send + Sync> = Box::new(move || nudger.nudge());
                        (
                            id.clone(),
                            Path::new(&dir).join(format!("{id}.sqlite")),
                            nudge,
                        )
                    })
                    .collect();
                hosts.load(host, devices, tell.clone());
            }
            "stop" => hosts.stop(),
            "quit" => break,
            other => match other.strip_prefix("away ") {
                // The socket closed, the replica's loop ends.
                Some(id) => {
                    for (_, socket) in sockets.iter().filter(|(of, _)| of == id) {
                        socket.close();
                    }
                }
                None => panic!("the fleet takes load, stop, away and quit, not `{other}`"),
            },
        }
    }
    hosts.join();
    for (_, socket) in &sockets {
        socket.close();
    }
    for thread in threads {
        thread.join().expect("a replica's thread");
    }
    let mut out = out.lock().expect("not poisoned");
    writeln!(out, "bye").expect("the parent reads");
    out.flush().expect("flush");
}

/// In the child: tells the parent the rows `message` carried, or its
/// snapshot's end, one line each.
fn tell_applied(
    out: &Mutex<std::io::BufWriter<std::io::Stdout>>,
    id: &str,
    message: &[u8],
    at: i64,
) {
    let mut lines = String::new();
    match ToReplica::decode(message).map(|m| m.body) {
        Ok(Some(Body::Down(down))) => {
            for table in &down.tables {
                for row in &table.upserts {
                    let json = std::str::from_utf8(&row.data).expect("a JSON row");
                    debug_assert!(!json.contains('\n'), "JSON written on one line");
                    lines.push_str(&format!("r {id} {} {at} {json}\n", table.table));
                }
            }
        }
        Ok(Some(Body::EndSnapshot(_))) => lines.push_str(&format!("e {id} {at}\n")),
        _ => {}
    }
    if lines.is_empty() {
        return;
    }
    let mut out = out.lock().expect("not poisoned");
    out.write_all(lines.as_bytes()).expect("the parent reads");
    out.flush().expect("flush");
}

/// What a replica applied, and when: `(id, message, microseconds since 1970)`.
type Applied<'a> = dyn Fn(&str, &[u8], i64) + 'a;

/// A replica's production loop over `link` until the link closes, showing
/// `applied` every message it applied.
fn run_replica(replica: &mut Replica, link: &dyn Link, applied: &Applied<'_>) {
    let id = replica.id().to_string();
    let watched = Watched {
        link,
        id: &id,
        applied,
        applying: Mutex::new(None),
    };
    magic_sync::run::replica::replica(replica, &watched).expect("the replica's loop");
}

/// A replica's link, watched: the loop reports a message right after
/// applying it.
struct Watched<'a> {
    link: &'a dyn Link,
    id: &'a str,
    applied: &'a Applied<'a>,
    /// The message being applied.
    applying: Mutex<Option<Vec<u8>>>,
}

impl Link for Watched<'_> {
    fn max_message_bytes(&self) -> usize {
        self.link.max_message_bytes()
    }

    fn next(&self, timeout: Duration) -> Delivery {
        let delivery = self.link.next(timeout);
        if let Delivery::Message(message) = &delivery {
            *self.applying.lock().expect("not poisoned") = Some(message.clone());
        }
        delivery
    }

    fn report(&self, report: Report) {
        let at = matches!(report, Report::Applied(_)).then(now_micros);
        self.link.report(report);
        if let (Some(at), Some(message)) = (at, self.applying.lock().expect("not poisoned").take())
        {
            (self.applied)(self.id, &message, at);
        }
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        self.link.upload(up)
    }
}

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
//! benchmark's [`Watch`] on a thread of its own. Its standard input takes
//! the hub's address, the server's key, the directory and each replica's
//! secret, then `quit`.

use crate::bench::{now_micros, Watcher};
use magic_sync::envelope::{to_replica::Body, ToReplica, Up};
use magic_sync::relay::ReplicaInfo;
use magic_sync::replica::{Replica, UplinkError};
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
pub fn child_if_asked(engine: &'static Engine) {
    if std::env::var(CHILD).as_deref() != Ok("fleet") {
        return;
    }
    child(engine);
    std::process::exit(0);
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

/// The parent's side: the hub, its serving task, the child, and the thread
/// reading what the child tells.
pub(crate) struct Fleet {
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

impl Fleet {
    /// Issues each replica a secret, serves a hub on loopback, starts the
    /// child and waits until every replica is connected.
    pub(crate) async fn start(
        config: tokio_postgres::Config,
        client: &tokio_postgres::Client,
        replicas: &[ReplicaInfo],
        key: ServerKey,
        dir: &Path,
        watcher: Watcher,
        ends: Arc<Mutex<BTreeMap<String, Instant>>>,
    ) -> Fleet {
        let mut secrets = Vec::new();
        for info in replicas {
            let secret = credentials::issue(client, &info.id)
                .await
                .expect("issue a secret");
            secrets.push((info.id.to_string(), secret));
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
        let url = format!("ws://{}", listener.local_addr().expect("an address"));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = {
            let hub = hub.clone();
            tokio::spawn(async move {
                serve(hub, listener, Security::Plain, async {
                    stopped.await.ok();
                })
                .await
                .expect("serve the hub");
            })
        };
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
        let reader = std::thread::spawn(move || hear(stdout, &*watcher, &ends, said_bye));
        let started = Instant::now();
        while hub.connected().len() < replicas.len() {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "{} of {} replicas connected in 120 s",
                hub.connected().len(),
                replicas.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Fleet {
            hub,
            serving: (stop, task),
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

    /// Stops the child (each replica after the message it is applying),
    /// then the hub.
    pub(crate) async fn stop(mut self) {
        tokio::task::block_in_place(|| {
            writeln!(self.stdin, "quit").expect("the fleet reads");
            self.stdin.flush().expect("flush");
            self.bye.recv().expect("the fleet says bye");
            self.reader.join().expect("the reader");
            let status = self.child.wait().expect("the fleet ends");
            assert!(status.success(), "the fleet's process: {status}");
        });
        let (stop, task) = self.serving;
        stop.send(()).ok();
        task.await.expect("the hub's task");
    }
}

/// The parent's reader: every line the child tells, until it says bye.
fn hear(
    stdout: BufReader<std::process::ChildStdout>,
    watch: &crate::bench::Watch,
    ends: &Mutex<BTreeMap<String, Instant>>,
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
                watch(id, table, json.as_bytes(), applied);
            }
            Some("e") => {
                let id = parts.next().expect("an id");
                let applied: i64 = parts.next().expect("when").parse().expect("microseconds");
                // The child's clock is the wall's; the parent keeps instants.
                let ago = Duration::from_micros((now_micros() - applied).max(0) as u64);
                let at = Instant::now().checked_sub(ago).unwrap_or_else(Instant::now);
                ends.lock()
                    .expect("not poisoned")
                    .entry(id.to_string())
                    .or_insert(at);
            }
            Some("bye") => {
                said_bye.send(()).ok();
                return;
            }
            _ => panic!("the fleet said `{line}`"),
        }
    }
    panic!("the fleet's process ended without saying bye");
}

/// The child: a thread and a socket per replica, as the parent asks.
fn child(engine: &'static Engine) {
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
        let (id, dir, link, out) = (id.to_string(), dir.clone(), socket.clone(), out.clone());
        threads.push(std::thread::spawn(move || {
            let mut replica = open(Path::new(&dir), &id, engine, &key);
            let told = Told {
                link: &link,
                id: &id,
                out: &out,
                applying: Mutex::new(None),
            };
            magic_sync::run::replica::replica(&mut replica, &told).expect("the replica's loop");
        }));
        sockets.push(socket);
    }
    // `quit`, or the parent gone (its end of the pipe closed).
    let command = lines.next();
    assert!(
        matches!(command.as_deref(), Some("quit") | None),
        "the fleet takes `quit` only, not {command:?}"
    );
    for socket in &sockets {
        socket.close();
    }
    for thread in threads {
        thread.join().expect("a replica's thread");
    }
    let mut out = out.lock().expect("not poisoned");
    writeln!(out, "bye").expect("the parent reads");
    out.flush().expect("flush");
}

/// A replica's link in the child, telling the parent what it applied: the
/// loop reports a message right after applying it.
struct Told<'a> {
    link: &'a Socket,
    id: &'a str,
    out: &'a Mutex<std::io::BufWriter<std::io::Stdout>>,
    /// The message being applied.
    applying: Mutex<Option<Vec<u8>>>,
}

impl Link for Told<'_> {
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
        let applied = matches!(report, Report::Applied(_)).then(now_micros);
        self.link.report(report);
        let (Some(applied), Some(message)) =
            (applied, self.applying.lock().expect("not poisoned").take())
        else {
            return;
        };
        let mut lines = Vec::new();
        match ToReplica::decode(message.as_slice()).map(|m| m.body) {
            Ok(Some(Body::Down(down))) => {
                for table in &down.tables {
                    for row in &table.upserts {
                        let json = std::str::from_utf8(&row.data).expect("a JSON row");
                        debug_assert!(!json.contains('\n'), "JSON written on one line");
                        lines.push(format!("r {} {} {applied} {json}\n", self.id, table.table));
                    }
                }
            }
            Ok(Some(Body::EndSnapshot(_))) => lines.push(format!("e {} {applied}\n", self.id)),
            _ => {}
        }
        if lines.is_empty() {
            return;
        }
        let mut out = self.out.lock().expect("not poisoned");
        for line in lines {
            out.write_all(line.as_bytes()).expect("the parent reads");
        }
        out.flush().expect("flush");
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        self.link.upload(up)
    }
}

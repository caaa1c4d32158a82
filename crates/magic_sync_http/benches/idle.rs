//! A thousand idle replicas on one hub (issue 13): whether all connect,
//! how long that takes, and what each costs the server in memory.
//!
//! cargo bench -p magic_sync_http --bench idle
//!
//! The server runs in a child process of its own, so its memory is its
//! alone: a `Hub` served on loopback with its default settings (its bounds on
//! connections, overall and from one address, raised to the fleet's size:
//! every replica comes from loopback here), checking
//! secrets against a test database, and no relay (nothing is sent but the
//! hub's pings: the figures are the transport's). This process holds the
//! replicas: raw WebSocket clients (tokio-tungstenite, HTTP Basic
//! credentials, as `client::Socket` connects) on its runtime, reading all
//! along so that they answer pings. A client whose attempt fails tries
//! again as `Socket` does: after 100 ms doubling to 10 s, times a jitter
//! of 0.5-1.5.
//!
//! 1. Issue MAGIC_SYNC_BENCH_CONNECTIONS secrets (default 1,000), one
//!    Argon2 hash each, four at a time (in this process).
//! 2. Connect every replica, at most MAGIC_SYNC_BENCH_CONNECT_AT_ONCE
//!    attempts in flight (default 16). Each first connection has its
//!    secret checked by Argon2 on the server. Reported: the time until
//!    `hub.connected()` lists every replica, the attempts refused and why,
//!    the server's threads and peak memory meanwhile.
//! 3. The server's RSS (`VmRSS`) before and after, per connection, once
//!    the blocking threads that ran Argon2 have ended (tokio keeps them
//!    10 s).
//! 4. Idle for MAGIC_SYNC_BENCH_IDLE_SECONDS (default 20, past one ping
//!    interval): the server's CPU time, and that every replica stays.
//! 5. Every client closes, then connects again: the secrets are proved
//!    already (a digest compared, no Argon2), so this is connecting alone;
//!    and the server's RSS from no connections to all of them again.
//!
//! Memory. Each Argon2 check allocates its 19 MiB of memory blocks, and
//! glibc's allocator, whose threshold for returning large blocks to the
//! system grows with the blocks it sees, keeps them once freed: the RSS
//! after connecting would count every block ever in use at once. The
//! server runs with `GLIBC_TUNABLES=glibc.malloc.mmap_threshold=131072`
//! (a fixed threshold: every block larger than 128 KiB is given back when
//! freed) so that its RSS is what it holds; MAGIC_SYNC_BENCH_MALLOC=default
//! runs it with glibc's defaults instead, to see what it keeps.
//!
//! Safety: the server's address space is limited to
//! MAGIC_SYNC_BENCH_SERVER_GIB (default 8) GiB, so that a connection storm
//! (say MAGIC_SYNC_BENCH_CONNECT_AT_ONCE=1000: every check's Argon2 at once,
//! on as many blocking threads as tokio starts, up to 512) ends the server
//! alone rather than the machine's other processes.
//!
//! The limit of open files is raised towards its hard limit when below what
//! the connections need (each side needs one descriptor a connection).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync_testkit::bench as support;

use futures_util::{SinkExt, StreamExt};
use magic_sync_http::credentials::{self, Credentials};
use magic_sync_http::server::{serve, Hub, Security, Settings};
use std::io::{BufRead, BufReader, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{env_u64, show};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

/// A field of `/proc/self/status`, in kB (or a count).
fn status(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// This process's CPU time (user and system), in milliseconds.
fn cpu_ms() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command's name, which is in parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("(comm)") + 2..]
        .split_whitespace()
        .collect();
    // utime and stime, fields 14 and 15 of the line (11 and 12 here), in
    // the kernel's USER_HZ: 100 a second on Linux.
    (fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()) * 10
}

/// Raises the soft limit of open files to at least `needed`, up to the
/// hard limit; says what it is.
fn open_files(needed: u64) {
    let (soft, hard) =
        rlimit::getrlimit(rlimit::Resource::NOFILE).expect("the limit of open files");
    let now = if soft < needed {
        rlimit::increase_nofile_limit(needed).expect("raise the limit of open files")
    } else {
        soft
    };
    println!("open files: soft limit {now} (was {soft}, hard {hard}); {needed} needed");
    assert!(
        now >= needed,
        "{needed} open files needed, at most {now} allowed: raise the hard limit (`ulimit -Hn`)"
    );
}

// ---------------------------------------------------------------------------
// The server's process.

/// The child: reads the database's conninfo, serves, says its address,
/// then answers `stats` and `quit`.
fn server_main() {
    let gib = env_u64("MAGIC_SYNC_BENCH_SERVER_GIB", 8);
    let (_, hard) = rlimit::getrlimit(rlimit::Resource::AS).expect("the address space limit");
    rlimit::setrlimit(rlimit::Resource::AS, (gib << 30).min(hard), hard)
        .expect("limit the address space");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let mut lines = std::io::stdin().lock().lines().map(|l| l.expect("a line"));
    let conninfo = lines.next().expect("the database");
    let config: tokio_postgres::Config = conninfo.parse().expect("a conninfo");
    // Every replica comes from one address here, loopback; a fleet's
    // devices come from many. The bounds are raised to the fleet's size,
    // never lowered.
    let connections = env_u64("MAGIC_SYNC_BENCH_CONNECTIONS", 1_000) as usize;
    let defaults = Settings::default();
    let settings = Settings {
        max_connections: defaults.max_connections.max(connections),
        max_connections_per_address: defaults.max_connections_per_address.max(connections),
        max_connections_per_network: defaults.max_connections_per_network.max(connections),
        ..defaults
    };
    let hub = Hub::new(settings, Credentials::new(config));
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a port");
    println!("ws://{}", listener.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = runtime.spawn(serve(hub.clone(), listener, Security::Plain, async {
        stopped.await.ok();
    }));
    for command in lines {
        match command.as_str() {
            "stats" => println!(
                "{} {} {} {} {} {}",
                hub.connected().len(),
                hub.connections(),
                status("VmRSS"),
                status("VmHWM"),
                status("Threads"),
                cpu_ms()
            ),
            "quit" => break,
            other => panic!("unknown command `{other}`"),
        }
    }
    stop.send(()).ok();
    runtime
        .block_on(serving)
        .expect("the server's task")
        .expect("serve");
    println!("bye");
}

/// What the server says of itself.
#[derive(Debug, Clone, Copy)]
struct ServerStats {
    /// `hub.connected().len()`.
    connected: usize,
    /// `hub.connections()`.
    connections: usize,
    rss_kib: u64,
    peak_kib: u64,
    threads: u64,
    cpu_ms: u64,
}

struct Server {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    url: String,
    log: std::path::PathBuf,
}

impl Server {
    fn start(conninfo: &str, log: &std::path::Path, default_malloc: bool) -> Server {
        let mut command =
            std::process::Command::new(std::env::current_exe().expect("this program"));
        command
            .env("MAGIC_SYNC_BENCH_CHILD", "server")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(log).expect("the server's log"));
        if !default_malloc {
            command.env("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=131072");
        }
        let mut child = command.spawn().expect("start the server's process");
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        writeln!(stdin, "{conninfo}").expect("the server reads");
        stdin.flush().expect("flush");
        let mut url = String::new();
        stdout.read_line(&mut url).expect("the server's address");
        assert!(url.starts_with("ws://"), "the server said `{url}`");
        Server {
            child,
            stdin,
            stdout,
            url: url.trim_end().to_string(),
            log: log.to_path_buf(),
        }
    }

    fn ask(&mut self, command: &str) -> String {
        tokio::task::block_in_place(|| {
            writeln!(self.stdin, "{command}").expect("the server reads");
            self.stdin.flush().expect("flush");
            let mut line = String::new();
            self.stdout
                .read_line(&mut line)
                .expect("the server answers");
            if line.is_empty() {
                let status = self.child.wait().expect("the server ended");
                panic!(
                    "the server's process ended ({status}); its log, {}:\n{}",
                    self.log.display(),
                    tail(&self.log, 5)
                );
            }
            line.trim_end().to_string()
        })
    }

    fn stats(&mut self) -> ServerStats {
        let v: Vec<u64> = self
            .ask("stats")
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        ServerStats {
            connected: v[0] as usize,
            connections: v[1] as usize,
            rss_kib: v[2],
            peak_kib: v[3],
            threads: v[4],
            cpu_ms: v[5],
        }
    }

    fn stop(mut self) {
        assert_eq!(self.ask("quit"), "bye");
        let status = self.child.wait().expect("the server ends");
        assert!(status.success(), "the server's process: {status}");
    }
}

/// The last `n` lines of a file, and how many it has.
fn tail(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    format!(
        "({} lines)\n{}",
        lines.len(),
        lines[lines.len().saturating_sub(n)..].join("\n")
    )
}

// ---------------------------------------------------------------------------
// The clients, in this process.

/// The clients' counts, shared by their tasks.
#[derive(Debug, Default)]
struct Counts {
    connected: AtomicUsize,
    attempts: AtomicU64,
    /// 401: wrong credentials (never expected).
    unauthorized: AtomicU64,
    /// 503: the check could not be made, or took too long.
    unavailable: AtomicU64,
    /// Anything else: refused, reset, timed out.
    failed: AtomicU64,
}

impl Counts {
    fn describe(&self) -> String {
        format!(
            "{} attempts: {} refused as unavailable (503), {} unauthorized (401), {} failed otherwise",
            self.attempts.load(Ordering::Relaxed),
            self.unavailable.load(Ordering::Relaxed),
            self.unauthorized.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed)
        )
    }
}

type Stream =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn attempt(url: &str, id: &str, secret: &str, counts: &Counts) -> Option<Stream> {
    use base64::Engine as _;
    counts.attempts.fetch_add(1, Ordering::Relaxed);
    let mut request = format!("{url}{}", magic_sync_http::PATH)
        .into_client_request()
        .expect("a request");
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
    request.headers_mut().insert(
        "authorization",
        format!("Basic {basic}").parse().expect("a header"),
    );
    // As `Socket`'s default connect timeout.
    let connecting = tokio_tungstenite::connect_async(request);
    match tokio::time::timeout(Duration::from_secs(10), connecting).await {
        Ok(Ok((stream, _))) => return Some(stream),
        Ok(Err(tokio_tungstenite::tungstenite::Error::Http(response))) => {
            match response.status().as_u16() {
                401 => &counts.unauthorized,
                503 => &counts.unavailable,
                _ => &counts.failed,
            }
        }
        Ok(Err(_)) | Err(_) => &counts.failed,
    }
    .fetch_add(1, Ordering::Relaxed);
    None
}

/// 0.5 to 1.5, from the clock's low bits (enough for a jitter).
fn jitter() -> f64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    0.5 + f64::from(nanos % 1_000_000) / 1_000_000.0
}

/// One replica: connected while `wanted` says so, reading (and so
/// answering pings) all along; connects again as `Socket` does when
/// refused or cut off.
async fn replica(
    url: Arc<str>,
    id: String,
    secret: String,
    counts: Arc<Counts>,
    permits: Arc<tokio::sync::Semaphore>,
    mut wanted: tokio::sync::watch::Receiver<bool>,
) {
    let (min, max) = (Duration::from_millis(100), Duration::from_secs(10));
    loop {
        if wanted.wait_for(|w| *w).await.is_err() {
            return;
        }
        let mut backoff = min;
        let mut stream = loop {
            let permit = permits.acquire().await.expect("open");
            let stream = attempt(&url, &id, &secret, &counts).await;
            drop(permit);
            if let Some(stream) = stream {
                break stream;
            }
            tokio::time::sleep(backoff.mul_f64(jitter())).await;
            backoff = (backoff * 2).min(max);
        };
        counts.connected.fetch_add(1, Ordering::Relaxed);
        loop {
            tokio::select! {
                frame = stream.next() => match frame {
                    Some(Ok(_)) => {}
                    // Cut off: connect again.
                    Some(Err(_)) | None => break,
                },
                changed = wanted.changed() => {
                    if changed.is_err() || !*wanted.borrow() {
                        let _ = stream.send(Message::Close(None)).await;
                        // Until the server's close comes back.
                        let _ = tokio::time::timeout(Duration::from_secs(5), async {
                            while let Some(Ok(_)) = stream.next().await {}
                        })
                        .await;
                        break;
                    }
                }
            }
        }
        counts.connected.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Waits until the server lists `n` replicas (or, with `n` 0, none), for
/// at most `limit`, saying how it goes every 10 s. Returns how long it took
/// (`None` past the limit), and the most threads and the peak RSS the
/// server had meanwhile.
async fn until_connected(
    server: &mut Server,
    counts: &Counts,
    n: usize,
    limit: Duration,
) -> (Option<Duration>, ServerStats) {
    let started = Instant::now();
    let mut said = Instant::now();
    let mut most_threads = 0;
    loop {
        let mut stats = server.stats();
        most_threads = most_threads.max(stats.threads);
        stats.threads = most_threads;
        if stats.connected == n {
            return (Some(started.elapsed()), stats);
        }
        if started.elapsed() >= limit {
            return (None, stats);
        }
        if said.elapsed() >= Duration::from_secs(10) {
            said = Instant::now();
            println!(
                "  after {}: {} connected; {}; the server: {} threads, peak RSS {}",
                show(started.elapsed()),
                stats.connected,
                counts.describe(),
                most_threads,
                mib(stats.peak_kib)
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn main() {
    if std::env::var("MAGIC_SYNC_BENCH_CHILD").as_deref() == Ok("server") {
        server_main();
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
    let n = env_u64("MAGIC_SYNC_BENCH_CONNECTIONS", 1_000) as usize;
    let at_once = env_u64("MAGIC_SYNC_BENCH_CONNECT_AT_ONCE", 16).max(1) as usize;
    let idle = Duration::from_secs(env_u64("MAGIC_SYNC_BENCH_IDLE_SECONDS", 20));
    let limit = Duration::from_secs(env_u64("MAGIC_SYNC_BENCH_CONNECT_LIMIT", 300));
    let default_malloc = std::env::var("MAGIC_SYNC_BENCH_MALLOC").as_deref() == Ok("default");
    // Each side: a descriptor a connection, and some to spare. The
    // server's process inherits the limit.
    open_files(n as u64 + 256);

    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client)
        .await
        .expect("migrate");
    let ids: Vec<String> = (0..n).map(|i| format!("r{i:04}")).collect();
    let started = Instant::now();
    let replicas: Vec<(String, String)> = futures_util::stream::iter(ids.iter())
        .map(|id| {
            let client = &client;
            async move {
                let secret = credentials::issue(client, id).await.expect("a secret");
                (id.clone(), secret)
            }
        })
        .buffer_unordered(4)
        .collect()
        .await;
    println!(
        "issued {n} secrets in {} ({:.1} ms each, four at a time on 2 cores)",
        show(started.elapsed()),
        started.elapsed().as_secs_f64() * 1e3 / n as f64
    );

    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("server.log");
    let mut server = Server::start(&db.conninfo(), &log, default_malloc);
    println!(
        "server: a child process, malloc {}, address space at most {} GiB",
        if default_malloc {
            "as glibc's defaults"
        } else {
            "with glibc.malloc.mmap_threshold=131072"
        },
        env_u64("MAGIC_SYNC_BENCH_SERVER_GIB", 8)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = server.stats();
    println!(
        "server before any connection: RSS {}, {} threads",
        mib(before.rss_kib),
        before.threads
    );
    let clients_before = status("VmRSS");

    // 2. Connect, every secret checked by Argon2.
    println!("connecting {n} replicas, at most {at_once} attempts at once");
    let counts = Arc::new(Counts::default());
    let permits = Arc::new(tokio::sync::Semaphore::new(at_once));
    let (want, wanted) = tokio::sync::watch::channel(true);
    let url: Arc<str> = server.url.as_str().into();
    let tasks: Vec<_> = replicas
        .iter()
        .map(|(id, secret)| {
            tokio::spawn(replica(
                url.clone(),
                id.clone(),
                secret.clone(),
                counts.clone(),
                permits.clone(),
                wanted.clone(),
            ))
        })
        .collect();
    let (took, during) = until_connected(&mut server, &counts, n, limit).await;
    match took {
        Some(took) => println!(
            "all {n} connected (hub.connected().len() = {}) in {} ({:.1} ms each): {}",
            during.connected,
            show(took),
            took.as_secs_f64() * 1e3 / n as f64,
            counts.describe()
        ),
        None => println!(
            "NOT ALL CONNECTED: {} of {n} after {}: {}",
            during.connected,
            show(limit),
            counts.describe()
        ),
    }
    println!(
        "  meanwhile the server: up to {} threads, peak RSS {}; hub.connections() = {} with {} connected",
        during.threads,
        mib(during.peak_kib),
        during.connections,
        during.connected
    );

    // 3. Memory, once the threads that ran Argon2 have ended.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = server.stats();
    let per = |from: &ServerStats, to: &ServerStats| {
        to.rss_kib.saturating_sub(from.rss_kib) as f64 / to.connected.max(1) as f64
    };
    println!(
        "server with {} connected: RSS {} ({} more: {:.1} KiB a connection), {} threads",
        after.connected,
        mib(after.rss_kib),
        mib(after.rss_kib.saturating_sub(before.rss_kib)),
        per(&before, &after),
        after.threads
    );
    let clients_after = status("VmRSS");
    println!(
        "  (the clients' process: RSS {} more, {:.1} KiB a connection)",
        mib(clients_after.saturating_sub(clients_before)),
        clients_after.saturating_sub(clients_before) as f64 / n as f64
    );

    // 4. Idle.
    let attempts = counts.attempts.load(Ordering::Relaxed);
    tokio::time::sleep(idle).await;
    let idled = server.stats();
    let used = idled.cpu_ms - after.cpu_ms;
    println!(
        "idle {}: server CPU {used} ms ({:.2}% of a core); {} connected after, {} attempts meanwhile",
        show(idle),
        used as f64 * 100.0 / idle.as_millis() as f64,
        idled.connected,
        counts.attempts.load(Ordering::Relaxed) - attempts
    );

    // 5. Close every connection, then connect again: no Argon2 now.
    want.send_replace(false);
    let (closed, _) = until_connected(&mut server, &counts, 0, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let empty = server.stats();
    println!(
        "every client closed{}: server RSS {}",
        closed.map_or(" (not all within 60 s)".to_string(), |d| format!(
            " in {}",
            show(d)
        )),
        mib(empty.rss_kib)
    );
    let attempts = counts.attempts.load(Ordering::Relaxed);
    want.send_replace(true);
    let (took, _) = until_connected(&mut server, &counts, n, limit).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = server.stats();
    println!(
        "connected again, secrets proved before, in {}: {} attempts; server RSS {} ({} more than with none: {:.1} KiB a connection)",
        took.map_or("(not all)".to_string(), show),
        counts.attempts.load(Ordering::Relaxed) - attempts,
        mib(again.rss_kib),
        mib(again.rss_kib.saturating_sub(empty.rss_kib)),
        per(&empty, &again)
    );

    want.send_replace(false);
    let _ = until_connected(&mut server, &counts, 0, Duration::from_secs(30)).await;
    drop(want);
    for task in tasks {
        task.await.expect("a client");
    }
    server.stop();
    println!("the server's log: {}", tail(&log, 3));
}

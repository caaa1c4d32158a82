//! magic_sync's demo: a small shop's server and its tills, each till a
//! process of its own on a SQLite file, over the network transport on
//! loopback. The server writes orders and prices while the tills record
//! sales and count stock; it ends when every till holds what it should and
//! the server holds every till's sales, and prints the overview.
//!
//! cargo run --release -p demo
//!
//! With DATABASE_URL set it uses that database; otherwise it keeps a
//! PostgreSQL cluster of its own under the data folder. Run it again and it
//! continues from where it was. Ctrl-C stops it cleanly. With `--broker`
//! the tills read their mailboxes on a `nats-server` the demo starts
//! (over TLS, each till enrolled with a key of its own) instead of holding
//! a socket to the server.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command speaks to its operator"
)]

use clap::Parser;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use magic_sync::ops::{self, ReplicaState, Scope};
use magic_sync::relay::Transport;
use magic_sync::relay::{ReplicaInfo, Replicas, Settings as RelaySettings};
use magic_sync::run::server::Reports;
use magic_sync::sign::ServerKey;
use magic_sync_http::credentials::{self, Credentials};
use magic_sync_http::server::{serve, Hub, Security, Settings as HubSettings};
use magic_sync_nats::access;
use magic_sync_nats::broker::{self, Broker};
use rand::Rng;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

#[derive(Debug, Parser)]
#[command(about = "magic_sync's demo: a shop's server and its tills, over the network")]
struct Args {
    /// Where the tills' files (and, without DATABASE_URL, the database) live.
    #[arg(long, default_value = "demo-data")]
    data: PathBuf,
    /// How many tills.
    #[arg(long, default_value_t = 4)]
    tills: usize,
    /// How long the live writes go on, in seconds.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// A short run: three tills, five seconds of writes (what CI runs).
    #[arg(long)]
    short: bool,
    /// How long to wait for every till to converge once writes stop.
    #[arg(long, default_value_t = 120)]
    converge_within: u64,
    /// The PostgreSQL database, as a URL.
    #[arg(long, env = "DATABASE_URL")]
    database_url: Option<String>,
    /// Run the tills through a NATS JetStream broker (a `nats-server` the
    /// demo starts, over TLS) rather than over sockets to the server.
    #[arg(long)]
    broker: bool,
    /// Run the last till as a Python app (`bindings/python/examples/
    /// shop_till.py`, `python3` with the standard library alone) through
    /// the C ABI, following the server's description: no Rust of its own.
    #[arg(long, conflicts_with = "broker")]
    python_till: bool,
}

/// Every till is live, in one region.
struct Tills(Vec<String>);

impl Replicas for Tills {
    async fn replicas(&self) -> magic_sync::Result<Vec<ReplicaInfo>> {
        Ok(self
            .0
            .iter()
            .map(|t| ReplicaInfo::live(t.clone(), None))
            .collect())
    }
}

fn main() -> ExitCode {
    // The demo starts its tills as this same program, so that they are
    // always of the same build: `demo till ...` is `shop-till ...`.
    let operator = magic_sync::run::process::Operator::new(std::io::stderr());
    match std::env::args().nth(1).as_deref() {
        Some("till") => {
            return demo::till::run(
                demo::till::Args::parse_from(std::env::args().skip(1)),
                &operator,
            )
        }
        Some("till-broker") => {
            return demo::till::run_broker(
                demo::till::BrokerArgs::parse_from(std::env::args().skip(1)),
                &operator,
            )
        }
        _ => {}
    }
    demo::logs();
    let mut args = Args::parse();
    if args.short {
        args.tills = 3;
        args.seconds = 5;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo: {}", chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// An error with its causes: a database error's message is its source.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

type Fallible<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The database: DATABASE_URL's, or a cluster kept under the data folder.
fn database(args: &Args) -> Fallible<(tokio_postgres::Config, Option<magic_sync_testdb::Cluster>)> {
    if let Some(url) = &args.database_url {
        return Ok((url.parse()?, None));
    }
    let bin = magic_sync_testdb::require_bin_dir()?;
    let dir = std::path::absolute(args.data.join("postgres"))?;
    println!("starting PostgreSQL in {} ...", dir.display());
    let cluster = match magic_sync_testdb::Cluster::keep(&bin, &dir) {
        Ok(cluster) => cluster,
        // Run as root from a folder the `postgres` user cannot enter (a
        // clone under /root): the cluster goes under the temporary
        // folder instead, named after the data folder, so a second run
        // still finds it.
        Err(e) if e.contains("cannot enter") => {
            let name: String = dir
                .to_string_lossy()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            let tail = &name[name.len().saturating_sub(48)..];
            let elsewhere = std::env::temp_dir().join(format!("magic-sync-demo-{tail}"));
            println!(
                "the postgres user cannot reach {}; keeping the cluster in {} instead",
                dir.display(),
                elsewhere.display()
            );
            magic_sync_testdb::Cluster::keep(&bin, &elsewhere)?
        }
        Err(e) => return Err(e.into()),
    };
    Ok((cluster.admin_config(), Some(cluster)))
}

async fn connect(config: &tokio_postgres::Config) -> Fallible<tokio_postgres::Client> {
    let (client, connection) = config.connect(NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("demo: database connection: {}", chain(&e));
        }
    });
    Ok(client)
}

/// The shop's tables, the sync schema, the triggers, and a first stock of
/// products, price lists, customers and groups (once).
async fn install(client: &mut tokio_postgres::Client, tills: &[String]) -> Fallible<()> {
    client.batch_execute(demo::SCHEMA).await?;
    magic_sync::schema::migrate(client).await?;
    magic_sync::trigger::ensure(demo::engine(), client, &Default::default()).await?;
    client
        .batch_execute(
            "INSERT INTO products
             SELECT i, 'product ' || i, 1 + (i % 50) FROM generate_series(1, 500) i
             ON CONFLICT DO NOTHING;
             INSERT INTO customers
             SELECT i, 'customer ' || i FROM generate_series(1, 200) i
             ON CONFLICT DO NOTHING;
             INSERT INTO price_lists
             SELECT i, 1 + (i % 500), 1 + (i % 40) FROM generate_series(1, 300) i
             ON CONFLICT DO NOTHING;
             INSERT INTO price_list_members
             SELECT i % 3, i FROM generate_series(1, 300) i
             ON CONFLICT DO NOTHING;",
        )
        .await?;
    for (i, till) in tills.iter().enumerate() {
        let group = (i % 3) as i64;
        client
            .execute(
                "INSERT INTO till_groups VALUES ($1, $2) ON CONFLICT DO NOTHING",
                &[till, &group],
            )
            .await?;
        client
            .execute(
                "INSERT INTO stock SELECT $1, id, 100 FROM products ON CONFLICT DO NOTHING",
                &[till],
            )
            .await?;
    }
    Ok(())
}

/// Each till's secret: kept in the data folder, its hash on the server.
async fn secrets(client: &tokio_postgres::Client, data: &Path, tills: &[String]) -> Fallible<()> {
    for till in tills {
        let path = data.join(format!("{till}.secret"));
        let secret = match std::fs::read_to_string(&path) {
            Ok(secret) => secret.trim().to_string(),
            Err(_) => {
                let secret = credentials::generate();
                write_private(&path, &secret)?;
                secret
            }
        };
        credentials::set(client, till, &secret).await?;
    }
    Ok(())
}

fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    options.mode(0o600);
    options.open(path)?.write_all(text.as_bytes())
}

/// Starts `till`'s process: this program again, as a till.
/// The demo server's certificate for `localhost` and its key, as PEM files
/// in the data folder: made once, self-signed.
fn certificate(data: &Path) -> Fallible<(std::path::PathBuf, std::path::PathBuf)> {
    let (cert, key) = (data.join("server.crt"), data.join("server.key"));
    if !(cert.exists() && key.exists()) {
        let rcgen::CertifiedKey {
            cert: made,
            key_pair,
        } = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])?;
        std::fs::write(&cert, made.pem())?;
        write_private(&key, &key_pair.serialize_pem())?;
    }
    Ok((cert, key))
}

fn start_till(
    args: &Args,
    url: &str,
    key: &ServerKey,
    certificate: &Path,
    till: &str,
    python: bool,
) -> Fallible<Child> {
    let exe = std::env::current_exe()?;
    let log = std::fs::File::create(args.data.join(format!("{till}.log")))?;
    let sales = args.seconds * 1000 / 200;
    let mut command = Command::new(&exe);
    if python {
        let bindings = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bindings/python");
        command = Command::new("python3");
        command
            .arg(bindings.join("examples/shop_till.py"))
            .env("PYTHONPATH", &bindings)
            .env("MAGIC_SYNC_LIB", ffi_library(&exe)?)
            .arg("--server")
            .arg(url)
            .arg("--secret-file")
            .arg(args.data.join(format!("{till}.secret")));
    } else if args.broker {
        command
            .arg("till-broker")
            .arg("--broker")
            .arg(url)
            .arg("--seed-file")
            .arg(args.data.join(format!("{till}.seed")));
    } else {
        command
            .arg("till")
            .arg("--server")
            .arg(url)
            .arg("--secret-file")
            .arg(args.data.join(format!("{till}.secret")));
    }
    // Its own process group: Ctrl-C reaches the demo, which stops the
    // tills itself, each closing its connection.
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    Ok(command
        .arg("--until-stdin-closes")
        .arg("--id")
        .arg(till)
        // One key in 64 begins with `-`: given as `--server-key=KEY`, no
        // parser of arguments takes it for an option.
        .arg(format!("--server-key={key}"))
        .arg("--trust")
        .arg(certificate)
        .arg("--db")
        .arg(args.data.join(format!("{till}.sqlite")))
        .arg("--sell-every-ms")
        .arg("200")
        .arg("--sales")
        .arg(sales.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?)
}

/// The C ABI's shared library, built with the demo: beside it, or in the
/// `deps` folder beside it (where cargo leaves a dependency's).
fn ffi_library(exe: &Path) -> Fallible<PathBuf> {
    let file = format!(
        "{}magic_sync_ffi{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let dir = exe.parent().ok_or("the demo's program has no folder")?;
    [dir.join(&file), dir.join("deps").join(&file)]
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| format!("--python-till: no {file} beside {}", exe.display()).into())
}

/// The server's own writes, as any application makes them: an order with
/// lines for a till, a price change, now and then a price list change.
async fn write(client: &tokio_postgres::Client, tills: &[String]) -> Fallible<()> {
    let (till, customer, lines, product, price) = {
        let mut rng = rand::thread_rng();
        (
            tills[rng.gen_range(0..tills.len())].clone(),
            rng.gen_bool(0.8).then(|| rng.gen_range(1..=200i64)),
            rng.gen_range(1..=3i32),
            rng.gen_range(1..=500i64),
            format!("{}.{:02}", rng.gen_range(1..60), rng.gen_range(0..100)),
        )
    };
    let order: i64 = client
        .query_one(
            "INSERT INTO orders (id, till, customer_id)
             SELECT coalesce(max(id), 0) + 1, $1, $2 FROM orders RETURNING id",
            &[&till, &customer],
        )
        .await?
        .get(0);
    client
        .execute(
            "INSERT INTO order_lines
             SELECT $1::bigint, n, 1 + ($1::bigint * 7 + n) % 500, n FROM generate_series(1, $2::int) n",
            &[&order, &lines],
        )
        .await?;
    client
        .execute(
            "UPDATE products SET price = $2::text::numeric WHERE id = $1",
            &[&product, &price],
        )
        .await?;
    if order % 5 == 0 {
        client
            .execute(
                "UPDATE price_lists SET price = price + 0.10 WHERE id = 1 + $1::bigint % 300",
                &[&order],
            )
            .await?;
    }
    Ok(())
}

/// What a till should hold that differs from what it holds, in words; or
/// nothing when it agrees with the server.
async fn differences(
    client: &tokio_postgres::Client,
    data: &Path,
    till: &str,
) -> Fallible<Vec<String>> {
    let checks: [(&str, String, &str); 6] = [
        (
            "products",
            "SELECT count(*)::text || ':' || coalesce(sum(price * 100), 0)::bigint::text FROM products".into(),
            "SELECT count(*) || ':' || CAST(round(coalesce(sum(price * 100), 0)) AS INTEGER) FROM products",
        ),
        (
            "orders",
            format!(
                "SELECT count(*)::text || ':' || coalesce(sum(id), 0)::text FROM orders WHERE till = '{till}'"
            ),
            "SELECT count(*) || ':' || coalesce(sum(id), 0) FROM orders",
        ),
        (
            "order lines",
            format!(
                "SELECT count(*)::text FROM order_lines l JOIN orders o ON o.id = l.order_id WHERE o.till = '{till}'"
            ),
            "SELECT count(*) || '' FROM order_lines",
        ),
        (
            "customers",
            format!(
                "SELECT count(DISTINCT customer_id)::text FROM orders WHERE till = '{till}'"
            ),
            "SELECT count(*) || '' FROM customers",
        ),
        (
            "price lists",
            format!(
                "SELECT count(*)::text || ':' || coalesce(sum(p.price * 100), 0)::bigint::text FROM price_lists p
                 JOIN price_list_members m ON m.price_list_id = p.id
                 JOIN till_groups g ON g.group_id = m.group_id AND g.till = '{till}'"
            ),
            "SELECT count(*) || ':' || CAST(round(coalesce(sum(price * 100), 0)) AS INTEGER) FROM price_lists",
        ),
        (
            "sales and counts",
            format!(
                "SELECT (SELECT count(*) FROM sales WHERE till = '{till}')::text || ':' ||
                        (SELECT coalesce(sum(counted), 0) FROM stock WHERE till = '{till}')::text"
            ),
            "SELECT (SELECT count(*) FROM sales) || ':' || (SELECT coalesce(sum(counted), 0) FROM stock)",
        ),
    ];
    let conn = rusqlite::Connection::open(data.join(format!("{till}.sqlite")))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let mut out = Vec::new();
    for (what, server, local) in checks {
        let want: String = client.query_one(&server, &[]).await?.get(0);
        let held: String = conn
            .query_row(local, [], |r| r.get(0))
            .unwrap_or_else(|e| format!("unreadable ({e})"));
        if want != held {
            out.push(format!("{what}: server {want}, till {held}"));
        }
    }
    Ok(out)
}

async fn run(args: Args) -> Fallible<ExitCode> {
    std::fs::create_dir_all(&args.data)?;
    let tills: Vec<String> = (1..=args.tills).map(|i| format!("till-{i}")).collect();
    let (config, cluster) = database(&args)?;
    let mut client = connect(&config).await?;
    install(&mut client, &tills).await?;
    // Each till is given the server's key with its secret, and applies
    // only what that key signed.
    let key = magic_sync::store::keys::public(&client).await?;

    // TLS, as a fleet runs it: a certificate of the demo's own, which the
    // tills are told to trust.
    let certificate = certificate(&args.data)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let (link, url) = if args.broker {
        let (broker, nats, url) = through_broker(&args, &client, &tills, &certificate).await?;
        (Link::Broker(broker, nats), url)
    } else {
        secrets(&client, &args.data, &tills).await?;
        let hub = Hub::new(HubSettings::default(), Credentials::new(config.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let acceptor = magic_sync_http::server::tls_acceptor(&certificate.0, &certificate.1)?;
        let url = format!("wss://localhost:{}", listener.local_addr()?.port());
        let serving = tokio::spawn(serve(
            hub.clone(),
            listener,
            Security::Tls(acceptor),
            stopped(),
        ));
        (Link::Socket(hub, serving), url)
    };
    let relay = match &link {
        Link::Socket(hub, _) => spawn_relay(&config, &tills, hub.clone(), stopped()),
        Link::Broker(broker, _) => spawn_relay(&config, &tills, broker.clone(), stopped()),
    };
    let listening = if args.broker {
        "broker"
    } else {
        "server listening"
    };
    println!("{listening} on {url}; starting {} tills", tills.len());
    let mut children = Vec::new();
    for (i, till) in tills.iter().enumerate() {
        let python = args.python_till && i + 1 == tills.len();
        if python {
            println!("{till} is a Python app, through the C ABI");
        }
        children.push(start_till(&args, &url, &key, &certificate.0, till, python)?);
    }

    let mut outcome = tokio::select! {
        outcome = live(&args, &config, &client, &tills, &mut children) => outcome,
        () = magic_sync::run::server::stop_signal() => Ok(Live::Interrupted),
    };
    // What went wrong is in the tills' own words, and the broker's.
    if let Ok(Live::Diverged(report)) = &mut outcome {
        report.push_str(&said_last(&args, &tills, &mut children));
        if let Link::Broker(broker, _) = &link {
            report.push_str(&format!(
                "\nwhat the broker holds (`magic-sync broker status`):\n{}",
                broker_status(broker, &tills).await
            ));
        }
    }
    // Closing their input stops the tills; one that does not stop in
    // time is killed (its file is safe: every write is a transaction).
    for child in &mut children {
        drop(child.stdin.take());
    }
    let patience = Instant::now() + Duration::from_secs(5);
    for child in &mut children {
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < patience {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if matches!(child.try_wait(), Ok(None)) {
            let _ = child.kill();
        }
        let _ = child.wait();
    }
    let _ = stop_tx.send(true);
    relay.await??;
    match link {
        Link::Socket(hub, serving) => {
            serving.await??;
            drop(hub);
        }
        Link::Broker(broker, nats) => drop((broker, nats)),
    }
    // Every connection closes before the database stops.
    drop(client);
    drop(cluster);
    match outcome? {
        Live::Converged(overview) => {
            println!("{overview}");
            Ok(ExitCode::SUCCESS)
        }
        Live::Interrupted => {
            println!("stopped; run it again to continue from where it was");
            Ok(ExitCode::SUCCESS)
        }
        Live::Diverged(report) => {
            eprintln!("{report}");
            Ok(ExitCode::FAILURE)
        }
    }
}

/// How the server reaches its tills.
enum Link {
    /// Sockets to a hub it serves.
    Socket(
        Hub,
        tokio::task::JoinHandle<Result<(), magic_sync_http::Error>>,
    ),
    /// A broker, and the `nats-server` the demo started.
    Broker(Broker, Stopped),
}

/// Whether each till still runs, and the last lines each wrote to its log
/// (and the broker to its own, but for its notices): where a demo that did
/// not converge says why.
fn said_last(args: &Args, tills: &[String], children: &mut [Child]) -> String {
    const LINES: usize = 12;
    let tail = |path: &Path, keep: &dyn Fn(&str) -> bool| -> String {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let lines: Vec<&str> = text.lines().filter(|l| keep(l)).collect();
                let from = lines.len().saturating_sub(LINES);
                lines[from..].iter().map(|l| format!("    {l}\n")).collect()
            }
            Err(e) => format!("    (cannot read {}: {e})\n", path.display()),
        }
    };
    let mut out = String::new();
    for (till, child) in tills.iter().zip(children.iter_mut()) {
        let state = match child.try_wait() {
            Ok(None) => "runs".to_string(),
            Ok(Some(status)) => format!("exited early ({status})"),
            Err(e) => format!("unknown ({e})"),
        };
        let log = args.data.join(format!("{till}.log"));
        out.push_str(&format!(
            "\n{till} {state}; the end of {}:\n{}",
            log.display(),
            tail(&log, &|_| true)
        ));
    }
    if args.broker {
        let log = args.data.join("nats.log");
        out.push_str(&format!(
            "\nthe broker's warnings and errors, from {}:\n{}",
            log.display(),
            tail(&log, &|l| !l.contains("[INF]"))
        ));
    }
    out
}

/// `magic-sync broker status` for the tills, as the server's connection
/// reads it; or why it cannot be read.
async fn broker_status(broker: &Broker, tills: &[String]) -> String {
    match magic_sync_cli::BrokerStatus::read(&broker.inspector(), tills.to_vec()).await {
        Ok(read) => magic_sync_cli::show::broker_status(&read),
        Err(e) => format!("{e}\n"),
    }
}

/// A process stopped when this is dropped, however the demo ends.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The relay's runner over `link`, until `stopped`.
fn spawn_relay<L: Transport + Reports + Send + Sync + 'static>(
    config: &tokio_postgres::Config,
    tills: &[String],
    link: L,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<magic_sync::Result<()>> {
    let (config, tills) = (config.clone(), Tills(tills.to_vec()));
    tokio::spawn(async move {
        magic_sync::run::server::server(
            config,
            demo::engine().clone(),
            RelaySettings::default(),
            &tills,
            &link,
            &link,
            stopped,
        )
        .await
    })
}

/// The broker's side of the demo: the server's key pair on the broker
/// (drawn once, kept in the data folder), each till enrolled (a new seed
/// in its file every run), and a `nats-server` of the demo's own on
/// loopback, over TLS with the demo's certificate, letting in exactly
/// those keys. Returns the server's connection to it, the broker's
/// process, and its address.
async fn through_broker(
    args: &Args,
    client: &tokio_postgres::Client,
    tills: &[String],
    (certificate, key): &(PathBuf, PathBuf),
) -> Fallible<(Broker, Stopped, String)> {
    let seed_file = args.data.join("broker-server.seed");
    let server = match std::fs::read_to_string(&seed_file) {
        Ok(seed) => access::Credentials::from_seed(seed.trim())?,
        Err(_) => {
            let drawn = access::Credentials::issue();
            write_private(&seed_file, drawn.seed())?;
            drawn
        }
    };
    for till in tills {
        let credentials = access::enrol(client, till).await?;
        write_private(&args.data.join(format!("{till}.seed")), credentials.seed())?;
    }
    let block = access::Access::read(client, server.public_key())
        .await?
        .authorization();
    let dir = std::path::absolute(args.data.join("nats"))?;
    std::fs::create_dir_all(&dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let (certificate, key) = (std::path::absolute(certificate)?, std::path::absolute(key)?);
    write_private(
        &dir.join("nats.conf"),
        &format!(
            "listen: \"127.0.0.1:{port}\"\njetstream {{ store_dir: {:?} }}\ntls {{ cert_file: {:?}, key_file: {:?} }}\n{block}",
            dir.join("store").display().to_string(),
            certificate.display().to_string(),
            key.display().to_string(),
        ),
    )?;
    let log = std::fs::File::create(args.data.join("nats.log"))?;
    let mut command = Command::new(nats_server()?);
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let mut nats = Stopped(
        command
            .arg("-c")
            .arg(dir.join("nats.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?,
    );
    let url = format!("tls://localhost:{port}");
    let settings = broker::Settings {
        trust: Some(certificate),
        ..broker::Settings::new(url.clone())
    };
    // Ready once the server's connection is taken (a bare probe of the
    // port would leave a failed TLS handshake in the broker's log).
    let deadline = Instant::now() + Duration::from_secs(20);
    let broker = loop {
        match Broker::connect(settings.clone(), server.seed()).await {
            Ok(broker) => break broker,
            Err(e) if Instant::now() > deadline || !matches!(nats.0.try_wait(), Ok(None)) => {
                return Err(format!(
                    "nats-server did not start ({e}); see {}",
                    args.data.join("nats.log").display()
                )
                .into());
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    for till in tills {
        broker.prepare(till).await?;
    }
    Ok((broker, nats, url))
}

/// `nats-server`: on `PATH`, or where Debian's package puts it.
fn nats_server() -> Fallible<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir: PathBuf| dir.join("nats-server"))
        .find(|p| p.is_file())
        .ok_or_else(|| "--broker needs nats-server (Debian: `apt-get install nats-server`)".into())
}

enum Live {
    Converged(String),
    Diverged(String),
    Interrupted,
}

/// The live part: the server writes while the tills sell, with a bar per
/// till; then it waits for every till to agree with the server.
async fn live(
    args: &Args,
    config: &tokio_postgres::Config,
    client: &tokio_postgres::Client,
    tills: &[String],
    children: &mut [Child],
) -> Fallible<Live> {
    // The operator's reads take transactions: a connection of their own.
    let mut ops_client = connect(config).await?;
    let board = MultiProgress::new();
    let style = ProgressStyle::with_template("{prefix:>8} [{bar:40}] {pos}/{len} rows held  {msg}")
        .expect("a template")
        .progress_chars("=> ");
    let bars: Vec<ProgressBar> = tills
        .iter()
        .map(|till| {
            let bar = board.add(ProgressBar::new(0));
            bar.set_style(style.clone());
            bar.set_prefix(till.clone());
            bar
        })
        .collect();
    let began = Instant::now();
    let writes_end = began + Duration::from_secs(args.seconds);
    let deadline = writes_end + Duration::from_secs(args.converge_within);
    let mut writes = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tick.tick().await;
        let now = Instant::now();
        // A till runs until the demo ends it: one that stopped will not
        // converge, and its log says why.
        let stopped: Vec<&str> = tills
            .iter()
            .zip(children.iter_mut())
            .filter_map(|(till, child)| {
                (!matches!(child.try_wait(), Ok(None))).then_some(till.as_str())
            })
            .collect();
        if !stopped.is_empty() {
            return Ok(Live::Diverged(format!(
                "{} stopped before converging:",
                stopped.join(", ")
            )));
        }
        if now < writes_end {
            write(client, tills).await?;
            writes += 1;
        }
        let listing = ops::listing(&mut ops_client, &Scope::All, None, tills.len().max(1)).await?;
        for (till, bar) in tills.iter().zip(&bars) {
            if let Some(r) = listing.replicas.iter().find(|r| &r.id == till) {
                // Rows held as they are now, of the rows it is to hold.
                let progress = ops::progress(&mut ops_client, till).await?;
                let (held, wanted) = progress
                    .tables
                    .iter()
                    .map(|t| t.bar())
                    .fold((0, 0), |(h, w), (th, tw)| (h + th, w + tw));
                bar.set_length(wanted.max(0) as u64);
                bar.set_position(held.clamp(0, wanted.max(0)) as u64);
                bar.set_message(r.state.name());
            }
        }
        if now < writes_end {
            continue;
        }
        let caught_up = listing.replicas.len() == tills.len()
            && listing
                .replicas
                .iter()
                .all(|r| r.state == ReplicaState::CaughtUp);
        let mut report = Vec::new();
        if caught_up {
            for till in tills {
                for d in differences(client, &args.data, till).await? {
                    report.push(format!("{till}: {d}"));
                }
            }
        }
        if caught_up && report.is_empty() {
            for bar in &bars {
                bar.finish();
            }
            let overview = ops::overview(&mut ops_client, &Scope::All, 10).await?;
            let sales: i64 = client
                .query_one("SELECT count(*) FROM sales", &[])
                .await?
                .get(0);
            let orders: i64 = client
                .query_one("SELECT count(*) FROM orders", &[])
                .await?
                .get(0);
            return Ok(Live::Converged(format!(
                "{}\nevery till converged in {:.1} s: {} tills, {writes} server writes this run, \
                 {orders} orders in all, {sales} sales filed",
                magic_sync_cli::show::overview(&overview),
                began.elapsed().as_secs_f64(),
                tills.len(),
            )));
        }
        if now > deadline {
            let overview = ops::overview(&mut ops_client, &Scope::All, 10).await?;
            return Ok(Live::Diverged(format!(
                "not converged within {} s of the writes' end:\n{}\n{}",
                args.converge_within,
                report.join("\n"),
                magic_sync_cli::show::overview(&overview)
            )));
        }
    }
}

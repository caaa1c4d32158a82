//! How a host deploys without freezing the application: stopping the
//! runner, or losing its process, leaves nothing running on the server;
//! repairing triggers that were missing brings the replicas what was
//! written meanwhile.

use crate::relay::{for_the_runner, until, Host};
use crate::scenarios::shop;
use magic_sync::relay::{ReplicaInfo, Settings, RELAY_LOCK};
use magic_sync::run::memory::Network;
use magic_sync::trigger::{ensure, Ensured, InstallSettings};
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::task::JoinHandle;
use tokio_postgres::config::Host as PgHost;
use tokio_postgres::{Client, Config};

/// The recording session's backend, once it waits for a lock mid-pass while
/// holding the relay's.
async fn blocked_recorder(client: &Client) -> Option<i32> {
    client
        .query_opt(
            "SELECT a.pid FROM pg_stat_activity a
             WHERE a.datname = current_database()
               AND a.application_name = 'magic_sync relay: record'
               AND a.wait_event_type = 'Lock'
               AND EXISTS (SELECT 1 FROM pg_locks l
                           WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
                             AND ((l.classid::int8 << 32) | l.objid::int8) = $1)",
            &[&RELAY_LOCK],
        )
        .await
        .unwrap()
        .map(|row| row.get(0))
}

/// The relay's sessions on this test's database, as operators find them.
async fn relay_sessions(client: &Client) -> Vec<String> {
    client
        .query(
            "SELECT application_name FROM pg_stat_activity
             WHERE datname = current_database() AND application_name LIKE 'magic_sync relay%'
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Whether `client` could take the relay's lock (and now holds it).
async fn take_lock(client: &Client) -> bool {
    client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&RELAY_LOCK])
        .await
        .unwrap()
        .get(0)
}

/// A session that holds `sync.notes` so no pass can read them: the next pass
/// waits mid-statement, holding the relay's lock, until it is let go.
async fn hold_the_notes(fleet: &crate::fleet::Fleet) -> Client {
    let holder = fleet.db.connect().await;
    holder
        .batch_execute("BEGIN; LOCK TABLE sync.notes IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    holder
}

/// `run::server` over `config` for one till, until `stopped`.
fn run_server(
    config: Config,
    fleet: &crate::fleet::Fleet,
    network: &Network,
    stopped: tokio::sync::oneshot::Receiver<()>,
) -> JoinHandle<magic_sync::Result<()>> {
    let (network, engine) = (network.clone(), fleet.engine.clone());
    tokio::spawn(async move {
        let host = Host(vec![ReplicaInfo::live("u1", Some("north"))]);
        magic_sync::run::server::server(
            config,
            engine,
            Settings::default(),
            &host,
            &network,
            &network,
            async {
                stopped.await.ok();
            },
        )
        .await
    })
}

#[tokio::test]
async fn stopping_the_runner_mid_statement_leaves_no_session_behind_and_frees_the_lock() {
    let (fleet, network) = for_the_runner().await;
    let holder = hold_the_notes(&fleet).await;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let server = run_server(fleet.db.config(), &fleet, &network, stopped);
    until(
        "the relay never waited mid-pass holding its lock",
        || async { blocked_recorder(&fleet.writer).await.is_some() },
    )
    .await;
    assert_eq!(
        relay_sessions(&fleet.writer).await,
        ["magic_sync relay: publish", "magic_sync relay: record"]
    );
    stop.send(()).unwrap();
    server.await.unwrap().expect("the runner stops cleanly");
    // Given back before the runner returned, with the notes still held.
    assert!(
        take_lock(&fleet.writer).await,
        "the stopped relay still holds its lock"
    );
    until(
        "the stopped relay's sessions stayed on the server",
        || async { relay_sessions(&fleet.writer).await.is_empty() },
    )
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_host_lost_mid_statement_leaves_no_session_behind() {
    let (fleet, network) = for_the_runner().await;
    let holder = hold_the_notes(&fleet).await;
    let proxy = Proxy::start(&fleet.db.config()).await;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    let server = run_server(proxy.config(&fleet.db.config()), &fleet, &network, stopped);
    until(
        "the relay never waited mid-pass holding its lock",
        || async { blocked_recorder(&fleet.writer).await.is_some() },
    )
    .await;
    let recorder = blocked_recorder(&fleet.writer).await;
    // The host's network goes, as when its process or machine does: no
    // cancel, no goodbye, and no way back in.
    proxy.cut().await;
    until(
        "the lost relay's statement went on waiting on the server",
        || async {
            fleet
                .writer
                .query_opt(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = $1",
                    &[&recorder],
                )
                .await
                .unwrap()
                .is_none()
        },
    )
    .await;
    assert!(
        take_lock(&fleet.writer).await,
        "the lost relay's lock was not given back"
    );
    until("the lost relay's sessions stayed on the server", || async {
        relay_sessions(&fleet.writer).await.is_empty()
    })
    .await;
    holder.batch_execute("ROLLBACK").await.unwrap();
    // The runner itself, cut off, was trying to reconnect.
    stop.send(()).unwrap();
    server.await.unwrap().expect("the runner stops cleanly");
}

/// `(table, unnoted)` for each table `ensure` repaired.
fn repaired(ensured: &Ensured) -> Vec<(String, bool)> {
    ensured
        .installed
        .iter()
        .map(|i| (i.table.clone(), i.unnoted))
        .collect()
}

#[tokio::test]
async fn writes_made_while_a_row_trigger_was_missing_reach_the_replicas_after_the_repair() {
    let mut fleet = shop().await;
    fleet.write("DROP TRIGGER magic_sync_note ON orders").await;
    // Unnoted: a new order for u1 (with a customer it did not hold), and an
    // order moved from u2 to u3.
    fleet
        .write(
            "INSERT INTO orders (id, unit_id, customer_id) VALUES (50, 'u1', 9);
             UPDATE orders SET unit_id = 'u3' WHERE id = 2",
        )
        .await;
    assert_eq!(fleet.sync().await, 0, "nothing was noted, nothing moves");
    let ensured = ensure(
        &fleet.engine,
        &mut fleet.writer,
        &InstallSettings::default(),
    )
    .await
    .expect("repaired");
    assert_eq!(repaired(&ensured), [("orders".to_string(), true)]);
    // Any replica could be owed an unnoted row, with the rows it points at.
    assert_eq!(ensured.provisioned, ["u1", "u2", "u3"]);
    fleet.sync().await;
    fleet.check().await;
}

#[tokio::test]
async fn a_truncate_while_its_trigger_was_missing_provisions_again_only_the_tables_holders() {
    let mut fleet = shop().await;
    // A till in a region with no notices.
    fleet.add("u4", Some("east"));
    fleet.sync().await;
    fleet
        .write(
            "DROP TRIGGER magic_sync_no_truncate ON notices;
             TRUNCATE notices;
             CREATE OR REPLACE FUNCTION sync.note_public_products() RETURNS trigger
                 LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;",
        )
        .await;
    let ensured = ensure(
        &fleet.engine,
        &mut fleet.writer,
        &InstallSettings::default(),
    )
    .await
    .expect("repaired");
    // A function that merely differs noted nothing wrongly as far as the
    // engine can tell: no one is provisioned for it.
    assert_eq!(
        repaired(&ensured),
        [
            ("notices".to_string(), true),
            ("products".to_string(), false)
        ]
    );
    // The notices' holders; with the rows a rule gives left to it, every
    // replica, as no record row says who held the rows gone.
    let holders: &[&str] = match fleet.relay.settings().record_ruled_rows {
        true => &["u1", "u2", "u3"],
        false => &["u1", "u2", "u3", "u4"],
    };
    assert_eq!(ensured.provisioned, holders);
    fleet.sync().await;
    fleet.check().await;
}

/// Where the test server listens.
#[derive(Clone)]
enum Target {
    Tcp(String, u16),
    Unix(std::path::PathBuf),
}

/// A TCP proxy in front of the test server, which the test can cut: the
/// network between a host and the server, failing.
struct Proxy {
    port: u16,
    accepting: JoinHandle<()>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(server: &Config) -> Proxy {
        let port = server.get_ports().first().copied().unwrap_or(5432);
        let target = match server.get_hosts().first() {
            Some(PgHost::Tcp(host)) => Target::Tcp(host.clone(), port),
            Some(PgHost::Unix(dir)) => Target::Unix(dir.join(format!(".s.PGSQL.{port}"))),
            None => Target::Tcp("localhost".into(), port),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let links = Arc::new(Mutex::new(Vec::new()));
        let accepting = tokio::spawn({
            let links = links.clone();
            async move {
                while let Ok((host_side, _)) = listener.accept().await {
                    let link = tokio::spawn(forward(host_side, target.clone()));
                    links.lock().unwrap().push(link);
                }
            }
        });
        Proxy {
            port,
            accepting,
            links,
        }
    }

    /// `server`'s database, user and password, through the proxy.
    fn config(&self, server: &Config) -> Config {
        let mut config = Config::new();
        config.host("127.0.0.1").port(self.port);
        if let Some(user) = server.get_user() {
            config.user(user);
        }
        if let Some(password) = server.get_password() {
            config.password(password);
        }
        if let Some(dbname) = server.get_dbname() {
            config.dbname(dbname);
        }
        config
    }

    /// Stops accepting, then drops every connection's sockets at once.
    async fn cut(self) {
        self.accepting.abort();
        let _ = self.accepting.await;
        let links: Vec<JoinHandle<()>> = self.links.lock().unwrap().drain(..).collect();
        for link in links {
            link.abort();
            let _ = link.await;
        }
    }
}

async fn forward(mut host_side: TcpStream, target: Target) {
    match target {
        Target::Tcp(host, port) => {
            let mut server_side = TcpStream::connect((host.as_str(), port)).await.unwrap();
            let _ = tokio::io::copy_bidirectional(&mut host_side, &mut server_side).await;
        }
        Target::Unix(path) => {
            let mut server_side = UnixStream::connect(path).await.unwrap();
            let _ = tokio::io::copy_bidirectional(&mut host_side, &mut server_side).await;
        }
    }
}

//! Real PostgreSQL servers for magic_sync's tests and benchmarks.
//!
//! Every test asks for a database of its own with [`database`]. Behind it sits
//! one [`Server`] per process, picked on first use:
//!
//! * when `DATABASE_URL` is set (and not empty), that server is used: test
//!   databases are created on it and dropped again, nothing else is started;
//! * otherwise a private throwaway cluster is initialised under `/tmp` and
//!   started on a free port of `127.0.0.1`. It is shared by every test of the
//!   process (the tests of one test binary run as threads of one process) and
//!   is stopped and deleted by a watchdog process once this process exits,
//!   however it exits. When running as root, the cluster runs as the
//!   `postgres` user (override with `MAGIC_SYNC_PG_USER`), since PostgreSQL
//!   refuses to run as root.
//!
//! The PostgreSQL programs are looked up in `MAGIC_SYNC_PG_BIN`, then
//! `pg_config --bindir`, then the newest `/usr/lib/postgresql/*/bin`, then
//! `PATH` (see [`find_bin_dir`]); on Debian and Ubuntu,
//! `apt-get install postgresql` installs them.
//!
//! A program that must find its data again when run anew (a demo, say) can
//! start a kept cluster in a directory of its choosing with [`Cluster::keep`]:
//! it is stopped, not deleted, when the program is done.
//!
//! ```no_run
//! # async fn demo() {
//! let db = magic_sync_testdb::database().await;
//! let client = db.connect().await;
//! client.batch_execute("CREATE TABLE t (id int)").await.unwrap();
//! // `db` drops its database when it goes out of scope.
//! # }
//! ```

mod bins;
mod cluster;
mod conninfo;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

pub use cluster::Cluster;

/// Name of the environment variable that points the tests at an existing server.
pub const DATABASE_URL_ENV: &str = "DATABASE_URL";

/// How many times `CREATE DATABASE` is retried when PostgreSQL reports the
/// template as busy.
const CREATE_ATTEMPTS: u32 = 50;

/// The PostgreSQL server the tests of this process use.
#[derive(Debug)]
pub struct Server {
    admin: Config,
    bin_dir: Option<PathBuf>,
    cluster: Option<Cluster>,
}

/// The directory of the PostgreSQL programs (`initdb`, `pg_ctl`, `psql`, …):
/// the first of `$MAGIC_SYNC_PG_BIN` (taken as given), `pg_config --bindir`,
/// the newest `/usr/lib/postgresql/<version>/bin` and the `PATH` entry that
/// holds `initdb`; `None` when PostgreSQL seems not to be installed.
pub fn find_bin_dir() -> Option<PathBuf> {
    bins::find_bin_dir()
}

/// [`find_bin_dir`], or an error message saying where it looked and how to
/// install PostgreSQL. For [`Cluster::start`] and [`Cluster::keep`]:
///
/// ```no_run
/// # fn demo() -> Result<(), String> {
/// let bin_dir = magic_sync_testdb::require_bin_dir()?;
/// let cluster = magic_sync_testdb::Cluster::keep(&bin_dir, "demo-data".as_ref())?;
/// println!("postgresql://postgres@127.0.0.1:{}/postgres", cluster.port());
/// # Ok(())
/// # }
/// ```
pub fn require_bin_dir() -> Result<PathBuf, String> {
    find_bin_dir().ok_or_else(|| {
        format!(
            "no PostgreSQL installation was found (looked at {}): {}",
            bins::SEARCHED,
            bins::INSTALL_HINT
        )
    })
}

static SERVER: OnceLock<Result<Server, String>> = OnceLock::new();

/// The server shared by all tests of this process, started on first use.
///
/// Panics (in every caller, with the same message) when no server can be
/// reached or started.
pub fn server() -> &'static Server {
    match SERVER.get_or_init(Server::from_environment) {
        Ok(server) => server,
        Err(message) => panic!("magic_sync_testdb: no PostgreSQL server: {message}"),
    }
}

/// Creates a fresh, empty database for one test on the shared [`server`].
///
/// The database is dropped when the returned [`TestDb`] is dropped.
pub async fn database() -> TestDb {
    server().create_database().await
}

impl Server {
    fn from_environment() -> Result<Server, String> {
        let bin_dir = find_bin_dir();
        match std::env::var(DATABASE_URL_ENV) {
            Ok(url) if !url.trim().is_empty() => {
                let admin: Config = url
                    .trim()
                    .parse()
                    .map_err(|e| format!("cannot parse {DATABASE_URL_ENV}: {e}"))?;
                if admin.get_hosts().is_empty() {
                    return Err(format!("{DATABASE_URL_ENV} names no host"));
                }
                Ok(Server {
                    admin,
                    bin_dir,
                    cluster: None,
                })
            }
            _ => {
                let bin_dir = bin_dir.ok_or_else(|| {
                    format!(
                        "{DATABASE_URL_ENV} is not set and no PostgreSQL installation was found \
                         (looked at {}): {}, or set {DATABASE_URL_ENV} to a server to use",
                        bins::SEARCHED,
                        bins::INSTALL_HINT
                    )
                })?;
                let cluster = Cluster::start(&bin_dir)?;
                Ok(Server {
                    admin: cluster.admin_config(),
                    bin_dir: Some(bin_dir),
                    cluster: Some(cluster),
                })
            }
        }
    }

    /// Connection settings for the server's maintenance database, as superuser
    /// for a private cluster, or exactly as given by `DATABASE_URL`.
    pub fn admin_config(&self) -> Config {
        self.admin.clone()
    }

    /// [`Server::admin_config`] as a libpq `key=value` string (for `psql`, `pgbench`).
    pub fn admin_conninfo(&self) -> String {
        conninfo::conninfo(&self.admin)
    }

    /// Directory holding `psql`, `pgbench`, `pg_ctl`, …
    ///
    /// Panics when no PostgreSQL installation was found (only possible when
    /// `DATABASE_URL` is set); see [`Server::try_bin_dir`].
    pub fn bin_dir(&self) -> &Path {
        self.try_bin_dir().unwrap_or_else(|| {
            panic!(
                "magic_sync_testdb: no PostgreSQL programs found (looked at {}): {}",
                bins::SEARCHED,
                bins::INSTALL_HINT
            )
        })
    }

    /// Directory holding the PostgreSQL programs, if one was found.
    pub fn try_bin_dir(&self) -> Option<&Path> {
        self.bin_dir.as_deref()
    }

    /// Path of the PostgreSQL program `name` (e.g. `"pgbench"`), see [`Server::bin_dir`].
    pub fn bin(&self, name: &str) -> PathBuf {
        self.bin_dir().join(name)
    }

    /// The private cluster, or `None` when `DATABASE_URL` is in use.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// Creates a fresh, empty database on this server; see [`database`].
    pub async fn create_database(&'static self) -> TestDb {
        match self.try_create_database().await {
            Ok(db) => db,
            Err(e) => panic!("magic_sync_testdb: {e}"),
        }
    }

    async fn try_create_database(&'static self) -> Result<TestDb, String> {
        let admin = self.connect_admin().await?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let name = unique_name();
            let sql = format!(
                "CREATE DATABASE {} TEMPLATE template0 ENCODING 'UTF8'",
                quote_ident(&name)
            );
            match admin.batch_execute(&sql).await {
                Ok(()) => {
                    let mut config = self.admin.clone();
                    config.dbname(&name);
                    return Ok(TestDb {
                        name,
                        config,
                        server: self,
                    });
                }
                Err(e) if attempt < CREATE_ATTEMPTS && is_retryable_create_error(&e) => {
                    let backoff = Duration::from_millis(10 * u64::from(attempt.min(20)));
                    tokio::time::sleep(backoff).await;
                }
                Err(e) => return Err(format!("{sql}: {}", describe(&e))),
            }
        }
    }

    async fn connect_admin(&self) -> Result<Client, String> {
        let (client, connection) = self.admin.connect(NoTls).await.map_err(|e| {
            format!(
                "cannot connect to {}: {}",
                conninfo::conninfo_without_password(&self.admin),
                describe(&e)
            )
        })?;
        tokio::spawn(async move {
            // The connection ends with its client; errors then are of no interest.
            let _ = connection.await;
        });
        Ok(client)
    }
}

fn is_retryable_create_error(e: &tokio_postgres::Error) -> bool {
    // "source database is being accessed by other users" and name clashes
    // (a fresh name is drawn on every attempt).
    matches!(
        e.code(),
        Some(code) if *code == SqlState::OBJECT_IN_USE || *code == SqlState::DUPLICATE_DATABASE
    )
}

/// A database of one test. Dropping it drops the database (with `FORCE`,
/// so connections still open do not keep it alive).
pub struct TestDb {
    name: String,
    config: Config,
    server: &'static Server,
}

impl fmt::Debug for TestDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TestDb")
            .field("name", &self.name)
            .field(
                "conninfo",
                &conninfo::conninfo_without_password(&self.config),
            )
            .finish()
    }
}

impl TestDb {
    /// The database's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Connection settings for this database.
    pub fn config(&self) -> Config {
        self.config.clone()
    }

    /// This database as a libpq `key=value` string (host, port, user, dbname,
    /// and password if there is one), usable by `psql` and `pgbench`.
    pub fn conninfo(&self) -> String {
        conninfo::conninfo(&self.config)
    }

    /// This database as a `postgresql://` URL.
    pub fn url(&self) -> String {
        conninfo::url(&self.config)
    }

    /// The server holding this database.
    pub fn server(&self) -> &'static Server {
        self.server
    }

    /// Opens a connection to this database. Its connection task is spawned on
    /// the current tokio runtime (so this panics outside of one).
    pub async fn connect(&self) -> Client {
        let (client, connection) = match self.config.connect(NoTls).await {
            Ok(pair) => pair,
            Err(e) => panic!(
                "magic_sync_testdb: cannot connect to {}: {}",
                conninfo::conninfo_without_password(&self.config),
                describe(&e)
            ),
        };
        let name = self.name.clone();
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                // Dropping the database terminates its connections on purpose.
                if e.code() != Some(&SqlState::ADMIN_SHUTDOWN) {
                    #[allow(
                        clippy::print_stderr,
                        reason = "said to whoever reads the test's output"
                    )]
                    {
                        eprintln!("magic_sync_testdb: connection to {name} failed: {e}");
                    }
                }
            }
        });
        client
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop may run inside a tokio runtime, where blocking on another future
        // is not allowed, so the work happens on a thread with a runtime of its own.
        let server = self.server;
        let name = self.name.clone();
        let outcome = std::thread::Builder::new()
            .name(format!("drop {name}"))
            .spawn(move || -> Result<(), String> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| format!("cannot build a runtime: {e}"))?;
                runtime.block_on(drop_database(server, &name))
            })
            .map_err(|e| format!("cannot spawn a thread: {e}"))
            .and_then(|thread| {
                thread
                    .join()
                    .unwrap_or_else(|_| Err("the dropping thread panicked".to_owned()))
            });
        if let Err(e) = outcome {
            #[allow(
                clippy::print_stderr,
                reason = "said to whoever reads the test's output"
            )]
            {
                eprintln!(
                    "magic_sync_testdb: could not drop database {}: {e}",
                    self.name
                );
            }
        }
    }
}

async fn drop_database(server: &Server, name: &str) -> Result<(), String> {
    let admin = server.connect_admin().await?;
    let ident = quote_ident(name);
    let forced = format!("DROP DATABASE IF EXISTS {ident} WITH (FORCE)");
    match admin.batch_execute(&forced).await {
        Ok(()) => Ok(()),
        // Servers before PostgreSQL 13 know no FORCE: end the sessions by hand.
        Err(e) if e.code() == Some(&SqlState::SYNTAX_ERROR) => {
            admin
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE datname = $1 AND pid <> pg_backend_pid()",
                    &[&name],
                )
                .await
                .map_err(|e| describe(&e))?;
            admin
                .batch_execute(&format!("DROP DATABASE IF EXISTS {ident}"))
                .await
                .map_err(|e| describe(&e))
        }
        Err(e) => Err(describe(&e)),
    }
}

/// `t_<pid>_<counter>_<random>`: unique within the process through the
/// counter, and across processes sharing a server through pid and randomness.
fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "t_{}_{}_{:08x}",
        std::process::id(),
        n,
        random_u64() & 0xffff_ffff
    )
}

/// A random number from the standard library's randomly keyed hasher.
pub(crate) fn random_u64() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The server's message with its detail, or the client-side error.
fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => match db.detail() {
            Some(detail) => format!("{} ({}): {detail}", db.message(), db.code().code()),
            None => format!("{} ({})", db.message(), db.code().code()),
        },
        None => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_valid_identifiers() {
        let a = unique_name();
        let b = unique_name();
        assert_ne!(a, b);
        for name in [a, b] {
            assert!(name.len() < 64, "{name}");
            assert!(name.starts_with(&format!("t_{}_", std::process::id())));
            assert!(name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
        }
    }

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("plain"), "\"plain\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}

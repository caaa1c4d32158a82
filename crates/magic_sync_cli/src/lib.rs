//! `magic-sync`: what an operator sees of a magic_sync server database,
//! from the engine's own record (`magic_sync::ops`), without the host's
//! declarations.
//!
//! The commands are a clap [`Command`] a host can mount in its own binary
//! (`#[command(subcommand)]`) and run with [`run`] on a connection of its
//! own. Each prints a human-readable table, or with `--json` the read's
//! result as JSON whose field names are stable.
//!
//! Exit codes ([`Outcome::exit_code`]): 0 when nothing waits for a fix; 2
//! when something waits for a fix to be deployed (a refused upload); 1 on
//! an error (the database cannot be reached or read, bad input).
//!
//! Two commands stay running: `dashboard` serves a page, its JSON and
//! Prometheus metrics ([`dashboard::serve`]), and `watch` draws a bar per
//! replica until all are caught up.

// A library speaks through its return values and `tracing`, never by
// printing behind its host's back.
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod dashboard;
mod scrape;
pub mod show;
mod watch;

use clap::{Args, Parser, Subcommand};
use magic_sync::core::schema::Fingerprint;
use magic_sync::ops::{self, Scope};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_postgres::Client;

/// The exit code of an error.
pub const EXIT_ERROR: u8 = 1;
/// The exit code when something waits for a fix to be deployed.
pub const EXIT_FIX: u8 = 2;

/// The `magic-sync` command line.
#[derive(Debug, Parser)]
#[command(
    name = "magic-sync",
    version,
    about = "What an operator sees of a magic_sync server: connects with DATABASE_URL",
    after_help = "Exit codes: 0 nothing waits for a fix; 2 something waits for a fix to be \
                  deployed; 1 an error."
)]
pub struct Cli {
    /// Print JSON (stable field names) instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to read.
    #[command(subcommand)]
    pub command: Command,
}

/// Which replicas to read: all live ones by default.
#[derive(Debug, Clone, Default, Args)]
pub struct ScopeArgs {
    /// Only this replica (repeat for more).
    #[arg(long = "replica", value_name = "ID", conflicts_with = "partition")]
    pub replicas: Vec<String>,
    /// Only the replicas of this partition.
    #[arg(long, value_name = "PARTITION")]
    pub partition: Option<String>,
}

impl ScopeArgs {
    /// The scope the arguments name.
    pub fn scope(&self) -> Scope {
        match (&self.partition, self.replicas.is_empty()) {
            (Some(p), _) => Scope::Partition(p.clone()),
            (None, false) => Scope::Replicas(self.replicas.clone()),
            (None, true) => Scope::All,
        }
    }
}

/// The commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Whether everything is where it should be: replicas per state, the
    /// worst, and the tables with anything on its way.
    Overview {
        #[command(flatten)]
        scope: ScopeArgs,
        /// How many of the worst replicas to list.
        #[arg(long, default_value_t = 10)]
        worst: usize,
    },
    /// Every live replica, a page at a time, by id.
    Replicas {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Begin after this replica id (the previous page's `next`).
        #[arg(long, value_name = "ID")]
        after: Option<String>,
        /// Replicas per page.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// How far along one replica is, per table.
    Progress {
        /// The replica's id.
        replica: String,
    },
    /// Where one row is, per replica.
    Row {
        /// The table, as the engine names it.
        table: String,
        /// The key's values, in the table's key order.
        #[arg(required = true, value_name = "KEY")]
        key: Vec<String>,
    },
    /// What the engine waits on, each item saying wait or deploy a fix.
    Health {
        #[command(flatten)]
        scope: ScopeArgs,
    },
    /// Serves a page that refreshes itself (the fleet, tables, health), its
    /// JSON under /api/, and Prometheus metrics at /metrics, until Ctrl-C.
    Dashboard {
        #[command(flatten)]
        scope: ScopeArgs,
        /// The address to listen on.
        #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9187")]
        listen: SocketAddr,
        /// A file holding the token every request must present (HTTP
        /// Basic, as the password; or Bearer). Needed to listen beyond
        /// this machine: the dashboard shows every replica's state.
        #[arg(long, value_name = "PATH", env = "MAGIC_SYNC_DASHBOARD_TOKEN_FILE")]
        token_file: Option<std::path::PathBuf>,
        /// A name the dashboard is reached by, besides localhost (the
        /// `Host` a browser sends); repeat for more. Requests for any other
        /// name are refused, so no other site's page can read it. Without
        /// it, a dashboard with a token answers to any name.
        #[arg(long = "allow-host", value_name = "NAME")]
        allow_hosts: Vec<String>,
        /// Serve plain HTTP on an address beyond this machine's loopback,
        /// where the token and every read cross the network in the clear.
        /// Refused without it: listen on loopback behind a proxy that ends
        /// TLS instead.
        #[arg(long)]
        allow_plain_http: bool,
    },
    /// A progress bar per replica while it provisions or catches up, read
    /// again every interval; ends once all are caught up, or on Ctrl-C.
    Watch {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Seconds between reads.
        #[arg(long, value_name = "SECONDS", default_value_t = 1.0)]
        every: f64,
    },
    /// Waits until the fleet is settled (every live replica caught up, no
    /// note pending, nothing waiting for a fix), with `--caught-up` until
    /// every live replica is caught up, or with `--deployed` until the
    /// newest build's deployment is complete on every live replica. Exits 0
    /// once it is, 1 when `--timeout` passes first, 2 as soon as something
    /// waits for a fix. With `--timeout`, a database with no sync schema
    /// yet (or one the server's migrations have not reached), or no relay
    /// started, is waited on too; without, it is an error.
    Wait {
        #[command(flatten)]
        scope: ScopeArgs,
        /// Wait until every live replica is caught up, pending notes aside.
        #[arg(long, conflicts_with_all = ["settled", "deployed"])]
        caught_up: bool,
        /// Wait until the fleet is settled (the default).
        #[arg(long, conflicts_with = "deployed")]
        settled: bool,
        /// Wait until the deployment of the declarations the server last
        /// started with is done and every live replica was told it holds
        /// them whole, and acknowledged it. Given a fingerprint (hex, as a
        /// replica of the build prints its own, `Configuration::own`), wait
        /// for the declarations of that build: while the server runs
        /// others (its new build has not started yet), keep waiting.
        #[arg(long, value_name = "FINGERPRINT", value_parser = fingerprint)]
        deployed: Option<Option<Fingerprint>>,
        /// Give up after this many seconds.
        #[arg(long, value_name = "SECONDS")]
        timeout: Option<f64>,
        /// Seconds between reads.
        #[arg(long, value_name = "SECONDS", default_value_t = 0.5)]
        every: f64,
    },
    /// The last deployment of changed declarations, table by table: what
    /// changed, what is done about it, and how far it got.
    Deployment,
    /// The server's public key, which a replica is given with its secret
    /// when it is enrolled, and pins: it applies only what that key (or a
    /// newer key it endorsed) signed.
    Key {
        /// Replace the key the server signs with by a new one, endorsed by
        /// the old: replicas that pinned the old key follow to the new one.
        /// Prints the new key, for replicas enrolled from now on.
        #[arg(long)]
        rotate: bool,
    },
    /// The replicas' keys on a NATS broker (`magic_sync_nats`), kept by the
    /// server: enrol or revoke a replica, and write the broker's
    /// `authorization` block from what is kept; and where each replica
    /// stands on the broker.
    #[command(subcommand)]
    Broker(Broker),
    /// Installs the `sync` schema in the database, or brings it to this
    /// build's version: what the relay does when it starts. Run it to
    /// enrol replicas, or read the server's key, before the relay first
    /// runs. Safe to run again, and beside a running relay.
    Migrate,
}

impl Command {
    /// Whether the command reads or writes the database: `broker server`
    /// only draws a key pair, and `broker status` with replicas named only
    /// asks the broker.
    pub fn needs_database(&self) -> bool {
        match self {
            Command::Broker(Broker::Server) => false,
            Command::Broker(Broker::Status(status)) => status.replicas.is_empty(),
            _ => true,
        }
    }
}

/// `broker`'s commands.
#[derive(Debug, Clone, Subcommand)]
pub enum Broker {
    /// Draws the server's own key pair on the broker and prints both
    /// halves: the seed is the relay's secret (keep it with the database's
    /// password and give it to `Broker::connect` on every start); the
    /// public key goes to `broker authorization --server`. Kept nowhere.
    Server,
    /// Draws new credentials for a replica (replacing any it had), keeps
    /// the public key, and prints the seed: hand it to the replica. It is
    /// printed this once and kept nowhere.
    Enrol {
        /// The replica.
        replica: String,
    },
    /// Takes a replica's key away: the next block leaves it out.
    Revoke {
        /// The replica.
        replica: String,
    },
    /// Prints the broker's `authorization { ... }` block: the server's
    /// user and every replica enrolled, each confined to its own subjects.
    /// Write it into the broker's configuration and reload the broker.
    Authorization {
        /// The server's public nkey (`U...`), whose seed the relay
        /// connects with.
        #[arg(long, value_name = "KEY")]
        server: String,
    },
    /// Where each replica stands on the broker: messages waiting in its
    /// stream, whether it reads them, what it was handed and has not
    /// acknowledged; and the reports waiting for the server. A replica
    /// that never reads (not running, or cannot connect) shows no
    /// consumer. Connects as the server and takes nothing, so it runs
    /// beside the relay.
    Status(StatusArgs),
}

/// `broker status`'s arguments.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// The broker: tls://host:4222, or nats://host:4222 on this machine.
    #[arg(long, env = "MAGIC_SYNC_BROKER")]
    pub broker: String,
    /// A file holding the server's seed on the broker (its first line), as
    /// `broker server` printed it.
    #[arg(long)]
    pub seed_file: std::path::PathBuf,
    /// PEM certificates to trust for the broker's TLS in place of the
    /// system's roots; TLS is then required.
    #[arg(long)]
    pub trust: Option<std::path::PathBuf>,
    /// Allow nats:// (no TLS) to a broker on another machine.
    #[arg(long)]
    pub allow_plain: bool,
    /// The replicas to read; every replica enrolled when none is named.
    pub replicas: Vec<String>,
}

/// `broker status`: where each replica stands on the broker, and the
/// reports waiting for the server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BrokerStatus {
    /// Each replica read, in the order named (or by id).
    pub replicas: Vec<ReplicaStanding>,
    /// The upload stream and the server's consumer of it.
    pub uploads: magic_sync_nats::broker::Standing,
}

impl BrokerStatus {
    /// Where `replicas` stand on the broker, and the reports waiting, as
    /// `inspector` asks it.
    pub async fn read(
        inspector: &magic_sync_nats::broker::Inspector,
        replicas: Vec<String>,
    ) -> Result<BrokerStatus, magic_sync_nats::Error> {
        let mut read = BrokerStatus {
            replicas: Vec::with_capacity(replicas.len()),
            uploads: inspector.uploads_standing().await?,
        };
        for replica in replicas {
            let standing = inspector.standing(&replica).await?;
            read.replicas.push(ReplicaStanding { replica, standing });
        }
        Ok(read)
    }
}

/// One replica's line of [`BrokerStatus`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaStanding {
    /// The replica.
    pub replica: String,
    /// Its stream and consumer.
    pub standing: magic_sync_nats::broker::Standing,
}

/// `deploy`, for a host to mount in its own binary: only the host knows
/// its declarations. With `--dry-run` it prints what starting this build
/// would change (tables reused, added, planned again, sent again, taken
/// back, with the rows each moves) and changes nothing; without, where the
/// last deployment stands. The relay does the deployment itself when the
/// new build starts.
#[derive(Debug, Clone, Default, Args)]
pub struct Deploy {
    /// Print what starting this build would change, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs [`Deploy`] for the build whose declarations are `engine`, on a
/// connection of its own.
pub async fn deploy(
    client: &mut Client,
    engine: &magic_sync::Engine,
    args: &Deploy,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    if args.dry_run {
        let read = magic_sync::deploy::dry_run(client, engine)
            .await
            .map_err(Error::Deployment)?;
        emit(out, args.json, &read, show::dry_run)?;
    } else {
        let read = magic_sync::deploy::progress(client)
            .await
            .map_err(Error::Deployment)?;
        emit(out, args.json, &read, |d: &Vec<_>| show::deployment(d))?;
    }
    Ok(Outcome::Fine)
}

/// `indexes`, for a host to mount in its own binary beside [`Deploy`]:
/// prints the `CREATE INDEX` statements the relay's start-up check would
/// demand of this build's declarations (the columns a `follows` table
/// follows its parent by, a group rule's members and grants), each with
/// what the relay looks up through it, and ends as
/// [`Outcome::WaitsForFix`] (exit 2) when any is missing, so a deploy
/// script can stop before the relay would refuse to start.
#[derive(Debug, Clone, Default, Args)]
pub struct Indexes {
    /// Print JSON (stable field names) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// One index [`Indexes`] found missing, as its JSON prints it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Missing {
    /// The table's schema.
    pub schema: String,
    /// The table.
    pub table: String,
    /// The columns the index must lead with.
    pub columns: Vec<String>,
    /// What the relay looks up through it.
    pub why: String,
    /// The statement that makes it.
    pub sql: String,
}

/// Runs [`Indexes`] for the build whose declarations are `engine`.
pub async fn indexes(
    client: &Client,
    engine: &magic_sync::Engine,
    args: &Indexes,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let missing: Vec<Missing> = magic_sync::check::missing_indexes(engine, client)
        .await
        .map_err(Error::Catalogue)?
        .into_iter()
        .map(|m| Missing {
            sql: format!("{};", m.create_sql()),
            schema: m.schema,
            table: m.table,
            columns: m.columns,
            why: m.why,
        })
        .collect();
    emit(out, args.json, &missing, |m: &Vec<Missing>| {
        show::indexes(m)
    })?;
    Ok(Outcome::of(!missing.is_empty()))
}

/// How a command ended, for the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing read waits for a fix.
    Fine,
    /// Something read waits for a fix to be deployed.
    WaitsForFix,
    /// What was waited for did not come in time.
    TimedOut,
}

impl Outcome {
    /// 0, or [`EXIT_FIX`].
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Fine => 0,
            Outcome::WaitsForFix => EXIT_FIX,
            Outcome::TimedOut => EXIT_ERROR,
        }
    }

    pub(crate) fn of(waits: bool) -> Outcome {
        if waits {
            Outcome::WaitsForFix
        } else {
            Outcome::Fine
        }
    }
}

/// What a command could not do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The read failed.
    #[error(transparent)]
    Read(#[from] ops::Error),
    /// Keeping or reading the replicas' keys on a broker failed.
    #[error("the broker's keys: {0}")]
    Broker(#[from] magic_sync_nats::Error),
    /// The database has no `sync` schema: nothing was installed yet.
    #[error("this database has no sync schema yet: run `magic-sync migrate` (the relay also migrates when it starts)")]
    NotMigrated,
    /// Reading or installing the `sync` schema failed.
    #[error("the sync schema: {0}")]
    Schema(#[source] magic_sync::Error),
    /// Reading or replacing the server's key failed.
    #[error("the server's key: {0}")]
    Key(#[from] magic_sync::Error),
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
    /// The dashboard could not listen, or serve.
    #[error("serving the dashboard on {addr}: {source}")]
    Serve {
        /// Where it was to listen.
        addr: SocketAddr,
        /// What failed.
        source: std::io::Error,
    },
    /// Reading the database's catalogue failed.
    #[error("reading the catalogue: {0}")]
    Catalogue(#[source] magic_sync::Error),
    /// Reading or planning a deployment failed.
    #[error("the deployment: {0}")]
    Deployment(#[source] magic_sync::Error),
    /// An argument out of its range.
    #[error("{0}")]
    Argument(&'static str),
    /// `broker authorization --server` given something not a user's
    /// public nkey. What was given is not repeated: it may be a seed.
    #[error("--server is not a user's public nkey (U..., 56 characters); a seed (S...) is the secret and goes only to the relay")]
    NotAUserKey,
    /// Asking the broker where replicas stand failed.
    #[error("asking the broker: {0}")]
    BrokerStatus(#[source] magic_sync_nats::Error),
    /// The server's seed on the broker could not be read. Only the file
    /// is named, never what it holds.
    #[error("the server's seed on the broker: {0}")]
    SeedFile(String),
    /// The dashboard would be served as it must not be: a token too short,
    /// or plain HTTP beyond loopback not accepted.
    #[error("the dashboard: {0}")]
    Exposed(String),
    /// The dashboard's token could not be read.
    #[error("reading the dashboard's token from {path}: {why}")]
    Token {
        /// The file named.
        path: std::path::PathBuf,
        /// What was wrong.
        why: String,
    },
}

/// Runs `command` on `client`, writing to `out`: JSON when `json`, tables
/// otherwise.
pub async fn run(
    command: &Command,
    json: bool,
    client: &mut Client,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    // A wait given a timeout waits for the schema too: the relay makes it
    // when it first starts.
    let waits_for_schema = matches!(
        command,
        Command::Wait {
            timeout: Some(_),
            ..
        }
    );
    if !matches!(command, Command::Migrate | Command::Broker(Broker::Server))
        && !waits_for_schema
        && magic_sync::schema::version(client)
            .await
            .map_err(Error::Schema)?
            == 0
    {
        return Err(Error::NotMigrated);
    }
    match command {
        Command::Migrate => {
            let version = magic_sync::schema::migrate(client)
                .await
                .map_err(Error::Schema)?;
            let read = serde_json::json!({ "schema_version": version });
            emit(out, json, &read, |read| {
                format!("the sync schema is at version {}\n", read["schema_version"])
            })?;
            Ok(Outcome::Fine)
        }
        Command::Overview { scope, worst } => {
            let read = ops::overview(client, &scope.scope(), *worst).await?;
            emit(out, json, &read, show::overview)?;
            Ok(Outcome::of(read.waits_for_fix()))
        }
        Command::Replicas {
            scope,
            after,
            limit,
        } => {
            let read = ops::listing(client, &scope.scope(), after.as_deref(), *limit).await?;
            emit(out, json, &read, show::listing)?;
            Ok(Outcome::of(
                read.replicas
                    .iter()
                    .any(|r| r.state == ops::ReplicaState::WaitingOnFix),
            ))
        }
        Command::Deployment => {
            let read = magic_sync::deploy::progress(&*client)
                .await
                .map_err(Error::Deployment)?;
            emit(out, json, &read, |d: &Vec<_>| show::deployment(d))?;
            Ok(Outcome::Fine)
        }
        Command::Progress { replica } => {
            let read = ops::progress(client, replica).await?;
            emit(out, json, &read, show::progress)?;
            Ok(Outcome::of(
                read.replica.state == ops::ReplicaState::WaitingOnFix,
            ))
        }
        Command::Row { table, key } => {
            let read = ops::row_progress(client, table, key).await?;
            emit(out, json, &read, show::row)?;
            Ok(Outcome::of(read.waits_for_fix()))
        }
        Command::Health { scope } => {
            let read = ops::health(client, &scope.scope()).await?;
            emit(out, json, &read, show::health)?;
            Ok(Outcome::of(!read.healthy))
        }
        Command::Dashboard {
            scope,
            listen,
            token_file,
            allow_hosts,
            allow_plain_http,
        } => {
            let access = match token_file {
                Some(path) => dashboard::Access::Token(dashboard::Token::new(&read_token(path)?)),
                None if listen.ip().is_loopback() => dashboard::Access::Open,
                None => {
                    return Err(Error::Argument(
                        "listening beyond this machine needs --token-file: \
                         the dashboard shows every replica's state",
                    ))
                }
            };
            let serving = |source| Error::Serve {
                addr: *listen,
                source,
            };
            let options = dashboard::Options {
                access,
                hosts: allow_hosts.clone(),
                plain_http: *allow_plain_http,
            };
            let listener = TcpListener::bind(listen).await.map_err(serving)?;
            let addr = listener.local_addr().map_err(serving)?;
            match dashboard::exposure(addr, &options) {
                Err(why) => return Err(Error::Exposed(why)),
                Ok(Some(warning)) => {
                    // Beside the command's output, which a script may read.
                    #[allow(clippy::print_stderr, reason = "an operator's command warns on stderr")]
                    {
                        eprintln!("warning: {warning}");
                    }
                }
                Ok(None) => {}
            }
            writeln!(
                out,
                "magic-sync dashboard at http://{addr}/ (Ctrl-C stops it)"
            )?;
            out.flush()?;
            let stop = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            dashboard::serve_with(listener, client, scope.scope(), options, stop)
                .await
                .map_err(serving)?;
            Ok(Outcome::Fine)
        }
        Command::Watch { scope, every } => {
            let every = Duration::try_from_secs_f64(*every)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or(Error::Argument("--every takes a number of seconds above 0"))?;
            watch::watch(client, &scope.scope(), every, out).await
        }
        Command::Wait {
            scope,
            caught_up,
            settled: _,
            deployed,
            timeout,
            every,
        } => {
            let seconds = |s: f64, what: &'static str| {
                Duration::try_from_secs_f64(s)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or(Error::Argument(what))
            };
            let every = seconds(*every, "--every takes a number of seconds above 0")?;
            let timeout = timeout
                .map(|t| seconds(t, "--timeout takes a number of seconds above 0"))
                .transpose()?;
            let until = match (deployed, caught_up) {
                (Some(build), _) => Until::Deployed(build.as_ref()),
                (None, true) => Until::CaughtUp,
                (None, false) => Until::Settled,
            };
            let pace = Pace { every, timeout };
            wait(client, &scope.scope(), until, pace, json, out).await
        }
        Command::Key { rotate } => {
            let key = if *rotate {
                magic_sync::store::keys::rotate(client).await?
            } else {
                magic_sync::store::keys::public(&*client).await?
            };
            let read = serde_json::json!({ "key": key.to_string() });
            emit(out, json, &read, |read| {
                format!("{}\n", read["key"].as_str().unwrap_or(""))
            })?;
            Ok(Outcome::Fine)
        }
        Command::Broker(command) => broker(command, json, client, out).await,
    }
}

/// Runs a command that needs no database ([`Command::needs_database`]):
/// `broker server`, which draws the server's key pair on the broker and
/// keeps it nowhere, or `broker status` for the replicas named.
pub async fn run_offline(
    command: &Command,
    json: bool,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    match command {
        Command::Broker(Broker::Server) => draw_server(json, out),
        Command::Broker(Broker::Status(status)) if !command.needs_database() => {
            broker_status(status, None, json, out).await
        }
        _ => Err(Error::Argument("this command reads the database")),
    }
}

/// `broker server`: the server's key pair on the broker, kept nowhere.
fn draw_server(json: bool, out: &mut dyn Write) -> Result<Outcome, Error> {
    let credentials = magic_sync_nats::access::Credentials::issue();
    let read = serde_json::json!({
        "public_key": credentials.public_key(),
        "seed": credentials.seed(),
    });
    emit(out, json, &read, |read| {
        format!(
            "public key: {}\nseed: {}\n",
            read["public_key"].as_str().unwrap_or(""),
            read["seed"].as_str().unwrap_or("")
        )
    })?;
    Ok(Outcome::Fine)
}

async fn broker(
    command: &Broker,
    json: bool,
    client: &Client,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    use magic_sync_nats::access::{self, Access};
    let read = match command {
        Broker::Server => return draw_server(json, out),
        Broker::Enrol { replica } => {
            let credentials = access::enrol(client, replica).await?;
            serde_json::json!({
                "replica": replica,
                "public_key": credentials.public_key(),
                "seed": credentials.seed(),
            })
        }
        Broker::Revoke { replica } => {
            serde_json::json!({ "replica": replica, "revoked": access::revoke(client, replica).await? })
        }
        Broker::Status(status) => return broker_status(status, Some(client), json, out).await,
        Broker::Authorization { server } => {
            if !access::is_public_key(server) {
                return Err(Error::NotAUserKey);
            }
            let block = Access::read(client, server).await?.authorization();
            serde_json::json!({ "authorization": block })
        }
    };
    emit(out, json, &read, |read| {
        if let Some(seed) = read["seed"].as_str() {
            format!("{seed}\n")
        } else if let Some(block) = read["authorization"].as_str() {
            block.to_string()
        } else {
            format!(
                "{}\n",
                if read["revoked"].as_bool() == Some(true) {
                    "revoked"
                } else {
                    "had no key"
                }
            )
        }
    })?;
    Ok(Outcome::Fine)
}

/// `broker status`: the replicas named, or (with `client`) every one
/// enrolled.
async fn broker_status(
    status: &StatusArgs,
    client: Option<&Client>,
    json: bool,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let StatusArgs {
        broker,
        seed_file,
        trust,
        allow_plain,
        replicas,
    } = status;
    let seed = magic_sync::run::read_secret(seed_file).map_err(Error::SeedFile)?;
    let settings = magic_sync_nats::broker::Settings {
        trust: trust.clone(),
        allow_plain: *allow_plain,
        ..magic_sync_nats::broker::Settings::new(broker.clone())
    };
    let inspector = magic_sync_nats::broker::Inspector::connect(&settings, &seed)
        .await
        .map_err(Error::BrokerStatus)?;
    let names = match client {
        Some(client) if replicas.is_empty() => magic_sync::store::broker_keys::all(client)
            .await
            .map_err(|e| Error::BrokerStatus(e.into()))?
            .into_iter()
            .map(|(replica, _)| replica)
            .collect(),
        _ => replicas.clone(),
    };
    let read = BrokerStatus::read(&inspector, names)
        .await
        .map_err(Error::BrokerStatus)?;
    emit(out, json, &read, show::broker_status)?;
    Ok(Outcome::Fine)
}

/// What `wait` waits for.
#[derive(Debug, Clone, Copy)]
enum Until<'a> {
    /// The fleet settled.
    Settled,
    /// Every live replica caught up.
    CaughtUp,
    /// The deployment of the declarations with this fingerprint (by
    /// default, those the server last started with) complete.
    Deployed(Option<&'a Fingerprint>),
}

/// How often `wait` reads, and for how long.
#[derive(Debug, Clone, Copy)]
struct Pace {
    every: Duration,
    timeout: Option<Duration>,
}

/// One read of what `wait` waits for.
enum Reading {
    Settled(ops::Settled),
    Deployed(ops::Deployed),
    /// No sync schema yet, or one the server's migrations have not reached:
    /// nothing to read until a relay starts (or `migrate` runs).
    NotMigrated(NotMigrated),
}

/// What `wait` prints when it gave up before the database had a sync
/// schema it reads.
#[derive(Debug, Clone, serde::Serialize)]
struct NotMigrated {
    /// Always false.
    migrated: bool,
    /// Always false: a relay makes the schema as it starts.
    relay_started: bool,
    /// What is missing, in words.
    says: String,
}

impl Reading {
    async fn read(
        client: &mut Client,
        scope: &Scope,
        until: Until<'_>,
    ) -> Result<Self, ops::Error> {
        match until {
            Until::Deployed(build) => ops::deployed(client, scope, build)
                .await
                .map(Reading::Deployed),
            Until::Settled | Until::CaughtUp => {
                ops::settled(client, scope).await.map(Reading::Settled)
            }
        }
    }

    /// `error` as what is awaited, when it is one a relay starting mends.
    fn not_migrated(error: &ops::Error) -> Option<Self> {
        let says = match error {
            ops::Error::NoSyncSchema => {
                "the database has no sync schema yet: no relay has started on it".to_string()
            }
            ops::Error::SchemaBehind { .. } => error.to_string(),
            _ => return None,
        };
        Some(Reading::NotMigrated(NotMigrated {
            migrated: false,
            relay_started: false,
            says,
        }))
    }

    fn reached(&self, until: Until<'_>) -> bool {
        match (self, until) {
            (Reading::Settled(read), Until::CaughtUp) => read.caught_up,
            (Reading::Settled(read), _) => read.settled,
            (Reading::Deployed(read), _) => read.complete,
            (Reading::NotMigrated(_), _) => false,
        }
    }

    fn waits_for_fix(&self) -> bool {
        match self {
            Reading::Settled(read) => {
                read.waiting_on_fix > 0 || read.quarantined > 0 || read.parked > 0
            }
            Reading::Deployed(read) => read.waits_for_fix(),
            Reading::NotMigrated(_) => false,
        }
    }

    fn emit(&self, out: &mut dyn Write, json: bool) -> Result<(), Error> {
        match self {
            Reading::Settled(read) => emit(out, json, read, |r| format!("{}\n", r.says)),
            Reading::Deployed(read) => emit(out, json, read, |r| format!("{}\n", r.says)),
            Reading::NotMigrated(read) => emit(out, json, read, |r| format!("{}\n", r.says)),
        }
    }
}

/// Reads what `until` names every `pace.every` until it is reached,
/// something waits for a fix, or `pace.timeout` passes; prints the last
/// read. Given a timeout, a database not migrated yet is waited on.
async fn wait(
    client: &mut Client,
    scope: &Scope,
    until: Until<'_>,
    pace: Pace,
    json: bool,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let deadline = pace.timeout.map(|t| tokio::time::Instant::now() + t);
    loop {
        let read = match Reading::read(client, scope, until).await {
            Ok(read) => read,
            Err(e) => match Reading::not_migrated(&e).filter(|_| deadline.is_some()) {
                Some(read) => read,
                None => return Err(e.into()),
            },
        };
        let outcome = if read.waits_for_fix() {
            Some(Outcome::WaitsForFix)
        } else if read.reached(until) {
            Some(Outcome::Fine)
        } else if deadline.is_some_and(|d| tokio::time::Instant::now() + pace.every > d) {
            Some(Outcome::TimedOut)
        } else {
            None
        };
        if let Some(outcome) = outcome {
            read.emit(out, json)?;
            return Ok(outcome);
        }
        tokio::time::sleep(pace.every).await;
    }
}

/// A fingerprint of declarations, as 64 hex digits.
fn fingerprint(text: &str) -> Result<Fingerprint, String> {
    let digits = text.trim();
    let bytes: Option<Vec<u8>> = (digits.len() == 64 && digits.is_ascii())
        .then(|| {
            (0..32)
                .map(|i| u8::from_str_radix(&digits[2 * i..2 * i + 2], 16).ok())
                .collect()
        })
        .flatten();
    bytes
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .map(Fingerprint)
        .ok_or_else(|| {
            "a fingerprint is 64 hex digits, as a replica prints its build's \
             (`Configuration::own`)"
                .to_string()
        })
}

/// The token in `path`, without the whitespace around it; never empty.
fn read_token(path: &std::path::Path) -> Result<String, Error> {
    let failed = |why: String| Error::Token {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(failed("the file is empty".into()));
    }
    Ok(token.to_string())
}

fn emit<T: serde::Serialize>(
    out: &mut dyn Write,
    json: bool,
    read: &T,
    table: fn(&T) -> String,
) -> Result<(), Error> {
    if json {
        serde_json::to_writer_pretty(&mut *out, read).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", table(read))?;
    }
    Ok(())
}

/// Sends what the engine and the transport log to standard error: warnings
/// and worse, or as `RUST_LOG` says (`RUST_LOG=magic_sync=debug` times every
/// step of a pass). With `OTEL_EXPORTER_OTLP_ENDPOINT` (or
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, the engine's spans go to that
/// OpenTelemetry collector too, over OTLP/HTTP (the `otlp` feature, on by
/// default): a pass, publishing, hearing replicas and each snapshot, with
/// the steps' timings as events within them, whatever `RUST_LOG` says of
/// standard error. They go in batches, every five seconds
/// (`OTEL_BSP_SCHEDULE_DELAY`) and at [`flush_traces`]. For the command's
/// binary and a host's own; a host with a subscriber of its own does not
/// call it, and adds `tracing-opentelemetry`'s layer itself.
pub fn logs() {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter);
    let registry = tracing_subscriber::registry().with(stderr);
    #[cfg(feature = "otlp")]
    let registry = registry.with(otlp::layer());
    let _ = registry.try_init();
}

/// Sends the spans not exported yet to the collector, if traces are
/// exported (see [`logs`]); a process calls it before it exits.
pub fn flush_traces() {
    #[cfg(feature = "otlp")]
    otlp::flush();
}

#[cfg(feature = "otlp")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use std::sync::OnceLock;
    use tracing_subscriber::Layer as _;

    /// The exporter's provider, once made: flushed by `flush`.
    static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

    /// The layer exporting the engine's spans, when the environment names
    /// a collector; `None` otherwise, or when the exporter cannot be made
    /// (said on standard error: the process runs on without it).
    pub(super) fn layer<S>() -> Option<impl tracing_subscriber::Layer<S>>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let named = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ]
        .iter()
        .any(|name| std::env::var_os(name).is_some_and(|v| !v.is_empty()));
        if !named {
            return None;
        }
        let exporter = match opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build()
        {
            Ok(exporter) => exporter,
            Err(e) => {
                #[allow(clippy::print_stderr, reason = "logging is what failed to start")]
                {
                    eprintln!("magic-sync: traces are not exported: {e}");
                }
                return None;
            }
        };
        let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "magic_sync".into());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service)
                    .build(),
            )
            .build();
        let tracer = provider.tracer("magic_sync");
        let _ = PROVIDER.set(provider);
        // The engine's spans and what happens within them; the exporter's
        // own logs never, or exporting would trace itself.
        let targets = tracing_subscriber::filter::Targets::new()
            .with_target("magic_sync", tracing::Level::INFO)
            .with_target("magic_sync_server", tracing::Level::INFO)
            .with_target("magic_sync_http", tracing::Level::INFO)
            .with_target("magic_sync_nats", tracing::Level::INFO);
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(tracer)
                .with_filter(targets),
        )
    }

    pub(super) fn flush() {
        if let Some(provider) = PROVIDER.get() {
            let _ = provider.force_flush();
        }
    }
}

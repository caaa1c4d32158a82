//! `magic-sync`: what an operator sees of a magic_sync server database,
//! from the engine's own record (`magic_sync::ops`). Reading needs none of
//! the host's declarations; `deploy` and `indexes` are the two commands
//! that do, which a host mounts beside them.
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
//!
//! Its parts: `arguments`, the command line as clap parses it; `broker`,
//! the replicas' keys on a NATS broker and where they stand on it;
//! `deployment`, what a host mounts beside its declarations (`deploy`,
//! `indexes`); `wait` and `watch`, the commands that read again until the
//! fleet is where it should be; [`dashboard`], with `scrape` writing its
//! Prometheus metrics; [`show`], the tables the commands print; and
//! `telemetry`, where logs and spans go.

mod arguments;
mod broker;
pub mod dashboard;
mod deployment;
mod scrape;
pub mod show;
mod telemetry;
mod wait;
mod watch;

pub use arguments::{Broker, Cli, Command, ScopeArgs, StatusArgs};
pub use broker::{BrokerStatus, ReplicaStanding};
pub use deployment::{deploy, indexes, Deploy, Indexes, Missing};
pub use telemetry::{flush_traces, logs};

use broker::{broker, broker_status, draw_server};
use magic_sync::ops::{self, Scope};
use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_postgres::Client;
use wait::{wait, Pace, Until};

/// The exit code of an error.
pub const EXIT_ERROR: u8 = 1;
/// The exit code when something waits for a fix to be deployed.
pub const EXIT_FIX: u8 = 2;

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
            let options = dashboard_options(
                listen,
                token_file.as_deref(),
                allow_hosts,
                *allow_plain_http,
            )?;
            serve_dashboard(client, scope.scope(), *listen, options, out).await
        }
        Command::Watch { scope, every } => {
            let every = seconds(*every, "--every takes a number of seconds above 0")?;
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
            let until = match deployed {
                Some(build) => Until::Deployed(build.as_ref()),
                None if *caught_up => Until::CaughtUp,
                None => Until::Settled,
            };
            let pace = Pace {
                every: seconds(*every, "--every takes a number of seconds above 0")?,
                timeout: timeout
                    .map(|t| seconds(t, "--timeout takes a number of seconds above 0"))
                    .transpose()?,
            };
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

/// `s` seconds as a duration, refused with `what` unless above 0.
fn seconds(s: f64, what: &'static str) -> Result<Duration, Error> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(Error::Argument(what))
}

/// How the dashboard the arguments describe is reached: a token is needed
/// to listen beyond this machine, since it shows every replica's state.
fn dashboard_options(
    listen: &SocketAddr,
    token_file: Option<&std::path::Path>,
    allow_hosts: &[String],
    allow_plain_http: bool,
) -> Result<dashboard::Options, Error> {
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
    Ok(dashboard::Options {
        access,
        hosts: allow_hosts.to_vec(),
        plain_http: allow_plain_http,
    })
}

/// Serves the dashboard on `listen` until Ctrl-C, having said where; an
/// exposure it refuses is an error, one it warns of is said on stderr.
async fn serve_dashboard(
    client: &mut Client,
    scope: Scope,
    listen: SocketAddr,
    options: dashboard::Options,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let serving = |source| Error::Serve {
        addr: listen,
        source,
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
    dashboard::serve_with(listener, client, scope, options, stop)
        .await
        .map_err(serving)?;
    Ok(Outcome::Fine)
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

//! The command line as clap parses it: [`Cli`], its [`Command`]s and their
//! arguments. A host mounts [`Command`] in its own binary, and
//! [`crate::run`] runs what was parsed.

use clap::{Args, Parser, Subcommand};
use magic_sync::core::schema::Fingerprint;
use magic_sync::ops::Scope;
use std::net::SocketAddr;

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

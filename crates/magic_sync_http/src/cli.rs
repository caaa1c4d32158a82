//! A replica process: the arguments it takes and the loop it runs.
//!
//! `magic-sync-replica`, this crate's binary, is a replica for any app: it
//! follows the server's description of its tables and needs nothing of
//! its host but these arguments. A Rust host that wants its declarations
//! checked at compile time builds its own, and this is all of its body:
//!
//! ```no_run
//! use clap::Parser;
//!
//! fn main() -> std::process::ExitCode {
//!     let args = magic_sync_http::cli::ReplicaArgs::parse();
//!     // The host's declarations; the foreign keys among its tables come
//!     // from the server.
//!     let engine = magic_sync::Engine::builder()
//!         // .table::<Artist>().table::<Album>() ...: the host's tables
//!         .build()
//!         .expect("the declarations hold together");
//!     // Where it tells its operator how the link goes.
//!     let operator = magic_sync_http::cli::Operator::new(std::io::stderr());
//!     magic_sync_http::cli::run_replica(&args, &engine, &operator)
//! }
//! ```

use crate::client::{Settings, Socket};
use magic_sync::replica::Replica;
pub use magic_sync::run::process::Operator;
use magic_sync::run::process::{run_opened, Connecting, Identity};
use magic_sync::Engine;
use std::path::PathBuf;
use std::process::ExitCode;

/// A replica process's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicaCommand {
    /// The server: ws://host:port or wss://host:port.
    #[arg(long, env = "MAGIC_SYNC_SERVER")]
    pub server: String,
    /// A file holding the replica's secret (its first line).
    #[arg(long, env = "MAGIC_SYNC_SECRET_FILE")]
    pub secret_file: PathBuf,
    #[command(flatten)]
    pub identity: Identity,
}

/// [`ReplicaCommand`] as a program's whole command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    about = "A magic_sync replica: applies what the server sends to a SQLite file, and sends up what its host writes"
)]
pub struct ReplicaArgs {
    #[command(flatten)]
    pub replica: ReplicaCommand,
}

pub use magic_sync::run::process::read_secret;

/// Opens the replica and its socket as `args` say: with the host's
/// declarations in `engine`, or following the server's description with
/// `None`.
pub fn open(args: &ReplicaCommand, engine: Option<&Engine>) -> Result<(Replica, Socket), String> {
    let who = &args.identity;
    who.open(&args.secret_file, engine, |secret| {
        let mut settings = Settings::new(args.server.clone(), who.id.clone(), secret);
        settings.trust.clone_from(&who.trust);
        settings.allow_plain = who.allow_plain;
        Socket::connect(settings).map_err(|e| e.to_string())
    })
}

/// Runs the replica `args` names until its socket closes, its database
/// fails, or the process gets SIGTERM or Ctrl-C: what the server sends is
/// applied, what the host writes goes up (`magic_sync::run::process::run`);
/// how its link goes, and why it ended, is told to `operator`.
pub fn run_replica(args: &ReplicaArgs, engine: &Engine, operator: &Operator) -> ExitCode {
    let args = &args.replica;
    run_opened(
        open(args, Some(engine)),
        &args.identity.id,
        &args.server,
        operator,
    )
}

/// [`run_replica`] for a replica with no declarations of its own: its
/// tables are what the server describes (`magic-sync-replica`).
pub fn run_described(args: &ReplicaArgs, operator: &Operator) -> ExitCode {
    let args = &args.replica;
    run_opened(open(args, None), &args.identity.id, &args.server, operator)
}

impl Connecting for Socket {
    fn connects(&self) -> u64 {
        Socket::connects(self)
    }

    fn is_connected(&self) -> bool {
        Socket::is_connected(self)
    }

    fn last_error(&self) -> Option<String> {
        Socket::last_error(self)
    }

    fn close(&self) {
        Socket::close(self);
    }
}

//! A replica process: the arguments it takes and the loop it runs. A
//! replica needs its host's declarations (the tables and their types), so
//! the binary is the host's; this is all of its body:
//!
//! ```no_run
//! use clap::Parser;
//! use std::sync::OnceLock;
//!
//! /// The host's declarations, made once and kept for the program's life.
//! fn engine() -> &'static magic_sync::Engine {
//!     static ENGINE: OnceLock<magic_sync::Engine> = OnceLock::new();
//!     ENGINE.get_or_init(|| {
//!         magic_sync::Engine::builder()
//!             // .table::<Artist>().table::<Album>() ...: the host's tables
//!             .build()
//!             .expect("the declarations hold together")
//!     })
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     let args = magic_sync_http::cli::ReplicaArgs::parse();
//!     // The foreign keys among its tables come from the server.
//!     magic_sync_http::cli::run_replica(&args, engine())
//! }
//! ```

use crate::client::{Settings, Socket};
use magic_sync::replica::{Replica, ServerKey};
use magic_sync::run::process::{open_replica, Connecting};
use magic_sync::Engine;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// A replica process's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicaCommand {
    /// The server: ws://host:port or wss://host:port.
    #[arg(long, env = "MAGIC_SYNC_SERVER")]
    pub server: String,
    /// The replica's id.
    #[arg(long, env = "MAGIC_SYNC_REPLICA")]
    pub id: String,
    /// A file holding the replica's secret (its first line).
    #[arg(long, env = "MAGIC_SYNC_SECRET_FILE")]
    pub secret_file: PathBuf,
    /// The server's public key, as it was given with the secret when the
    /// replica was enrolled (`magic-sync key`): the replica applies only
    /// what this key, or a newer key it endorsed, signed.
    /// A key may begin with `-` (one in 64 does): it is taken as the
    /// value, never as an option.
    #[arg(long, env = "MAGIC_SYNC_SERVER_KEY", allow_hyphen_values = true)]
    pub server_key: ServerKey,
    /// The replica's SQLite file (created if missing).
    #[arg(long)]
    pub db: PathBuf,
    /// PEM certificates to trust for wss:// in place of the usual roots.
    #[arg(long)]
    pub trust: Option<PathBuf>,
    /// Allow ws:// (no TLS) to a server on another machine, where a proxy
    /// beside the replica ends TLS. Without it, only wss:// leaves this
    /// machine: the secret would otherwise cross the network in the clear.
    #[arg(long)]
    pub allow_plain: bool,
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

/// Opens the replica and its socket as `args` say.
pub fn open(args: &ReplicaCommand, engine: &Engine) -> Result<(Replica, Socket), String> {
    let secret = read_secret(&args.secret_file)?;
    let replica = open_replica(&args.db, &args.id, &args.server_key, engine)?;
    let mut settings = Settings::new(args.server.clone(), args.id.clone(), secret);
    settings.trust.clone_from(&args.trust);
    settings.allow_plain = args.allow_plain;
    let socket = Socket::connect(settings).map_err(|e| e.to_string())?;
    Ok((replica, socket))
}

/// Runs the replica `args` names until its socket closes, its database
/// fails, or the process gets SIGTERM or Ctrl-C: what the server sends is
/// applied, what the host writes goes up (`magic_sync::run::process::run`).
pub fn run_replica(args: &ReplicaArgs, engine: &'static Engine) -> ExitCode {
    let (mut replica, socket) = match open(&args.replica, engine) {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("magic-sync-replica: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = &args.replica;
    magic_sync::run::process::run(&mut replica, Arc::new(socket), &args.id, &args.server)
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

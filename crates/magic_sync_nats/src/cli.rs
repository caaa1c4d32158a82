//! A replica process reading its mailbox on the broker: the arguments it
//! takes and the loop it runs. A replica needs its host's declarations,
//! so the binary is the host's; this is all of its body:
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
//!     let args = magic_sync_nats::cli::ReplicaArgs::parse();
//!     // The foreign keys among its tables come from the server.
//!     magic_sync_nats::cli::run_replica(&args, engine())
//! }
//! ```
//!
//! Run as, say, `till --broker tls://broker:4222 --id till-1 --seed-file
//! /etc/till/seed --server-key KEY --trust /etc/till/ca.pem --db till.sqlite`,
//! with the seed `magic-sync broker enrol till-1` printed.

use crate::mailbox::{Mailbox, Settings};
use magic_sync::replica::{Replica, ServerKey};
use magic_sync::run::process::{open_replica, read_secret, Connecting};
use magic_sync::Engine;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// A replica process's arguments, when it reads its mailbox on a broker.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicaCommand {
    /// The broker: tls://host:4222, or nats://host:4222 on this machine.
    #[arg(long, env = "MAGIC_SYNC_BROKER")]
    pub broker: String,
    /// The replica's id.
    #[arg(long, env = "MAGIC_SYNC_REPLICA")]
    pub id: String,
    /// A file holding the replica's nkey seed (its first line), as
    /// `magic-sync broker enrol` printed it.
    #[arg(long, env = "MAGIC_SYNC_SEED_FILE")]
    pub seed_file: PathBuf,
    /// The server's public key, as `magic-sync key` gives it: the replica
    /// applies only what this key, or a newer key it endorsed, signed.
    /// A key may begin with `-` (one in 64 does): it is taken as the
    /// value, never as an option.
    #[arg(long, env = "MAGIC_SYNC_SERVER_KEY", allow_hyphen_values = true)]
    pub server_key: ServerKey,
    /// The replica's SQLite file (created if missing).
    #[arg(long)]
    pub db: PathBuf,
    /// PEM certificates to trust for the broker's TLS in place of the
    /// system's roots; TLS is then required.
    #[arg(long)]
    pub trust: Option<PathBuf>,
    /// Allow nats:// (no TLS) to a broker on another machine, where a proxy
    /// beside the replica ends TLS. Without it, the rows the replica holds
    /// leave this machine only encrypted.
    #[arg(long)]
    pub allow_plain: bool,
}

/// [`ReplicaCommand`] as a program's whole command line.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    about = "A magic_sync replica reading its mailbox on a NATS broker: applies what the server sends to a SQLite file, and sends up what its host writes"
)]
pub struct ReplicaArgs {
    #[command(flatten)]
    pub replica: ReplicaCommand,
}

/// Opens the replica and its mailbox as `args` say. Errors say what was
/// wrong and where, never the seed.
pub fn open(args: &ReplicaCommand, engine: &Engine) -> Result<(Replica, Mailbox), String> {
    let seed = read_secret(&args.seed_file)?;
    let replica = open_replica(&args.db, &args.id, &args.server_key, engine)?;
    let settings = Settings {
        trust: args.trust.clone(),
        allow_plain: args.allow_plain,
        ..Settings::new(args.broker.clone(), args.id.clone(), seed)
    };
    let mailbox = Mailbox::open(settings).map_err(|e| e.to_string())?;
    Ok((replica, mailbox))
}

/// Runs the replica `args` names until its mailbox closes, its database
/// fails, or the process gets SIGTERM or Ctrl-C: what the server sends is
/// applied, what the host writes goes up (`magic_sync::run::process::run`).
pub fn run_replica(args: &ReplicaArgs, engine: &'static Engine) -> ExitCode {
    let (mut replica, mailbox) = match open(&args.replica, engine) {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("magic-sync-replica: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args = &args.replica;
    magic_sync::run::process::run(&mut replica, Arc::new(mailbox), &args.id, &args.broker)
}

impl Connecting for Mailbox {
    fn connects(&self) -> u64 {
        self.readings()
    }

    fn is_connected(&self) -> bool {
        self.is_reading()
    }

    fn last_error(&self) -> Option<String> {
        Mailbox::last_error(self)
    }

    fn close(&self) {
        Mailbox::close(self);
    }
}

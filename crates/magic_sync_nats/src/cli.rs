//! A replica process reading its mailbox on the broker: the arguments it
//! takes and the loop it runs. A replica needs its host's declarations,
//! so the binary is the host's; this is all of its body:
//!
//! ```no_run
//! use clap::Parser;
//!
//! fn main() -> std::process::ExitCode {
//!     let args = magic_sync_nats::cli::ReplicaArgs::parse();
//!     // The host's declarations; the foreign keys among its tables come
//!     // from the server.
//!     let engine = magic_sync::Engine::builder()
//!         // .table::<Artist>().table::<Album>() ...: the host's tables
//!         .build()
//!         .expect("the declarations hold together");
//!     // Where it tells its operator how the link goes.
//!     let operator = magic_sync_nats::cli::Operator::new(std::io::stderr());
//!     magic_sync_nats::cli::run_replica(&args, &engine, &operator)
//! }
//! ```
//!
//! Run as, say, `till --broker tls://broker:4222 --id till-1 --seed-file
//! /etc/till/seed --server-key KEY --trust /etc/till/ca.pem --db till.sqlite`,
//! with the seed `magic-sync broker enrol till-1` printed.

use crate::mailbox::{Mailbox, Settings};
use magic_sync::replica::Replica;
pub use magic_sync::run::process::Operator;
use magic_sync::run::process::{run_opened, Connecting, Identity};
use magic_sync::Engine;
use std::path::PathBuf;
use std::process::ExitCode;

/// A replica process's arguments, when it reads its mailbox on a broker.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicaCommand {
    /// The broker: tls://host:4222, or nats://host:4222 on this machine.
    #[arg(long, env = "MAGIC_SYNC_BROKER")]
    pub broker: String,
    /// A file holding the replica's nkey seed (its first line), as
    /// `magic-sync broker enrol` printed it.
    #[arg(long, env = "MAGIC_SYNC_SEED_FILE")]
    pub seed_file: PathBuf,
    #[command(flatten)]
    pub identity: Identity,
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
    let who = &args.identity;
    who.open(&args.seed_file, Some(engine), |seed| {
        let settings = Settings {
            trust: who.trust.clone(),
            allow_plain: who.allow_plain,
            ..Settings::new(args.broker.clone(), who.id.clone(), seed)
        };
        Mailbox::open(settings).map_err(|e| e.to_string())
    })
}

/// Runs the replica `args` names until its mailbox closes, its database
/// fails, or the process gets SIGTERM or Ctrl-C: what the server sends is
/// applied, what the host writes goes up (`magic_sync::run::process::run`);
/// how its link goes, and why it ended, is told to `operator`.
pub fn run_replica(args: &ReplicaArgs, engine: &Engine, operator: &Operator) -> ExitCode {
    let args = &args.replica;
    run_opened(
        open(args, engine),
        &args.identity.id,
        &args.broker,
        operator,
    )
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

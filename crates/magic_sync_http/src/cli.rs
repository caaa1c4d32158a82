//! A replica process: the arguments it takes and the loop it runs. A
//! replica needs its host's declarations (the tables and their types), so
//! the binary is the host's; this is all of its body:
//!
//! ```no_run
//! # fn engine() -> &'static magic_sync::Engine {
//! #     Box::leak(Box::new(magic_sync::Engine::builder().build().unwrap()))
//! # }
//! use clap::Parser;
//! fn main() -> std::process::ExitCode {
//!     let args = magic_sync_http::cli::ReplicaArgs::parse();
//!     // The engine lives as long as the program (a `OnceLock`, or leaked).
//!     // The foreign keys among its tables come from the server.
//!     magic_sync_http::cli::run_replica(&args, engine())
//! }
//! ```

use crate::client::{Settings, Socket};
use magic_sync::replica::{Replica, ServerKey};
use magic_sync::Engine;
use std::path::PathBuf;
use std::process::ExitCode;

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
    #[arg(long, env = "MAGIC_SYNC_SERVER_KEY")]
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

/// Reads the secret: the first line of the file, without its end.
pub fn read_secret(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the secret file {}: {e}", path.display()))?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.is_empty() {
        return Err(format!("the secret file {} is empty", path.display()));
    }
    Ok(secret)
}

/// Opens the replica and its socket as `args` say.
pub fn open(args: &ReplicaCommand, engine: &Engine) -> Result<(Replica, Socket), String> {
    let secret = read_secret(&args.secret_file)?;
    let mut replica = Replica::open(&args.db, &args.id, engine)
        .map_err(|e| format!("cannot open the replica at {}: {e}", args.db.display()))?;
    replica
        .trust(&args.server_key)
        .map_err(|e| format!("the replica at {}: {e}", args.db.display()))?;
    let mut settings = Settings::new(args.server.clone(), args.id.clone(), secret);
    settings.trust.clone_from(&args.trust);
    settings.allow_plain = args.allow_plain;
    let socket = Socket::connect(settings).map_err(|e| e.to_string())?;
    Ok((replica, socket))
}

/// Runs the replica `args` names until its socket closes, its database
/// fails, or the process gets SIGTERM or Ctrl-C: what the server sends is
/// applied, what the host writes goes up.
pub fn run_replica(args: &ReplicaArgs, engine: &'static Engine) -> ExitCode {
    let (mut replica, socket) = match open(&args.replica, engine) {
        Ok(opened) => opened,
        Err(e) => {
            eprintln!("magic-sync-replica: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = std::sync::Arc::new(socket);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let telling = {
        let (socket, done, args) = (socket.clone(), done.clone(), args.replica.clone());
        std::thread::spawn(move || tell(&socket, &done, &args))
    };
    // SIGTERM or Ctrl-C closes the link: the loop finishes the message it
    // applies (a transaction of its own) and ends, and the process exits
    // as it does when the server goes away.
    {
        let socket = socket.clone();
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(magic_sync::run::server::stop_signal());
            socket.close();
        });
    }
    let ran = magic_sync::run::replica::replica(&mut replica, &*socket);
    done.store(true, std::sync::atomic::Ordering::Release);
    let _ = telling.join();
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("magic-sync-replica `{}`: {e}", args.replica.id);
            ExitCode::FAILURE
        }
    }
}

/// Says on standard error when the replica connects, and why it cannot
/// (wrong credentials, no server), each time that changes: a replica that
/// keeps trying is never silent about why.
pub fn tell(socket: &Socket, done: &std::sync::atomic::AtomicBool, args: &ReplicaCommand) {
    let (mut connects, mut told) = (0, None::<String>);
    while !done.load(std::sync::atomic::Ordering::Acquire) {
        let now = socket.connects();
        if now != connects && socket.is_connected() {
            connects = now;
            told = None;
            eprintln!(
                "magic-sync-replica `{}`: connected to {}",
                args.id, args.server
            );
        } else if !socket.is_connected() {
            let error = socket.last_error();
            if error.is_some() && error != told {
                eprintln!(
                    "magic-sync-replica `{}`: {}; trying again",
                    args.id,
                    error.as_deref().unwrap_or_default()
                );
                told = error;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

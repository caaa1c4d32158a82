//! What a replica process does around its loop, whatever link it reads:
//! the secret it reads from a file, what it tells its operator about the
//! link, and how a signal ends it. The socket's `magic_sync_http::cli` and
//! the broker's `magic_sync_nats::cli` are each this with their own
//! arguments.
//!
//! It is a process's body, and speaks to its operator through the
//! [`Operator`] its binary gives it (standard error, as a rule): a library
//! never prints behind its host's back.

use crate::replica::Replica;
use crate::run::replica::Link;
use std::fmt;
use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Where a replica process tells its operator how it goes, a line at a
/// time: standard error in a binary (`Operator::new(std::io::stderr())`),
/// a buffer in a test. Cheap to clone: clones write to the same place.
#[derive(Clone)]
pub struct Operator(Arc<Mutex<dyn Write + Send>>);

impl Operator {
    /// Tells the operator by writing to `out`.
    pub fn new(out: impl Write + Send + 'static) -> Self {
        Self(Arc::new(Mutex::new(out)))
    }

    /// Writes `line`, and a newline. A line that cannot be written is
    /// lost: the replica goes on whether or not anyone reads it.
    pub fn say(&self, line: fmt::Arguments<'_>) {
        let mut out = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

impl fmt::Debug for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Operator")
    }
}

/// A link that connects to something and can say how that goes.
pub trait Connecting: Link + Send + Sync + 'static {
    /// Times it connected (or began reading) so far.
    fn connects(&self) -> u64;
    /// Whether it is connected now.
    fn is_connected(&self) -> bool;
    /// Why it last failed to connect, or was cut off; `None` while it is
    /// connected.
    fn last_error(&self) -> Option<String>;
    /// Ends the link: the replica's loop finishes the message it applies
    /// and returns.
    fn close(&self);
}

pub use super::read_secret;

/// Who a replica process is, where it keeps its rows and how it may
/// connect: the arguments a replica takes whatever its transport (each
/// transport's `cli` flattens them beside where it connects and the file
/// its credential is in).
#[cfg(feature = "cli")]
#[derive(Debug, Clone, clap::Args)]
pub struct Identity {
    /// The replica's id.
    #[arg(long, env = "MAGIC_SYNC_REPLICA")]
    pub id: String,
    /// The server's public key, as it was given with the credential when
    /// the replica was enrolled (`magic-sync key`): the replica applies
    /// only what this key, or a newer key it endorsed, signed.
    /// A key may begin with `-` (one in 64 does): it is taken as the
    /// value, never as an option.
    #[arg(long, env = "MAGIC_SYNC_SERVER_KEY", allow_hyphen_values = true)]
    pub server_key: crate::sign::ServerKey,
    /// The replica's SQLite file (created if missing).
    #[arg(long)]
    pub db: std::path::PathBuf,
    /// PEM certificates to trust in place of the system's roots: the
    /// server's for wss://, the broker's (TLS is then required).
    #[arg(long)]
    pub trust: Option<std::path::PathBuf>,
    /// Allow a plain connection (ws://, nats://) to another machine, where
    /// a proxy beside the replica ends TLS. Without it, only TLS leaves
    /// this machine: the rows the replica holds, and over ws:// its
    /// secret, would otherwise cross the network in the clear.
    #[arg(long)]
    pub allow_plain: bool,
}

#[cfg(feature = "cli")]
impl Identity {
    /// Reads the credential in `credential_file`, opens the replica (with
    /// the host's declarations in `engine`, or following the server's
    /// description with `None`), then its link by `connect` given the
    /// credential. Errors say what was wrong and where, never the
    /// credential.
    pub fn open<L>(
        &self,
        credential_file: &Path,
        engine: Option<&crate::Engine>,
        connect: impl FnOnce(String) -> Result<L, String>,
    ) -> Result<(Replica, L), String> {
        let credential = read_secret(credential_file)?;
        let replica = open_replica(&self.db, &self.id, &self.server_key, engine)?;
        Ok((replica, connect(credential)?))
    }
}

/// [`run`] over what a transport's `open` gave, or the reason it could not
/// open, told: a replica process's whole body.
pub fn run_opened<L: Connecting>(
    opened: Result<(Replica, L), String>,
    id: &str,
    address: &str,
    operator: &Operator,
) -> ExitCode {
    match opened {
        Ok((mut replica, link)) => run(&mut replica, Arc::new(link), id, address, operator),
        Err(e) => {
            operator.say(format_args!("magic-sync-replica: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// Opens (or creates) the replica `id` in the SQLite file `db`, pinned to
/// the server's `key`: what a replica process does before its link. With
/// `engine` its tables are the host's declarations; without, the server's
/// description ([`Replica::open_described`]).
pub fn open_replica(
    db: &Path,
    id: &str,
    key: &crate::sign::ServerKey,
    engine: Option<&crate::Engine>,
) -> Result<Replica, String> {
    let opened = match engine {
        Some(engine) => Replica::open(db, id, engine),
        None => Replica::open_described(db, id),
    };
    let mut replica =
        opened.map_err(|e| format!("cannot open the replica at {}: {e}", db.display()))?;
    replica
        .trust(key)
        .map_err(|e| format!("the replica at {}: {e}", db.display()))?;
    Ok(replica)
}

/// Tells the operator when the link connects, and why it cannot (wrong
/// credentials, nothing listening, a certificate not trusted), each time
/// that changes, until `done`: a replica that keeps trying is never silent
/// about why. `address` is where it connects, as the operator gave it.
pub fn tell<L: Connecting + ?Sized>(
    link: &L,
    done: &AtomicBool,
    id: &str,
    address: &str,
    operator: &Operator,
) {
    let (mut connects, mut told) = (0, None::<String>);
    while !done.load(Ordering::Acquire) {
        let now = link.connects();
        if now != connects && link.is_connected() {
            connects = now;
            told = None;
            operator.say(format_args!(
                "magic-sync-replica `{id}`: connected to {address}"
            ));
        } else if !link.is_connected() {
            let error = link.last_error();
            if error.is_some() && error != told {
                operator.say(format_args!(
                    "magic-sync-replica `{id}`: {}; trying again",
                    error.as_deref().unwrap_or_default()
                ));
                told = error;
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs the replica's loop over `link` until the link closes or the
/// database fails, telling the operator how the link goes meanwhile
/// ([`tell`]). Success when the link closed; the loop's error, told,
/// otherwise.
pub fn serve<L: Connecting>(
    replica: &mut Replica,
    link: &Arc<L>,
    id: &str,
    address: &str,
    operator: &Operator,
) -> ExitCode {
    let done = Arc::new(AtomicBool::new(false));
    let telling = {
        let (link, done, id, address, operator) = (
            link.clone(),
            done.clone(),
            id.to_string(),
            address.to_string(),
            operator.clone(),
        );
        std::thread::spawn(move || tell(&*link, &done, &id, &address, &operator))
    };
    let ran = crate::run::replica::replica(replica, &**link);
    done.store(true, Ordering::Release);
    let _ = telling.join();
    match ran {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            operator.say(format_args!("magic-sync-replica `{id}`: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// [`serve`], with SIGTERM or Ctrl-C closing the link: the loop finishes
/// the message it applies (a transaction of its own) and ends, and the
/// process exits as it does when the link goes away. A replica process's
/// body once its replica and link are open.
pub fn run<L: Connecting>(
    replica: &mut Replica,
    link: Arc<L>,
    id: &str,
    address: &str,
    operator: &Operator,
) -> ExitCode {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            // The handlers are in place before the loop starts: a SIGTERM
            // from then on closes the link, and never kills the process
            // half-way (SIGTERM's default). Made outside a runtime, they
            // panicked on their thread, and SIGTERM killed the process.
            let signalled = {
                let _entered = runtime.enter();
                crate::run::server::stop_signal()
            };
            let link = link.clone();
            std::thread::spawn(move || {
                runtime.block_on(signalled);
                link.close();
            });
        }
        Err(e) => operator.say(format_args!(
            "magic-sync-replica `{id}`: no signal handling: {e}"
        )),
    }
    serve(replica, &link, id, address, operator)
}

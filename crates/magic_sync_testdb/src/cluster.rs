//! A private throwaway PostgreSQL cluster, living as long as this process.

use std::ffi::OsString;
use std::io::Write as _;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_postgres::Config;

use crate::bins;

/// Environment variable naming the user the cluster runs as when this process is root.
const PG_USER_ENV: &str = "MAGIC_SYNC_PG_USER";
/// Superuser created by `initdb`.
const SUPERUSER: &str = "postgres";
/// How many fresh ports to try when the chosen one was taken in the meantime.
const START_ATTEMPTS: u32 = 5;
/// Lines of the server log quoted when the server fails to start.
const LOG_TAIL_LINES: usize = 40;

/// Settings appended to `postgresql.conf`: a disposable cluster needs no durability.
const SETTINGS: &str = "
# magic_sync_testdb: throwaway test cluster
listen_addresses = '127.0.0.1'
max_connections = 300
shared_buffers = 256MB
fsync = off
synchronous_commit = off
full_page_writes = off
logging_collector = off
log_checkpoints = off
";

/// Waits until its standard input reaches end of file, which happens once
/// the process holding the pipe's write end (the test process) has exited,
/// however it ended; then stops the cluster and deletes its directory.
/// Arguments: cluster directory, data directory, then the `pg_ctl` command
/// (possibly behind `runuser`).
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT QUIT TERM PIPE
dir=$1
data=$2
shift 2
cat >/dev/null 2>&1
"$@" stop -D "$data" -m immediate -w -t 60 -s >/dev/null 2>&1
if [ -f "$data/postmaster.pid" ]; then
    pid=$(head -n 1 "$data/postmaster.pid")
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
fi
rm -rf "$dir"
"#;

/// A PostgreSQL cluster initialised and started by this process, listening on
/// `127.0.0.1` and on a unix socket in its directory, with trust
/// authentication and superuser `postgres`.
///
/// A watchdog process stops it and deletes its directory as soon as this
/// value is dropped or, for the never-dropped one behind [`crate::server`],
/// as soon as the process has exited, however it exits.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    port: u16,
    run_as: Option<String>,
    startup: Duration,
    /// Write end of the pipe the watchdog waits on; closed only by process exit.
    _watchdog: Mutex<ChildStdin>,
}

impl Cluster {
    /// Initialises and starts a new cluster with the programs in `bin_dir`.
    ///
    /// Most code wants the process-wide [`crate::server`] instead.
    pub fn start(bin_dir: &Path) -> Result<Cluster, String> {
        let began = Instant::now();
        let run_as = if running_as_root()? {
            let user = std::env::var(PG_USER_ENV)
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "postgres".to_owned());
            Some(user)
        } else {
            None
        };
        let runner = Runner::new(run_as.clone())?;

        let dir = create_cluster_dir(&runner)?;
        let data_dir = dir.join("data");
        let log_file = dir.join("postgres.log");
        let pg_ctl = bin_dir.join("pg_ctl");

        // The watchdog comes first, so that whatever happens from here on the
        // directory (and any server started in it) is cleaned up.
        let watchdog = spawn_watchdog(&runner, &dir, &data_dir, &pg_ctl).map_err(|e| {
            let _ = std::fs::remove_dir(&dir);
            format!("cannot start the watchdog (sh): {e}")
        })?;

        let mut initdb = runner.command(&bin_dir.join("initdb"));
        initdb
            .arg("-D")
            .arg(&data_dir)
            .args([
                "-U",
                SUPERUSER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ])
            .current_dir(&dir);
        run(&mut initdb, "initdb")?;

        let mut conf = std::fs::OpenOptions::new()
            .append(true)
            .open(data_dir.join("postgresql.conf"))
            .map_err(|e| format!("cannot open postgresql.conf: {e}"))?;
        let socket_dir = dir.to_str().ok_or("cluster path is not UTF-8")?;
        writeln!(
            conf,
            "{SETTINGS}unix_socket_directories = '{}'",
            socket_dir.replace('\'', "''")
        )
        .map_err(|e| format!("cannot write postgresql.conf: {e}"))?;
        drop(conf);

        let mut attempt = 0;
        let port = loop {
            attempt += 1;
            let port = free_port()?;
            let mut start = runner.command(&pg_ctl);
            start
                .arg("start")
                .arg("-D")
                .arg(&data_dir)
                .arg("-l")
                .arg(&log_file)
                .args(["-w", "-t", "60", "-s", "-o"])
                .arg(format!("-p {port}"))
                .current_dir(&dir);
            let output = start
                .output()
                .map_err(|e| format!("cannot run {}: {e}", pg_ctl.display()))?;
            if output.status.success() {
                break port;
            }
            let log = log_tail(&log_file);
            let port_taken = log.contains("could not bind") || log.contains("already in use");
            if !(port_taken && attempt < START_ATTEMPTS) {
                return Err(format!(
                    "pg_ctl start failed ({}): {}\n--- tail of {} ---\n{log}",
                    output.status,
                    output_text(&output),
                    log_file.display()
                ));
            }
        };

        Ok(Cluster {
            dir,
            data_dir,
            log_file,
            port,
            run_as,
            startup: began.elapsed(),
            _watchdog: Mutex::new(watchdog),
        })
    }

    /// The cluster's directory: data directory, socket and log live in it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory of the server's unix socket (the cluster directory).
    pub fn socket_dir(&self) -> &Path {
        &self.dir
    }

    /// The server's log file.
    pub fn log_file(&self) -> &Path {
        &self.log_file
    }

    /// The TCP port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The operating-system user the server runs as, when it is not this process's user.
    pub fn run_as(&self) -> Option<&str> {
        self.run_as.as_deref()
    }

    /// How long initialising and starting the cluster took.
    pub fn startup_duration(&self) -> Duration {
        self.startup
    }

    /// The postmaster's process id, from `postmaster.pid`.
    pub fn postmaster_pid(&self) -> Option<u32> {
        let text = std::fs::read_to_string(self.data_dir.join("postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }

    /// Superuser connection to the `postgres` database over TCP.
    pub fn admin_config(&self) -> Config {
        let mut config = Config::new();
        config
            .host("127.0.0.1")
            .port(self.port)
            .user(SUPERUSER)
            .dbname("postgres")
            .application_name("magic_sync_testdb");
        config
    }
}

/// Runs PostgreSQL programs, through `runuser` when a user is given.
struct Runner {
    prefix: Vec<OsString>,
    owner: Option<(u32, u32)>,
}

impl Runner {
    fn new(user: Option<String>) -> Result<Runner, String> {
        let Some(user) = user else {
            return Ok(Runner {
                prefix: Vec::new(),
                owner: None,
            });
        };
        let uid = id_of(&user, "-u")?;
        let gid = id_of(&user, "-g")?;
        let prefix = if let Some(runuser) = bins::find_in_path("runuser") {
            vec![runuser.into(), "-u".into(), user.into(), "--".into()]
        } else if let Some(sudo) = bins::find_in_path("sudo") {
            vec![
                sudo.into(),
                "-n".into(),
                "-u".into(),
                user.into(),
                "--".into(),
            ]
        } else {
            return Err(format!(
                "running as root, but neither runuser nor sudo was found to run PostgreSQL as {user}"
            ));
        };
        Ok(Runner {
            prefix,
            owner: Some((uid, gid)),
        })
    }

    fn command(&self, program: &Path) -> Command {
        let mut command = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut command = Command::new(first);
                command.args(rest).arg(program);
                command
            }
            None => Command::new(program),
        };
        command.env("LC_ALL", "C").stdin(Stdio::null());
        command
    }
}

/// Whether this process's effective user is root.
fn running_as_root() -> Result<bool, String> {
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        // "Uid:\t<real>\t<effective>\t<saved>\t<fs>"
        if let Some(euid) = status
            .lines()
            .find_map(|line| line.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
        {
            return Ok(euid == "0");
        }
    }
    let output = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("cannot run `id -u`: {e}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).trim() == "0")
}

fn id_of(user: &str, flag: &str) -> Result<u32, String> {
    let output = Command::new("id")
        .arg(flag)
        .arg(user)
        .output()
        .map_err(|e| format!("cannot run `id`: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .trim()
        .parse()
        .map_err(|_| {
            format!(
                "running as root, but user {user:?} to run PostgreSQL as does not exist \
                 (set {PG_USER_ENV}): {}",
                output_text(&output)
            )
        })
}

/// `/tmp/magic_sync_pg.<pid>.<random>`, mode 0755, owned by the server's user.
/// `/tmp` rather than `$TMPDIR`: every parent must be traversable by that user,
/// and the socket path must stay short.
fn create_cluster_dir(runner: &Runner) -> Result<PathBuf, String> {
    let base = if Path::new("/tmp").is_dir() {
        PathBuf::from("/tmp")
    } else {
        std::env::temp_dir()
    };
    let mut tries = 0;
    let dir = loop {
        tries += 1;
        let candidate = base.join(format!(
            "magic_sync_pg.{}.{:012x}",
            std::process::id(),
            crate::random_u64() & 0xffff_ffff_ffff
        ));
        match std::fs::create_dir(&candidate) {
            Ok(()) => break candidate,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && tries < 10 => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", candidate.display())),
        }
    };
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
    if let Some((uid, gid)) = runner.owner {
        if let Err(e) = std::os::unix::fs::chown(&dir, Some(uid), Some(gid)) {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("cannot chown {}: {e}", dir.display()));
        }
    }
    Ok(dir)
}

fn spawn_watchdog(
    runner: &Runner,
    dir: &Path,
    data_dir: &Path,
    pg_ctl: &Path,
) -> std::io::Result<ChildStdin> {
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG_SCRIPT)
        .arg("magic_sync_pg_watchdog")
        .arg(dir)
        .arg(data_dir)
        .args(&runner.prefix)
        .arg(pg_ctl)
        .env("LC_ALL", "C")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Its own process group: a Ctrl-C aimed at the tests must not reach it.
        .process_group(0)
        .spawn()?;
    // Our end of the pipe is close-on-exec, so no other child inherits it; the
    // child handle itself can go, the watchdog outlives this process anyway.
    child
        .stdin
        .take()
        .ok_or_else(|| std::io::Error::other("watchdog has no stdin"))
}

/// A port on 127.0.0.1 that was free a moment ago.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("cannot find a free port: {e}"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(|e| format!("cannot find a free port: {e}"))
}

fn run(command: &mut Command, what: &str) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|e| format!("cannot run {what}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            output.status,
            output_text(&output)
        ))
    }
}

fn output_text(output: &Output) -> String {
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    text.trim().to_owned()
}

fn log_tail(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read the log: {e})"),
    }
}

//! PostgreSQL clusters started by this process: throwaway ones living as long
//! as it ([`Cluster::start`]) and kept ones that later runs continue
//! ([`Cluster::keep`]).

use std::ffi::OsString;
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Output, Stdio};
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
/// How long a kept cluster's start waits for the processes of a crashed
/// server to let go of its shared memory.
const OLD_PROCESSES_WAIT: Duration = Duration::from_secs(10);
/// How long [`Cluster::keep`] waits for a server still running in its
/// directory (typically the previous run's, being stopped by its watchdog).
const PREVIOUS_SERVER_WAIT: Duration = Duration::from_secs(30);
/// How often the waits above look again.
const POLL: Duration = Duration::from_millis(100);
/// Longest cluster directory whose socket path (`<dir>/.s.PGSQL.<port>`)
/// still fits the 108 bytes (with the terminating NUL) of `sun_path`.
const MAX_SOCKET_DIR_LEN: usize = 107 - "/.s.PGSQL.65535".len();
/// Name, inside a kept cluster's directory, of the data directory while
/// `initdb` fills it; renamed to `data` once complete.
const INITDB_DIR_NAME: &str = "data.initdb";

/// Settings appended to `postgresql.conf`: a disposable cluster needs no durability.
const SETTINGS: &str = "
# magic_sync_testdb: a test cluster, without durability
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
/// the [`Cluster`] is dropped or the process holding the pipe's write end has
/// exited, however it ended. Then, for a throwaway cluster (`throwaway`),
/// stops the server and deletes the cluster directory; for a kept one
/// (`keep`), only stops the server, with a fast shutdown. Exits with status 0
/// when that worked. Arguments: mode, cluster directory, data directory, then
/// the `pg_ctl` command (possibly behind `runuser`).
///
/// A kept cluster's server is stopped by its process, whose id comes first
/// on the pipe ([`Watchdog::follow`]), not by its directory: the next run's
/// `keep` starts a server there as soon as this one is gone, and `pg_ctl`
/// given the directory could stop that one instead (it did, reading the new
/// server's pid file half written, then escalating to an immediate stop).
const WATCHDOG_SCRIPT: &str = r#"
trap '' HUP INT QUIT TERM PIPE
mode=$1
dir=$2
data=$3
shift 3
if [ "$mode" = keep ]; then
    read -r pid
    cat >/dev/null 2>&1
    case $pid in
        ''|*[!0-9]*) pid=$(head -n 1 "$data/postmaster.pid" 2>/dev/null) ;;
    esac
    case $pid in
        ''|*[!0-9]*) exit 0 ;;
    esac
    gone() {
        i=0
        while kill -0 "$pid" 2>/dev/null; do
            [ "$i" -lt 600 ] || return 1
            sleep 0.1
            i=$((i + 1))
        done
    }
    # To the postmaster, SIGINT is a fast shutdown and SIGQUIT an immediate one.
    kill -INT "$pid" 2>/dev/null
    gone || { kill -QUIT "$pid" 2>/dev/null; gone; }
    exit
fi
cat >/dev/null 2>&1
"$@" stop -D "$data" -m immediate -w -t 60 -s >/dev/null 2>&1
if [ -f "$data/postmaster.pid" ]; then
    pid=$(head -n 1 "$data/postmaster.pid")
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null
fi
rm -rf "$dir"
[ ! -e "$dir" ]
"#;

/// What happens to a cluster when its [`Cluster`] is dropped or the process exits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Stopped and its directory deleted ([`Cluster::start`]).
    Throwaway,
    /// Only stopped ([`Cluster::keep`]).
    Kept,
}

impl Kind {
    fn watchdog_mode(self) -> &'static str {
        match self {
            Kind::Throwaway => "throwaway",
            Kind::Kept => "keep",
        }
    }
}

/// A PostgreSQL cluster started by this process, listening on `127.0.0.1`
/// and on a unix socket in its directory, with trust authentication and
/// superuser `postgres`.
///
/// A watchdog process stops the server when this value is dropped (the drop
/// waits for it) or, for the never-dropped one behind [`crate::server`], as
/// soon as the process has exited, however it exits. For a throwaway cluster
/// ([`Cluster::start`]) the watchdog then deletes the cluster directory; a
/// kept one ([`Cluster::keep`]) stays for the next run.
#[derive(Debug)]
pub struct Cluster {
    kind: Kind,
    dir: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    port: u16,
    run_as: Option<String>,
    startup: Duration,
    watchdog: Watchdog,
}

/// Where a cluster's pieces live.
struct Layout {
    dir: PathBuf,
    data_dir: PathBuf,
    log_file: PathBuf,
    pg_ctl: PathBuf,
}

impl Layout {
    fn new(bin_dir: &Path, dir: PathBuf) -> Layout {
        Layout {
            data_dir: dir.join("data"),
            log_file: dir.join("postgres.log"),
            pg_ctl: bin_dir.join("pg_ctl"),
            dir,
        }
    }

    fn into_cluster(
        self,
        kind: Kind,
        runner: Runner,
        port: u16,
        began: Instant,
        watchdog: Watchdog,
    ) -> Cluster {
        Cluster {
            kind,
            dir: self.dir,
            data_dir: self.data_dir,
            log_file: self.log_file,
            port,
            run_as: runner.user,
            startup: began.elapsed(),
            watchdog,
        }
    }
}

impl Cluster {
    /// Initialises and starts a new throwaway cluster with the programs in
    /// `bin_dir`, in a fresh directory under `/tmp` that is deleted again
    /// when this value is dropped or the process exits.
    ///
    /// Most code wants the process-wide [`crate::server`] instead.
    pub fn start(bin_dir: &Path) -> Result<Cluster, String> {
        let began = Instant::now();
        check_bin_dir(bin_dir)?;
        let runner = Runner::for_server()?;
        let layout = Layout::new(bin_dir, create_cluster_dir(&runner)?);

        // The watchdog comes first, so that whatever happens from here on the
        // directory (and any server started in it) is cleaned up.
        let watchdog = Watchdog::spawn(&runner, Kind::Throwaway, &layout).inspect_err(|_| {
            let _ = std::fs::remove_dir(&layout.dir);
        })?;

        let socket_dir = socket_dir_setting(&layout.dir)?;
        init_data_dir(&runner, bin_dir, &layout.dir, &layout.data_dir, socket_dir)?;
        let port = start_server(&runner, &layout)?;
        Ok(layout.into_cluster(Kind::Throwaway, runner, port, began, watchdog))
    }

    /// Starts the cluster kept in `dir`, with the programs in `bin_dir`,
    /// first creating `dir` (and its parents) and initialising the cluster
    /// when `dir/data/PG_VERSION` does not exist yet. Data written in an
    /// earlier run (of this or another process) is there again.
    ///
    /// `dir` holds the data directory `data`, the unix socket and the log
    /// `postgres.log`; it is made the server's user's (see
    /// [`Cluster::run_as`]), every folder above it must be enterable by that
    /// user, and its absolute path must stay short enough for a socket path
    /// (about 90 bytes). The server listens on a free port, chosen anew on
    /// every start, and has the same settings as a throwaway cluster, so
    /// without durability: an operating-system crash can damage it.
    ///
    /// The server is stopped (fast shutdown) when this value is dropped (the
    /// drop waits for it) or, when it never is, once the process has exited,
    /// however it exits. The directory is never deleted. One process at a
    /// time may use the directory: when a server is still running in it, this
    /// waits for it to stop (as it does once the previous run's watchdog is
    /// done) for up to 30 seconds, then fails.
    pub fn keep(bin_dir: &Path, dir: &Path) -> Result<Cluster, String> {
        let began = Instant::now();
        check_bin_dir(bin_dir)?;
        let runner = Runner::for_server()?;
        let layout = Layout::new(bin_dir, prepare_kept_dir(&runner, dir)?);
        let socket_dir = socket_dir_setting(&layout.dir)?;

        if layout.data_dir.join("PG_VERSION").is_file() {
            wait_until_stopped(&runner, &layout)?;
        } else {
            init_kept_data_dir(&runner, bin_dir, &layout, socket_dir)?;
        }

        // Only now, as it stops whatever server runs in the directory once
        // this value is gone, which must not be one still used by another process.
        let watchdog = Watchdog::spawn(&runner, Kind::Kept, &layout)?;
        let port = start_server(&runner, &layout)?;
        let mut cluster = layout.into_cluster(Kind::Kept, runner, port, began, watchdog);
        let pid = cluster.postmaster_pid();
        cluster.watchdog.follow(pid);
        Ok(cluster)
    }

    /// Stops the server now, and for a throwaway cluster deletes its
    /// directory, like dropping this value does, but reports failure.
    pub fn stop(self) -> Result<(), String> {
        let Cluster {
            kind,
            dir,
            mut watchdog,
            ..
        } = self;
        let status = watchdog.finish()?;
        if status.success() {
            Ok(())
        } else {
            Err(match kind {
                Kind::Throwaway => format!(
                    "the watchdog could not stop the server and delete {} ({status})",
                    dir.display()
                ),
                Kind::Kept => format!(
                    "the server in {} did not stop ({status}); see {}",
                    dir.display(),
                    dir.join("postgres.log").display()
                ),
            })
        }
    }

    /// Whether this is a kept cluster ([`Cluster::keep`]), whose directory
    /// outlives it, rather than a throwaway one ([`Cluster::start`]).
    pub fn is_kept(&self) -> bool {
        self.kind == Kind::Kept
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

    /// How long initialising (when needed) and starting the cluster took.
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
    /// The user the server runs as, when not this process's.
    user: Option<String>,
    prefix: Vec<OsString>,
    owner: Option<(u32, u32)>,
}

impl Runner {
    /// Runs the programs as `$MAGIC_SYNC_PG_USER` (default `postgres`) when
    /// this process is root, which PostgreSQL refuses to run as, else as is.
    fn for_server() -> Result<Runner, String> {
        if !running_as_root()? {
            return Ok(Runner {
                user: None,
                prefix: Vec::new(),
                owner: None,
            });
        }
        let user = std::env::var(PG_USER_ENV)
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| "postgres".to_owned());
        let uid = id_of(&user, "-u")?;
        let gid = id_of(&user, "-g")?;
        let prefix = if let Some(runuser) = bins::find_in_path("runuser") {
            vec![runuser.into(), "-u".into(), (&user).into(), "--".into()]
        } else if let Some(sudo) = bins::find_in_path("sudo") {
            vec![
                sudo.into(),
                "-n".into(),
                "-u".into(),
                (&user).into(),
                "--".into(),
            ]
        } else {
            return Err(format!(
                "running as root, but neither runuser nor sudo was found to run PostgreSQL as {user}"
            ));
        };
        Ok(Runner {
            user: Some(user),
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

/// Fails, saying how to install PostgreSQL, unless `bin_dir` holds `pg_ctl` and `initdb`.
fn check_bin_dir(bin_dir: &Path) -> Result<(), String> {
    match ["initdb", "pg_ctl"]
        .into_iter()
        .find(|program| !bin_dir.join(program).is_file())
    {
        None => Ok(()),
        Some(program) => Err(format!(
            "{} does not hold the PostgreSQL program {program}: {}",
            bin_dir.display(),
            bins::INSTALL_HINT
        )),
    }
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
    hand_over_dir(runner, &dir).inspect_err(|_| {
        let _ = std::fs::remove_dir(&dir);
    })?;
    Ok(dir)
}

/// `dir` (created when missing) as an absolute path, handed over to the
/// server's user, after checking that user can reach it.
fn prepare_kept_dir(runner: &Runner, dir: &Path) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let dir =
        std::fs::canonicalize(dir).map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    check_parents_enterable(runner, &dir)?;
    hand_over_dir(runner, &dir)?;
    Ok(dir)
}

/// Makes `dir` mode 0755 and, when the server runs as another user, that user's.
fn hand_over_dir(runner: &Runner, dir: &Path) -> Result<(), String> {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("cannot chmod {}: {e}", dir.display()))?;
    if let Some((uid, gid)) = runner.owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))
            .map_err(|e| format!("cannot chown {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Fails, naming the folder, when the server's user (if not this process's)
/// cannot enter one of the folders above `dir`, checked as that user.
fn check_parents_enterable(runner: &Runner, dir: &Path) -> Result<(), String> {
    let Some(user) = &runner.user else {
        return Ok(());
    };
    let mut parents: Vec<&Path> = dir.ancestors().skip(1).collect();
    parents.reverse();
    let mut check = runner.command(Path::new("sh"));
    check
        .args([
            "-c",
            r#"for d do [ -x "$d" ] || { printf '%s' "$d"; exit 1; }; done"#,
            "magic_sync_pg_check",
        ])
        .args(&parents);
    let output = check
        .output()
        .map_err(|e| format!("cannot run sh as {user}: {e}"))?;
    if output.status.success() {
        return Ok(());
    }
    let folder = String::from_utf8_lossy(&output.stdout);
    if folder.is_empty() {
        return Err(format!(
            "cannot check, as user {user}, the folders above {}: {}",
            dir.display(),
            output_text(&output)
        ));
    }
    Err(format!(
        "PostgreSQL runs as user {user}, who cannot enter the folder {folder} above the \
         cluster directory {}: every folder above it must be searchable by {user} \
         (e.g. `chmod o+x {folder}`), or choose another directory",
        dir.display()
    ))
}

/// The cluster directory as the `unix_socket_directories` value, if it is
/// UTF-8 and short enough for a socket path.
fn socket_dir_setting(dir: &Path) -> Result<&str, String> {
    let text = dir
        .to_str()
        .ok_or_else(|| format!("cluster path {} is not UTF-8", dir.display()))?;
    if text.len() > MAX_SOCKET_DIR_LEN {
        return Err(format!(
            "cluster path {text} is too long for the server's unix socket in it \
             ({} bytes, at most {MAX_SOCKET_DIR_LEN}): choose a shorter one",
            text.len()
        ));
    }
    Ok(text)
}

/// Runs `initdb` for `data_dir` and appends this crate's settings to its
/// `postgresql.conf`.
fn init_data_dir(
    runner: &Runner,
    bin_dir: &Path,
    dir: &Path,
    data_dir: &Path,
    socket_dir: &str,
) -> Result<(), String> {
    let mut initdb = runner.command(&bin_dir.join("initdb"));
    initdb
        .arg("-D")
        .arg(data_dir)
        .args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "-N",
        ])
        .current_dir(dir);
    run(&mut initdb, "initdb")?;

    let mut conf = std::fs::OpenOptions::new()
        .append(true)
        .open(data_dir.join("postgresql.conf"))
        .map_err(|e| format!("cannot open postgresql.conf: {e}"))?;
    writeln!(
        conf,
        "{SETTINGS}unix_socket_directories = '{}'",
        socket_dir.replace('\'', "''")
    )
    .map_err(|e| format!("cannot write postgresql.conf: {e}"))
}

/// Initialises a kept cluster's data directory: `initdb` fills a scratch
/// directory that becomes `data` only once complete, so an interrupted run
/// leaves no half-made cluster behind.
fn init_kept_data_dir(
    runner: &Runner,
    bin_dir: &Path,
    layout: &Layout,
    socket_dir: &str,
) -> Result<(), String> {
    let scratch = layout.dir.join(INITDB_DIR_NAME);
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch)
            .map_err(|e| format!("cannot remove the leftover {}: {e}", scratch.display()))?;
    }
    match std::fs::read_dir(&layout.data_dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(format!(
                    "{} holds no PG_VERSION, so it is no PostgreSQL data directory, but is \
                     not empty either: move it away",
                    layout.data_dir.display()
                ));
            }
            std::fs::remove_dir(&layout.data_dir)
                .map_err(|e| format!("cannot remove {}: {e}", layout.data_dir.display()))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", layout.data_dir.display())),
    }
    init_data_dir(runner, bin_dir, &layout.dir, &scratch, socket_dir)?;
    std::fs::rename(&scratch, &layout.data_dir).map_err(|e| {
        format!(
            "cannot rename {} to {}: {e}",
            scratch.display(),
            layout.data_dir.display()
        )
    })
}

/// Waits until no server runs in the kept cluster, failing after
/// [`PREVIOUS_SERVER_WAIT`]. A `postmaster.pid` whose process is gone (the
/// server was killed) counts as stopped: `pg_ctl status` says so, and the
/// server started next replaces the file.
fn wait_until_stopped(runner: &Runner, layout: &Layout) -> Result<(), String> {
    let deadline = Instant::now() + PREVIOUS_SERVER_WAIT;
    loop {
        let output = runner
            .command(&layout.pg_ctl)
            .arg("status")
            .arg("-D")
            .arg(&layout.data_dir)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", layout.pg_ctl.display()))?;
        // 0: running; 3: not running; 4: no readable data directory, which
        // starting the server reports better.
        if output.status.code() != Some(0) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "a server still runs in {} after {} s: is another process using this \
                 cluster? ({})",
                layout.dir.display(),
                PREVIOUS_SERVER_WAIT.as_secs(),
                output_text(&output).lines().next().unwrap_or_default()
            ));
        }
        std::thread::sleep(POLL);
    }
}

/// Starts the server on a free port and returns the port.
fn start_server(runner: &Runner, layout: &Layout) -> Result<u16, String> {
    let old_processes_deadline = Instant::now() + OLD_PROCESSES_WAIT;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let port = free_port()?;
        // A kept cluster's log holds earlier runs too: only this attempt's part counts.
        let log_start = std::fs::metadata(&layout.log_file).map_or(0, |m| m.len());
        let mut start = runner.command(&layout.pg_ctl);
        start
            .arg("start")
            .arg("-D")
            .arg(&layout.data_dir)
            .arg("-l")
            .arg(&layout.log_file)
            .args(["-w", "-t", "60", "-s", "-o"])
            .arg(format!("-p {port}"))
            .current_dir(&layout.dir);
        let output = start
            .output()
            .map_err(|e| format!("cannot run {}: {e}", layout.pg_ctl.display()))?;
        if output.status.success() {
            return Ok(port);
        }
        let log = log_tail(&layout.log_file, log_start);
        let port_taken = log.contains("could not bind") || log.contains("already in use");
        // After a crash of a kept cluster's server, its other processes may
        // hold its shared memory a little longer.
        let old_processes = log.contains("pre-existing shared memory block");
        if port_taken && attempt < START_ATTEMPTS {
            continue;
        }
        if old_processes && Instant::now() < old_processes_deadline {
            std::thread::sleep(POLL);
            continue;
        }
        return Err(format!(
            "pg_ctl start failed ({}): {}\n--- tail of {} ---\n{log}",
            output.status,
            output_text(&output),
            layout.log_file.display()
        ));
    }
}

/// The watchdog process and the write end of the pipe it waits on.
#[derive(Debug)]
struct Watchdog {
    pipe: Option<ChildStdin>,
    child: Child,
}

impl Watchdog {
    fn spawn(runner: &Runner, kind: Kind, layout: &Layout) -> Result<Watchdog, String> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("magic_sync_pg_watchdog")
            .arg(kind.watchdog_mode())
            .arg(&layout.dir)
            .arg(&layout.data_dir)
            .args(&runner.prefix)
            .arg(&layout.pg_ctl)
            .env("LC_ALL", "C")
            .current_dir("/")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Its own process group: a Ctrl-C aimed at this process must not reach it.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start the watchdog (sh): {e}"))?;
        // Our end of the pipe is close-on-exec, so no other child inherits it:
        // it closes when this value is dropped or the process exits.
        let pipe = child.stdin.take();
        if pipe.is_none() {
            let _ = child.kill();
            let _ = child.wait();
            return Err("cannot start the watchdog: it has no stdin".to_owned());
        }
        Ok(Watchdog { pipe, child })
    }

    /// Tells a kept cluster's watchdog which server is its own: the
    /// postmaster `pid`. Without it (`None`, or a watchdog gone) it reads
    /// the pid file when it stops the server.
    fn follow(&mut self, pid: Option<u32>) {
        if let (Some(pipe), Some(pid)) = (self.pipe.as_mut(), pid) {
            let _ = writeln!(pipe, "{pid}");
        }
    }

    /// Lets the watchdog do its work and waits until it is done.
    fn finish(&mut self) -> Result<ExitStatus, String> {
        drop(self.pipe.take());
        self.child
            .wait()
            .map_err(|e| format!("cannot wait for the watchdog: {e}"))
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        let _ = self.finish();
    }
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

/// The last lines of the log written from byte `from` on.
fn log_tail(path: &Path, from: u64) -> String {
    let mut bytes = Vec::new();
    let read = std::fs::File::open(path).and_then(|mut file| {
        if file.metadata()?.len() >= from {
            file.seek(SeekFrom::Start(from))?;
        }
        file.read_to_end(&mut bytes)
    });
    match read {
        Ok(_) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
        }
        Err(e) => format!("(cannot read the log: {e})"),
    }
}

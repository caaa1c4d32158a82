//! `cargo xtask test [ARGS...]`: the README's test command.
//!
//! The tests need PostgreSQL's server binaries (they start a throwaway
//! cluster of their own when `DATABASE_URL` is unset), `nats-server` for the
//! broker transport's (each starts its own), for the dashboard's page
//! Debian's Chromium, Python 3 for the Python till's, and the system's
//! SQLite to link against (the library shares the app's, decision 169;
//! `libsqlite3-dev`). On a fresh
//! machine none may be there; this installs
//! whichever is missing with `apt-get` (through `sudo
//! -n` when not root), then runs `cargo test --workspace --all-features --no-fail-fast`
//! with any further arguments. With none, it runs the down path's suite
//! again with the rows a rule gives left to it (`MAGIC_SYNC_RECORD_RULED=0`),
//! the record's other form (`Settings::record_ruled_rows` off).
//! `.ci/run` calls the same command, so what a newcomer runs is what CI
//! runs.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command speaks to its operator"
)]

use std::path::Path;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        Some("test") => match test(args.collect()) {
            Ok(code) => code,
            Err(why) => {
                eprintln!("cargo xtask test: {why}");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask test [ARGS...]\n\n  test  installs PostgreSQL, nats-server, Chromium and \
                 Python 3 when missing, then runs cargo test --workspace --all-features --no-fail-fast [ARGS...]"
            );
            ExitCode::from(2)
        }
    }
}

fn test(extra: Vec<String>) -> Result<ExitCode, String> {
    let mut apt = Apt::default();
    // Every crate links the system's SQLite rather than compiling its own.
    apt.ensure(
        "libsqlite3-dev",
        have_sqlite_dev,
        "libsqlite3-dev",
        "no sqlite3.h is found",
    )?;
    apt.ensure(
        "PostgreSQL",
        have_initdb,
        "postgresql",
        "no initdb is found",
    )?;
    apt.ensure(
        "Chromium",
        have_chromium,
        "chromium",
        "no `chromium` is on PATH",
    )?;
    apt.ensure(
        "nats-server",
        have_nats_server,
        "nats-server",
        "no `nats-server` is found",
    )?;
    // The Python till's test runs the bindings with the standard library's
    // sqlite3 and ctypes.
    apt.ensure(
        "Python 3",
        have_python,
        "python3",
        "no `python3` with sqlite3 and ctypes",
    )?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let full = extra.is_empty();
    let status = Command::new(&cargo)
        // Every test binary runs even after one fails: a CI run says all
        // that is wrong, not only the first.
        .args(["test", "--workspace", "--all-features", "--no-fail-fast"])
        .args(&extra)
        .status()
        .map_err(|e| format!("cannot run cargo test: {e}"))?;
    let mut code = exit_code(status);
    if full {
        // The record's other form, the rows a rule gives left to it
        // (`Settings::record_ruled_rows` off): the down path's suite runs
        // in it too.
        let thinned = Command::new(&cargo)
            .env("MAGIC_SYNC_RECORD_RULED", "0")
            .args(["test", "--workspace", "--all-features", "--no-fail-fast"])
            .args(["--test", "down"])
            .status()
            .map_err(|e| format!("cannot run cargo test: {e}"))?;
        if code == 0 {
            code = exit_code(thinned);
        }
    }
    Ok(ExitCode::from(code))
}

/// A process's exit code as a test run's: 1 when it had none.
fn exit_code(status: std::process::ExitStatus) -> u8 {
    match status.code() {
        Some(code) => u8::try_from(code).unwrap_or(1),
        None => 1,
    }
}

/// Where the tests look for PostgreSQL's binaries (magic_sync_testdb's
/// order): `MAGIC_SYNC_PG_BIN`, `PATH`, `pg_config --bindir`, Debian's
/// versioned folders.
fn have_initdb() -> bool {
    if let Some(dir) = std::env::var_os("MAGIC_SYNC_PG_BIN") {
        if Path::new(&dir).join("initdb").is_file() {
            return true;
        }
    }
    if runs("initdb", &["--version"]) {
        return true;
    }
    let bindir = Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if bindir.is_some_and(|d| Path::new(&d).join("initdb").is_file()) {
        return true;
    }
    std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
        versions
            .flatten()
            .any(|v| v.path().join("bin/initdb").is_file())
    })
}

/// Where the broker transport's tests look for it: on `PATH`, or where
/// Debian's package puts it (`/usr/sbin`, which a user's `PATH` may lack).
fn have_nats_server() -> bool {
    runs("nats-server", &["--version"]) || Path::new("/usr/sbin/nats-server").is_file()
}

/// What linking SQLite needs: its header and library, as Debian's
/// `libsqlite3-dev` installs them (pkg-config finds them elsewhere).
fn have_sqlite_dev() -> bool {
    runs("pkg-config", &["--exists", "sqlite3"]) || Path::new("/usr/include/sqlite3.h").is_file()
}

fn have_python() -> bool {
    runs("python3", &["-c", "import ctypes, sqlite3"])
}

fn have_chromium() -> bool {
    runs("chromium", &["--version"]) || runs("chromium-browser", &["--version"])
}

fn runs(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Debian's package manager, updated once before the first install.
#[derive(Debug, Default)]
struct Apt {
    updated: bool,
}

impl Apt {
    /// Installs `package` unless `present` says `what` is there already,
    /// and checks it is there once installed (`missing` says what is not).
    fn ensure(
        &mut self,
        what: &str,
        present: fn() -> bool,
        package: &str,
        missing: &str,
    ) -> Result<(), String> {
        if present() {
            println!("xtask: {what} is installed");
            return Ok(());
        }
        self.install(package)?;
        match present() {
            true => Ok(()),
            false => Err(format!("installed {package}, and still {missing}")),
        }
    }

    fn install(&mut self, package: &str) -> Result<(), String> {
        println!("xtask: installing {package} (apt-get)");
        if !self.updated {
            self.run(&["update"])?;
            self.updated = true;
        }
        self.run(&["install", "-y", "--no-install-recommends", package])
    }

    fn run(&self, args: &[&str]) -> Result<(), String> {
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
        let mut command = if root {
            Command::new("apt-get")
        } else {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "apt-get"]);
            sudo
        };
        let status = command
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "apt-get {} failed ({status}); install it by hand and run again",
                args.join(" ")
            ))
        }
    }
}

//! The private cluster is stopped and deleted once the process that started
//! it has exited, although nothing in that process runs at exit.
//!
//! The test runs the crate's `testdb_child watchdog` as a child process,
//! which starts a cluster and exits, then watches the child's cluster
//! disappear.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

use std::net::{Ipv4Addr, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{process_alive, wait_until};

/// Upper bound for the watchdog to finish once the child is gone.
const CLEANUP_DEADLINE: Duration = Duration::from_secs(60);

#[test]
fn cluster_stops_after_process_exit() {
    if std::env::var_os("DATABASE_URL").is_some()
        && magic_sync_testdb::server().try_bin_dir().is_none()
    {
        eprintln!("skipped: DATABASE_URL is set and no PostgreSQL programs are installed");
        return;
    }

    let output = Command::new(env!("CARGO_BIN_EXE_testdb_child"))
        .arg("watchdog")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let value = |key: &str| -> String {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("child printed no {key}:\n{stdout}"))
            .to_owned()
    };
    let dir = PathBuf::from(value("cluster_dir"));
    let pid: u32 = value("postmaster_pid").parse().unwrap();
    let port: u16 = value("port").parse().unwrap();
    eprintln!("child cluster started in {} ms", value("startup_ms"));

    let deadline = Instant::now() + CLEANUP_DEADLINE;
    wait_until(
        deadline,
        || !dir.exists(),
        || format!("{} still exists", dir.display()),
    );
    wait_until(
        deadline,
        || !process_alive(pid),
        || format!("postmaster {pid} still runs"),
    );
    assert!(
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1))
            .is_err(),
        "something still listens on port {port}"
    );
}

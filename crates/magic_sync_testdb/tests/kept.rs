//! Kept clusters ([`Cluster::keep`]): stopped, never deleted, when their value
//! is dropped or their process exits, and found again by the next `keep` on
//! the same directory.
//!
//! One test runs the crate's `testdb_child keep` as a child process, which
//! keeps a cluster and exits without dropping it, to see what happens then.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::{process_alive, wait_until};

use magic_sync_testdb::Cluster;
use tokio_postgres::{Client, NoTls};

/// Upper bound for a server to stop.
const STOP_DEADLINE: Duration = Duration::from_secs(60);

/// The PostgreSQL programs, or `None` (the test is skipped) when there are
/// none and the tests use an existing server through `DATABASE_URL`.
fn bin_dir() -> Option<PathBuf> {
    match magic_sync_testdb::require_bin_dir() {
        Ok(dir) => Some(dir),
        Err(e) if std::env::var_os("DATABASE_URL").is_some() => {
            eprintln!("skipped: DATABASE_URL is set and {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

/// A temporary directory the server's user (`postgres`, when the tests run
/// as root) can enter, as every folder above a kept cluster must be.
fn enterable_tempdir() -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    tmp
}

/// Runs `sql` (statements without results) on the cluster's `postgres` database.
fn execute(cluster: &Cluster, sql: &str) {
    on_cluster(cluster, async |client| {
        client.batch_execute(sql).await.unwrap();
    });
}

/// The `int` first column of the rows of `query` on the cluster's `postgres` database.
fn ids(cluster: &Cluster, query: &str) -> Vec<i32> {
    on_cluster(cluster, async |client| {
        let rows = client.query(query, &[]).await.unwrap();
        rows.iter().map(|row| row.get(0)).collect()
    })
}

/// Runs `work` with a superuser connection to the cluster's `postgres` database.
fn on_cluster<T>(cluster: &Cluster, work: impl AsyncFnOnce(&Client) -> T) -> T {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = cluster.admin_config().connect(NoTls).await.unwrap();
        let connection = tokio::spawn(connection);
        let result = work(&client).await;
        drop(client);
        connection.await.unwrap().unwrap();
        result
    })
}

#[test]
fn dropped_kept_cluster_is_stopped_and_found_again() {
    let Some(bin_dir) = bin_dir() else { return };
    let tmp = enterable_tempdir();
    let dir = tmp.path().join("cluster");

    let cluster = Cluster::keep(&bin_dir, &dir).unwrap();
    assert!(cluster.is_kept());
    assert!(cluster.data_dir().join("PG_VERSION").is_file());
    execute(
        &cluster,
        "CREATE TABLE kept (id int PRIMARY KEY); INSERT INTO kept VALUES (1)",
    );
    let pid = cluster
        .postmaster_pid()
        .expect("postmaster.pid is readable");
    let data_dir = cluster.data_dir().to_owned();
    drop(cluster);

    // The drop has waited for the server to stop, and deleted nothing.
    assert!(!process_alive(pid), "postmaster {pid} still runs");
    assert!(!data_dir.join("postmaster.pid").exists());
    assert!(data_dir.join("PG_VERSION").is_file());

    let again = Cluster::keep(&bin_dir, &dir).unwrap();
    assert_eq!(again.data_dir(), data_dir);
    assert_eq!(ids(&again, "SELECT id FROM kept"), [1]);
    execute(&again, "INSERT INTO kept VALUES (2)");
    again.stop().unwrap();

    let third = Cluster::keep(&bin_dir, &dir).unwrap();
    assert_eq!(ids(&third, "SELECT id FROM kept ORDER BY id"), [1, 2]);
    third.stop().unwrap();
    assert!(data_dir.join("PG_VERSION").is_file());
}

#[test]
fn kept_cluster_starts_over_a_killed_server() {
    let Some(bin_dir) = bin_dir() else { return };
    let tmp = enterable_tempdir();
    let dir = tmp.path().join("cluster");

    let cluster = Cluster::keep(&bin_dir, &dir).unwrap();
    // Committed for sure before the crash despite `synchronous_commit = off`.
    execute(
        &cluster,
        "SET synchronous_commit = on; CREATE TABLE kept (id int); INSERT INTO kept VALUES (7)",
    );
    let pid = cluster.postmaster_pid().unwrap();
    let status = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    wait_until(
        Instant::now() + STOP_DEADLINE,
        || !process_alive(pid),
        || format!("postmaster {pid} still runs"),
    );
    // Nothing left to stop, which counts as stopped.
    cluster.stop().unwrap();
    let pid_file = dir.join("data").join("postmaster.pid");
    assert!(
        pid_file.exists(),
        "the killed server leaves its postmaster.pid"
    );

    let again = Cluster::keep(&bin_dir, &dir).unwrap();
    assert_ne!(again.postmaster_pid(), Some(pid));
    assert_eq!(ids(&again, "SELECT id FROM kept"), [7]);
    again.stop().unwrap();
}

#[test]
fn kept_cluster_is_stopped_at_process_exit() {
    let Some(bin_dir) = bin_dir() else { return };
    let tmp = enterable_tempdir();
    let dir = tmp.path().join("cluster");

    // The crate's child starts the kept cluster and exits.
    let output = Command::new(env!("CARGO_BIN_EXE_testdb_child"))
        .arg("keep")
        .arg(&bin_dir)
        .arg(&dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let pid: u32 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("postmaster_pid="))
        .unwrap_or_else(|| panic!("child printed no postmaster_pid:\n{stdout}"))
        .parse()
        .unwrap();

    wait_until(
        Instant::now() + STOP_DEADLINE,
        || !process_alive(pid),
        || format!("postmaster {pid} still runs"),
    );
    assert!(dir.join("data").join("PG_VERSION").is_file());

    // Right away, even while the child's watchdog may still be finishing.
    let again = Cluster::keep(&bin_dir, &dir).unwrap();
    assert_eq!(ids(&again, "SELECT id FROM kept"), [42]);
    again.stop().unwrap();
}

#[test]
fn unreachable_kept_directory_is_named() {
    let Some(bin_dir) = bin_dir() else { return };
    // This process's, mode 0700: only another user cannot enter it.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let dir = tmp.path().join("cluster");
    match Cluster::keep(&bin_dir, &dir) {
        Err(e) => {
            assert!(e.contains("cannot enter"), "{e}");
            assert!(e.contains(&tmp.path().display().to_string()), "{e}");
        }
        // The server runs as this process's user, who can.
        Ok(cluster) => {
            assert_eq!(cluster.run_as(), None);
            cluster.stop().unwrap();
        }
    }
}

//! A process for this crate's own tests to start and watch die: it starts a
//! cluster as a test process would, prints what its parent needs to find
//! it, and exits without cleaning anything up, so that only the watchdog
//! can stop it.
//!
//! - `testdb_child watchdog`: a private cluster (with a table in a test
//!   database); prints `cluster_dir=`, `postmaster_pid=`, `port=` and
//!   `startup_ms=`.
//! - `testdb_child keep BIN_DIR DIR`: a kept cluster at `DIR`, run by the
//!   programs in `BIN_DIR`, holding table `kept` with the row 42; prints
//!   `postmaster_pid=`.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command speaks to its operator"
)]

use magic_sync_testdb::Cluster;
use std::path::Path;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["watchdog"] => runtime.block_on(watchdog()),
        ["keep", bin_dir, dir] => runtime.block_on(keep(Path::new(bin_dir), Path::new(dir))),
        _ => {
            eprintln!("usage: testdb_child watchdog | testdb_child keep BIN_DIR DIR");
            std::process::exit(2);
        }
    }
}

async fn watchdog() {
    let server = magic_sync_testdb::server();
    let cluster = server
        .cluster()
        .expect("the child must run a private cluster");
    {
        let db = magic_sync_testdb::database().await;
        let client = db.connect().await;
        client
            .batch_execute("CREATE TABLE alive (x int)")
            .await
            .expect("a table in the child's database");
    }
    let pid = cluster
        .postmaster_pid()
        .expect("postmaster.pid is readable");
    println!("cluster_dir={}", cluster.dir().display());
    println!("postmaster_pid={pid}");
    println!("port={}", cluster.port());
    println!("startup_ms={}", cluster.startup_duration().as_millis());
    // The cluster is never dropped: only the process's exit lets the
    // watchdog act.
}

async fn keep(bin_dir: &Path, dir: &Path) {
    let cluster = Cluster::keep(bin_dir, dir).expect("a kept cluster");
    let (client, connection) = cluster
        .admin_config()
        .connect(tokio_postgres::NoTls)
        .await
        .expect("a connection to the kept cluster");
    let connection = tokio::spawn(connection);
    client
        .batch_execute("CREATE TABLE kept (id int); INSERT INTO kept VALUES (42); CHECKPOINT")
        .await
        .expect("the kept table");
    drop(client);
    let _ = connection.await;
    println!(
        "postmaster_pid={}",
        cluster
            .postmaster_pid()
            .expect("postmaster.pid is readable")
    );
    // Never dropped: only the process's exit lets the watchdog act.
    std::mem::forget(cluster);
}

//! `magic-sync-replica`, the ready binary, as an app that is not Rust
//! would run it: a process beside the app, a SQLite file they share, and
//! nothing of the host's declarations.

use crate::support::*;
use magic_sync_http::server::Security;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The longest any step waits.
const WAIT: Duration = Duration::from_secs(60);

/// The binary's process, killed when dropped (a failed test leaves none
/// running).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The binary running `till` against `server`, its secret in a file.
fn spawn(server: &Server, till: &str) -> Running {
    let secret = server.dir.path().join(format!("{till}.secret"));
    std::fs::write(&secret, &server.secrets[till]).unwrap();
    Command::new(env!("CARGO_BIN_EXE_magic-sync-replica"))
        .args(["--server", &server.url, "--id", till])
        .arg("--secret-file")
        .arg(&secret)
        .args(["--server-key", &server.key.to_string()])
        .arg("--db")
        .arg(server.path(till))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(Running)
        .unwrap()
}

/// `magic-sync-replica --status --json --db …` for `till`.
fn status(server: &Server, till: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_magic-sync-replica"))
        .args(["--status", "--json", "--db"])
        .arg(server.path(till))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn the_ready_binary_follows_the_server_and_sends_up_what_the_app_writes() {
    let mut server = server(&["t1"], hub_settings(), Security::Plain).await;
    server
        .client
        .execute(
            "INSERT INTO orders VALUES (1, 't1', 'first'), (2, 't2', 'not mine')",
            &[],
        )
        .await
        .unwrap();
    let child = spawn(&server, "t1");
    until("the binary's till to hold its share", WAIT, async || {
        agrees(&server, "t1").await
    })
    .await;

    // The app, on a connection of its own, writes a sale.
    let app = rusqlite::Connection::open(server.path("t1")).unwrap();
    app.busy_timeout(Duration::from_secs(5)).unwrap();
    app.execute(
        "INSERT INTO sales (id, till, total) VALUES ('s1', 't1', '2.50')",
        [],
    )
    .unwrap();
    until("the server to file the app's sale", WAIT, async || {
        server
            .client
            .query_opt(
                "SELECT total::text FROM sales WHERE id = 's1' AND till = 't1'",
                &[],
            )
            .await
            .unwrap()
            .is_some_and(|r| r.get::<_, String>(0) == "2.50")
    })
    .await;
    until("the till to know its sale filed", WAIT, async || {
        status(&server, "t1")["unfiled"] == 0
    })
    .await;
    let told = status(&server, "t1");
    assert_eq!(told["ready"], true, "{told}");
    assert!(told["applied"].as_u64().is_some_and(|n| n > 0), "{told}");

    // A change on the server reaches the app's file.
    server
        .client
        .execute("UPDATE orders SET note = 'changed' WHERE id = 1", &[])
        .await
        .unwrap();
    until("the change to reach the till", WAIT, async || {
        agrees(&server, "t1").await
    })
    .await;
    drop(child);
    server.stop().await;
}

#[test]
fn status_of_a_file_that_is_no_replica_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_magic-sync-replica"))
        .args(["--status", "--db"])
        .arg(dir.path().join("missing.sqlite"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("cannot read the replica at") && said.contains("missing.sqlite"),
        "{said}"
    );
}

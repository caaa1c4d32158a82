//! A till process (the demo's, whose body is `magic_sync::run::process::run`,
//! as `magic_sync_http::cli` and `magic_sync_nats::cli` run theirs) ends
//! cleanly on SIGTERM: it closes its link, its loop returns, and it exits
//! with success. Before, its signal handling panicked at start and
//! SIGTERM killed it outright. Its server key begins with `-`, which its
//! command line once refused.

#![cfg(unix)]

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A port nothing listens on: bound, then let go.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ends_cleanly_on_sigterm(link: &[&str], secret: &str) {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = dir.path().join("secret");
    std::fs::write(&secret_file, format!("{secret}\n")).unwrap();
    // A key that begins with `-`, as one in 64 does: the till takes it as
    // the key, not as an option (a till once exited at once on one).
    let key = (0..u16::MAX)
        .map(|i| {
            let mut seed = [0u8; 32];
            seed[..2].copy_from_slice(&i.to_le_bytes());
            magic_sync::sign::Signer::new(&seed, Vec::new()).public()
        })
        .find(|k| k.to_string().starts_with('-'))
        .expect("one key in 64 begins with `-`");
    let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
        .args(link)
        .arg("--id")
        .arg("till-1")
        .arg("--server-key")
        .arg(key.to_string())
        .arg("--db")
        .arg(dir.path().join("till.sqlite"))
        .arg(if link[0] == "till" {
            "--secret-file"
        } else {
            "--seed-file"
        })
        .arg(&secret_file)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // What it says, line by line, as it says it.
    let (said, lines) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = said.send(line);
        }
    });
    // It has started its loop (and its signal handling before it) once it
    // says why it cannot connect: nothing listens.
    let mut heard = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !heard.iter().any(|l: &String| l.contains("trying again")) {
        let left = deadline.saturating_duration_since(Instant::now());
        match lines.recv_timeout(left) {
            Ok(line) => heard.push(line),
            Err(_) => panic!("{link:?}: never said it was trying again: {heard:#?}"),
        }
    }
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "{link:?}: still running 30 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    reader.join().unwrap();
    heard.extend(lines.try_iter());
    assert!(
        status.success(),
        "{link:?}: SIGTERM ended it with {status}: {heard:#?}"
    );
    assert!(
        !heard.iter().any(|l| l.contains("panicked")),
        "{link:?}: {heard:#?}"
    );
}

#[test]
fn a_till_over_a_socket_ends_cleanly_on_sigterm() {
    let server = format!("ws://127.0.0.1:{}", closed_port());
    ends_cleanly_on_sigterm(&["till", "--server", &server], "a secret");
}

#[test]
fn a_till_through_a_broker_ends_cleanly_on_sigterm() {
    let broker = format!("nats://127.0.0.1:{}", closed_port());
    let seed = magic_sync_nats::access::Credentials::issue();
    ends_cleanly_on_sigterm(&["till-broker", "--broker", &broker], seed.seed());
}

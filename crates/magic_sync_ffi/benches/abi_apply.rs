//! A replica provisioned through the C ABI, against the same replica run
//! by its Rust loop: the same server, the same snapshot, one fresh till
//! each, alternating. Timed from its first message applied to ready, so
//! that connecting and the relay's noticing a new till (the same for both,
//! and most of the spread) are left out. What the ABI adds to applying is
//! its callback and its locks per message; the bound is 1.1x.
//!
//! `cargo bench -p magic_sync_ffi --bench abi_apply`
//! (`MAGIC_SYNC_BENCH_ROUNDS`, default 8; `MAGIC_SYNC_BENCH_ROWS`, the
//! products every till holds, default 100,000).
#![allow(
    unsafe_code,
    clippy::print_stdout,
    reason = "a benchmark calls the C ABI as an app does, and prints its figures"
)]

#[path = "../tests/abi/support.rs"]
#[allow(dead_code, reason = "the tests' server; the benchmark uses part of it")]
mod support;

use magic_sync::replica::Replica;
use magic_sync_ffi::*;
use magic_sync_http::client::{Settings, Socket};
use std::ffi::c_char;
use std::ptr::null_mut;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{c, c_path, take, Server};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).map_or(default, |v| v.parse().expect(name))
}

/// How often readiness is asked, the same on both sides.
const LOOK: Duration = Duration::from_millis(2);

/// The Rust loop on a thread, over a socket: from opening to ready.
fn rust(server: &Server, till: &str) -> Duration {
    let path = server.path(till);
    let key: magic_sync::sign::ServerKey = server.key.parse().unwrap();
    let mut replica = Replica::open_described(&path, till).unwrap();
    replica.trust(&key).unwrap();
    let socket = Arc::new(
        Socket::connect(Settings::new(server.url.clone(), till, server.secret(till))).unwrap(),
    );
    let link = socket.clone();
    let thread = std::thread::spawn(move || {
        magic_sync::run::replica::replica(&mut replica, &*link).unwrap();
    });
    let started = wait(|| {
        magic_sync::replica::status_at(&path)
            .map(|s| (s.applied.is_some(), s.ready))
            .unwrap_or_default()
    });
    let took = started.elapsed();
    socket.close();
    thread.join().unwrap();
    took
}

/// The same through the C ABI: open, run, ask its status until ready.
fn abi(server: &Server, till: &str) -> Duration {
    let (url, secret, key) = (c(&server.url), c(server.secret(till)), c(&server.key));
    let mut r = null_mut();
    unsafe {
        assert_eq!(
            ms_replica_open(
                c_path(&server.path(till)).as_ptr(),
                c(till).as_ptr(),
                &mut r
            ),
            ms_code::MS_OK
        );
        assert_eq!(
            ms_replica_run(r, url.as_ptr(), secret.as_ptr(), key.as_ptr()),
            ms_code::MS_OK
        );
    }
    let started = wait(|| {
        let mut json: *mut c_char = null_mut();
        assert_eq!(unsafe { ms_replica_status(r, &mut json) }, ms_code::MS_OK);
        let status: serde_json::Value = serde_json::from_str(&take(json)).unwrap();
        (!status["applied"].is_null(), status["ready"] == true)
    });
    let took = started.elapsed();
    assert_eq!(unsafe { ms_replica_close(r) }, ms_code::MS_OK);
    took
}

/// Asks `look` (first message applied, ready) every [`LOOK`] until ready;
/// returns when the first message was seen applied.
fn wait(mut look: impl FnMut() -> (bool, bool)) -> Instant {
    let mut first = None;
    loop {
        let (applied, ready) = look();
        if applied && first.is_none() {
            first = Some(Instant::now());
        }
        if ready {
            return first.unwrap_or_else(Instant::now);
        }
        std::thread::sleep(LOOK);
    }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let rounds = env("MAGIC_SYNC_BENCH_ROUNDS", 8);
    let rows = env("MAGIC_SYNC_BENCH_ROWS", 100_000);
    let server = Server::start_with(2 * rounds, rows as i64);
    let (mut by_rust, mut by_abi) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let (a, b) = (format!("t{}", 2 * i + 1), format!("t{}", 2 * i + 2));
        // Alternating which goes first, so neither always meets a warmer
        // server.
        if i % 2 == 0 {
            by_rust.push(rust(&server, &a));
            by_abi.push(abi(&server, &b));
        } else {
            by_abi.push(abi(&server, &a));
            by_rust.push(rust(&server, &b));
        }
        println!(
            "round {}: rust {:.1} ms, abi {:.1} ms",
            i + 1,
            by_rust[i].as_secs_f64() * 1e3,
            by_abi[i].as_secs_f64() * 1e3
        );
    }
    let (r, a) = (median(by_rust), median(by_abi));
    println!(
        "provisioning a till of {rows} rows, first message applied to ready, median of {rounds}: \
         rust loop {:.1} ms, C ABI {:.1} ms: abi / rust {:.2}x (target <= 1.1x)",
        r.as_secs_f64() * 1e3,
        a.as_secs_f64() * 1e3,
        a.as_secs_f64() / r.as_secs_f64()
    );
}

//! The library's functions called from Rust exactly as C calls them.

use crate::support::*;
use magic_sync_ffi::*;
use magic_sync_testkit::until_within;
use std::ffi::{c_char, c_void};
use std::ptr::{null, null_mut};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest any step waits.
const WAIT: Duration = Duration::from_secs(60);

fn open(path: &std::path::Path, id: &str) -> *mut ms_replica {
    let mut r = null_mut();
    let code = unsafe { ms_replica_open(c_path(path).as_ptr(), c(id).as_ptr(), &mut r) };
    assert_eq!(code, ms_code::MS_OK, "{:?}", last_error());
    r
}

fn status(r: *mut ms_replica) -> serde_json::Value {
    let mut json: *mut c_char = null_mut();
    let code = unsafe { ms_replica_status(r, &mut json) };
    assert_eq!(code, ms_code::MS_OK, "{:?}", last_error());
    serde_json::from_str(&take(json)).unwrap()
}

#[test]
fn an_app_through_the_c_abi_holds_its_share_and_its_writes_go_up() {
    let server = Server::start();
    let path = server.path("t1");
    let r = open(&path, "t1");
    let (sender, applied_numbers) = mpsc::channel::<u64>();
    let context = &sender as *const mpsc::Sender<u64> as *mut c_void;
    assert_eq!(
        unsafe { ms_replica_on_applied(r, Some(applied), context) },
        ms_code::MS_OK
    );
    let (url, secret, key) = (c(&server.url), c(server.secret("t1")), c(&server.key));
    let run = |r| unsafe { ms_replica_run(r, url.as_ptr(), secret.as_ptr(), key.as_ptr()) };
    assert_eq!(run(r), ms_code::MS_OK, "{:?}", last_error());
    assert_eq!(run(r), ms_code::MS_RUNNING, "a second loop on one replica");
    assert!(last_error().unwrap().contains("runs already"));

    // Each message applied is told; the replica is ready, holding its share.
    let started = Instant::now();
    let mut told = Vec::new();
    while !(status(r)["ready"] == true && server.agrees("t1")) {
        let left = WAIT.saturating_sub(started.elapsed());
        let number = applied_numbers
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("not ready in {WAIT:?}: {}", status(r)));
        told.push(number);
    }
    assert!(!told.is_empty(), "no message told");
    // Messages may still come once it holds its share (the relay goes on
    // working): each is told, up to the last it applied.
    let applied = status(r)["applied"].as_u64().expect("a number applied");
    while *told.last().unwrap() < applied {
        let left = WAIT.saturating_sub(started.elapsed());
        let number = applied_numbers
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("message {applied} applied, not told: {told:?}"));
        told.push(number);
    }
    let now = status(r);
    assert_eq!(
        (&now["running"], &now["connected"], &now["link_error"]),
        (&true.into(), &true.into(), &serde_json::Value::Null),
        "{now}"
    );
    assert!(
        told.windows(2).all(|w| w[0] < w[1]),
        "told out of order: {told:?}"
    );
    assert_eq!(applied, *told.last().unwrap());

    // Stopped, the replica keeps what the app writes on a connection of its
    // own; run again, it sends it up, and the app waits until it is filed.
    assert_eq!(
        unsafe { ms_replica_stop(r) },
        ms_code::MS_OK,
        "{:?}",
        last_error()
    );
    let app = rusqlite::Connection::open(&path).unwrap();
    app.busy_timeout(Duration::from_secs(5)).unwrap();
    app.execute(
        "INSERT INTO sales (id, till, total) VALUES ('s1', 't1', '2.50')",
        [],
    )
    .unwrap();
    let progress = || {
        let mut json = null_mut();
        assert_eq!(unsafe { ms_replica_progress(r, &mut json) }, ms_code::MS_OK);
        serde_json::from_str::<serde_json::Value>(&take(json)).unwrap()
    };
    assert_eq!(
        progress(),
        serde_json::json!({"tables": [{"table": "sales", "unsent": 1, "unfiled": 0}]})
    );
    let mut mark = 0;
    assert_eq!(unsafe { ms_replica_mark(r, &mut mark) }, ms_code::MS_OK);
    let mut written = ms_written::MS_WRITTEN_REACHED;
    assert_eq!(
        unsafe { ms_replica_written(r, mark, &mut written) },
        ms_code::MS_OK
    );
    assert_eq!(written, ms_written::MS_WRITTEN_HERE);
    assert_eq!(run(r), ms_code::MS_OK, "{:?}", last_error());
    let code = unsafe {
        ms_replica_wait_written(
            r,
            mark,
            ms_written::MS_WRITTEN_FILED as u32,
            WAIT.as_millis() as u64,
            &mut written,
        )
    };
    assert_eq!(code, ms_code::MS_OK, "{:?}", last_error());
    assert_ne!(
        written,
        ms_written::MS_WRITTEN_HERE,
        "not filed in {WAIT:?}"
    );
    assert_eq!(
        server.query("SELECT id || ':' || till || ':' || total FROM sales"),
        ["s1:t1:2.50"]
    );
    assert_eq!(progress(), serde_json::json!({"tables": []}));

    // Stopped and closed, the handle means nothing; the file keeps the
    // replica, which opens again following the description it kept.
    assert_eq!(
        unsafe { ms_replica_stop(r) },
        ms_code::MS_OK,
        "{:?}",
        last_error()
    );
    let now = status(r);
    assert_eq!(now["stopped"], serde_json::Value::Null, "{now}");
    assert_eq!(now["running"], false, "{now}");
    assert_eq!(unsafe { ms_replica_close(r) }, ms_code::MS_OK);
    let mut json = null_mut();
    assert_eq!(
        unsafe { ms_replica_status(r, &mut json) },
        ms_code::MS_INVALID_HANDLE
    );
    assert!(json.is_null());
    assert!(
        last_error().unwrap().contains("closed"),
        "{:?}",
        last_error()
    );
    let again = open(&path, "t1");
    assert_eq!(status(again)["ready"], true);
    assert_ne!(again, r, "a handle is never given twice");
    assert_eq!(unsafe { ms_replica_close(again) }, ms_code::MS_OK);
    drop(sender);
}

#[test]
fn wrong_arguments_are_codes_with_words_and_break_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t1.sqlite");
    let mut json = null_mut();

    // Null and unknown handles.
    assert_eq!(
        unsafe { ms_replica_status(null_mut(), &mut json) },
        ms_code::MS_INVALID_HANDLE
    );
    assert!(last_error().unwrap().contains("null"));
    let never = std::ptr::without_provenance_mut::<ms_replica>(usize::MAX);
    assert_eq!(
        unsafe { ms_replica_stop(never) },
        ms_code::MS_INVALID_HANDLE
    );
    assert_eq!(
        unsafe { ms_replica_close(never) },
        ms_code::MS_INVALID_HANDLE
    );

    // Null, and not UTF-8, arguments.
    let mut r = null_mut();
    let id = c("t1");
    assert_eq!(
        unsafe { ms_replica_open(null(), id.as_ptr(), &mut r) },
        ms_code::MS_INVALID_ARGUMENT
    );
    assert_eq!(last_error().as_deref(), Some("the path is null"));
    let not_utf8 = [b't', 0xff, 0];
    assert_eq!(
        unsafe { ms_replica_open(c_path(&path).as_ptr(), not_utf8.as_ptr().cast(), &mut r) },
        ms_code::MS_INVALID_ARGUMENT
    );
    assert_eq!(
        last_error().as_deref(),
        Some("the replica's id is not UTF-8")
    );
    assert_eq!(
        unsafe { ms_replica_open(c_path(&path).as_ptr(), id.as_ptr(), null_mut()) },
        ms_code::MS_INVALID_ARGUMENT
    );
    assert!(r.is_null(), "nothing handed out on a failure");

    // A key that is no key, and an address that is no socket's, leave the
    // replica as it was.
    let r = open(&path, "t1");
    assert_eq!(
        last_error(),
        None,
        "a call that went through clears the words"
    );
    // One handle per file, however the path is spelled.
    let again = dir.path().join(".").join("t1.sqlite");
    let mut second = null_mut();
    assert_eq!(
        unsafe { ms_replica_open(c_path(&again).as_ptr(), id.as_ptr(), &mut second) },
        ms_code::MS_INVALID_ARGUMENT
    );
    assert!(
        last_error().unwrap().contains("open already"),
        "{:?}",
        last_error()
    );
    assert!(second.is_null());
    let (url, secret) = (c("ws://127.0.0.1:9"), c("secret"));
    let code = unsafe { ms_replica_run(r, url.as_ptr(), secret.as_ptr(), c("nonsense").as_ptr()) };
    assert_eq!(code, ms_code::MS_INVALID_ARGUMENT);
    assert!(
        last_error().unwrap().starts_with("the server's key"),
        "{:?}",
        last_error()
    );
    let key = magic_sync::sign::Signer::new(&[7; 32], Vec::new())
        .public()
        .to_string();
    let code = unsafe {
        ms_replica_run(
            r,
            c("http://127.0.0.1:9").as_ptr(),
            secret.as_ptr(),
            c(&key).as_ptr(),
        )
    };
    assert_eq!(code, ms_code::MS_INVALID_ARGUMENT);
    assert!(
        last_error().unwrap().contains("ws://"),
        "{:?}",
        last_error()
    );
    // A key pinned refuses another: the till was enrolled with one server.
    assert_eq!(
        unsafe { ms_replica_trust(r, c(&key).as_ptr()) },
        ms_code::MS_OK
    );
    let other = magic_sync::sign::Signer::new(&[8; 32], Vec::new())
        .public()
        .to_string();
    assert_eq!(
        unsafe { ms_replica_trust(r, c(&other).as_ptr()) },
        ms_code::MS_STOP
    );
    let words = last_error().unwrap();
    assert!(words.contains(&key) && words.contains(&other), "{words}");
    let mut written = ms_written::MS_WRITTEN_HERE;
    assert_eq!(
        unsafe { ms_replica_wait_written(r, 0, 9, 0, &mut written) },
        ms_code::MS_INVALID_ARGUMENT
    );
    assert!(last_error().unwrap().contains("not an ms_written"));
    assert_eq!(
        unsafe { ms_replica_mark(r, null_mut()) },
        ms_code::MS_INVALID_ARGUMENT
    );
    assert_eq!(status(r)["ready"], false, "the replica is still there");
    assert_eq!(
        unsafe { ms_replica_stop(r) },
        ms_code::MS_OK,
        "stopping an idle replica"
    );
    unsafe { ms_string_free(null_mut()) };

    assert_eq!(unsafe { ms_replica_close(r) }, ms_code::MS_OK);
    assert_eq!(unsafe { ms_replica_close(r) }, ms_code::MS_INVALID_HANDLE);
    assert!(last_error().unwrap().contains("closed"));
}

#[test]
fn a_till_whose_secret_is_refused_says_so_in_its_status() {
    let server = Server::start();
    let r = open(&server.path("t1"), "t1");
    let (url, secret, key) = (c(&server.url), c("not t1's secret"), c(&server.key));
    let code = unsafe { ms_replica_run(r, url.as_ptr(), secret.as_ptr(), key.as_ptr()) };
    assert_eq!(code, ms_code::MS_OK, "{:?}", last_error());
    let mut told = String::new();
    server
        .runtime
        .block_on(until_within("the refusal to be told", WAIT, async || {
            told = status(r)["link_error"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            !told.is_empty()
        }));
    assert!(told.contains("refused"), "{told}");
    let now = status(r);
    assert_eq!(
        (&now["running"], &now["connected"]),
        (&true.into(), &false.into()),
        "{now}"
    );
    assert_eq!(now["ready"], false, "{now}");
    assert_eq!(
        unsafe { ms_replica_close(r) },
        ms_code::MS_OK,
        "{:?}",
        last_error()
    );
}

/// What the callback below was given, and where it says what it saw.
struct Asking {
    replica: *mut ms_replica,
    told: mpsc::Sender<(ms_code, ms_code, String)>,
}

/// Asks the status and tries to stop the loop from within the callback.
unsafe extern "C" fn ask_and_stop(context: *mut c_void, _message: u64) {
    let asking = unsafe { &*(context as *const Asking) };
    let mut json = null_mut();
    let status = unsafe { ms_replica_status(asking.replica, &mut json) };
    if status == ms_code::MS_OK {
        take(json);
    }
    let stop = unsafe { ms_replica_stop(asking.replica) };
    let words = last_error().unwrap_or_default();
    let _ = asking.told.send((status, stop, words));
}

#[test]
fn the_callback_may_ask_the_status_and_may_not_stop_its_own_loop() {
    let server = Server::start();
    let r = open(&server.path("t1"), "t1");
    let (told, heard) = mpsc::channel();
    let asking = Asking { replica: r, told };
    let context = &asking as *const Asking as *mut c_void;
    assert_eq!(
        unsafe { ms_replica_on_applied(r, Some(ask_and_stop), context) },
        ms_code::MS_OK
    );
    let (url, secret, key) = (c(&server.url), c(server.secret("t1")), c(&server.key));
    let code = unsafe { ms_replica_run(r, url.as_ptr(), secret.as_ptr(), key.as_ptr()) };
    assert_eq!(code, ms_code::MS_OK, "{:?}", last_error());
    let (asked, stop, words) = heard.recv_timeout(WAIT).expect("a message applied");
    assert_eq!(asked, ms_code::MS_OK, "the status, from the callback");
    assert_eq!(
        stop,
        ms_code::MS_INVALID_ARGUMENT,
        "a stop from the callback"
    );
    assert!(words.contains("its own callback"), "{words}");
    // The loop went on, and stops from here; the callback may run while
    // it stops, and asks the status meanwhile without a deadlock.
    server.runtime.block_on(until_within(
        "the till to hold its share",
        WAIT,
        async || server.agreeing("t1").await,
    ));
    assert_eq!(
        unsafe { ms_replica_stop(r) },
        ms_code::MS_OK,
        "{:?}",
        last_error()
    );
    assert_eq!(status(r)["running"], false);
    assert_eq!(unsafe { ms_replica_close(r) }, ms_code::MS_OK);
    drop(asking);
}

//! A replica for an app in any language, through a C ABI: the replica
//! follows the server's description of its tables
//! ([`Replica::open_described`]) and speaks to the server over the socket
//! transport, on a thread of its own. The header is `include/magic_sync.h`.
//!
//! What it holds to:
//!
//! - **Handles, not structs.** A `ms_replica *` is a number the library
//!   keeps in a table, never an address: a null handle, or one already
//!   closed, is [`ms_code::MS_INVALID_HANDLE`], never a crash, and a closed
//!   handle never comes to mean another replica.
//! - **Codes with words.** Every call returns an [`ms_code`];
//!   [`ms_last_error`] gives the words of the calling thread's last
//!   failure. No panic crosses the boundary: a panic is
//!   [`ms_code::MS_BUG`], with its message.
//! - **Strings in are the caller's, strings out the library's.** Arguments
//!   are NUL-terminated UTF-8 the caller keeps; a string the library hands
//!   out (status and progress as JSON) is given back with
//!   [`ms_string_free`].
//! - **The loop runs on a thread of its own.** [`ms_replica_run`] connects
//!   and returns; [`ms_replica_stop`] ends the loop after the message it
//!   applies. [`ms_replica_on_applied`] calls back on that thread after
//!   each message applied.
//!
//! The app writes its own records (tables that go up, owned columns) with
//! any SQLite driver, on a connection of its own: triggers note each
//! write, and the loop sends them up. [`ms_replica_mark`] and
//! [`ms_replica_wait_written`] say how far they went.
#![allow(
    unsafe_code,
    reason = "a C ABI reads the caller's pointers; each unsafe block says why it holds"
)]

use magic_sync::replica::{Handling, Mark, Replica, Written};
use magic_sync::run::replica::{Delivery, Link, Report};
use magic_sync::sign::ServerKey;
use magic_sync_http::client::{Settings, Socket};
use rusqlite::Connection;
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a call did. `MS_OK` is success; the next three are the kinds of
/// failure the engine itself tells apart, and say what to do next.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, reason = "C names")]
pub enum ms_code {
    /// It went through.
    MS_OK = 0,
    /// It failed on what may pass (the app held the file past the busy
    /// timeout): the same call again, later, may go through.
    MS_RETRY = 1,
    /// What it was about was left, and the rest goes on.
    MS_SET_ASIDE = 2,
    /// Only the app's operator can end it (a key not trusted, a file that
    /// cannot be written, a description it cannot follow): say it, and stop.
    MS_STOP = 3,
    /// The handle is null, or was closed.
    MS_INVALID_HANDLE = 4,
    /// An argument is null, not UTF-8, or not what it should be (a server
    /// key that is no key, an address that is no `ws://` or `wss://`).
    MS_INVALID_ARGUMENT = 5,
    /// The replica's loop runs: stop it first.
    MS_RUNNING = 6,
    /// A bug in the library: a panic, caught at the boundary.
    MS_BUG = 7,
}

/// How far the app's writes up to a mark went.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(non_camel_case_types, reason = "C names")]
pub enum ms_written {
    /// Some are on this replica only: not sent yet, or not filed yet.
    MS_WRITTEN_HERE = 0,
    /// The server filed them all; what it did because of them has not all
    /// come back yet.
    MS_WRITTEN_FILED = 1,
    /// Filed, and everything the server did because of them applied here:
    /// the app reads its own writes.
    MS_WRITTEN_REACHED = 2,
}

impl From<Written> for ms_written {
    fn from(written: Written) -> Self {
        match written {
            Written::Here => ms_written::MS_WRITTEN_HERE,
            Written::Filed => ms_written::MS_WRITTEN_FILED,
            Written::Reached => ms_written::MS_WRITTEN_REACHED,
        }
    }
}

/// A replica, as the app holds it: opaque, a number in the library's
/// table of open replicas.
#[allow(non_camel_case_types, reason = "C names")]
#[derive(Debug)]
pub struct ms_replica {
    _opaque: [u8; 0],
}

/// Called on the replica's thread with the number of each message applied,
/// and `context` as it was given. It must not block: the next message
/// waits for it.
#[allow(non_camel_case_types, reason = "C names")]
pub type ms_on_applied = Option<unsafe extern "C" fn(context: *mut c_void, message: u64)>;

/// A failure, before it is a code and words.
#[derive(Debug)]
struct Failure {
    code: ms_code,
    words: String,
}

impl Failure {
    fn new(code: ms_code, words: impl Into<String>) -> Failure {
        Failure {
            code,
            words: words.into(),
        }
    }

    fn argument(words: impl Into<String>) -> Failure {
        Failure::new(ms_code::MS_INVALID_ARGUMENT, words)
    }
}

impl From<magic_sync::replica::Error> for Failure {
    fn from(e: magic_sync::replica::Error) -> Failure {
        let code = match e.handling() {
            Handling::Retry => ms_code::MS_RETRY,
            Handling::SetAside => ms_code::MS_SET_ASIDE,
            Handling::Stop => ms_code::MS_STOP,
        };
        Failure::new(code, e.to_string())
    }
}

impl From<rusqlite::Error> for Failure {
    fn from(e: rusqlite::Error) -> Failure {
        magic_sync::replica::Error::from(e).into()
    }
}

thread_local! {
    /// The words of this thread's last failure.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Runs one call's body: its result as a code, its failure's words kept for
/// [`ms_last_error`], a panic caught.
fn call(body: impl FnOnce() -> Result<(), Failure>) -> ms_code {
    let failure = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => None,
        Ok(Err(failure)) => Some(failure),
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic with no message".to_string());
            Some(Failure::new(
                ms_code::MS_BUG,
                format!("a bug in magic_sync: {message}"),
            ))
        }
    };
    let code = failure.as_ref().map_or(ms_code::MS_OK, |f| f.code);
    let words = failure.map(|f| CString::new(f.words.replace('\0', " ")).unwrap_or_default());
    LAST_ERROR.with(|last| *last.borrow_mut() = words);
    code
}

/// What the library keeps of an open replica.
struct Handle {
    path: PathBuf,
    id: String,
    /// The app's questions (status, marks, progress) are read here, beside
    /// the loop's own connection.
    reader: Mutex<Connection>,
    state: Mutex<State>,
    /// Why the loop last ended on what only the app's operator can end.
    stopped: Arc<Mutex<Option<String>>>,
    on_applied: Arc<Mutex<Option<Callback>>>,
    /// PEM certificates the next run trusts in place of the system's roots.
    trust: Mutex<Option<PathBuf>>,
}

/// The replica, idle or lent to its loop.
enum State {
    Idle(Box<Replica>),
    Running {
        socket: Arc<Socket>,
        thread: JoinHandle<(Box<Replica>, magic_sync::replica::Result<()>)>,
    },
    /// A call is stopping its loop: the lock is not held while it waits,
    /// so the loop's callback may still ask where the replica stands.
    Stopping,
    /// Its loop panicked, and took the replica with it.
    Lost,
}

/// The app's callback and its context.
#[derive(Clone, Copy)]
struct Callback {
    function: unsafe extern "C" fn(*mut c_void, u64),
    context: *mut c_void,
}

// SAFETY: the context is the app's, handed to the replica's thread as
// `ms_replica_on_applied` documents: the app promises it may be used there.
unsafe impl Send for Callback {}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The open replicas, by the number their handle is.
static HANDLES: LazyLock<Mutex<HashMap<usize, Arc<Handle>>>> = LazyLock::new(Default::default);
/// The next handle's number; never 0 (null), never used twice.
static NEXT: AtomicUsize = AtomicUsize::new(1);

fn handle(r: *const ms_replica) -> Result<Arc<Handle>, Failure> {
    let number = r.addr();
    lock(&HANDLES).get(&number).cloned().ok_or_else(|| {
        Failure::new(
            ms_code::MS_INVALID_HANDLE,
            match number {
                0 => "the replica handle is null".to_string(),
                n => {
                    format!("no open replica has the handle {n:#x}: it was closed, or never opened")
                }
            },
        )
    })
}

/// The string at `s`, the argument `what`.
///
/// # Safety
///
/// `s` is null or a NUL-terminated string that lives through the call.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, Failure> {
    if s.is_null() {
        return Err(Failure::argument(format!("{what} is null")));
    }
    // SAFETY: not null, and NUL-terminated by the caller's promise.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| Failure::argument(format!("{what} is not UTF-8")))
}

/// Writes `value` to `out`, the argument `what`.
///
/// # Safety
///
/// `out` is null or points at a `T` the caller can be written to.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        return Err(Failure::argument(format!("{what} is null")));
    }
    // SAFETY: not null, and writable by the caller's promise.
    unsafe { out.write(value) };
    Ok(())
}

/// A string the app is given, freed with [`ms_string_free`].
fn handed(json: &serde_json::Value) -> *mut c_char {
    // JSON escapes every control character, NUL included.
    CString::new(json.to_string())
        .expect("JSON has no NUL")
        .into_raw()
}

/// The words of the calling thread's last failure, or null after a call
/// that went through. The library keeps them until this thread's next
/// call: copy them to keep them.
#[no_mangle]
pub extern "C" fn ms_last_error() -> *const c_char {
    LAST_ERROR.with(|last| {
        last.borrow()
            .as_ref()
            .map_or(std::ptr::null(), |s| s.as_ptr())
    })
}

/// Gives back a string the library handed out. Null is nothing to free.
///
/// # Safety
///
/// `s` is null, or a string this library handed out and not freed yet.
#[no_mangle]
pub unsafe extern "C" fn ms_string_free(s: *mut c_char) {
    if !s.is_null() {
        // SAFETY: made by `CString::into_raw` in `handed`, by the caller's
        // promise, and freed once.
        drop(unsafe { CString::from_raw(s) });
    }
}

/// Opens (or creates) the replica `id` in the SQLite file at `path`, and
/// hands back its handle in `out`. It holds no table until the server
/// describes them; reopened, it follows the description it kept.
///
/// # Safety
///
/// `path` and `id` are NUL-terminated strings; `out` points at a handle
/// the library may write.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_open(
    path: *const c_char,
    id: *const c_char,
    out: *mut *mut ms_replica,
) -> ms_code {
    call(|| {
        // SAFETY: the caller's promise, passed on.
        let (path, id) = unsafe { (text(path, "the path")?, text(id, "the replica's id")?) };
        if out.is_null() {
            return Err(Failure::argument("the handle's place (out) is null"));
        }
        let place = where_(path)?;
        // Held while the file opens: two opens of one file at once would
        // both find it free.
        let mut handles = lock(&HANDLES);
        if let Some((number, _)) = handles.iter().find(|(_, h)| h.path == place) {
            return Err(Failure::argument(format!(
                "the replica at {path} is open already (handle {number:#x}): one handle per file, \
                 or two loops would apply into it"
            )));
        }
        let replica = Replica::open_described(path, id).map_err(|e| {
            Failure::from(e).with_context(&format!("opening the replica at {path}"))
        })?;
        let reader = Connection::open(path)?;
        reader.busy_timeout(Duration::from_secs(5))?;
        let number = NEXT.fetch_add(1, Ordering::Relaxed);
        handles.insert(
            number,
            Arc::new(Handle {
                path: place,
                id: id.to_string(),
                reader: Mutex::new(reader),
                state: Mutex::new(State::Idle(Box::new(replica))),
                stopped: Default::default(),
                on_applied: Default::default(),
                trust: Default::default(),
            }),
        );
        // SAFETY: checked not null above; writable by the caller's promise.
        unsafe { put(out, std::ptr::without_provenance_mut(number), "out") }
    })
}

/// The file at `path` as one name, whichever way the app spelled it: the
/// same file opened twice is found.
fn where_(path: &str) -> Result<PathBuf, Failure> {
    let path = std::path::Path::new(path);
    let named = match (path.parent(), path.file_name()) {
        // The folder is made canonical, the file may not exist yet.
        (Some(dir), Some(file)) => {
            let dir = if dir.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                dir
            };
            std::fs::canonicalize(dir).map(|d| d.join(file))
        }
        _ => std::path::absolute(path),
    };
    named.map_err(|e| Failure::argument(format!("the path {}: {e}", path.display())))
}

impl Failure {
    fn with_context(mut self, context: &str) -> Failure {
        self.words = format!("{context}: {}", self.words);
        self
    }
}

/// Pins `server_key`, the server's key as it was handed over with the
/// replica's secret (`magic-sync key` prints it): from then on the replica
/// applies only what that key, or a newer key it endorsed, signed. A
/// replica that pinned a key takes that key again, and refuses another
/// (`MS_STOP`, naming both). [`ms_replica_run`] pins the key it is given
/// too; this pins it before a run (`MS_RUNNING` while one runs).
///
/// # Safety
///
/// `r` is a handle or null; `server_key` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_trust(
    r: *mut ms_replica,
    server_key: *const c_char,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        // SAFETY: the caller's promise, passed on.
        let key = server_key_of(unsafe { text(server_key, "the server's key")? })?;
        let mut state = lock(&handle.state);
        match &mut *state {
            State::Idle(replica) => replica.trust(&key).map_err(Failure::from),
            State::Running { .. } => Err(Failure::new(
                ms_code::MS_RUNNING,
                format!("the replica `{}`'s loop runs: stop it first", handle.id),
            )),
            State::Stopping => Err(stopping(&handle)),
            State::Lost => Err(lost(&handle)),
        }
    })
}

fn server_key_of(key: &str) -> Result<ServerKey, Failure> {
    key.trim()
        .parse()
        .map_err(|e| Failure::argument(format!("the server's key: {e}")))
}

/// Starts the replica's loop on a thread of its own, connected to `server`
/// (`wss://host:port`, or `ws://` to this machine) with the `secret` its
/// host issued it, applying only what `server_key` (as `magic-sync key`
/// printed it) or a key it endorsed signed. Returns once the loop runs: it
/// connects, and connects again, on its own.
///
/// # Safety
///
/// `r` is a handle or null; the strings are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_run(
    r: *mut ms_replica,
    server: *const c_char,
    secret: *const c_char,
    server_key: *const c_char,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        // SAFETY: the caller's promise, passed on.
        let (server, secret, key) = unsafe {
            (
                text(server, "the server")?,
                text(secret, "the secret")?,
                text(server_key, "the server's key")?,
            )
        };
        let key = server_key_of(key)?;
        let mut state = lock(&handle.state);
        let mut replica = match std::mem::replace(&mut *state, State::Lost) {
            State::Idle(replica) => replica,
            // The loop ended on its own (its failure is in the status's
            // `stopped`): it runs again, as a process would be restarted.
            State::Running { socket, thread } if thread.is_finished() => {
                socket.close();
                match thread.join() {
                    Ok((replica, _ended)) => replica,
                    Err(_) => return Err(lost(&handle)),
                }
            }
            running @ State::Running { .. } => {
                *state = running;
                return Err(Failure::new(
                    ms_code::MS_RUNNING,
                    format!("the replica `{}`'s loop runs already", handle.id),
                ));
            }
            State::Stopping => {
                *state = State::Stopping;
                return Err(stopping(&handle));
            }
            State::Lost => {
                *state = State::Lost;
                return Err(lost(&handle));
            }
        };
        // The address is checked before the key is pinned: a till given a
        // wrong address keeps no trace of the attempt.
        let mut settings = Settings::new(server, handle.id.clone(), secret);
        settings.trust.clone_from(&lock(&handle.trust));
        let started = Socket::connect(settings)
            .map_err(|e| Failure::argument(e.to_string()))
            .and_then(|socket| match replica.trust(&key) {
                Ok(()) => Ok(Arc::new(socket)),
                Err(e) => {
                    socket.close();
                    Err(e.into())
                }
            });
        let socket = match started {
            Ok(socket) => socket,
            Err(failure) => {
                *state = State::Idle(replica);
                return Err(failure);
            }
        };
        *lock(&handle.stopped) = None;
        let (link, stopped) = (
            Told {
                socket: socket.clone(),
                on_applied: handle.on_applied.clone(),
                told: Mutex::new(None),
            },
            handle.stopped.clone(),
        );
        let thread = std::thread::Builder::new()
            .name(format!("magic_sync replica {}", handle.id))
            .spawn(move || {
                let ran = magic_sync::run::replica::replica(&mut replica, &link);
                if let Err(e) = &ran {
                    *lock(&stopped) = Some(e.to_string());
                }
                (replica, ran)
            })
            .map_err(|e| Failure::new(ms_code::MS_RETRY, format!("no thread for the loop: {e}")))?;
        *state = State::Running { socket, thread };
        Ok(())
    })
}

fn lost(handle: &Handle) -> Failure {
    Failure::new(
        ms_code::MS_STOP,
        format!(
            "the replica `{}` at {} was lost when its loop panicked: close it and open it again",
            handle.id,
            handle.path.display()
        ),
    )
}

/// Tells the running loop the app wrote something: it looks for writes to
/// send up now rather than at its next look (a tenth of a second at most).
/// Nothing when the loop is not running.
///
/// # Safety
///
/// `r` is a handle or null.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_nudge(r: *mut ms_replica) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        if let State::Running { socket, .. } = &*lock(&handle.state) {
            socket.nudger().nudge();
        }
        Ok(())
    })
}

/// Has the next [`ms_replica_run`] trust the PEM certificates in the file
/// at `pem_path` in place of the system's roots (a fleet's own certificate
/// authority, a server's self-signed certificate); null goes back to the
/// system's roots. The file is read when the loop connects.
///
/// # Safety
///
/// `r` is a handle or null; `pem_path` is null or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_trust_certificates(
    r: *mut ms_replica,
    pem_path: *const c_char,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        let path = match pem_path.is_null() {
            true => None,
            // SAFETY: not null, and NUL-terminated by the caller's promise.
            false => Some(PathBuf::from(unsafe {
                text(pem_path, "the certificates' path")?
            })),
        };
        *lock(&handle.trust) = path;
        Ok(())
    })
}

/// The socket, telling the app after each message applied.
struct Told {
    socket: Arc<Socket>,
    on_applied: Arc<Mutex<Option<Callback>>>,
    /// The last message the app was told of: a report said again (lost
    /// acknowledgements are) tells it nothing new.
    told: Mutex<Option<u64>>,
}

impl Link for Told {
    fn max_message_bytes(&self) -> usize {
        Link::max_message_bytes(&*self.socket)
    }

    fn next(&self, timeout: Duration) -> Delivery {
        Link::next(&*self.socket, timeout)
    }

    fn report(&self, report: Report) {
        let applied = match &report {
            Report::Applied(ack) => Some(ack.number),
            _ => None,
        };
        Link::report(&*self.socket, report);
        let Some(number) = applied else { return };
        if lock(&self.told).replace(number) == Some(number) {
            return;
        }
        // Called under the lock: once `ms_replica_on_applied` returns, the
        // callback it replaced is never called again, and its context may go.
        let callback = lock(&self.on_applied);
        if let Some(callback) = *callback {
            // SAFETY: the app's function, with the context it gave, on the
            // thread it was told it would be called on.
            unsafe { (callback.function)(callback.context, number) };
        }
    }

    fn upload(
        &self,
        up: &magic_sync::core::envelope::Up,
    ) -> Result<(), magic_sync::replica::UplinkError> {
        Link::upload(&*self.socket, up)
    }
}

/// Stops the replica's loop after the message it applies, and waits for
/// it. `MS_OK` when it was not running. When the loop had ended on a
/// failure of its own, that failure's code and words.
///
/// # Safety
///
/// `r` is a handle or null.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_stop(r: *mut ms_replica) -> ms_code {
    call(|| stop(&*handle(r)?))
}

fn stop(handle: &Handle) -> Result<(), Failure> {
    let (socket, thread) = {
        let mut state = lock(&handle.state);
        match std::mem::replace(&mut *state, State::Stopping) {
            State::Running { socket, thread }
                if thread.thread().id() != std::thread::current().id() =>
            {
                (socket, thread)
            }
            running @ State::Running { .. } => {
                *state = running;
                return Err(Failure::argument(format!(
                    "the replica `{}`'s loop cannot be stopped from its own callback: stop it from another thread",
                    handle.id
                )));
            }
            State::Idle(replica) => {
                *state = State::Idle(replica);
                return Ok(());
            }
            State::Stopping => return Err(stopping(handle)),
            State::Lost => {
                *state = State::Lost;
                return Err(lost(handle));
            }
        }
    };
    // Not under the lock: the loop's callback, which may ask the status,
    // runs until the loop ends.
    socket.close();
    let joined = thread.join();
    let mut state = lock(&handle.state);
    match joined {
        Ok((replica, ran)) => {
            *state = State::Idle(replica);
            ran.map_err(Failure::from)
        }
        Err(_) => {
            *state = State::Lost;
            Err(Failure::new(
                ms_code::MS_BUG,
                format!(
                    "a bug in magic_sync: the replica `{}`'s loop panicked",
                    handle.id
                ),
            ))
        }
    }
}

fn stopping(handle: &Handle) -> Failure {
    Failure::new(
        ms_code::MS_RUNNING,
        format!(
            "the replica `{}`'s loop is being stopped by another call",
            handle.id
        ),
    )
}

/// Stops the replica's loop if it runs, and closes the replica: the handle
/// means nothing from then on. The loop's own failure, if it had one, is
/// said as [`ms_replica_stop`] says it; the replica is closed anyway.
///
/// # Safety
///
/// `r` is a handle or null.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_close(r: *mut ms_replica) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        let stopped = stop(&handle);
        if matches!(&stopped, Err(f) if f.code == ms_code::MS_INVALID_ARGUMENT) {
            // From the loop's own callback: nothing is closed.
            return stopped;
        }
        lock(&HANDLES).remove(&r.addr());
        stopped
    })
}

/// Has `callback` called with `context` and the number of each message
/// applied, on the replica's own thread, from the next message on; null
/// calls nothing. The callback must not block, and `context` must be
/// usable on that thread. It may ask where the replica stands
/// ([`ms_replica_status`] and the other questions); it must not call this
/// function, and [`ms_replica_stop`] or [`ms_replica_close`] from it are
/// refused (`MS_INVALID_ARGUMENT`). Once this returns, the callback it
/// replaced is not called again: its context may be freed.
///
/// # Safety
///
/// `r` is a handle or null; `callback` is null or a function that may be
/// called with `context` from another thread until it is replaced or the
/// replica is closed.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_on_applied(
    r: *mut ms_replica,
    callback: ms_on_applied,
    context: *mut c_void,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        *lock(&handle.on_applied) = callback.map(|function| Callback { function, context });
        Ok(())
    })
}

/// Where the replica stands, as one JSON object in `json` (free it with
/// [`ms_string_free`]): the fields `magic-sync-replica --status --json`
/// prints; `stopped`, why the loop last ended on what only the app's
/// operator can end; `running`, whether the loop runs; `connected`, whether
/// it is connected now; and `link_error`, why it last failed to connect (a
/// secret refused, nothing listening, a certificate not trusted) or was
/// cut off, `null` while connected.
///
/// # Safety
///
/// `r` is a handle or null; `json` points at a string pointer the library
/// may write.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_status(r: *mut ms_replica, json: *mut *mut c_char) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        let mut status = magic_sync::replica::status(&lock(&handle.reader))?;
        status.stopped.clone_from(&lock(&handle.stopped));
        let mut told = status.to_json();
        let (running, connected, link_error) = match &*lock(&handle.state) {
            State::Running { socket, thread } => (
                !thread.is_finished(),
                socket.is_connected(),
                socket.last_error(),
            ),
            _ => (false, false, None),
        };
        told["running"] = running.into();
        told["connected"] = connected.into();
        told["link_error"] = link_error.into();
        // SAFETY: the caller's promise.
        unsafe { put(json, handed(&told), "json") }
    })
}

/// Per table the app writes, rows not sent up yet and rows sent and not
/// filed yet, as JSON in `json` (free it with [`ms_string_free`]):
/// `{"tables":[{"table":"sales","unsent":2,"unfiled":1}]}`.
///
/// # Safety
///
/// `r` is a handle or null; `json` points at a string pointer the library
/// may write.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_progress(
    r: *mut ms_replica,
    json: *mut *mut c_char,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        let backlog = magic_sync::replica::backlog(&lock(&handle.reader))?;
        let tables: Vec<serde_json::Value> = backlog
            .tables
            .iter()
            .map(
                |t| serde_json::json!({"table": t.table, "unsent": t.unsent, "unfiled": t.unfiled}),
            )
            .collect();
        // SAFETY: the caller's promise.
        unsafe {
            put(
                json,
                handed(&serde_json::json!({ "tables": tables })),
                "json",
            )
        }
    })
}

/// The mark of everything the app wrote to the replica's file so far, in
/// `mark`: ask [`ms_replica_written`] how far it went.
///
/// # Safety
///
/// `r` is a handle or null; `mark` points at an `int64_t` the library may
/// write.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_mark(r: *mut ms_replica, mark: *mut i64) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        let got = magic_sync::replica::mark(&lock(&handle.reader))?;
        // SAFETY: the caller's promise.
        unsafe { put(mark, got.get(), "mark") }
    })
}

/// How far the app's writes up to `mark` went, in `written`.
///
/// # Safety
///
/// `r` is a handle or null; `written` points at an `ms_written` the
/// library may write.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_written(
    r: *mut ms_replica,
    mark: i64,
    written: *mut ms_written,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        let got = magic_sync::replica::written(&lock(&handle.reader), Mark::from_number(mark))?;
        // SAFETY: the caller's promise.
        unsafe { put(written, got.into(), "written") }
    })
}

/// Waits up to `timeout_ms` until the app's writes up to `mark` went as far
/// as `until` (an `ms_written`), and says in `written` how far they went:
/// as far as `until`, or less when the time ran out (which is no failure).
///
/// # Safety
///
/// `r` is a handle or null; `written` points at an `ms_written` the
/// library may write.
#[no_mangle]
pub unsafe extern "C" fn ms_replica_wait_written(
    r: *mut ms_replica,
    mark: i64,
    until: u32,
    timeout_ms: u64,
    written: *mut ms_written,
) -> ms_code {
    call(|| {
        let handle = handle(r)?;
        if written.is_null() {
            return Err(Failure::argument("written is null"));
        }
        let until = match until {
            0 => Written::Here,
            1 => Written::Filed,
            2 => Written::Reached,
            other => {
                return Err(Failure::argument(format!(
                    "until is {other}, not an ms_written"
                )))
            }
        };
        // A connection of the wait's own: the wait does not hold the
        // handle's reader from the app's other threads.
        let conn = Connection::open(&handle.path)?;
        conn.busy_timeout(Duration::from_secs(5))?;
        let got = magic_sync::replica::wait_written(
            &conn,
            Mark::from_number(mark),
            until,
            Duration::from_millis(timeout_ms),
        )?;
        // SAFETY: the caller's promise.
        unsafe { put(written, got.into(), "written") }
    })
}

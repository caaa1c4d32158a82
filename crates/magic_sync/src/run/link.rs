//! The shell every network link of a replica shares, whatever it speaks
//! (the socket of `magic_sync_http`, the mailbox of `magic_sync_nats`): a
//! thread of its own running the transport's loop on a runtime of its own,
//! the queue it feeds the replica's loop through, the channel the loop
//! speaks back on, whether it is connected and why not, and a close that
//! the thread hears wherever it waits. A transport writes only its loop.

use crate::envelope::Up;
use crate::replica::UplinkError;
use crate::run::replica::{Incoming, Nudger};
use crate::run::Delivery;
use prost::Message;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use tokio::sync::{mpsc, Notify};

/// What a link's thread and the replica's loop both see.
#[derive(Debug, Default)]
pub struct State {
    connected: AtomicBool,
    connects: AtomicU64,
    last_error: Mutex<Option<String>>,
    stopping: AtomicBool,
    stop: Notify,
}

impl State {
    /// Whether the link is connected now.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Acquire)
    }

    /// Times it connected so far.
    pub fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }

    /// Why it last failed to connect, or was cut off.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("not poisoned").clone()
    }

    /// It connected: counted, and the last error is forgotten.
    pub fn connected(&self) {
        self.connected.store(true, Ordering::Release);
        self.connects.fetch_add(1, Ordering::Relaxed);
        *self.last_error.lock().expect("not poisoned") = None;
    }

    /// It is not connected, for `why` when that is known.
    pub fn lost(&self, why: Option<String>) {
        self.connected.store(false, Ordering::Release);
        if let Some(why) = why {
            *self.last_error.lock().expect("not poisoned") = Some(why);
        }
    }

    /// Whether it was told to close.
    pub fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Returns once it is told to close (at once if it was).
    pub async fn stopped(&self) {
        let notified = self.stop.notified();
        if !self.stopping() {
            notified.await;
        }
    }

    fn close(&self) {
        self.stopping.store(true, Ordering::Release);
        // `notify_one` keeps a permit when nobody waits yet, so a close
        // between two waits is not missed; `notify_waiters` wakes every
        // `select!` waiting at once.
        self.stop.notify_waiters();
        self.stop.notify_one();
    }
}

/// A link's thread, and what the replica's loop holds of it. `O` is what
/// the loop hands the thread (bytes to send, or more).
#[derive(Debug)]
pub struct Shell<O> {
    incoming: Incoming,
    out: mpsc::UnboundedSender<O>,
    state: Arc<State>,
    max_message_bytes: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What a link's loop is given when its thread starts.
#[derive(Debug)]
pub struct Ends<O> {
    /// Where it puts what arrives for the replica's loop.
    pub feed: std_mpsc::Sender<Delivery>,
    /// What the replica's loop hands it.
    pub out: mpsc::UnboundedReceiver<O>,
    /// Shared with the replica's loop.
    pub state: Arc<State>,
}

impl<O: Send + 'static> Shell<O> {
    /// Starts the thread `name`, running `body` on a runtime of its own
    /// until it returns: the link's loop, which connects (again) until its
    /// state says stop. Returns at once.
    pub fn start<F, Fut>(name: String, max_message_bytes: usize, body: F) -> std::io::Result<Self>
    where
        F: FnOnce(Ends<O>) -> Fut + Send + 'static,
        Fut: Future<Output = ()>,
    {
        let incoming = Incoming::default();
        let (out, out_rx) = mpsc::unbounded_channel();
        let state = Arc::new(State::default());
        let ends = Ends {
            feed: incoming.feed(),
            out: out_rx,
            state: state.clone(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || runtime.block_on(body(ends)))?;
        Ok(Shell {
            incoming,
            out,
            state,
            max_message_bytes,
            thread: Some(thread),
        })
    }

    /// What the thread and the loop share.
    pub fn state(&self) -> &State {
        &self.state
    }

    /// What arrives, in order.
    pub fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    /// A handle the host nudges when it wrote something.
    pub fn nudger(&self) -> Nudger {
        self.incoming.nudger()
    }

    /// The most bytes one message may have.
    pub fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    /// Hands the thread `what`; false once the thread has ended.
    pub fn send(&self, what: O) -> bool {
        self.out.send(what).is_ok()
    }

    /// `up` encoded, if it can go now: the link connected (else it waits,
    /// `Unreachable`, saying why, or that `to` was not reached yet) and
    /// the upload within a message (else `Refused`).
    pub fn upload_bytes(&self, up: &Up, to: &str) -> Result<Vec<u8>, UplinkError> {
        if !self.state.is_connected() {
            return Err(UplinkError::unreachable(
                self.state
                    .last_error()
                    .unwrap_or_else(|| format!("not connected to {to} yet")),
            ));
        }
        let bytes = up.encode_to_vec();
        if bytes.len() > self.max_message_bytes {
            return Err(UplinkError::refused(format!(
                "an upload of {} bytes, more than a message may have ({})",
                bytes.len(),
                self.max_message_bytes
            )));
        }
        Ok(bytes)
    }

    /// Closes the link and stops connecting: the replica's loop sees the
    /// link end.
    pub fn close(&self) {
        self.state.close();
    }
}

impl<O> Drop for Shell<O> {
    fn drop(&mut self) {
        self.state.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

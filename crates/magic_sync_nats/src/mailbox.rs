//! The replica's side: a [`Mailbox`] reads the replica's stream on the
//! broker and publishes what the replica says.
//!
//! The replica's loop is synchronous; the mailbox runs the broker's client
//! on a thread of its own and hands what arrives to the loop through a
//! channel, as the socket client does.
//!
//! A message is acknowledged to the broker (and so leaves the stream) only
//! once the loop has dealt with it: when the loop next asks for what comes
//! next, or reports. A replica that dies between taking a message and
//! applying it finds the message still there when it comes back.
//!
//! The consumer is the replica's own, and made afresh whenever the mailbox
//! (re)starts reading: a work-queue stream keeps only what was not
//! acknowledged, so a fresh consumer that delivers everything begins at the
//! first message the replica has not dealt with, in order. Nothing it had
//! been handed before is sent ahead of what it had not.

use crate::{inbox_of, stream_of, up_subject, Reach, CONSUMER};
use async_nats::jetstream::{self, consumer, message::Acker};
use futures_util::StreamExt;
use magic_sync::backoff::Backoff;
use magic_sync::envelope::Up;
use magic_sync::replica::UplinkError;
pub use magic_sync::run::replica::Nudger;
use magic_sync::run::replica::{Incoming, Link};
use magic_sync::run::{Delivery, Report};
use prost::Message as _;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// Where and as whom a replica reads its mailbox.
#[derive(Clone)]
pub struct Settings {
    /// The broker (`nats://host:4222`).
    pub url: String,
    /// The replica's id.
    pub replica: String,
    /// The replica's nkey seed. Never printed.
    pub seed: String,
    /// The most bytes one message may have, either way: as the server's.
    pub max_message_bytes: usize,
    /// The first wait before reading again after a failure; it doubles up
    /// to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest wait before reading again.
    pub backoff_max: Duration,
    /// How long a message handed to the replica and not acknowledged stays
    /// its own before the broker hands it over again.
    pub ack_wait: Duration,
    /// How long the broker may go without a sign of life on the consumer
    /// before the mailbox reads afresh.
    pub heartbeat: Duration,
    /// Allow `nats://` (no TLS) to a broker that is not on this machine.
    /// Off by default: the rows the replica holds would cross the network
    /// in the clear (the seed never does: the broker checks a signature of
    /// its challenge). For a network where a proxy or leaf node beside the
    /// replica ends TLS.
    pub allow_plain: bool,
    /// Trust only the certificates in this PEM file for the broker's TLS
    /// (a private certificate authority, say), and require TLS. `None`
    /// trusts the system's roots.
    pub trust: Option<PathBuf>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("url", &self.url)
            .field("replica", &self.replica)
            .field("seed", &"<hidden>")
            .field("max_message_bytes", &self.max_message_bytes)
            .field("backoff_min", &self.backoff_min)
            .field("backoff_max", &self.backoff_max)
            .field("ack_wait", &self.ack_wait)
            .field("heartbeat", &self.heartbeat)
            .field("allow_plain", &self.allow_plain)
            .field("trust", &self.trust)
            .finish()
    }
}

impl Settings {
    /// Settings for `replica` with its `seed` at the broker `url`.
    pub fn new(
        url: impl Into<String>,
        replica: impl Into<String>,
        seed: impl Into<String>,
    ) -> Self {
        Settings {
            url: url.into(),
            replica: replica.into(),
            seed: seed.into(),
            max_message_bytes: 1 << 20,
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
            ack_wait: Duration::from_secs(30),
            heartbeat: Duration::from_secs(5),
            allow_plain: false,
            trust: None,
        }
    }

    fn reach(&self) -> Reach<'_> {
        Reach {
            url: &self.url,
            trust: self.trust.as_deref(),
            allow_plain: self.allow_plain,
        }
    }
}

/// What the loop asks of the mailbox's thread.
enum Out {
    /// Bytes to publish: a report or an upload.
    Say(Vec<u8>),
    /// Everything handed to the loop before the `n`th delivery was dealt
    /// with.
    Done(u64),
}

#[derive(Debug, Default)]
struct Shared {
    /// Reading its stream now.
    reading: AtomicBool,
    /// Times it began reading.
    readings: AtomicU64,
    last_error: Mutex<Option<String>>,
    /// The broker's last refusal of a subject (a permissions violation):
    /// what explains the timeouts that follow it.
    refused: Mutex<Option<String>>,
    stopping: AtomicBool,
    stop: Notify,
}

/// A replica's mailbox on the broker, read by a thread of its own.
#[derive(Debug)]
pub struct Mailbox {
    incoming: Incoming,
    out: mpsc::UnboundedSender<Out>,
    /// Deliveries from the broker the loop has taken.
    taken: AtomicU64,
    /// What was last said to be dealt with.
    done: AtomicU64,
    shared: Arc<Shared>,
    max_message_bytes: usize,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Mailbox {
    /// Starts reading: returns at once, and connects (again) in the
    /// background until closed.
    pub fn open(settings: Settings) -> crate::Result<Mailbox> {
        settings.reach().check("the replica holds")?;
        crate::access::Credentials::from_seed(&settings.seed)?;
        let incoming = Incoming::default();
        let feed = incoming.feed();
        let (out, out_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let max_message_bytes = settings.max_message_bytes;
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("magic_sync mailbox {}", settings.replica))
                .spawn(move || runtime.block_on(run(settings, feed, out_rx, shared)))?
        };
        Ok(Mailbox {
            incoming,
            out,
            taken: AtomicU64::new(0),
            done: AtomicU64::new(0),
            shared,
            max_message_bytes,
            thread: Some(thread),
        })
    }

    /// Whether it reads its stream now.
    pub fn is_reading(&self) -> bool {
        self.shared.reading.load(Ordering::Acquire)
    }

    /// Times it began reading its stream.
    pub fn readings(&self) -> u64 {
        self.shared.readings.load(Ordering::Relaxed)
    }

    /// Why reading last stopped or failed to begin; `None` while it reads.
    pub fn last_error(&self) -> Option<String> {
        self.shared.last_error.lock().expect("not poisoned").clone()
    }

    /// A handle the host nudges when it wrote something.
    pub fn nudger(&self) -> Nudger {
        self.incoming.nudger()
    }

    /// Stops reading: the replica's loop sees the link end.
    pub fn close(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.stop.notify_one();
    }

    /// Tells the thread that everything taken so far was dealt with.
    fn dealt_with(&self) {
        let taken = self.taken.load(Ordering::Acquire);
        if self.done.swap(taken, Ordering::AcqRel) < taken {
            let _ = self.out.send(Out::Done(taken));
        }
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.close();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Link for Mailbox {
    fn max_message_bytes(&self) -> usize {
        self.max_message_bytes
    }

    fn next(&self, timeout: Duration) -> Delivery {
        // The loop asks again only once it dealt with what it had.
        self.dealt_with();
        let delivery = self.incoming.next(timeout);
        if matches!(delivery, Delivery::Message(_) | Delivery::Filed(_)) {
            self.taken.fetch_add(1, Ordering::AcqRel);
        }
        delivery
    }

    fn report(&self, report: Report) {
        self.dealt_with();
        let _ = self.out.send(Out::Say(report.encode()));
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        if !self.is_reading() {
            return Err(UplinkError::Unreachable(
                self.last_error()
                    .unwrap_or_else(|| "not connected to the broker yet".into()),
            ));
        }
        let bytes = up.encode_to_vec();
        if bytes.len() > self.max_message_bytes {
            return Err(UplinkError::Refused(format!(
                "an upload of {} bytes, more than a message may have ({})",
                bytes.len(),
                self.max_message_bytes
            )));
        }
        self.out
            .send(Out::Say(bytes))
            .map_err(|_| UplinkError::Unreachable("the mailbox is closed".into()))
    }
}

/// What the thread keeps between readings.
struct Thread {
    settings: Settings,
    feed: std_mpsc::Sender<Delivery>,
    out: mpsc::UnboundedReceiver<Out>,
    shared: Arc<Shared>,
    /// Deliveries fed to the loop so far.
    fed: u64,
    /// Of those, the ones not yet acknowledged, by number.
    unacked: VecDeque<(u64, Acker)>,
}

/// Connects, reads, and reads again after a failure, until stopped; then
/// ends the link.
async fn run(
    settings: Settings,
    feed: std_mpsc::Sender<Delivery>,
    out: mpsc::UnboundedReceiver<Out>,
    shared: Arc<Shared>,
) {
    let mut backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
    let client = loop {
        let options = settings
            .reach()
            .apply(async_nats::ConnectOptions::with_nkey(settings.seed.clone()));
        let noting = shared.clone();
        let connecting = options
            .event_callback(move |event| {
                let noting = noting.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let e = e.to_string();
                        if e.contains("ermissions") {
                            *noting.refused.lock().expect("not poisoned") = Some(e);
                        }
                    }
                }
            })
            .name(format!("magic_sync replica {}", settings.replica))
            .custom_inbox_prefix(inbox_of(&settings.replica))
            .max_reconnects(None)
            .connect(&settings.url);
        let failed = tokio::select! {
            connected = connecting => match connected {
                Ok(client) => break client,
                Err(e) => settings.reach().not_connected(&e),
            },
            () = shared.stop.notified() => {
                let _ = feed.send(Delivery::Closed);
                return;
            }
        };
        *shared.last_error.lock().expect("not poisoned") = Some(failed);
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            () = shared.stop.notified() => {
                let _ = feed.send(Delivery::Closed);
                return;
            }
        }
    };
    let js = jetstream::new(client.clone());
    let mut thread = Thread {
        settings,
        feed,
        out,
        shared,
        fed: 0,
        unacked: VecDeque::new(),
    };
    while !thread.shared.stopping.load(Ordering::Acquire) {
        let ended = thread.read(&client, &js).await;
        thread.shared.reading.store(false, Ordering::Release);
        match ended {
            Ended::Stopped => break,
            Ended::Failed {
                mut why,
                was_reading,
            } => {
                if was_reading {
                    backoff.reset();
                }
                if let Some(refused) = thread.shared.refused.lock().expect("not poisoned").take() {
                    why = format!(
                        "{why}; the broker refused this connection a subject ({refused}): is this \
                         seed the one enrolled for `{}`?",
                        thread.settings.replica
                    );
                }
                *thread.shared.last_error.lock().expect("not poisoned") = Some(why);
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            () = thread.shared.stop.notified() => break,
        }
    }
    // What the loop said last goes before the connection closes.
    let _ = client.flush().await;
    let _ = thread.feed.send(Delivery::Closed);
}

enum Ended {
    Stopped,
    Failed { why: String, was_reading: bool },
}

fn failed(why: impl Into<String>) -> Ended {
    Ended::Failed {
        why: why.into(),
        was_reading: false,
    }
}

impl Thread {
    /// Reads the stream afresh until reading fails or the mailbox stops.
    async fn read(&mut self, client: &async_nats::Client, js: &jetstream::Context) -> Ended {
        let settings = &self.settings;
        let stream = stream_of(&settings.replica);
        // Whatever was handed out and not acknowledged is delivered again
        // by the new consumer, first and in order.
        self.unacked.clear();
        match js.delete_consumer_from_stream(CONSUMER, &stream).await {
            Ok(_) => {}
            Err(e) if e.to_string().contains("not found") => {}
            Err(e) => return failed(format!("clearing the consumer of its stream: {e}")),
        }
        let consumer: consumer::PullConsumer = match js
            .create_consumer_on_stream(
                consumer::pull::Config {
                    durable_name: Some(CONSUMER.to_string()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: settings.ack_wait,
                    deliver_policy: consumer::DeliverPolicy::All,
                    // Bounds what waits for the loop in memory.
                    max_ack_pending: 64,
                    ..Default::default()
                },
                &stream,
            )
            .await
        {
            Ok(consumer) => consumer,
            Err(e) => return failed(format!("reading its stream: {e}")),
        };
        let mut messages = match consumer
            .stream()
            .heartbeat(settings.heartbeat)
            .expires(settings.heartbeat * 6)
            .messages()
            .await
        {
            Ok(messages) => messages,
            Err(e) => return failed(format!("reading its stream: {e}")),
        };
        self.shared.reading.store(true, Ordering::Release);
        self.shared.readings.fetch_add(1, Ordering::Relaxed);
        // What went wrong before is over.
        *self.shared.last_error.lock().expect("not poisoned") = None;
        let up = up_subject(&settings.replica);
        let gone = |why: String| Ended::Failed {
            why,
            was_reading: true,
        };
        loop {
            tokio::select! {
                message = messages.next() => {
                    let message = match message {
                        None => return gone("the broker ended the stream".into()),
                        Some(Err(e)) => return gone(format!("reading its stream: {e}")),
                        Some(Ok(message)) => message,
                    };
                    let (message, acker) = message.split();
                    let delivery = match Delivery::decode(&message.payload) {
                        Ok(Some(delivery)) => delivery,
                        Ok(None) => {
                            let _ = acker.ack().await;
                            continue;
                        }
                        Err(e) => {
                            // Not the server's: it would be signed and
                            // well formed. Dropped, as a forgery is.
                            tracing::warn!(error = %e, "a message that does not decode is dropped");
                            let _ = acker.ack().await;
                            continue;
                        }
                    };
                    self.unacked.push_back((self.fed, acker));
                    self.fed += 1;
                    if self.feed.send(delivery).is_err() {
                        return Ended::Stopped;
                    }
                }
                said = self.out.recv() => match said {
                    None => return Ended::Stopped,
                    Some(Out::Say(bytes)) => {
                        if let Err(e) = client.publish(up.clone(), bytes.into()).await {
                            return gone(format!("publishing: {e}"));
                        }
                    }
                    Some(Out::Done(upto)) => {
                        while self.unacked.front().is_some_and(|(n, _)| *n < upto) {
                            let (_, acker) = self.unacked.pop_front().expect("there is one");
                            if let Err(e) = acker.ack().await {
                                return gone(format!("acknowledging: {e}"));
                            }
                        }
                    }
                },
                () = self.shared.stop.notified() => return Ended::Stopped,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Mailbox, Settings};
    use crate::access::Credentials;

    #[test]
    fn plain_nats_is_for_this_machine_unless_allowed_and_the_seed_must_be_one() {
        let seed = Credentials::issue().seed().to_string();
        let remote = Settings::new("nats://10.0.0.5:4222", "till-1", &seed);
        let err = Mailbox::open(remote.clone()).expect_err("plain to another machine");
        assert!(err.to_string().contains("tls://"), "{err}");
        assert!(
            !format!("{remote:?}").contains(&seed),
            "the seed is never printed"
        );
        let wrong = Settings::new("nats://127.0.0.1:4222", "till-1", "not a seed");
        assert!(Mailbox::open(wrong).is_err());
        let http = Settings::new("http://127.0.0.1:4222", "till-1", &seed);
        assert!(Mailbox::open(http).is_err());
        let allowed = Settings {
            allow_plain: true,
            ..remote
        };
        Mailbox::open(allowed).expect("allowed").close();
    }
}

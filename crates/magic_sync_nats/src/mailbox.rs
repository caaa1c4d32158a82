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
//! The consumer is the one the server made for the replica (see
//! `broker`): the mailbox looks it up, fetches from it and acknowledges,
//! and may do nothing else, so it cannot start it afresh. The broker hands
//! over again what was not acknowledged in time, after messages it had not
//! handed yet; the mailbox feeds the loop by stream sequence all the same
//! (`order`), so nothing later overtakes what it had not dealt with. A
//! mailbox that closes hands back at once what it was handed and did not
//! deal with (a negative acknowledgement, in order), for whoever reads
//! next; one that died without closing leaves it to the consumer's
//! `ack_wait`, and the next reader waits that long for it.

use crate::order::{Arrival, InOrder};
use crate::{inbox_of, stream_of, up_subject, Reach, CONSUMER};
use async_nats::jetstream::{self, consumer, message::Acker, AckKind};
use futures_util::StreamExt;
use magic_sync::backoff::Backoff;
use magic_sync::envelope::Up;
use magic_sync::replica::UplinkError;
use magic_sync::run::link::{Ends, Shell, State};
use magic_sync::run::replica::Link;
pub use magic_sync::run::replica::Nudger;
use magic_sync::run::{Delivery, Report};
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

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
    /// How long the broker may go without a sign of life on the consumer
    /// before the mailbox reads afresh; while messages are held for one
    /// before them, how often it asks where its stream begins. (How long a
    /// message handed and not acknowledged stays the replica's is the
    /// server's to set, on the consumer it makes:
    /// `broker::Settings::replica_ack_wait`.)
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
#[derive(Debug)]
enum Out {
    /// Bytes to publish: a report or an upload.
    Say(Vec<u8>),
    /// Everything handed to the loop before the `n`th delivery was dealt
    /// with.
    Done(u64),
}

/// A replica's mailbox on the broker, read by a thread of its own.
#[derive(Debug)]
pub struct Mailbox {
    shell: Shell<Out>,
    /// Deliveries from the broker the loop has taken.
    taken: AtomicU64,
    /// What was last said to be dealt with.
    done: AtomicU64,
}

impl Mailbox {
    /// Starts reading: returns at once, and connects (again) in the
    /// background until closed.
    pub fn open(settings: Settings) -> crate::Result<Mailbox> {
        settings.reach().check("the replica holds")?;
        crate::access::Credentials::from_seed(&settings.seed)?;
        let shell = Shell::start(
            format!("magic_sync mailbox {}", settings.replica),
            settings.max_message_bytes,
            move |ends| run(settings, ends),
        )?;
        Ok(Mailbox {
            shell,
            taken: AtomicU64::new(0),
            done: AtomicU64::new(0),
        })
    }

    /// Whether it reads its stream now.
    pub fn is_reading(&self) -> bool {
        self.shell.state().is_connected()
    }

    /// Times it began reading its stream.
    pub fn readings(&self) -> u64 {
        self.shell.state().connects()
    }

    /// Why reading last stopped or failed to begin; `None` while it reads.
    pub fn last_error(&self) -> Option<String> {
        self.shell.state().last_error()
    }

    /// A handle the host nudges when it wrote something.
    pub fn nudger(&self) -> Nudger {
        self.shell.nudger()
    }

    /// Stops reading: the replica's loop sees the link end.
    pub fn close(&self) {
        self.shell.close();
    }

    /// Tells the thread that everything taken so far was dealt with.
    fn dealt_with(&self) {
        let taken = self.taken.load(Ordering::Acquire);
        if self.done.swap(taken, Ordering::AcqRel) < taken {
            self.shell.send(Out::Done(taken));
        }
    }
}

impl Link for Mailbox {
    fn max_message_bytes(&self) -> usize {
        self.shell.max_message_bytes()
    }

    fn next(&self, timeout: Duration) -> Delivery {
        // The loop asks again only once it dealt with what it had.
        self.dealt_with();
        let delivery = self.shell.incoming().next(timeout);
        if matches!(delivery, Delivery::Message(_) | Delivery::Filed(_)) {
            self.taken.fetch_add(1, Ordering::AcqRel);
        }
        delivery
    }

    fn report(&self, report: Report) {
        self.dealt_with();
        self.shell.send(Out::Say(report.encode()));
    }

    fn upload(&self, up: &Up) -> Result<(), UplinkError> {
        let bytes = self.shell.upload_bytes(up, "the broker")?;
        if self.shell.send(Out::Say(bytes)) {
            Ok(())
        } else {
            Err(UplinkError::unreachable("the mailbox is closed"))
        }
    }
}

/// What the thread keeps between readings.
struct Thread {
    settings: Settings,
    feed: std_mpsc::Sender<Delivery>,
    out: mpsc::UnboundedReceiver<Out>,
    state: Arc<State>,
    /// The broker's last refusal of a subject (a permissions violation):
    /// what explains the timeouts that follow it.
    refused: Arc<Mutex<Option<String>>>,
    /// Deliveries fed to the loop so far.
    fed: u64,
    /// Of those, the ones the loop said it dealt with.
    done: u64,
    /// Messages fed (or passed over) and not yet acknowledged, in order.
    unacked: VecDeque<Unacked>,
    /// Messages handed over and not fed yet, put back in order.
    order: InOrder<Handed>,
    /// Since when a message held waits for one before it.
    waiting_since: Option<Instant>,
    /// When the replica's stream was made, as last seen: a stream made
    /// anew numbers its messages from 1 again.
    stream_made: Option<String>,
}

/// A message as the broker handed it over.
struct Handed {
    /// What it carries for the loop; `None` for nothing (an empty frame,
    /// or one that does not decode).
    delivery: Option<Delivery>,
    acker: Acker,
}

/// A message fed, or passed over, and not yet acknowledged.
struct Unacked {
    sequence: u64,
    /// Acknowledged once the loop dealt with this many deliveries.
    after: u64,
    acker: Acker,
}

/// Connects, reads, and reads again after a failure, until stopped; then
/// ends the link.
async fn run(settings: Settings, ends: Ends<Out>) {
    let Ends { feed, out, state } = ends;
    let refused = Arc::new(Mutex::new(None::<String>));
    let mut backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
    let client = loop {
        let options = settings
            .reach()
            .apply(async_nats::ConnectOptions::with_nkey(settings.seed.clone()));
        let noting = refused.clone();
        let connecting = options
            .event_callback(move |event| {
                let noting = noting.clone();
                async move {
                    if let async_nats::Event::ServerError(e) = event {
                        let e = e.to_string();
                        if e.contains("ermissions") {
                            *noting.lock().expect("not poisoned") = Some(e);
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
            () = state.stopped() => {
                let _ = feed.send(Delivery::Closed);
                return;
            }
        };
        state.lost(Some(failed));
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            () = state.stopped() => {
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
        state,
        refused,
        fed: 0,
        done: 0,
        unacked: VecDeque::new(),
        order: InOrder::default(),
        waiting_since: None,
        stream_made: None,
    };
    while !thread.state.stopping() {
        let ended = thread.read(&client, &js).await;
        match ended {
            Ended::Stopped => break,
            Ended::Failed {
                mut why,
                was_reading,
            } => {
                if was_reading {
                    backoff.reset();
                }
                if let Some(refused) = thread.refused.lock().expect("not poisoned").take() {
                    why = format!(
                        "{why}; the broker refused this connection a subject ({refused}): is this \
                         seed the one enrolled for `{}`?",
                        thread.settings.replica
                    );
                }
                thread.state.lost(Some(why));
            }
        }
        tokio::select! {
            () = tokio::time::sleep(backoff.next_wait()) => {}
            () = thread.state.stopped() => break,
        }
    }
    thread.state.lost(None);
    thread.hand_back(&client).await;
    // What the loop said last goes before the connection closes.
    let _ = client.flush().await;
    let _ = thread.feed.send(Delivery::Closed);
}

/// A request for more messages lapses after this many heartbeats (the
/// least the client allows), and is made again.
const REQUEST_LAPSES: u32 = 2;

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

fn gone(why: impl Into<String>) -> Ended {
    Ended::Failed {
        why: why.into(),
        was_reading: true,
    }
}

impl Thread {
    /// Reads the stream until reading fails or the mailbox stops.
    async fn read(&mut self, client: &async_nats::Client, js: &jetstream::Context) -> Ended {
        let stream = stream_of(&self.settings.replica);
        let consumer: consumer::PullConsumer =
            match js.get_consumer_from_stream(CONSUMER, &stream).await {
                Ok(consumer) => consumer,
                Err(e) => {
                    return failed(format!(
                        "finding its consumer (the server makes it with the replica's stream): {e}"
                    ))
                }
            };
        // A message the broker hands again comes after its `ack_wait`; one
        // missing for twice that will not come.
        let give_up_after = consumer.cached_info().config.ack_wait * 2;
        if let Err(ended) = self.stream_begins(js, &stream, false).await {
            return ended;
        }
        let heartbeat = self.settings.heartbeat;
        let mut messages = match consumer
            .stream()
            .heartbeat(heartbeat)
            .expires(heartbeat * REQUEST_LAPSES)
            .messages()
            .await
        {
            Ok(messages) => messages,
            Err(e) => return failed(format!("reading its stream: {e}")),
        };
        // Counted, and what went wrong before is over.
        self.state.connected();
        let mut every = tokio::time::interval(heartbeat);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let waiting = self.order.is_waiting();
            let step = tokio::select! {
                message = messages.next() => match message {
                    None => Err(gone("the broker ended the stream")),
                    Some(Err(e)) => Err(gone(format!("reading its stream: {e}"))),
                    Some(Ok(message)) => self.take(message).await,
                },
                said = self.out.recv() => match said {
                    None => Err(Ended::Stopped),
                    Some(said) => self.heed(client, said).await,
                },
                _ = every.tick(), if waiting => self.still_waiting(js, &stream, give_up_after).await,
                () = self.state.stopped() => Err(Ended::Stopped),
            };
            if let Err(ended) = step {
                return ended;
            }
        }
    }

    /// Does what the loop asked: publishes what it says, or acknowledges
    /// what it dealt with.
    async fn heed(&mut self, client: &async_nats::Client, said: Out) -> Result<(), Ended> {
        match said {
            Out::Say(bytes) => client
                .publish(up_subject(&self.settings.replica), bytes.into())
                .await
                .map_err(|e| gone(format!("publishing: {e}"))),
            Out::Done(upto) => {
                self.done = self.done.max(upto);
                self.acknowledge().await
            }
        }
    }

    /// While messages are held for one before them: whether it left the
    /// stream, and past `give_up_after`, going on without it.
    async fn still_waiting(
        &mut self,
        js: &jetstream::Context,
        stream: &str,
        give_up_after: Duration,
    ) -> Result<(), Ended> {
        self.stream_begins(js, stream, true).await?;
        let waited = self.waiting_since.map(|since| since.elapsed());
        if waited.is_none_or(|waited| waited < give_up_after) {
            return Ok(());
        }
        tracing::warn!(
            replica = %self.settings.replica,
            waited = ?give_up_after,
            "a message missing from the mailbox did not come again; going on without it"
        );
        let given = self.order.give_up();
        self.feed_all(given).await
    }

    /// Asks where the replica's stream begins now, and feeds what was held
    /// only for messages that left it.
    async fn stream_begins(
        &mut self,
        js: &jetstream::Context,
        stream: &str,
        reading: bool,
    ) -> Result<(), Ended> {
        let found = match js.get_stream(stream).await {
            Ok(found) => found,
            Err(e) => {
                let why = format!("looking up its stream: {e}");
                return Err(if reading { gone(why) } else { failed(why) });
            }
        };
        let info = found.cached_info();
        let made = info.created.to_string();
        if self.stream_made.as_ref().is_some_and(|m| *m != made) {
            // Made anew: what was handed of the old one is no more.
            self.order.clear();
            self.unacked.clear();
        }
        self.stream_made = Some(made);
        let fed = self.order.begins_at(info.state.first_sequence);
        self.feed_all(fed).await
    }

    /// A message the broker handed over: fed in its turn.
    async fn take(&mut self, message: jetstream::Message) -> Result<(), Ended> {
        let sequence = match message.info() {
            Ok(info) => info.stream_sequence,
            Err(e) => {
                tracing::warn!(error = %e, "a message without its place in the stream is passed over");
                return Ok(());
            }
        };
        let (message, acker) = message.split();
        let delivery = Delivery::decode(&message.payload).unwrap_or_else(|e| {
            // Not the server's: it would be signed and well formed.
            // Passed over, as a forgery is.
            tracing::warn!(error = %e, "a message that does not decode is passed over");
            None
        });
        match self.order.arrive(sequence, Handed { delivery, acker }) {
            Arrival::Feed(fed) => self.feed_all(fed).await?,
            Arrival::Held => {
                self.waiting_since.get_or_insert_with(Instant::now);
            }
            // The copy held is acknowledged in its turn.
            Arrival::HeldAlready(_) => {}
            Arrival::Fed(again) => {
                if !self.unacked.iter().any(|u| u.sequence == sequence) {
                    // Dealt with, and its acknowledgement lost: again.
                    let _ = again.acker.ack().await;
                }
            }
        }
        Ok(())
    }

    /// Feeds the loop `fed`, in order; what carries nothing is passed over
    /// and acknowledged in its turn.
    async fn feed_all(&mut self, fed: Vec<(u64, Handed)>) -> Result<(), Ended> {
        if fed.is_empty() {
            return Ok(());
        }
        for (sequence, Handed { delivery, acker }) in fed {
            if let Some(delivery) = delivery {
                self.fed += 1;
                self.unacked.push_back(Unacked {
                    sequence,
                    after: self.fed,
                    acker,
                });
                if self.feed.send(delivery).is_err() {
                    return Err(Ended::Stopped);
                }
            } else {
                self.unacked.push_back(Unacked {
                    sequence,
                    after: self.fed,
                    acker,
                });
            }
        }
        self.waiting_since = self.order.is_waiting().then(Instant::now);
        self.acknowledge().await
    }

    /// Acknowledges, in order, what the loop dealt with.
    async fn acknowledge(&mut self) -> Result<(), Ended> {
        while self.unacked.front().is_some_and(|u| u.after <= self.done) {
            let dealt = self.unacked.pop_front().expect("there is one");
            if let Err(e) = dealt.acker.ack().await {
                return Err(gone(format!("acknowledging: {e}")));
            }
        }
        Ok(())
    }

    /// As the mailbox stops: what the loop said last goes, then what it
    /// was handed and did not deal with goes back to the broker, in order,
    /// to be handed to whoever reads next. Not at once: the broker (2.9)
    /// hands a message to a request for more until that request lapses,
    /// even once nobody listens for the answer, so what is handed back is
    /// handed again only after this mailbox's last request lapsed.
    async fn hand_back(&mut self, client: &async_nats::Client) {
        // Twice the lapse: the last request may have been made just now.
        let lapsed = self.settings.heartbeat * REQUEST_LAPSES * 2;
        let up = up_subject(&self.settings.replica);
        while let Ok(said) = self.out.try_recv() {
            match said {
                Out::Say(bytes) => {
                    let _ = client.publish(up.clone(), bytes.into()).await;
                }
                Out::Done(upto) => self.done = self.done.max(upto),
            }
        }
        let _ = self.acknowledge().await;
        let not_dealt = self.unacked.drain(..).map(|u| u.acker);
        let held = self.order.clear().into_iter().map(|(_, h)| h.acker);
        for acker in not_dealt.chain(held).collect::<Vec<_>>() {
            let _ = acker.ack_with(AckKind::Nak(Some(lapsed))).await;
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

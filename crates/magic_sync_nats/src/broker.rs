//! The server's side: a [`Broker`] publishes each replica's messages to a
//! stream of that replica's own, and hands the relay what replicas said.
//!
//! - **Down.** Each replica has a work-queue stream, `MAGIC_SYNC_R_<token>`,
//!   on the subject `magic_sync.down.<token>`, and one consumer of it, a
//!   durable pull consumer the server makes with the stream: the replica
//!   may fetch from it, look it up and acknowledge, never make, change or
//!   remove a consumer (a push consumer's deliver subject is checked
//!   against nobody's permissions, so one the replica made could deliver
//!   onto another replica's upload subject). A message leaves the stream
//!   when the replica acknowledges it, which it does once its loop applied
//!   it. A send is taken when the broker stored it:
//!   from then on the broker keeps it across its own restarts, for
//!   [`Settings::keep_for`]. A stream that is full refuses more (the send
//!   fails and the message waits in the outbox, as for a replica out of
//!   reach); one whose oldest message outlived `keep_for` drops it, and the
//!   replica, finding the gap, is provisioned again.
//! - **Up.** Every replica publishes to `magic_sync.up.<token>`, which the
//!   broker lets only that replica do; the subject names the replica. One
//!   stream, `MAGIC_SYNC_UP`, keeps what they said until the server's
//!   consumer takes it. What is taken is acknowledged to the broker once
//!   the relay drained it, so the broker never hands the server more than
//!   [`Settings::queued`] reports not yet drained: memory for what replicas
//!   say is bounded by the broker, not by how fast they talk. A replica
//!   that floods is held to [`Settings::queued_per_replica`] waiting reports
//!   of its own; past that its oldest go, and it sends its rows again, as
//!   after any lost upload.
//! - **Bounded as decoded.** A report is counted on the wire before it is
//!   decoded ([`magic_sync::core::bounds`]): one whose entries exceed what an
//!   `Up` may carry is refused unheard, and the reports held for the relay
//!   take at most [`Settings::decoded_bytes`] decoded; past that the server
//!   takes no more from the broker until the relay drained some.

use crate::{
    down_subject, replica_of, stream_of, Error, Reach, Result, CONSUMER, UP, UP_CONSUMER, UP_STREAM,
};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::{self, consumer, stream, AckKind};
use async_nats::ConnectErrorKind;
use futures_util::StreamExt;
use magic_sync::core::bounds::{bounded_decode, UpBounds};
use magic_sync::envelope::Filed;
use magic_sync::relay::{SendError, Transport};
use magic_sync::run::server::Reports;
use magic_sync::run::{LinkError, Report};
use magic_sync::ReplicaId;
use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How the server uses the broker.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The broker's address (`nats://host:4222`).
    pub url: String,
    /// The most bytes of one message; by default what the broker takes
    /// (its `max_payload`), less room for headers.
    pub max_message_bytes: Option<usize>,
    /// How long a replica's stream keeps a message it has not taken.
    pub keep_for: Duration,
    /// The most bytes a replica's stream keeps; -1 (the default) for no
    /// bound of its own beyond `keep_messages`. The broker reserves a
    /// bound, for every replica, against its `max_file_store`: 100,000
    /// replicas of 64 MiB reserve 6.4 TB.
    pub keep_bytes: i64,
    /// The most messages a replica's stream keeps.
    pub keep_messages: i64,
    /// How long the broker may take to say it stored a message.
    pub publish_timeout: Duration,
    /// Reports the broker hands the server before the relay drained them.
    pub queued: i64,
    /// Reports of one replica the upload stream keeps waiting.
    pub queued_per_replica: i64,
    /// How long a report taken and not drained stays the server's before
    /// the broker hands it over again (after a server that died, say).
    pub ack_wait: Duration,
    /// The most bytes the reports taken and not drained take decoded (each
    /// counted on the wire, [`magic_sync::core::bounds`]); past it the
    /// server takes no more until the relay drained some. One report is
    /// always taken, whatever its size within the bounds of an `Up`.
    pub decoded_bytes: usize,
    /// How long a message handed to a replica and not acknowledged stays
    /// its own before the broker hands it over again: its consumer's
    /// `ack_wait`, which the server sets when it makes the consumer. A
    /// replica that died holding messages finds them again after this.
    pub replica_ack_wait: Duration,
    /// Messages a replica is handed and has not acknowledged, at most: what
    /// waits for its loop in its memory.
    pub replica_in_flight: i64,
    /// Trust only the certificates in this PEM file for the broker's TLS,
    /// and require TLS. `None` trusts the system's roots.
    pub trust: Option<PathBuf>,
    /// Allow `nats://` (no TLS) to a broker on another machine: every row
    /// sent would cross the network in the clear. Off by default.
    pub allow_plain: bool,
}

impl Settings {
    /// Settings for the broker at `url`, the rest by default.
    pub fn new(url: impl Into<String>) -> Settings {
        Settings {
            url: url.into(),
            max_message_bytes: None,
            keep_for: Duration::from_secs(2 * 24 * 3600),
            keep_bytes: -1,
            keep_messages: 50_000,
            publish_timeout: Duration::from_secs(5),
            queued: 256,
            queued_per_replica: 64,
            ack_wait: Duration::from_secs(60),
            decoded_bytes: 256 << 20,
            replica_ack_wait: Duration::from_secs(30),
            replica_in_flight: 64,
            trust: None,
            allow_plain: false,
        }
    }

    fn reach(&self) -> Reach<'_> {
        Reach {
            url: &self.url,
            trust: self.trust.as_deref(),
            allow_plain: self.allow_plain,
        }
    }

    /// A connection as the server (`seed`), named `name` on the broker;
    /// it connects again by itself after a loss.
    async fn connect(&self, seed: &str, name: &str) -> Result<async_nats::Client> {
        self.reach().check("the server sends")?;
        self.reach()
            .apply(async_nats::ConnectOptions::with_nkey(seed.to_string()))
            .name(name)
            .max_reconnects(None)
            .connect(&self.url)
            .await
            .map_err(|e| {
                let why = self.reach().not_connected(&e);
                Error::Broker(match e.kind() {
                    // Its credentials or its certificates: the operator's.
                    ConnectErrorKind::Authentication
                    | ConnectErrorKind::AuthorizationViolation
                    | ConnectErrorKind::Tls
                    | ConnectErrorKind::ServerParse => LinkError::misconfigured(why),
                    ConnectErrorKind::Dns
                    | ConnectErrorKind::TimedOut
                    | ConnectErrorKind::Io
                    | ConnectErrorKind::MaxReconnects => LinkError::unreachable(why),
                })
            })
    }
}

/// How long the broker remembers a message's id, to keep one copy of a
/// message sent twice.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// Header room left in a broker message beside the payload.
const HEADER_ROOM: usize = 1024;

/// A report taken from the broker, with what acknowledges it there.
struct Taken {
    replica: ReplicaId,
    report: Report,
    acker: jetstream::message::Acker,
    /// At most what it takes decoded.
    decoded_bytes: usize,
}

/// The reports taken and not yet drained, and what they take decoded.
#[derive(Default)]
struct Held {
    taken: Vec<Taken>,
    decoded_bytes: usize,
}

struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    settings: Settings,
    max_message_bytes: usize,
    /// Replicas whose stream this process made sure of.
    streams: Mutex<HashSet<ReplicaId>>,
    reports: Mutex<Held>,
    reported: Notify,
    /// The relay drained reports: room for more.
    drained: Notify,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Broker")
            .field("url", &self.settings.url)
            .field("max_message_bytes", &self.max_message_bytes)
            .finish_non_exhaustive()
    }
}

/// The relay's transport and reports through NATS JetStream.
#[derive(Debug, Clone)]
pub struct Broker {
    inner: Arc<Inner>,
    consuming: Arc<tokio::task::JoinHandle<()>>,
}

impl Drop for Broker {
    fn drop(&mut self) {
        if Arc::strong_count(&self.consuming) == 1 {
            self.consuming.abort();
        }
    }
}

impl Broker {
    /// Connects as the server (`seed`, its nkey seed), makes sure of the
    /// upload stream and the server's consumer of it, and starts taking
    /// what replicas say. Connecting again after a loss is the client's:
    /// sends fail meanwhile, and messages wait in the outbox.
    pub async fn connect(settings: Settings, seed: &str) -> Result<Broker> {
        let client = settings.connect(seed, "magic_sync server").await?;
        let payload = client.server_info().max_payload;
        let max_message_bytes = settings
            .max_message_bytes
            .unwrap_or(payload.saturating_sub(HEADER_ROOM));
        if max_message_bytes + HEADER_ROOM > payload || max_message_bytes < 4096 {
            return Err(Error::Settings(format!(
                "messages of {max_message_bytes} bytes do not fit the broker's max_payload ({payload} bytes, {HEADER_ROOM} kept for headers)"
            )));
        }
        let js = jetstream::new(client.clone());
        let inner = Arc::new(Inner {
            client,
            js,
            settings,
            max_message_bytes,
            streams: Mutex::new(HashSet::new()),
            reports: Mutex::new(Held::default()),
            reported: Notify::new(),
            drained: Notify::new(),
        });
        // The first set-up fails the call; later ones are retried.
        let uploads = inner.uploads().await?;
        let consuming = tokio::spawn(consume(inner.clone(), Some(uploads)));
        Ok(Broker {
            inner,
            consuming: Arc::new(consuming),
        })
    }

    /// Makes sure `replica`'s stream and its consumer exist, so that its
    /// mailbox can open before the server first sends to it: call it when
    /// the replica is enrolled. Sending does the same.
    pub async fn prepare(&self, replica: &str) -> Result<()> {
        self.inner
            .stream(&ReplicaId::from(replica.to_string()))
            .await
    }

    /// Asks where streams stand over this connection ([`Inspector`]).
    pub fn inspector(&self) -> Inspector {
        Inspector {
            js: self.inner.js.clone(),
        }
    }

    /// The broker's client, as the server connected.
    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }
}

/// Where a stream and its one consumer stand on the broker: a replica's
/// messages and the replica's consumer, or the reports and the server's.
/// What tells a replica that does not read (nothing asks its consumer for
/// messages: it is not running, or cannot connect) from one that reads and
/// is slow (messages handed and not acknowledged).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Standing {
    /// The stream's name.
    pub stream: String,
    /// Messages the stream keeps; `None` when there is no such stream.
    pub waiting: Option<u64>,
    /// Its consumer; `None` when there is none (a stream made by a server
    /// of an earlier build, before it next sends).
    pub consumer: Option<Reading>,
}

/// What a stream's consumer was handed and has dealt with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Reading {
    /// The stream's last message handed to it.
    pub handed_up_to: u64,
    /// Handed and not yet acknowledged.
    pub not_acknowledged: usize,
    /// Handed more than once (not acknowledged in time).
    pub handed_again: usize,
    /// In the stream and not yet handed.
    pub yet_to_hand: u64,
    /// Requests for more waiting at the consumer: a reader that reads
    /// keeps one there, so none means nothing reads it now.
    pub asking: usize,
}

impl std::fmt::Display for Standing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(waiting) = self.waiting else {
            return write!(f, "no stream `{}`", self.stream);
        };
        let noun = if waiting == 1 { "message" } else { "messages" };
        write!(f, "{waiting} {noun} waiting in `{}`; ", self.stream)?;
        let Some(r) = &self.consumer else {
            return write!(f, "no consumer reads it");
        };
        if r.asking == 0 {
            write!(f, "nothing reads it now; ")?;
        }
        write!(
            f,
            "its consumer was handed up to #{}, {} of them not acknowledged \
             ({} handed again), {} yet to hand",
            r.handed_up_to, r.not_acknowledged, r.handed_again, r.yet_to_hand
        )
    }
}

/// Where `stream` and its consumer `consumer` stand; reads only.
async fn standing(js: &jetstream::Context, stream: &str, consumer: &str) -> Result<Standing> {
    let unknown = |e: &dyn std::fmt::Display| e.to_string().contains("not found");
    let mut found = match js.get_stream(stream).await {
        Ok(found) => found,
        Err(e) if unknown(&e) => {
            return Ok(Standing {
                stream: stream.to_string(),
                waiting: None,
                consumer: None,
            })
        }
        Err(e) => return Err(Error::broker(&format!("the stream `{stream}`"), e)),
    };
    let waiting = found
        .info()
        .await
        .map_err(|e| Error::broker(&format!("the stream `{stream}`"), e))?
        .state
        .messages;
    let consumer = match found.consumer_info(consumer).await {
        Ok(info) => Some(Reading {
            handed_up_to: info.delivered.stream_sequence,
            not_acknowledged: info.num_ack_pending,
            handed_again: info.num_redelivered,
            yet_to_hand: info.num_pending,
            asking: info.num_waiting,
        }),
        Err(e) if unknown(&e) => None,
        Err(e) => {
            return Err(Error::broker(
                &format!("the consumer `{consumer}` of `{stream}`"),
                e,
            ))
        }
    };
    Ok(Standing {
        stream: stream.to_string(),
        waiting: Some(waiting),
        consumer,
    })
}

/// A connection as the server that only asks the broker where streams
/// stand: it takes no report, so it may run beside the relay (as
/// `magic-sync broker status` does).
#[derive(Debug, Clone)]
pub struct Inspector {
    js: jetstream::Context,
}

impl Inspector {
    /// Connects as the server (`seed`), as [`Broker::connect`] does, and
    /// makes nothing. A relay's own `Broker` gives one over its connection
    /// ([`Broker::inspector`]).
    pub async fn connect(settings: &Settings, seed: &str) -> Result<Inspector> {
        let client = settings.connect(seed, "magic_sync inspector").await?;
        Ok(Inspector {
            js: jetstream::new(client),
        })
    }

    /// Where `replica`'s mailbox stands on the broker.
    pub async fn standing(&self, replica: &str) -> Result<Standing> {
        standing(&self.js, &stream_of(replica), CONSUMER).await
    }

    /// Where the reports waiting for the server stand, as [`standing`]
    /// says it of a replica's messages.
    ///
    /// [`standing`]: Inspector::standing
    pub async fn uploads_standing(&self) -> Result<Standing> {
        standing(&self.js, UP_STREAM, UP_CONSUMER).await
    }
}

impl Inner {
    /// `replica`'s stream and its consumer, made if missing.
    async fn stream(&self, replica: &ReplicaId) -> Result<()> {
        if self.streams.lock().expect("not poisoned").contains(replica) {
            return Ok(());
        }
        let s = &self.settings;
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: stream_of(replica),
                subjects: vec![down_subject(replica)],
                retention: stream::RetentionPolicy::WorkQueue,
                discard: stream::DiscardPolicy::New,
                max_age: s.keep_for,
                max_bytes: s.keep_bytes,
                max_messages: s.keep_messages,
                max_message_size: i32::try_from(self.max_message_bytes + HEADER_ROOM)
                    .unwrap_or(i32::MAX),
                storage: stream::StorageType::File,
                // The broker refuses a window longer than what it keeps.
                duplicate_window: DUPLICATE_WINDOW.min(s.keep_for),
                ..Default::default()
            })
            .await
            .map_err(|e| Error::broker(&format!("the stream of replica `{replica}`"), e))?;
        self.replica_consumer(replica, &stream)
            .await
            .map_err(|e| Error::broker(&format!("the consumer of replica `{replica}`"), e))?;
        self.streams
            .lock()
            .expect("not poisoned")
            .insert(replica.clone());
        Ok(())
    }

    /// Makes sure `stream` has the replica's consumer as the server sets
    /// it. One that differs (a replica of an earlier build made its own,
    /// perhaps a push consumer delivering elsewhere) is removed and made
    /// again: a new consumer of a work queue begins at the first message
    /// not acknowledged, so nothing is lost or reordered.
    async fn replica_consumer(
        &self,
        replica: &ReplicaId,
        stream: &stream::Stream,
    ) -> Result<(), async_nats::Error> {
        let wanted = consumer::pull::Config {
            durable_name: Some(CONSUMER.to_string()),
            ack_policy: consumer::AckPolicy::Explicit,
            ack_wait: self.settings.replica_ack_wait,
            deliver_policy: consumer::DeliverPolicy::All,
            max_ack_pending: self.settings.replica_in_flight,
            ..Default::default()
        };
        match stream.consumer_info(CONSUMER).await {
            Ok(info) if is_as_set(&info.config, &wanted) => return Ok(()),
            Ok(info) => {
                tracing::warn!(
                    replica = %replica,
                    deliver_subject = ?info.config.deliver_subject,
                    "the replica's consumer is not the one the server sets; made again"
                );
                stream.delete_consumer(CONSUMER).await?;
            }
            Err(e) if matches!(e.kind(), ConsumerInfoErrorKind::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
        stream.create_consumer(wanted).await?;
        Ok(())
    }

    /// Holds `taken` for the relay to drain, once the reports held leave
    /// room for what it takes decoded; the first is held whatever it takes.
    async fn hold(&self, taken: Taken) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            {
                let mut held = self.reports.lock().expect("not poisoned");
                let room = self
                    .settings
                    .decoded_bytes
                    .saturating_sub(held.decoded_bytes);
                if held.taken.is_empty() || taken.decoded_bytes <= room {
                    held.decoded_bytes += taken.decoded_bytes;
                    held.taken.push(taken);
                    break;
                }
            }
            // Taking no more meanwhile: the broker keeps the rest.
            drained.await;
        }
        self.reported.notify_waiters();
    }

    /// The upload stream and the server's consumer of it.
    async fn uploads(&self) -> Result<consumer::PullConsumer> {
        let s = &self.settings;
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: UP_STREAM.to_string(),
                subjects: vec![format!("{UP}.*")],
                retention: stream::RetentionPolicy::WorkQueue,
                discard: stream::DiscardPolicy::Old,
                max_messages_per_subject: s.queued_per_replica,
                max_message_size: i32::try_from(self.max_message_bytes + HEADER_ROOM)
                    .unwrap_or(i32::MAX),
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map_err(|e| Error::broker("the upload stream", e))?;
        stream
            .get_or_create_consumer(
                UP_CONSUMER,
                consumer::pull::Config {
                    durable_name: Some(UP_CONSUMER.to_string()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: s.ack_wait,
                    max_ack_pending: s.queued,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| Error::broker("the server's consumer of uploads", e))
    }

    async fn publish(&self, replica: &ReplicaId, id: Option<&str>, frame: Vec<u8>) -> Result<()> {
        self.stream(replica).await?;
        let mut headers = async_nats::HeaderMap::new();
        if let Some(id) = id {
            // The broker keeps one copy of a message sent twice.
            headers.insert("Nats-Msg-Id", id);
        }
        let stored = self
            .js
            .publish_with_headers(down_subject(replica), headers, frame.into())
            .await
            .map_err(|e| not_published("publishing", &e))?;
        match tokio::time::timeout(self.settings.publish_timeout, stored).await {
            Err(_) => Err(Error::Broker(LinkError::unreachable(format!(
                "the broker did not say it stored a message in {:?}",
                self.settings.publish_timeout
            )))),
            Ok(Err(e)) => {
                // A stream lost with the broker's storage is made again.
                self.streams.lock().expect("not poisoned").remove(replica);
                Err(not_published("storing", &e))
            }
            Ok(Ok(_)) => Ok(()),
        }
    }
}

/// A publish the broker did not take, doing `what`, by its kind: a message
/// larger than the broker carries never goes as it is; anything else
/// (the connection, a timeout, a stream being made again) may go later.
fn not_published(what: &str, e: &jetstream::context::PublishError) -> Error {
    let why = format!("{what}: {e}");
    Error::Broker(match e.kind() {
        jetstream::context::PublishErrorKind::MaxPayloadExceeded => LinkError::refused(why),
        _ => LinkError::unreachable(why),
    })
}

/// Whether `found` is the replica's consumer as the server sets it
/// (`wanted`): a durable pull consumer of the whole stream, acknowledged
/// one by one, with the server's timings.
fn is_as_set(found: &consumer::Config, wanted: &consumer::pull::Config) -> bool {
    found.deliver_subject.is_none()
        && found.deliver_group.is_none()
        && found.durable_name == wanted.durable_name
        && found.filter_subject.is_empty()
        && found.ack_policy == wanted.ack_policy
        && found.deliver_policy == wanted.deliver_policy
        && found.ack_wait == wanted.ack_wait
        && found.max_ack_pending == wanted.max_ack_pending
        && !found.headers_only
}

/// Takes what replicas say, for as long as the broker is kept; after a
/// failure, sets the consumer up again and goes on.
async fn consume(inner: Arc<Inner>, mut ready: Option<consumer::PullConsumer>) {
    let mut backoff =
        magic_sync::backoff::Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let consumer = match ready.take() {
            Some(consumer) => consumer,
            None => match inner.uploads().await {
                Ok(consumer) => consumer,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot take what replicas say yet");
                    tokio::time::sleep(backoff.next_wait()).await;
                    continue;
                }
            },
        };
        let mut messages = match consumer
            .stream()
            .heartbeat(Duration::from_secs(5))
            .expires(Duration::from_secs(30))
            .messages()
            .await
        {
            Ok(messages) => messages,
            Err(e) => {
                tracing::warn!(error = %e, "cannot take what replicas say yet");
                tokio::time::sleep(backoff.next_wait()).await;
                continue;
            }
        };
        while let Some(message) = messages.next().await {
            let message = match message {
                Ok(message) => message,
                Err(e) => {
                    tracing::warn!(error = %e, "taking what replicas say failed; taking it again");
                    break;
                }
            };
            backoff.reset();
            let (message, acker) = message.split();
            let Some(replica) = message
                .subject
                .strip_prefix(UP)
                .and_then(|t| t.strip_prefix('.'))
                .and_then(replica_of)
            else {
                LOGBOOK.log(Logged::NoReplica, |more| {
                    tracing::warn!(subject = %message.subject, "a report on a subject that names no replica is dropped{more}")
                });
                let _ = acker.ack_with(AckKind::Term).await;
                continue;
            };
            let bounds = UpBounds::of_messages(inner.max_message_bytes + HEADER_ROOM);
            match bounded_decode(&message.payload, &bounds) {
                Ok(bounded) => {
                    inner
                        .hold(Taken {
                            replica,
                            report: Report::from_up(bounded.up),
                            acker,
                            decoded_bytes: bounded.decoded_bytes,
                        })
                        .await;
                }
                Err(e) => {
                    LOGBOOK.log(Logged::Unheard, |more| {
                        tracing::warn!(replica = %replica, error = %e, "a report refused unheard{more}")
                    });
                    let _ = acker.ack_with(AckKind::Term).await;
                }
            }
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

impl Transport for Broker {
    fn max_message_bytes(&self) -> usize {
        self.inner.max_message_bytes
    }

    async fn send(&self, replica: &ReplicaId, id: &str, message: Vec<u8>) -> Result<(), SendError> {
        self.inner
            .publish(replica, Some(id), magic_sync::run::message_frame(message))
            .await
            .map_err(Error::into_link)
    }

    async fn answer(&self, replica: &ReplicaId, filed: Filed) -> Result<(), SendError> {
        self.inner
            .publish(replica, None, magic_sync::run::filed_frame(filed))
            .await
            .map_err(Error::into_link)
    }

    /// The broker cannot close one replica's connection; what it said was
    /// refused, and this says so where an operator looks.
    fn misbehaved(&self, replica: &ReplicaId, why: &str) {
        LOGBOOK.log(Logged::Misbehaved, |more| {
            tracing::warn!(replica = %replica, why, "a replica misbehaved; what it said was refused{more}")
        });
    }
}

/// What replicas do wrong, logged a line a minute per kind however many do
/// it (a replica can publish the same wrong thing as fast as it likes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Logged {
    NoReplica,
    Unheard,
    Misbehaved,
}

static LOGBOOK: std::sync::LazyLock<magic_sync::core::logbook::Logbook<Logged>> =
    std::sync::LazyLock::new(Default::default);

impl Reports for Broker {
    fn drain(&self) -> Vec<(ReplicaId, Report)> {
        let taken = {
            let mut held = self.inner.reports.lock().expect("not poisoned");
            held.decoded_bytes = 0;
            std::mem::take(&mut held.taken)
        };
        let mut reports = Vec::with_capacity(taken.len());
        let mut ackers = Vec::with_capacity(taken.len());
        for Taken {
            replica,
            report,
            acker,
            ..
        } in taken
        {
            reports.push((replica, report));
            ackers.push(acker);
        }
        if !ackers.is_empty() {
            // Drained: room for more, and the broker may hand them over.
            self.inner.drained.notify_waiters();
            tokio::spawn(async move {
                for acker in ackers {
                    let _ = acker.ack().await;
                }
            });
        }
        reports
    }

    async fn wait(&self) {
        let notified = self.inner.reported.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if !self
            .inner
            .reports
            .lock()
            .expect("not poisoned")
            .taken
            .is_empty()
        {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::not_published;
    use crate::Error;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};
    use magic_sync::run::{LinkError, LinkErrorKind};
    use magic_sync::Handling;

    #[test]
    fn a_message_larger_than_the_broker_carries_is_refused_anything_else_waits() {
        let too_large = not_published(
            "publishing",
            &PublishError::new(PublishErrorKind::MaxPayloadExceeded),
        );
        let timed_out = not_published("storing", &PublishError::new(PublishErrorKind::TimedOut));
        assert_eq!(too_large.handling(), Handling::SetAside, "{too_large}");
        assert_eq!(timed_out.handling(), Handling::Retry, "{timed_out}");
        // The relay's send keeps the broker's kind, and its words.
        let sent = too_large.into_link();
        assert_eq!(sent.kind, LinkErrorKind::Refused);
        assert!(sent.why.starts_with("the broker: publishing: "), "{sent}");
    }

    #[test]
    fn a_setting_that_cannot_work_is_the_operators_and_a_send_says_so() {
        let e = Error::Settings("the broker `x` is not a nats:// or tls:// address".into());
        assert_eq!(e.handling(), Handling::Stop);
        assert_eq!(e.into_link().kind, LinkErrorKind::Misconfigured);
        let refused = Error::Broker(LinkError::misconfigured("authorization violation"));
        assert_eq!(refused.handling(), Handling::Stop);
    }
}

//! The relay's loop: take the lock, then pass after pass — observe, plan,
//! record — waiting briefly when there was nothing to do, and backing off
//! after a failure; between passes, begin the snapshots of replicas waiting
//! for one, each streamed on a connection of its own while the passes go
//! on; beside the passes, on a second connection, publish what they wrote
//! and heed what replicas said.

use crate::backoff::Backoff;
use crate::engine::Engine;
use crate::envelope::{Ack, Filed, Gap, Receipt, Up};
use crate::error::{Handling, Result};
use crate::relay::{Failed, Heard, Relay, Replicas, Settings, Snapshot, Streamed, Transport};
use crate::session::{Session, SessionSettings};
use crate::store::epoch::Epoch;
use crate::store::wake::{self, Doze};
use futures_util::stream::{FuturesUnordered, StreamExt};
pub use magic_sync_core::link::Report;
use magic_sync_core::{MessageNo, ReplicaId};
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::{CancelToken, Client};
use tracing::Instrument;

/// Where what replicas say reaches the server.
pub trait Reports: Send + Sync {
    /// Everything said since the last call, by the replica the transport
    /// authenticated, oldest first.
    fn drain(&self) -> Vec<(ReplicaId, Report)>;
    /// Resolves when something was said.
    fn wait(&self) -> impl Future<Output = ()> + Send;
}

/// Applies what replicas said: acknowledgements all at once, gaps one by
/// one, uploads all in one transaction ([`crate::file::file_all`]), each
/// answered through `transport` once that committed, and digests compared
/// with the record ([`crate::relay::compare_digest`]). Nothing one replica
/// says can fail the call or touch another replica's work: an
/// acknowledgement that does not verify (a forged seal, a number no message
/// has) is refused, reported to the transport as misbehaviour and changes
/// nothing; an upload that cannot be filed for good is reported and
/// dropped; one that waits, or whose answer the transport cannot carry,
/// comes again from its replica. Only the database failing fails it. Needs
/// no lock. The runner does all but the digests this way on its publishing
/// connection, beside the passes, and compares digests on a connection of
/// their own ([`hear`]).
pub async fn heed<T: Transport>(
    client: &mut Client,
    engine: &Engine,
    transport: &T,
    reports: Vec<(ReplicaId, Report)>,
) -> Result<Heeded> {
    let (mut heeded, digests) = hear(client, engine, transport, reports).await?;
    for (replica, heard) in digests {
        let compared = heard.compare(client, engine, &replica).await?;
        tracing::debug!(replica = %replica, ?compared, "a digest");
        heeded.digests.push((replica, compared));
    }
    Ok(heeded)
}

/// [`heed`], but for the digests: each is handed back as it was heard, for
/// the caller to compare where it will ([`crate::relay::Heard::compare`]).
/// Comparing one reads the replica's whole record, which for a large
/// replica would hold back every acknowledgement and upload heard after it.
///
/// What was said costs round trips by its kind, never by how much of it
/// came: the uploads are filed together, the acknowledgements judged
/// together, and of the gaps only each replica's newest counts (it waits
/// for a snapshot however many it said), all in one statement sent beside
/// the acknowledgements' read. A replica flooding gaps or acknowledgements
/// holds back nobody's reports.
pub async fn hear<T: Transport>(
    client: &mut Client,
    engine: &Engine,
    transport: &T,
    reports: Vec<(ReplicaId, Report)>,
) -> Result<(Heeded, Vec<(ReplicaId, Heard)>)> {
    let mut said = Said::sort(transport, reports);
    let uploads = std::mem::take(&mut said.uploads);
    // The epoch the answers' receipts are made in; the acknowledgements'
    // read takes it beside the chains otherwise.
    let mut epoch = None;
    let mut filed = 0;
    if !uploads.is_empty() {
        let read = epoch.insert(Epoch::read(&*client).await?);
        filed = file_and_answer(client, engine, transport, read, &uploads).await?;
    }
    let (mut heeded, digests) = hear_said(client, transport, said, epoch.as_ref()).await?;
    heeded.filed = filed;
    Ok((heeded, digests))
}

/// What replicas said but their uploads, heard: the acknowledgements
/// judged together, each replica's newest gap, the digests handed back.
/// `epoch` is the epoch when the caller read it already.
async fn hear_said<T: Transport>(
    client: &Client,
    transport: &T,
    said: Said,
    epoch: Option<&Epoch>,
) -> Result<(Heeded, Vec<(ReplicaId, Heard)>)> {
    let mut heeded = Heeded::default();
    if said.acks.is_empty() && said.gaps.is_empty() {
        return Ok((heeded, said.digests));
    }
    let gaps: Vec<(ReplicaId, Gap)> = said.gaps.into_iter().collect();
    let started = Instant::now();
    let (marked, judged) = tokio::try_join!(
        crate::relay::gaps(client, &gaps),
        crate::relay::acknowledge(client, epoch, &said.acks)
    )?;
    crate::relay::trace(&format!("heed/acks ({})", said.acks.len()), started);
    heeded.marked = marked.len() as u64 + judged.marked;
    for ((replica, ack), outcome) in said.acks.iter().zip(judged.outcomes) {
        match outcome {
            Ok(crate::relay::Acknowledged::Recorded) => {
                // A recorded number is one the server sealed, so drew: it fits.
                let number = MessageNo::from_wire(ack.number).map_or(i64::MAX, MessageNo::store);
                heeded.acknowledged.push((replica.clone(), number));
            }
            Ok(_) => {}
            Err(e) => {
                LOGBOOK.log(Logged::AckRefused, |more| {
                    tracing::warn!(replica = %replica, error = %e, "acknowledgement refused{more}")
                });
                transport.misbehaved(replica, &e.to_string());
            }
        }
    }
    Ok((heeded, said.digests))
}

/// What replicas said, sorted by what the server does with it.
#[derive(Default)]
struct Said {
    acks: Vec<(ReplicaId, Ack)>,
    /// The newest gap of each replica that said one.
    gaps: std::collections::BTreeMap<ReplicaId, Gap>,
    uploads: Vec<(ReplicaId, Up)>,
    digests: Vec<(ReplicaId, Heard)>,
}

impl Said {
    fn sort<T: Transport>(transport: &T, reports: Vec<(ReplicaId, Report)>) -> Said {
        let mut said = Said::default();
        for (replica, report) in reports {
            match report {
                Report::Applied(ack) => said.acks.push((replica, ack)),
                Report::Gap(gap) => {
                    // A replica in a gap waits for a snapshot: its newest
                    // says all its earlier ones did.
                    said.gaps.insert(replica, gap);
                }
                Report::Upload(mut up) => {
                    if let Some(digest) = up.digest.take() {
                        // The backstop: compared with the record, and the
                        // replica provisioned again if it drifted.
                        let heard = Heard {
                            digest,
                            applied: up.applied.take(),
                            refused: std::mem::take(&mut up.refused),
                        };
                        said.digests.push((replica.clone(), heard));
                    }
                    let nothing_to_file =
                        up.send_id.is_empty() && up.tables.is_empty() && up.backlog.is_none();
                    if nothing_to_file {
                        continue;
                    }
                    if let Some(up) = within_limit(transport, &replica, up) {
                        said.uploads.push((replica, up));
                    }
                }
            }
        }
        said
    }
}

/// `up`, unless it is larger than a message may be: a replica's uplink
/// keeps within the limit, so this one misbehaved. Nothing of it is filed,
/// and no answer goes.
fn within_limit<T: Transport>(transport: &T, replica: &ReplicaId, up: Up) -> Option<Up> {
    use magic_sync_core::link::{upload_rows, MAX_UPLOAD_ROWS};
    let bytes = prost::Message::encoded_len(&up);
    let rows = upload_rows(&up);
    if bytes <= transport.max_message_bytes() && rows <= MAX_UPLOAD_ROWS {
        return Some(up);
    }
    let why = if rows > MAX_UPLOAD_ROWS {
        format!("an upload of {rows} rows, more than one may carry ({MAX_UPLOAD_ROWS}): refused, nothing filed")
    } else {
        format!(
            "an upload of {bytes} bytes, more than a message may have ({}): refused, nothing filed",
            transport.max_message_bytes()
        )
    };
    LOGBOOK.log(
        Logged::Oversized,
        |more| tracing::warn!(replica = %replica, "{why}{more}"),
    );
    transport.misbehaved(replica, &why);
    None
}

/// What replicas do wrong, logged a line a minute per kind however many
/// do it (a replica can say the same wrong thing as fast as it is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Logged {
    /// An acknowledgement under no seal of the server's.
    AckRefused,
    /// An upload larger than a message, or of more rows than one carries.
    Oversized,
    /// An upload that could not be filed.
    NotFiled,
}

static LOGBOOK: std::sync::LazyLock<magic_sync_core::logbook::Logbook<Logged>> =
    std::sync::LazyLock::new(Default::default);

/// Files `uploads` in one transaction, then answers each filed one, with
/// its receipt in `epoch` for a replica that takes receipts; returns how
/// many were filed.
async fn file_and_answer<T: Transport>(
    client: &mut Client,
    engine: &Engine,
    transport: &T,
    epoch: &Epoch,
    uploads: &[(ReplicaId, Up)],
) -> Result<u64> {
    let started = Instant::now();
    let filings = crate::file::file_all(client, engine, uploads).await?;
    crate::relay::trace(&format!("heed/file ({} uploads)", uploads.len()), started);
    let started = Instant::now();
    crate::file::checkpoint(client, uploads, &filings).await?;
    crate::relay::trace("heed/checkpoint", started);
    // Filed, not answered: the replica sends it again, and filing it again
    // changes nothing.
    fail::fail_point!("file-after-filing", |_| Err(crate::error::Error::Injected(
        "file-after-filing"
    )));
    let mut filed = 0;
    for ((replica, up), filing) in uploads.iter().zip(filings) {
        match filing {
            Ok(crate::file::Filing::Filed { answer, .. }) => {
                // Not carried: the replica sends it again. An upload
                // that only said its backlog wants no answer.
                if !answer.send_id.is_empty() {
                    filed += 1;
                    let answer = receipted(epoch, replica, up, answer);
                    let _ = transport.answer(replica, answer).await;
                }
            }
            Ok(crate::file::Filing::Waits { .. }) => {}
            Err(e) => LOGBOOK.log(Logged::NotFiled, |more| {
                tracing::warn!(replica = %replica, error = %e, "an upload was not filed{more}")
            }),
        }
    }
    Ok(filed)
}

/// `answer`, to `replica`'s upload `up`, as the replica reads it: signed
/// again with the server's receipt for the upload when the replica takes
/// receipts (`Up::takes_receipts`), as filing signed it otherwise (a
/// replica of an earlier build). The receipt carries the sequence as the
/// filing recorded it (`sync.uploads_answered` is `int8`), so no receipt
/// the server gives is ever above its own record.
fn receipted(epoch: &Epoch, replica: &ReplicaId, up: &Up, answer: Filed) -> Filed {
    if !up.takes_receipts {
        return answer;
    }
    let sequence = i64::try_from(up.sequence)
        .unwrap_or(i64::MAX)
        .unsigned_abs();
    let receipt = Receipt {
        epoch: epoch.id.to_vec(),
        sequence,
        seal: epoch.receipt(replica, sequence).to_vec(),
    };
    epoch.signer.answer(replica, answer.send_id, Some(receipt))
}

/// What [`heed`] recorded.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Heeded {
    /// Acknowledgements recorded, as (replica, message number), in the
    /// order they came.
    pub acknowledged: Vec<(ReplicaId, i64)>,
    /// Digests heard, and what became of each.
    pub digests: Vec<(ReplicaId, crate::relay::Compared)>,
    /// Uploads filed.
    pub filed: u64,
    /// Replicas newly marked to be provisioned again by what was said (a
    /// gap, an acknowledgement the server cannot take, a new epoch): a
    /// pass has something to do. One already marked is not counted.
    pub marked: u64,
}

/// What the runner's two loops measure together: the lags of messages
/// written and not yet acknowledged, and the period's figures.
#[derive(Debug, Default)]
struct Measured {
    lags: Lags,
    tally: crate::store::figures::Tally,
}

/// Per replica, the messages passes wrote it and when the oldest change
/// each carried was committed, until an acknowledgement covers them: how
/// long a change took from its commit to the replica saying it applied it
/// (`magic_sync_commit_to_acknowledged_seconds`).
#[derive(Debug, Default)]
struct Lags(HashMap<ReplicaId, std::collections::VecDeque<(i64, std::time::SystemTime)>>);

/// Messages remembered per replica at most; past it the two oldest merge,
/// keeping the older change, so a replica out of reach for long costs a
/// bounded book and its lag is never understated.
const LAGS_PER_REPLICA: usize = 1024;

impl Lags {
    fn written(&mut self, recorded: &crate::relay::Recorded) {
        for replica in &recorded.forgotten {
            self.0.remove(replica);
        }
        let Some(oldest) = recorded.oldest_change else {
            return;
        };
        for (replica, number) in &recorded.written {
            let book = self.0.entry(replica.clone()).or_default();
            if book.len() >= LAGS_PER_REPLICA {
                if let (Some((_, a)), Some((n, b))) = (book.pop_front(), book.pop_front()) {
                    book.push_front((n, a.min(b)));
                }
            }
            book.push_back((*number, oldest));
        }
    }

    /// The acknowledgement of `number` by `replica`: how long ago the
    /// oldest change it covers was committed, if it covers one.
    fn acknowledged(&mut self, replica: &str, number: i64) -> Option<Duration> {
        let book = self.0.get_mut(replica)?;
        let mut oldest = None::<std::time::SystemTime>;
        while book.front().is_some_and(|(n, _)| *n <= number) {
            let (_, at) = book.pop_front().expect("just seen");
            oldest = Some(oldest.map_or(at, |o| o.min(at)));
        }
        oldest.map(|at| at.elapsed().unwrap_or_default())
    }
}

/// Resolves once the process is asked to stop: SIGTERM (what a service
/// manager or a container runtime sends) or SIGINT (Ctrl-C). It listens
/// from the moment it is called, so a signal that comes before the first
/// poll is not missed. Given to [`server`] as its `stop`: the step under
/// way ends where it is (a pass not committed is rolled back whole, one
/// committed is published by whoever relays next), the relay's sessions
/// close and its lock goes back, and `server` returns `Ok`.
pub fn stop_signal() -> impl Future<Output = ()> {
    #[cfg(unix)]
    let terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate());
    async move {
        #[cfg(unix)]
        if let Ok(mut terminate) = terminate {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Runs the relay for `engine` over the database at `config` until `stop`
/// resolves. Waits for the lock while another relay holds it. A failed pass
/// is retried after a backoff with jitter; nothing is lost meanwhile: notes
/// stay pending and the outbox stays written. A failure only the operator
/// can end ([`Handling::Stop`]: declarations that disagree with the
/// database, an index or trigger missing, a schema of another build) is
/// returned instead, its text saying what to do.
///
/// When `stop` resolves, the statement in flight on either connection is
/// cancelled, the relay's lock given back and both connections closed
/// before this returns (within `settings.session.stop_timeout`), so a
/// stopped host leaves nothing running on the server. A host that dies
/// instead is covered by the sessions' own settings ([`crate::session`]).
pub async fn server<H, T, R>(
    config: tokio_postgres::Config,
    engine: Engine,
    settings: Settings,
    host: &H,
    transport: &T,
    reports: &R,
    stop: impl Future<Output = ()>,
) -> Result<()>
where
    H: Replicas,
    T: Transport,
    R: Reports,
{
    tokio::pin!(stop);
    let mut backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
    loop {
        let mut sessions = Sessions::default();
        let outcome = {
            let attempt = relay_loop(
                &mut sessions,
                &config,
                &engine,
                &settings,
                host,
                transport,
                reports,
                &mut backoff,
            );
            tokio::select! {
                () = &mut stop => None,
                result = attempt => Some(result),
            }
        };
        // Whatever ended the attempt, nothing of it goes on on the server.
        sessions.close(settings.session.stop_timeout).await;
        let e = match outcome {
            None => return Ok(()),
            Some(Ok(())) => continue,
            Some(Err(e)) => e,
        };
        match e.handling() {
            // Nothing will change until the operator acts: say what to do.
            Handling::Stop => {
                tracing::error!(error = %e, "the relay stops until the operator acts");
                return Err(e);
            }
            Handling::SetAside => {
                // Not narrowed to what it is about yet: the whole attempt
                // fails the same way until a fix is deployed.
                tracing::error!(
                    error = %e,
                    "a relay pass failed on what only a fix can change (deploy one); trying again after a backoff"
                );
            }
            Handling::Retry => tracing::warn!(error = %e, "a relay attempt failed; trying again"),
        }
        tokio::select! {
            () = &mut stop => return Ok(()),
            () = tokio::time::sleep(backoff.next_wait()) => {}
        }
    }
}

/// The runner's sessions, once open. They live outside the attempt that
/// uses them, so that however the attempt ends (stopped, or failed on one
/// connection while another was mid-statement) they can be closed. The
/// snapshots' sessions belong to their workers, which end with the
/// attempt; what they run is cancelled here.
#[derive(Default)]
struct Sessions {
    recorder: Option<Session>,
    publisher: Option<Session>,
    /// Opened for the first digest heard.
    digester: Option<Session>,
    /// Opened for the first upload heard.
    filer: Option<Session>,
    snapshots: Arc<Mutex<HashMap<ReplicaId, CancelToken>>>,
}

impl Sessions {
    async fn close(self, timeout: Duration) {
        let close = |s: Option<Session>| async move {
            if let Some(s) = s {
                s.close(timeout).await;
            }
        };
        let cancels: Vec<CancelToken> = self
            .snapshots
            .lock()
            .expect("not poisoned")
            .drain()
            .map(|(_, c)| c)
            .collect();
        let cancel = async {
            for c in cancels {
                if let Ok(tls) = crate::tls::tls() {
                    let _ = tokio::time::timeout(timeout, c.cancel_query(tls)).await;
                }
            }
        };
        tokio::join!(
            close(self.recorder),
            close(self.publisher),
            close(self.digester),
            close(self.filer),
            cancel
        );
    }
}

/// Records on the connection holding the lock and publishes and heeds on a
/// second one, at the same time: a pass's messages go out, and replicas'
/// acknowledgements are recorded, while the next pass plans. (Neither needs
/// the lock: the outbox holds only what a recording relay committed, a
/// replica applies a message once however often it comes, and
/// acknowledgements go to `sync.acks`, which passes write only to forget a
/// replica the host no longer lists.) Uploads are filed on a third, and
/// digests compared on a fourth, each opened when the first comes.
#[allow(clippy::too_many_arguments)]
async fn relay_loop<H: Replicas, T: Transport, R: Reports>(
    sessions: &mut Sessions,
    config: &tokio_postgres::Config,
    engine: &Engine,
    settings: &Settings,
    host: &H,
    transport: &T,
    reports: &R,
    backoff: &mut Backoff,
) -> Result<()> {
    let Sessions {
        recorder,
        publisher,
        digester,
        filer,
        ..
    } = sessions;
    let recorder = recorder.insert(Session::open(config, &settings.session, "record").await?);
    let mut relay = Relay::new(recorder.client(), engine.clone(), settings.clone()).await?;
    while !Relay::lock(recorder.client()).await? {
        tokio::time::sleep(settings.idle.max(Duration::from_millis(100))).await;
    }
    if settings.wake_on_commit {
        wake::listen(recorder.client()).await?;
    }
    let wakes = Wakes {
        notified: recorder.notifications(),
        stirred: Arc::new(tokio::sync::Notify::new()),
    };
    let publisher = publisher.insert(Session::open(config, &settings.session, "publish").await?);
    let written = tokio::sync::Notify::new();
    let digests = Digests::default();
    let filings = Filings::default();
    let measured = Mutex::new(Measured::default());
    let workers = Workers {
        config,
        session: &settings.session,
        transport,
        cancels: sessions.snapshots.clone(),
    };
    tokio::try_join!(
        record_forever(
            recorder.client_mut(),
            &mut relay,
            host,
            &workers,
            backoff,
            &written,
            &wakes,
            &measured
        ),
        publish_forever(
            publisher.client_mut(),
            transport,
            reports,
            settings,
            &written,
            &wakes.stirred,
            &measured,
            &digests,
            &filings
        ),
        file_forever(
            filer,
            config,
            &settings.session,
            engine,
            transport,
            &filings,
            &wakes.stirred
        ),
        compare_forever(
            digester,
            config,
            &settings.session,
            engine,
            &digests,
            &wakes.stirred
        )
    )?;
    Ok(())
}

/// How often the publisher looks at the outbox when no pass wrote to it
/// and no send failed.
const PUBLISH_AT_LEAST_EVERY: Duration = Duration::from_secs(1);

/// What ends a dozing recorder's wait, beside its longest
/// (`Settings::idle_longest`) and a snapshot that ends.
struct Wakes {
    /// A writer committed a note while the relay dozed (the recording
    /// session's notifications).
    notified: Arc<tokio::sync::Notify>,
    /// The publisher heard what a pass acts on: a gap, an upload filed
    /// (its checkpoint is answered by a pass), a digest compared.
    stirred: Arc<tokio::sync::Notify>,
}

/// What the snapshots' workers need: where to connect and how, where to
/// send, and where to leave what ends their sessions.
struct Workers<'a, T> {
    config: &'a tokio_postgres::Config,
    session: &'a SessionSettings,
    transport: &'a T,
    cancels: Arc<Mutex<HashMap<ReplicaId, CancelToken>>>,
}

impl<T: Transport> Workers<'_, T> {
    /// Streams `snapshot` on a session of its own, closed when it ends.
    async fn stream(&self, snapshot: Snapshot) -> (ReplicaId, Result<Streamed, Failed>) {
        let replica = snapshot.replica().clone();
        let mut session = match Session::open(self.config, self.session, "snapshot").await {
            Ok(session) => session,
            Err(e) => return (replica, Err(snapshot.fail(e))),
        };
        self.cancels
            .lock()
            .expect("not poisoned")
            .insert(replica.clone(), session.client().cancel_token());
        let span =
            tracing::info_span!(target: "magic_sync::snapshot", "snapshot", replica = %replica);
        let result = snapshot
            .stream(session.client_mut(), self.transport)
            .instrument(span)
            .await;
        self.cancels.lock().expect("not poisoned").remove(&replica);
        session.close(self.session.stop_timeout).await;
        (replica, result)
    }
}

/// The snapshots under way, and what became of those that ended.
#[derive(Default)]
struct Book {
    running: HashSet<ReplicaId>,
    retries: Retries,
    /// Messages and rows the snapshots that ended sent, not yet tallied.
    streamed: (u64, u64),
    /// Failed, to be put back to waiting on the lock's connection.
    failed: Vec<Failed>,
    /// A snapshot ended since the pass began: news the pass may not have
    /// seen (its end committed after the pass read), so another pass goes
    /// before the relay rests. Without it, changes held back for the end
    /// of a snapshot that ended mid-pass waited for the next wake, up to
    /// `idle_longest`.
    ended: bool,
}

impl Book {
    fn finished(
        &mut self,
        (replica, result): (ReplicaId, Result<Streamed, Failed>),
        settings: &Settings,
    ) {
        self.running.remove(&replica);
        self.ended = true;
        match result {
            Ok(streamed) => {
                self.streamed.0 += streamed.messages;
                self.streamed.1 += streamed.rows;
                self.retries.streamed(&replica);
            }
            Err(f) => {
                if !f.is_transient() {
                    tracing::error!(replica = %replica, error = %f, "a snapshot failed");
                }
                self.retries.failed(&replica, settings);
                self.failed.push(f);
            }
        }
    }
}

/// When each replica whose snapshot failed may be tried again, and the
/// waits after its next failures.
#[derive(Default)]
struct Retries(HashMap<ReplicaId, (Instant, Backoff)>);

impl Retries {
    fn failed(&mut self, replica: &ReplicaId, settings: &Settings) {
        let (at, backoff) = self.0.entry(replica.clone()).or_insert_with(|| {
            let backoff = Backoff::new(settings.backoff_min, settings.backoff_max);
            (Instant::now(), backoff)
        });
        *at = Instant::now() + backoff.next_wait();
    }

    fn streamed(&mut self, replica: &str) {
        self.0.remove(replica);
    }

    fn due(&self, replica: &str) -> bool {
        match self.0.get(replica) {
            Some((at, _)) => *at <= Instant::now(),
            None => true,
        }
    }
}

/// Pass after pass on the lock's connection; a pass that wrote messages
/// wakes the publisher. Between passes, the snapshots of replicas waiting
/// for one begin, up to `Settings::snapshots` at once, and stream while the
/// next passes run; one that failed is tried again after a backoff.
#[allow(clippy::too_many_arguments)]
async fn record_forever<H: Replicas, T: Transport>(
    client: &mut Client,
    relay: &mut Relay,
    host: &H,
    workers: &Workers<'_, T>,
    backoff: &mut Backoff,
    written: &tokio::sync::Notify,
    wakes: &Wakes,
    measured: &Mutex<Measured>,
) -> Result<()> {
    let settings = relay.settings().clone();
    let mut streaming = FuturesUnordered::new();
    let mut book = Book::default();
    loop {
        let replicas = host.replicas().await?;
        let started = std::time::Instant::now();
        book.ended = false;
        // A span per attempt, for a host exporting traces (OTLP): its
        // steps' timings are events within it.
        let span = tracing::info_span!(
            target: "magic_sync::pass",
            "pass",
            replicas = replicas.len(),
            notes = tracing::field::Empty,
            messages = tracing::field::Empty,
        );
        let pass = relay
            .record(client, &replicas, workers.transport.max_message_bytes())
            .instrument(span.clone());
        let recorded = beside_snapshots(pass, &mut streaming, &mut book, &settings).await;
        if let Ok(recorded) = &recorded {
            span.record("notes", recorded.planned.notes);
            span.record("messages", recorded.messages);
        }
        let recorded = match recorded {
            Ok(recorded) => recorded,
            // The pass lost a race with another transaction (what a
            // replica's report writes, say): it rolled back whole and its
            // session is sound, so the same pass runs again on it. The
            // attempt, the publisher and the snapshots under way go on.
            Err(e) if e.is_conflict() => {
                tracing::debug!(error = %e, "a pass gave way to another transaction; again");
                let wait = tokio::time::sleep(backoff.next_wait());
                beside_snapshots(wait, &mut streaming, &mut book, &settings).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        crate::relay::trace("record", started);
        // For a host that installs a `metrics` recorder (an exporter).
        metrics::histogram!("magic_sync_pass_seconds").record(started.elapsed().as_secs_f64());
        backoff.reset();
        measure(measured, &recorded, &mut book);
        if recorded.messages > 0 {
            written.notify_one();
        }
        // A snapshot's own connection may have been what failed.
        for f in book.failed.drain(..) {
            relay.abandon_snapshot(client, &f).await?;
            // What only the operator can end (a transport that refuses the
            // relay, say) is not begun again for ever: the runner stops.
            if f.source.handling() == Handling::Stop {
                return Err(f.source);
            }
        }
        for replica in &recorded.waiting {
            if book.running.len() >= settings.snapshots.max(1) {
                break;
            }
            if book.running.contains(replica) || !book.retries.due(replica) {
                continue;
            }
            if let Some(snapshot) = relay.begin_snapshot(client, replica).await? {
                book.running.insert(replica.clone());
                streaming.push(workers.stream(snapshot));
            }
        }
        if recorded.messages == 0
            && recorded.planned.notes == 0
            && recorded.deployed.is_none()
            && !book.ended
        {
            rest(client, wakes, &mut streaming, &mut book, &settings).await?;
        }
    }
}

/// Adds what a pass and the snapshots since the last one sent to the
/// period's figures.
fn measure(measured: &Mutex<Measured>, recorded: &crate::relay::Recorded, book: &mut Book) {
    let mut measured = measured.lock().expect("not poisoned");
    measured.lags.written(recorded);
    measured
        .tally
        .sent(recorded.messages, recorded.planned.sends);
    let (messages, rows) = std::mem::take(&mut book.streamed);
    measured.tally.sent(messages, rows);
}

/// After a pass with nothing to do: dozes until a commit's note, the
/// publisher or a snapshot's end wakes the relay (or `idle_longest`
/// passes), or, where a writer may not notify, waits `idle`; the
/// snapshots under way go on meanwhile.
async fn rest<S>(
    client: &mut Client,
    wakes: &Wakes,
    streaming: &mut FuturesUnordered<S>,
    book: &mut Book,
    settings: &Settings,
) -> Result<()>
where
    S: Future<Output = (ReplicaId, Result<Streamed, Failed>)>,
{
    let Wakes { notified, stirred } = wakes;
    let doze = match settings.wake_on_commit {
        true => wake::doze(client).await?,
        // Off: polled, as when a writer may not notify.
        false => Doze::Writing,
    };
    match doze {
        Doze::Noted => {}
        Doze::Writing => {
            let idle = tokio::time::sleep(settings.idle);
            beside_snapshots(idle, streaming, book, settings).await;
        }
        Doze::Dozing => {
            let woken = async {
                tokio::select! {
                    () = notified.notified() => {}
                    () = stirred.notified() => {}
                    () = tokio::time::sleep(settings.idle_longest) => {}
                }
            };
            until_a_snapshot_ends(woken, streaming, book, settings).await;
            wake::wake(client).await?;
        }
    }
    Ok(())
}

/// Drives `work` until it ends or one of the snapshots under way does,
/// filing each that ends in `book`: a snapshot that ended is news for the
/// next pass (a replica to keep up, or one to try again).
async fn until_a_snapshot_ends<W, S>(
    work: W,
    streaming: &mut FuturesUnordered<S>,
    book: &mut Book,
    settings: &Settings,
) where
    W: Future<Output = ()>,
    S: Future<Output = (ReplicaId, Result<Streamed, Failed>)>,
{
    tokio::select! {
        () = work => {}
        Some(done) = streaming.next(), if !streaming.is_empty() => {
            book.finished(done, settings);
        }
    }
}

/// Drives `work` to its end while the snapshots under way stream, filing
/// each that ends in `book`.
async fn beside_snapshots<W, S>(
    work: W,
    streaming: &mut FuturesUnordered<S>,
    book: &mut Book,
    settings: &Settings,
) -> W::Output
where
    W: Future,
    S: Future<Output = (ReplicaId, Result<Streamed, Failed>)>,
{
    tokio::pin!(work);
    loop {
        tokio::select! {
            done = &mut work => return done,
            Some(done) = streaming.next(), if !streaming.is_empty() => {
                book.finished(done, settings);
            }
        }
    }
}

/// Digests heard and not compared yet: the newest of each replica, so the
/// queue holds at most one a replica however often they come; and a
/// replica's are compared [`Digests::SPACING`] apart at least, so one that
/// sends a digest in every frame has the record read for it a few times a
/// minute, not back to back.
#[derive(Default)]
struct Digests {
    waiting: Mutex<std::collections::BTreeMap<ReplicaId, Heard>>,
    /// When each replica's digest was last compared, within the spacing.
    compared: Mutex<HashMap<ReplicaId, Instant>>,
    heard: tokio::sync::Notify,
}

impl Digests {
    /// The least time between two comparisons of one replica's digests. A
    /// replica sends one an hour by default.
    const SPACING: Duration = Duration::from_secs(5);

    fn push(&self, heard: Vec<(ReplicaId, Heard)>) {
        if heard.is_empty() {
            return;
        }
        self.waiting.lock().expect("not poisoned").extend(heard);
        self.heard.notify_one();
    }

    /// The next digest to compare, its replica's last comparison
    /// [`Digests::SPACING`] ago or more, counted as compared now; else how
    /// long until one is (`None` when none waits).
    fn next(&self, now: Instant) -> Result<(ReplicaId, Heard), Option<Duration>> {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        let mut compared = self.compared.lock().expect("not poisoned");
        compared.retain(|_, at| now.saturating_duration_since(*at) < Self::SPACING);
        let mut soonest: Option<Duration> = None;
        let mut ready = None;
        for replica in waiting.keys() {
            match compared.get(replica) {
                Some(at) => {
                    let wait = Self::SPACING - now.saturating_duration_since(*at);
                    soonest = Some(soonest.map_or(wait, |s| s.min(wait)));
                }
                None => {
                    ready = Some(replica.clone());
                    break;
                }
            }
        }
        let Some(replica) = ready else {
            return Err(soonest);
        };
        let heard = waiting.remove(&replica).expect("it waits");
        compared.insert(replica.clone(), now);
        Ok((replica, heard))
    }
}

/// Uploads heard and not filed yet, in the order they came, and how many
/// were filed since the figures last took the count. Bounded by what they
/// take decoded ([`Filings::BOUND`]): past it the publisher takes nothing
/// more from the transport until filing catches up.
#[derive(Default)]
struct Filings {
    waiting: Mutex<(std::collections::VecDeque<(ReplicaId, Up)>, usize)>,
    heard: tokio::sync::Notify,
    /// Woken when filing made room.
    room: tokio::sync::Notify,
    filed: std::sync::atomic::AtomicU64,
}

impl Filings {
    /// What the waiting uploads may take, encoded, before the publisher
    /// stops taking more: the transport's own queue of one replica.
    const BOUND: usize = 16 << 20;

    fn push(&self, uploads: Vec<(ReplicaId, Up)>) {
        if uploads.is_empty() {
            return;
        }
        let mut waiting = self.waiting.lock().expect("not poisoned");
        for (replica, up) in uploads {
            waiting.1 += prost::Message::encoded_len(&up);
            waiting.0.push_back((replica, up));
        }
        drop(waiting);
        self.heard.notify_one();
    }

    fn full(&self) -> bool {
        self.waiting.lock().expect("not poisoned").1 > Self::BOUND
    }

    /// The uploads waiting, as many as [`file_all`](crate::file::file_all)
    /// takes in one transaction at most.
    fn take(&self) -> Vec<(ReplicaId, Up)> {
        let mut waiting = self.waiting.lock().expect("not poisoned");
        let mut taken = Vec::new();
        let mut rows = 0;
        while let Some((replica, up)) = waiting.0.pop_front() {
            let these = magic_sync_core::link::upload_rows(&up);
            if !taken.is_empty() && rows + these > magic_sync_core::link::MAX_UPLOAD_ROWS {
                waiting.0.push_front((replica, up));
                break;
            }
            rows += these;
            waiting.1 -= prost::Message::encoded_len(&up);
            taken.push((replica, up));
        }
        taken
    }

    fn take_filed(&self) -> u64 {
        self.filed.swap(0, std::sync::atomic::Ordering::Relaxed)
    }
}

/// Files the uploads heard, a transaction of at most an upload's rows at a
/// time, on a session of its own opened for the first, and answers each
/// once filed: a replica's uploads in the order it sent them.
async fn file_forever<T: Transport>(
    session: &mut Option<Session>,
    config: &tokio_postgres::Config,
    settings: &SessionSettings,
    engine: &Engine,
    transport: &T,
    filings: &Filings,
    stirred: &tokio::sync::Notify,
) -> Result<()> {
    loop {
        let uploads = filings.take();
        if uploads.is_empty() {
            filings.heard.notified().await;
            continue;
        }
        let session = match session {
            Some(session) => session,
            None => session.insert(Session::open(config, settings, "file").await?),
        };
        let client = session.client_mut();
        let epoch = Epoch::read(&*client).await?;
        let filed = file_and_answer(client, engine, transport, &epoch, &uploads).await?;
        filings
            .filed
            .fetch_add(filed, std::sync::atomic::Ordering::Relaxed);
        filings.room.notify_one();
        // What was filed is a change a pass plans.
        stirred.notify_one();
    }
}

/// Compares each digest heard with the record, one at a time, on a session
/// of its own opened for the first: reading a large replica's record holds
/// back nothing the publishing connection does. What each comparison found
/// is logged and counted by [`crate::relay::compare_digest`].
async fn compare_forever(
    session: &mut Option<Session>,
    config: &tokio_postgres::Config,
    settings: &SessionSettings,
    engine: &Engine,
    digests: &Digests,
    stirred: &tokio::sync::Notify,
) -> Result<()> {
    loop {
        let (replica, heard) = match digests.next(Instant::now()) {
            Ok(next) => next,
            Err(None) => {
                digests.heard.notified().await;
                continue;
            }
            Err(Some(wait)) => {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = digests.heard.notified() => {}
                }
                continue;
            }
        };
        let session = match session {
            Some(session) => session,
            None => session.insert(Session::open(config, settings, "digest").await?),
        };
        let compared = heard
            .compare(session.client_mut(), engine, &replica)
            .await?;
        tracing::debug!(replica = %replica, ?compared, "a digest");
        // One found drifted waits for a snapshot, which a pass begins.
        stirred.notify_one();
    }
}

/// Publishes whenever a pass wrote messages, and now and then regardless,
/// to try again a replica a send failed to; heeds what replicas said
/// whenever they said something, leaving the uploads to [`file_forever`]
/// and the digests to [`compare_forever`].
#[allow(clippy::too_many_arguments)]
async fn publish_forever<T: Transport, R: Reports>(
    publisher: &mut Client,
    transport: &T,
    reports: &R,
    settings: &Settings,
    written: &tokio::sync::Notify,
    stirred: &tokio::sync::Notify,
    measured: &Mutex<Measured>,
    digests: &Digests,
    filings: &Filings,
) -> Result<()> {
    let mut away = crate::relay::Away::new(settings.backoff_min, settings.backoff_max)
        .by_rule(settings.record_by_rule);
    loop {
        let started = std::time::Instant::now();
        // While the uploads waiting to be filed are past their bound,
        // nothing more is taken from the transport: it holds what
        // replicas say within its own bounds, and stops reading them.
        let said = match filings.full() {
            true => Vec::new(),
            false => reports.drain(),
        };
        // A replica heard from is connected: what waits for it goes now.
        for (replica, _) in &said {
            away.back(replica);
        }
        // Uploads are filed on a session of their own (`file_forever`):
        // filing many rows, or rows refused one by one, holds back no
        // message going down and no acknowledgement.
        let mut said = Said::sort(transport, said);
        filings.push(std::mem::take(&mut said.uploads));
        let heeding = tracing::info_span!(
            target: "magic_sync::pass",
            "heed",
            acks = said.acks.len(),
            gaps = said.gaps.len(),
        );
        let (heeded, heard) = hear_said(publisher, transport, said, None)
            .instrument(heeding)
            .await?;
        // A pass has something to do only when a replica was newly marked
        // to be provisioned again: a gap from one already waiting, however
        // many, wakes none. Filing and comparing digests wake passes
        // themselves when they are done.
        if heeded.marked > 0 {
            stirred.notify_one();
        }
        digests.push(heard);
        crate::relay::trace("heed", started);
        let period = {
            let mut measured = measured.lock().expect("not poisoned");
            let Measured { lags, tally } = &mut *measured;
            for (replica, number) in &heeded.acknowledged {
                if let Some(lag) = lags.acknowledged(replica, *number) {
                    // For a host that installs a `metrics` recorder.
                    metrics::histogram!("magic_sync_commit_to_acknowledged_seconds")
                        .record(lag.as_secs_f64());
                    tally.acknowledged(lag);
                }
            }
            tally.filed(heeded.filed + filings.take_filed());
            match tally.due(settings.figures_every) {
                true => Some(std::mem::take(tally)),
                false => None,
            }
        };
        if let Some(period) = period {
            crate::store::figures::write(publisher, period).await?;
            crate::store::acks::forget_carried(publisher).await?;
        }
        let started = std::time::Instant::now();
        let publishing = tracing::info_span!(
            target: "magic_sync::pass",
            "publish",
            sent = tracing::field::Empty,
            failed = tracing::field::Empty,
        );
        let published = crate::relay::publish_beside(
            publisher,
            transport,
            settings.concurrency,
            settings.batch_from,
            &mut away,
        )
        .instrument(publishing.clone())
        .await?;
        publishing.record("sent", published.sent);
        publishing.record("failed", published.failed.len());
        crate::relay::trace("publish", started);
        // A replica a send failed to is tried again when its wait is over
        // (from `backoff_min`, doubling to `backoff_max`), or once it is
        // heard from. Otherwise only a pass brings new messages, and it
        // says so; what the transport took and no acknowledgement covered
        // goes again after RESEND_AFTER (30 s), which a look every second
        // catches.
        let again = away.next_try().map_or(PUBLISH_AT_LEAST_EVERY, |due| {
            due.saturating_duration_since(std::time::Instant::now())
                .min(PUBLISH_AT_LEAST_EVERY)
        });
        let reported = tokio::select! {
            () = written.notified() => false,
            () = reports.wait(), if !filings.full() => true,
            () = filings.room.notified() => false,
            () = tokio::time::sleep(again) => false,
        };
        if reported {
            // Woken by what replicas said alone: what more they say in the
            // next moment is heard with it, so a replica saying something
            // in every frame costs a few drains a second, not thousands.
            // A pass's messages do not wait for it.
            tokio::select! {
                () = written.notified() => {}
                () = tokio::time::sleep(HEED_GATHER) => {}
            }
        }
    }
}

/// How long the publisher, woken by reports alone, waits for more before
/// it heeds them: acknowledgements need no hurry, and a drain costs a few
/// statements however much it holds.
const HEED_GATHER: Duration = Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::{Digests, Lags, LAGS_PER_REPLICA};
    use crate::relay::{Heard, Recorded};
    use std::time::{Duration, Instant, SystemTime};

    /// A digest of one table of `rows` rows, from `replica`.
    fn digest(replica: &str, rows: u64) -> (magic_sync_core::ReplicaId, Heard) {
        let heard = Heard {
            digest: crate::envelope::Digest {
                tables: vec![crate::envelope::TableDigest {
                    table: "t".into(),
                    rows,
                    fingerprint: 0,
                    summed: None,
                }],
                ..crate::envelope::Digest::default()
            },
            applied: None,
            refused: Vec::new(),
        };
        (replica.into(), heard)
    }

    #[test]
    fn a_replica_s_digests_are_compared_a_spacing_apart_and_the_newest_waits() {
        let digests = Digests::default();
        let start = Instant::now();
        digests.push(vec![digest("a", 1)]);
        let (replica, _) = digests.next(start).unwrap();
        assert_eq!(replica.as_str(), "a");
        // Three more from `a` at once, and one from `b`: `b` goes first,
        // `a`'s newest waits out the spacing, its older ones are gone.
        digests.push(vec![digest("a", 2), digest("a", 3), digest("b", 1)]);
        digests.push(vec![digest("a", 4)]);
        let (replica, _) = digests.next(start).unwrap();
        assert_eq!(replica.as_str(), "b");
        let wait = digests.next(start + Duration::from_secs(1)).unwrap_err();
        assert_eq!(wait, Some(Digests::SPACING - Duration::from_secs(1)));
        let (replica, heard) = digests.next(start + Digests::SPACING).unwrap();
        assert_eq!((replica.as_str(), heard.digest.tables[0].rows), ("a", 4));
        assert_eq!(digests.next(start + Digests::SPACING).unwrap_err(), None);
    }

    fn pass(written: &[(&str, i64)], oldest: Option<SystemTime>) -> Recorded {
        Recorded {
            written: written.iter().map(|(r, n)| ((*r).into(), *n)).collect(),
            oldest_change: oldest,
            ..Recorded::default()
        }
    }

    #[test]
    fn an_acknowledgement_counts_from_the_oldest_change_it_covers() {
        let now = SystemTime::now();
        let mut lags = Lags::default();
        lags.written(&pass(
            &[("a", 3), ("b", 4)],
            Some(now - Duration::from_secs(10)),
        ));
        lags.written(&pass(&[("a", 5)], Some(now - Duration::from_secs(2))));
        // A pass that planned no change (a `Reached` only) counts nothing.
        lags.written(&pass(&[("a", 6)], None));
        assert_eq!(lags.acknowledged("a", 2), None, "before any change");
        let lag = lags.acknowledged("a", 5).expect("covers both passes");
        assert!(lag >= Duration::from_secs(10), "{lag:?}");
        assert_eq!(lags.acknowledged("a", 6), None, "covered already");
        assert!(lags.acknowledged("b", 4).unwrap() >= Duration::from_secs(10));
        assert_eq!(lags.acknowledged("c", 9), None, "never written to");
    }

    #[test]
    fn a_long_book_merges_its_oldest_and_a_forgotten_replica_has_none() {
        let now = SystemTime::now();
        let mut lags = Lags::default();
        for n in 0..(LAGS_PER_REPLICA as i64 + 10) {
            let at = now - Duration::from_secs(10_000) + Duration::from_secs(n as u64);
            lags.written(&pass(&[("a", n), ("b", n)], Some(at)));
        }
        assert!(lags.0["a"].len() <= LAGS_PER_REPLICA);
        // The first messages merged: their acknowledgement counts from the
        // first message's change, the oldest the book keeps.
        let merged = lags.0["a"][0].0;
        assert!(merged > 0 && merged <= 11, "{merged}");
        let lag = lags
            .acknowledged("a", merged)
            .expect("the oldest merged in");
        assert!(lag >= Duration::from_secs(9_999), "{lag:?}");
        let forget = Recorded {
            forgotten: vec!["b".into()],
            ..Recorded::default()
        };
        lags.written(&forget);
        assert_eq!(lags.acknowledged("b", i64::MAX), None);
    }
}

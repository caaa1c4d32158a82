//! A replica's loop: apply each message as it arrives, in one transaction
//! each, and say what was applied; send up what the host wrote, and let go
//! of it once filed.

use crate::envelope::Up;
use crate::error::Result;
use crate::{Outcome, Replica, Uplink, UplinkError};
pub use magic_sync_core::link::{Delivery, Report};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

/// A replica's side of its transport: what its loop waits on, and how it
/// speaks to the server. The in-process network
/// (`magic_sync::run::memory::Network::link`) is one; a socket client is another.
/// The server knows who speaks from the transport, never from what is said.
pub trait Link {
    /// The most bytes one message may have, either way.
    fn max_message_bytes(&self) -> usize;
    /// Waits up to `timeout` for what comes next: an answer to an upload,
    /// a message, a nudge from the host, or the link's end.
    fn next(&self, timeout: Duration) -> Delivery;
    /// Tells the server what was applied, or the gap the replica waits in.
    /// Lost on the way, it is said again: the server sends again what it
    /// has not heard acknowledged, and the replica answers a duplicate with
    /// its acknowledgement.
    fn report(&self, report: Report);
    /// Hands the server an upload. Out of reach is [`UplinkError::Unreachable`]
    /// (the rows wait); more than a message may carry is
    /// [`UplinkError::Refused`].
    fn upload(&self, up: &Up) -> std::result::Result<(), UplinkError>;
}

/// What a link's own thread hands the replica's loop, in order, with the
/// host's nudges among it: the queue a link over a network keeps between
/// its thread and [`Link::next`].
#[derive(Debug)]
pub struct Incoming {
    queue: Mutex<mpsc::Receiver<Delivery>>,
    feed: mpsc::Sender<Delivery>,
}

impl Default for Incoming {
    fn default() -> Self {
        let (feed, queue) = mpsc::channel();
        Incoming {
            queue: Mutex::new(queue),
            feed,
        }
    }
}

impl Incoming {
    /// Where the link's thread puts what arrives.
    pub fn feed(&self) -> mpsc::Sender<Delivery> {
        self.feed.clone()
    }

    /// A handle the host nudges when it wrote something.
    pub fn nudger(&self) -> Nudger {
        Nudger(self.feed.clone())
    }

    /// What comes next, waiting up to `timeout`: [`Delivery::Quiet`] when
    /// nothing came, [`Delivery::Closed`] once every feed is gone.
    pub fn next(&self, timeout: Duration) -> Delivery {
        match self
            .queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .recv_timeout(timeout)
        {
            Ok(delivery) => delivery,
            Err(mpsc::RecvTimeoutError::Timeout) => Delivery::Quiet,
            Err(mpsc::RecvTimeoutError::Disconnected) => Delivery::Closed,
        }
    }
}

/// Tells a replica's loop its host wrote something ([`Incoming::nudger`]).
#[derive(Debug, Clone)]
pub struct Nudger(mpsc::Sender<Delivery>);

impl Nudger {
    /// The loop looks for what to send up now.
    pub fn nudge(&self) {
        let _ = self.0.send(Delivery::Quiet);
    }
}

/// Applies one message as the transport delivered it, and returns what to
/// tell the server: the last message applied (also after a duplicate, so a
/// lost acknowledgement is given again), or the gap it waits in. A message
/// for another replica changes nothing and says nothing.
pub fn deliver(replica: &mut Replica, message: &[u8]) -> Result<Option<Report>> {
    let outcome = match replica.apply(message) {
        Ok(outcome) => outcome,
        // The message applied; only the purge after it failed. The rows wait
        // for the next purge; the message is acknowledged.
        Err(crate::Error::Purge { .. }) => Outcome::Applied {
            number: 0,
            refused: 0,
            purged: 0,
        },
        Err(e) => return Err(e),
    };
    // Applied, not acknowledged: the server hears of it from the next
    // acknowledgement, or sends it again and hears it as a duplicate.
    fail::fail_point!("replica-after-apply", |_| Err(crate::Error::Injected(
        "replica-after-apply"
    )));
    Ok(match outcome {
        Outcome::Applied { .. } | Outcome::Duplicate { .. } => replica.ack().map(Report::Applied),
        // A replay of an older epoch's message: where the replica stands,
        // said again, shows a server restored behind it where it is.
        Outcome::Superseded { .. } => standing(replica),
        Outcome::Gap { .. } => replica.gap().map(Report::Gap),
        Outcome::WrongReplica { .. } | Outcome::Forged { .. } => None,
    })
}

/// How a replica's loop sends up what its host wrote.
#[derive(Debug, Clone)]
pub struct Uploads {
    /// How long the loop waits for the server before it looks for writes
    /// to send.
    pub every: Duration,
    /// How long an upload may go unanswered before its rows go again, at
    /// least: four times the answers' smoothed round trip when that is
    /// longer, so a server slow to answer under load is not sent the same
    /// rows again and again.
    pub resend_after: Duration,
    /// Uploads sent at most per look, so a large backlog never keeps the
    /// loop from applying what the server sends.
    pub batch: usize,
    /// How often the loop tells the server a digest of what it holds
    /// ([`digest`]): the backstop that finds a replica that drifted from
    /// what the server records, however it happened.
    pub digest_every: Duration,
    /// How often a quiet loop says again where it stands ([`standing`]):
    /// the last message applied, or the gap it waits in. What it said last
    /// may have been lost, and nothing else would make it say it again
    /// while the server has nothing to send.
    pub say_again_every: Duration,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            every: Duration::from_millis(100),
            resend_after: Duration::from_secs(5),
            batch: 64,
            digest_every: Duration::from_secs(3600),
            say_again_every: Duration::from_secs(60),
        }
    }
}

/// Applies every message the link brings `replica` until it closes,
/// reports what it applied, and sends up what its host wrote, as
/// [`replica_with`] does with the default [`Uploads`].
pub fn replica(replica: &mut Replica, link: &impl Link) -> Result<()> {
    replica_with(replica, link, &Uploads::default())
}

/// Applies every message the link brings `replica` until it closes, and
/// reports what it applied. A message that cannot be applied as it is
/// (malformed, not a message at all) is skipped: the server's next
/// comparison covers what it carried. Once what came is applied (or after
/// `uploads.batch` deliveries in a row), and after a quiet spell or a
/// nudge from its host, it sends up what is due of what the host wrote
/// ([`Replica::upload`]), and lets go of what the server says it filed.
/// Stops on an error of the replica's own database, which the host decides
/// about.
pub fn replica_with(replica: &mut Replica, link: &impl Link, uploads: &Uploads) -> Result<()> {
    let mut looping = Looping::new();
    loop {
        if looping.digested.elapsed() >= uploads.digest_every {
            looping.digested = Instant::now();
            link.report(digest(replica)?);
        }
        let Some(delivery) = looping.next(link, uploads) else {
            return Ok(());
        };
        let quiet = matches!(delivery, Delivery::Quiet);
        if quiet && looping.said.elapsed() >= uploads.say_again_every {
            if let Some(report) = standing(replica) {
                link.report(report);
            }
            looping.said = Instant::now();
        }
        if !looping.take(replica, link, delivery)? {
            return Ok(());
        }
        looping.since += 1;
        if !quiet && looping.since < uploads.batch.max(1) {
            continue;
        }
        looping.since = 0;
        looping.send_up(replica, link, uploads)?;
    }
}

/// What the replica's loop keeps between deliveries.
struct Looping {
    /// Deliveries since the loop last looked for writes to send: it looks
    /// once what the server sent so far is applied (or after `batch` of
    /// them), not after every message, since looking reads the notes.
    since: usize,
    /// A message not applied because the host held the file past the busy
    /// timeout: applied again before anything else comes. The transport
    /// let go of it once delivered, so dropping it would open a gap, and a
    /// gap costs the replica a snapshot.
    held: Option<Vec<u8>>,
    /// What came while a held message waited, in the order it came.
    queued: std::collections::VecDeque<Delivery>,
    /// An answer let go of rows since the server last heard the backlog:
    /// it hears it at the next look, with the next upload (each carries
    /// it) or, when nothing goes up, in a report of its own. Reporting it
    /// after every answer doubled what a busy server had to file.
    backlog_owed: bool,
    /// When the replica last sent its digest.
    digested: Instant,
    /// When the replica last said anything to the server.
    said: Instant,
}

impl Looping {
    fn new() -> Looping {
        Looping {
            since: 0,
            held: None,
            queued: Default::default(),
            backlog_owed: false,
            digested: Instant::now(),
            said: Instant::now(),
        }
    }

    /// What comes next: a held message first (heeding the link meanwhile:
    /// its end ends the loop, anything else waits its turn), then what
    /// queued behind it, then the link. `None` once the link closed.
    fn next(&mut self, link: &impl Link, uploads: &Uploads) -> Option<Delivery> {
        let wait = if self.since == 0 {
            uploads.every
        } else {
            Duration::ZERO
        };
        match self.held.take() {
            Some(message) => {
                match link.next(Duration::ZERO) {
                    Delivery::Closed => return None,
                    Delivery::Quiet => {}
                    other => self.queued.push_back(other),
                }
                Some(Delivery::Message(message))
            }
            None => Some(self.queued.pop_front().unwrap_or_else(|| link.next(wait))),
        }
    }

    /// Applies a message, or lets go of what an answer says was filed.
    /// `false` once the link closed.
    fn take(
        &mut self,
        replica: &mut Replica,
        link: &impl Link,
        delivery: Delivery,
    ) -> Result<bool> {
        match delivery {
            Delivery::Message(message) => match deliver(replica, &message) {
                Ok(Some(report)) => {
                    self.said = Instant::now();
                    link.report(report);
                }
                Ok(None) => {}
                Err(crate::Error::Envelope(_) | crate::Error::Malformed { .. }) => {}
                Err(e) if e.is_transient() => self.held = Some(message),
                Err(e) => return Err(e),
            },
            Delivery::Filed(filed) => match replica.filed(&filed) {
                Ok(released) => self.backlog_owed |= released > 0,
                // Not the server's: counted, and nothing let go of.
                Err(crate::Error::Forged { .. }) => {}
                // The answer is lost: the upload goes again after a while,
                // and filing it again changes nothing.
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            },
            Delivery::Quiet => {}
            Delivery::Closed => return Ok(false),
        }
        Ok(true)
    }

    /// Sends up what is due of what the host wrote, and the backlog when
    /// it is owed and nothing else carries it.
    fn send_up(
        &mut self,
        replica: &mut Replica,
        link: &impl Link,
        uploads: &Uploads,
    ) -> Result<()> {
        let uplink = Uploading(link);
        let sent = match replica.send_up(
            &uplink,
            replica.patience(uploads.resend_after),
            uploads.batch,
        ) {
            Ok(sent) => sent,
            // The host held the file longer than the replica waits: the
            // next look sends it.
            Err(e) if e.is_transient() => return Ok(()),
            Err(e) => return Err(e),
        };
        for (table, key, why) in &sent.unreadable {
            // The host's to fix: it holds back no other row.
            tracing::warn!(
                replica = replica.id(),
                table = %table,
                key = %key,
                "set aside a row that cannot be sent: {why}"
            );
        }
        // Rows set aside count in the progress as not sent, whatever the
        // uploads before them said.
        if !sent.set_aside.is_empty() || (sent.uploads == 0 && self.backlog_owed) {
            link.report(progress(replica)?);
        }
        // Out of reach, the figure is owed still.
        if sent.waits.is_none() {
            self.backlog_owed = false;
        }
        Ok(())
    }
}

/// A link as the replica's uplink, leaving room in each upload for what
/// it carries beside its rows.
struct Uploading<'a, L>(&'a L);

/// What an upload needs beyond its rows' bytes: names, ids, the backlog.
const UPLOAD_HEADROOM: usize = 1024;

impl<L: Link> Uplink for Uploading<'_, L> {
    fn max_bytes(&self) -> usize {
        self.0
            .max_message_bytes()
            .saturating_sub(UPLOAD_HEADROOM)
            .max(1)
    }

    fn send(&self, up: &Up) -> std::result::Result<(), UplinkError> {
        self.0.upload(up)
    }
}

/// Where the replica stands, to be said again: the gap it waits in, or
/// else the last message it applied; `None` before the first. Said once,
/// it may have been lost on the way: a gap the server never heard leaves
/// the replica waiting for a snapshot nobody begins, and a lost
/// acknowledgement leaves the server counting it behind.
pub fn standing(replica: &Replica) -> Option<Report> {
    match replica.gap() {
        Some(gap) => Some(Report::Gap(gap)),
        None => replica.ack().map(Report::Applied),
    }
}

/// What the replica holds, in a few numbers per table, for the server to
/// compare with what it records the replica holding: the digest, with the
/// last message applied (the server compares only when it sent nothing
/// after it) and the rows it could not take (left out on both sides).
pub fn digest(replica: &Replica) -> Result<Report> {
    Ok(Report::Upload(crate::envelope::Up {
        digest: Some(replica.digest()?),
        applied: replica.ack(),
        refused: replica.refused()?,
        ..crate::envelope::Up::default()
    }))
}

/// An upload that only says the replica's backlog: what it has that the
/// server has not filed, after an answer let go of some of it.
pub fn progress(replica: &Replica) -> Result<Report> {
    Ok(Report::Upload(crate::envelope::Up {
        backlog: Some(replica.progress()?),
        ..crate::envelope::Up::default()
    }))
}

//! A replica's loop: apply each message as it arrives, in one transaction
//! each, and say what was applied; send up what the host wrote, and let go
//! of it once filed.

use crate::envelope::Up;
use crate::error::{Error, Handling, Result};
use crate::{Outcome, Replica, Uplink, UplinkError};
use magic_sync_core::backoff::Backoff;
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
    /// Hands the server an upload. Out of reach is an [`UplinkError`] of
    /// kind [`Unreachable`](crate::LinkErrorKind::Unreachable) (the rows
    /// wait); more than a message may carry,
    /// [`Refused`](crate::LinkErrorKind::Refused); a transport that carries
    /// nothing until its operator acts,
    /// [`Misconfigured`](crate::LinkErrorKind::Misconfigured) (the loop
    /// stops).
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
    /// The first wait before the loop tries again what failed on what may
    /// pass ([`Handling::Retry`]: the host held the file past the busy
    /// timeout); it doubles, with jitter, up to `backoff_max`.
    pub backoff_min: Duration,
    /// The longest wait before trying again.
    pub backoff_max: Duration,
}

impl Default for Uploads {
    fn default() -> Self {
        Uploads {
            every: Duration::from_millis(100),
            resend_after: Duration::from_secs(5),
            batch: 64,
            digest_every: Duration::from_secs(3600),
            say_again_every: Duration::from_secs(60),
            backoff_min: Duration::from_millis(100),
            backoff_max: Duration::from_secs(10),
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
/// reports what it applied. Once what came is applied (or after
/// `uploads.batch` deliveries in a row), and after a quiet spell or a
/// nudge from its host, it sends up what is due of what the host wrote
/// ([`Replica::upload`]), and lets go of what the server says it filed.
///
/// A step that fails does what the error's kind says ([`Error::handling`]):
/// - [`Handling::Retry`] (the host held the file past the busy timeout):
///   the same step again after a backoff. A message or an answer is held,
///   and taken again before anything that came after it.
/// - [`Handling::SetAside`]: what it is about is left and the rest goes on.
///   A message that cannot be applied as it is (malformed, not a message
///   at all, a row in the file it cannot read) is skipped, and the server's
///   next comparison covers what it carried; an answer that is not the
///   server's is refused; a digest that cannot be read is not told.
/// - [`Handling::Stop`] (a key not pinned, the replica's database failing,
///   a transport that refuses it): the loop ends with the error, which
///   [`Replica::status`] shows as `stopped` until the loop runs again.
pub fn replica_with(replica: &mut Replica, link: &impl Link, uploads: &Uploads) -> Result<()> {
    replica.stopped = None;
    let ran = Looping::new(uploads).run(replica, link, uploads);
    if let Err(e) = &ran {
        tracing::error!(
            replica = replica.id(),
            error = %e,
            "the replica's loop stops until its host acts"
        );
        replica.stopped = Some(e.to_string());
    }
    ran
}

/// What a step that failed leaves the loop to do, by the error's kind.
enum Failed {
    /// Try it again after a backoff.
    Retry,
    /// It was left; go on.
    SetAside,
}

/// The failure of a step, `what` it was, by its kind: what to do next, or
/// the error itself when the loop stops.
fn heed(replica: &Replica, what: &str, e: Error) -> Result<Failed> {
    match e.handling() {
        Handling::Retry => {
            tracing::debug!(replica = replica.id(), error = %e, "{what}: trying again");
            Ok(Failed::Retry)
        }
        Handling::SetAside => {
            tracing::warn!(replica = replica.id(), error = %e, "{what}: set aside; the rest goes on");
            Ok(Failed::SetAside)
        }
        Handling::Stop => Err(e),
    }
}

/// What the replica's loop keeps between deliveries.
struct Looping {
    /// Deliveries since the loop last looked for writes to send: it looks
    /// once what the server sent so far is applied (or after `batch` of
    /// them), not after every message, since looking reads the notes.
    since: usize,
    /// A delivery that failed on what may pass, and when it is taken
    /// again, before anything else comes. The transport let go of it once
    /// delivered: a message dropped would open a gap, and a gap costs the
    /// replica a snapshot; an answer dropped, the upload going again.
    held: Option<(Delivery, Instant)>,
    /// What came while a held delivery waited, in the order it came.
    queued: std::collections::VecDeque<Delivery>,
    /// The link closed while a delivery was held: what is left is taken,
    /// and the loop ends.
    closing: bool,
    /// An answer let go of rows since the server last heard the backlog:
    /// it hears it at the next look, with the next upload (each carries
    /// it) or, when nothing goes up, in a report of its own. Reporting it
    /// after every answer doubled what a busy server had to file.
    backlog_owed: bool,
    /// When the replica tells its digest next.
    digest_at: Instant,
    /// When the replica last said anything to the server.
    said: Instant,
    /// When the loop may look for writes to send again, after a look
    /// failed on what may pass.
    send_at: Option<Instant>,
    /// The waits before a step that failed on what may pass is tried
    /// again; back to the least once a step goes through.
    backoff: Backoff,
}

impl Looping {
    fn new(uploads: &Uploads) -> Looping {
        Looping {
            since: 0,
            held: None,
            queued: Default::default(),
            closing: false,
            backlog_owed: false,
            digest_at: Instant::now() + uploads.digest_every,
            said: Instant::now(),
            send_at: None,
            backoff: Backoff::new(uploads.backoff_min, uploads.backoff_max),
        }
    }

    /// The loop itself: returns once the link closed, or with the error
    /// of a step that stops it.
    fn run(&mut self, replica: &mut Replica, link: &impl Link, uploads: &Uploads) -> Result<()> {
        loop {
            if Instant::now() >= self.digest_at {
                self.tell_digest(replica, link, uploads)?;
            }
            let Some(delivery) = self.next(link, uploads) else {
                return Ok(());
            };
            let quiet = matches!(delivery, Delivery::Quiet);
            if quiet && self.said.elapsed() >= uploads.say_again_every {
                if let Some(report) = standing(replica) {
                    link.report(report);
                }
                self.said = Instant::now();
            }
            if !self.take(replica, link, delivery)? {
                return Ok(());
            }
            self.since += 1;
            if !quiet && self.since < uploads.batch.max(1) {
                continue;
            }
            self.since = 0;
            self.send_up(replica, link, uploads)?;
        }
    }

    /// When the step that just failed on what may pass is tried again.
    fn again(&mut self) -> Instant {
        Instant::now() + self.backoff.next_wait()
    }

    /// Tells the server the digest of what the replica holds; one that
    /// cannot be read waits for the next.
    fn tell_digest(
        &mut self,
        replica: &mut Replica,
        link: &impl Link,
        uploads: &Uploads,
    ) -> Result<()> {
        self.digest_at = match digest(replica) {
            Ok(report) => {
                link.report(report);
                Instant::now() + uploads.digest_every
            }
            Err(e) => match heed(replica, "telling the digest", e)? {
                Failed::Retry => self.again(),
                Failed::SetAside => Instant::now() + uploads.digest_every,
            },
        };
        Ok(())
    }

    /// What comes next: a held delivery once its backoff is over (heeding
    /// the link meanwhile: anything it brings waits its turn), then what
    /// queued behind it, then the link. The link's end cuts a backoff
    /// short: what the loop holds and what queued are taken once more,
    /// then the loop ends. `None` once the link closed and nothing is left.
    fn next(&mut self, link: &impl Link, uploads: &Uploads) -> Option<Delivery> {
        if let Some((held, at)) = self.held.take() {
            if self.closing {
                // Taken once more since the link's end, and held again.
                return None;
            }
            loop {
                let left = at.saturating_duration_since(Instant::now());
                match link.next(left) {
                    Delivery::Closed => {
                        self.closing = true;
                        return Some(held);
                    }
                    Delivery::Quiet => {}
                    other => self.queued.push_back(other),
                }
                if left.is_zero() {
                    return Some(held);
                }
            }
        }
        if let Some(queued) = self.queued.pop_front() {
            return Some(queued);
        }
        if self.closing {
            return None;
        }
        let wait = if self.since == 0 {
            uploads.every
        } else {
            Duration::ZERO
        };
        Some(link.next(wait))
    }

    /// Applies a message, or lets go of what an answer says was filed.
    /// `false` once the link closed.
    fn take(
        &mut self,
        replica: &mut Replica,
        link: &impl Link,
        delivery: Delivery,
    ) -> Result<bool> {
        let failed = match &delivery {
            Delivery::Message(message) => match deliver(replica, message) {
                Ok(report) => {
                    if let Some(report) = report {
                        self.said = Instant::now();
                        link.report(report);
                    }
                    None
                }
                Err(e) => Some(heed(replica, "applying a message", e)?),
            },
            Delivery::Filed(filed) => match replica.filed(filed) {
                Ok(released) => {
                    self.backlog_owed |= released > 0;
                    None
                }
                // One that is not the server's is counted, and lets go of
                // nothing.
                Err(e) => Some(heed(replica, "an answer to an upload", e)?),
            },
            Delivery::Quiet => None,
            Delivery::Closed => return Ok(false),
        };
        match failed {
            Some(Failed::Retry) => {
                let at = self.again();
                self.held = Some((delivery, at));
            }
            Some(Failed::SetAside) => {}
            None => self.backoff.reset(),
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
        if self.send_at.is_some_and(|at| Instant::now() < at) {
            return Ok(());
        }
        self.send_at = None;
        let uplink = Uploading(link);
        let sent = match replica.send_up(
            &uplink,
            replica.patience(uploads.resend_after),
            uploads.batch,
        ) {
            Ok(sent) => sent,
            Err(e) => {
                if let Failed::Retry = heed(replica, "sending up", e)? {
                    self.send_at = Some(self.again());
                }
                return Ok(());
            }
        };
        self.backoff.reset();
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
            match progress(replica) {
                Ok(report) => link.report(report),
                // Owed still: the next look says it.
                Err(e) => {
                    heed(replica, "reading the backlog", e)?;
                    return Ok(());
                }
            }
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

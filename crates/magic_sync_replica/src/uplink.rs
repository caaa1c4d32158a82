//! Handing uploads to the host's uplink, the replica-side twin of the
//! server's `Transport`, and finding the row an uplink refuses for good.
//!
//! An uplink either takes an upload, cannot reach the server now
//! (transient: nothing is recorded as sent, and the caller tries again
//! later), refuses it for good (too large, say, or a row it will never
//! carry), or carries nothing until its operator acts (its credentials
//! refused: the replica's loop stops, with what the uplink said). A
//! refused upload is halved, and each half sent, until what is refused is
//! one row sent alone; while one row is suspected, the next
//! rows are tried without it. A suspect is set aside only when the uplink
//! took some other upload in the same call, before or after: an uplink
//! that refuses everything is the infrastructure's fault, not a row's, and
//! sets nothing aside. A row set aside stays noted (it counts as not sent in the
//! replica's progress) and is tried again when the replica is next opened.

use super::up::{self, Note, Pending};
use crate::envelope::Up;
use crate::error::{Error, Result};
use crate::shape::Shapes;
pub use magic_sync_core::link::{LinkError, LinkErrorKind};
use rusqlite::Connection;
use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

/// Why an uplink did not take an upload, by its kind
/// ([`LinkErrorKind`]): the server out of reach now (try again later),
/// this upload never going as it is (halved until the row it refuses is
/// found), or nothing going until the transport's operator acts (the
/// replica's loop stops: [`crate::Error::Transport`]).
pub type UplinkError = LinkError;

/// How a replica's uploads reach the server.
pub trait Uplink {
    /// The most bytes of rows one upload may carry.
    fn max_bytes(&self) -> usize;
    /// Hands `up` over; Ok means the uplink took it.
    fn send(&self, up: &Up) -> std::result::Result<(), UplinkError>;
}

/// What one [`super::Replica::send_up`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SentUp {
    /// Uploads the uplink took.
    pub uploads: usize,
    /// Rows set aside by this call, as (table, key as noted).
    pub set_aside: Vec<(String, String)>,
    /// Of those, the rows that cannot be read as their table declares
    /// them (a value the host wrote in a form its column does not take),
    /// as (table, key as noted, why). They wait for the host to write
    /// them again, or for the replica to run again.
    pub unreadable: Vec<(String, String, String)>,
    /// Why sending stopped early, when the uplink could not reach the
    /// server or refused everything: try again after a backoff.
    pub waits: Option<String>,
}

/// How long answers take to come: see [`super::Replica::patience`].
#[derive(Debug, Default)]
pub(crate) struct Patience {
    /// Sends handed over and not answered yet, and when.
    in_flight: HashMap<Vec<u8>, Instant>,
    smoothed: Option<Duration>,
}

/// Sends remembered at most for timing their answers.
const TIMED: usize = 4096;

impl Patience {
    fn sent(&mut self, send_id: &[u8]) {
        if self.in_flight.len() >= TIMED {
            self.in_flight.clear();
        }
        self.in_flight.insert(send_id.to_vec(), Instant::now());
    }

    /// The answer to `send_id` came: one more sample of the round trip.
    pub fn answered(&mut self, send_id: &[u8]) {
        if let Some(at) = self.in_flight.remove(send_id) {
            let sample = at.elapsed();
            self.smoothed = Some(match self.smoothed {
                None => sample,
                Some(s) => (s * 7 + sample) / 8,
            });
        }
    }

    /// How long to wait for an answer before sending again.
    pub fn after(&self, floor: Duration) -> Duration {
        self.smoothed.map_or(floor, |s| floor.max(s * 4))
    }
}

/// The replica's side of the search: the connection and what it skips.
pub(crate) struct Sender<'a> {
    pub conn: &'a mut Connection,
    pub shapes: &'a Shapes,
    /// Rows set aside until the replica is opened again.
    pub set_aside: &'a mut HashSet<(String, String)>,
    /// Answers that came before their send was recorded.
    pub early: &'a mut HashSet<Vec<u8>>,
    pub patience: &'a mut Patience,
}

impl Sender<'_> {
    /// Records `pending` as sent; an answer that came first lets go of it
    /// at once.
    pub fn sent(&mut self, pending: &Pending) -> Result<usize> {
        up::stamp(self.conn, pending)?;
        self.patience.sent(&pending.up.send_id);
        if self.early.remove(&pending.up.send_id) {
            return up::filed(self.conn, &pending.up.send_id);
        }
        Ok(0)
    }

    /// Sends what is due, at most `most` uploads: see the module's comment.
    /// Sets aside rows that cannot be read, and says so in `report`.
    fn unreadable(
        &mut self,
        skip: &mut HashSet<(String, String)>,
        report: &mut SentUp,
        rows: Vec<(String, String, String)>,
    ) {
        for (table, key, why) in rows {
            skip.insert((table.clone(), key.clone()));
            if self.set_aside.insert((table.clone(), key.clone())) {
                report.set_aside.push((table.clone(), key.clone()));
                report.unreadable.push((table, key, why));
            }
        }
    }

    pub fn send_up(
        &mut self,
        uplink: &impl Uplink,
        resend_after: Duration,
        most: usize,
    ) -> Result<SentUp> {
        let mut report = SentUp::default();
        let mut skip = self.set_aside.clone();
        let mut suspects: Vec<Note> = Vec::new();
        // Why the uplink refused something in this call, if it did.
        let mut refused = None::<String>;
        'sending: while report.uploads < most {
            let due = up::due(self.conn, resend_after, &skip)?;
            if due.is_empty() {
                break;
            }
            // One upload per lane per round: a lane busy with a table
            // written often never holds back the others.
            for notes in up::by_lane(self.shapes, due).into_values() {
                if report.uploads >= most {
                    break 'sending;
                }
                let mut unreadable = Vec::new();
                let made = up::make(
                    self.conn,
                    self.shapes,
                    &notes,
                    uplink.max_bytes(),
                    &mut unreadable,
                );
                self.unreadable(&mut skip, &mut report, unreadable);
                let Some(pending) = made? else {
                    continue;
                };
                let mut queue = VecDeque::from([pending]);
                while let Some(pending) = queue.pop_front() {
                    let e = match uplink.send(&pending.up) {
                        Ok(()) => {
                            self.sent(&pending)?;
                            report.uploads += 1;
                            continue;
                        }
                        Err(e) => e,
                    };
                    match e.kind {
                        LinkErrorKind::Unreachable => {
                            report.waits = Some(e.why);
                            break 'sending;
                        }
                        LinkErrorKind::Misconfigured => return Err(Error::Transport(e)),
                        LinkErrorKind::Refused => {
                            refused.get_or_insert(e.why);
                            let halves = Halving {
                                skip: &mut skip,
                                report: &mut report,
                                suspects: &mut suspects,
                                queue: &mut queue,
                            };
                            self.halve(&pending, halves)?;
                        }
                    }
                }
            }
        }
        self.settle(suspects, refused, &mut report);
        Ok(report)
    }

    /// An upload the uplink refused, sent again as two halves, each read
    /// again (a row may be gone since), so that what it does take goes. A
    /// refused upload of one row makes that row a suspect, skipped for the
    /// rest of the call.
    fn halve(&mut self, pending: &Pending, halving: Halving<'_>) -> Result<()> {
        let Halving {
            skip,
            report,
            suspects,
            queue,
        } = halving;
        let notes = pending.notes();
        if notes.len() == 1 {
            let (t, k, _) = &notes[0];
            skip.insert((t.clone(), k.clone()));
            suspects.push(notes[0].clone());
            return Ok(());
        }
        let (first, second) = notes.split_at(notes.len() / 2);
        for half in [first, second] {
            let mut unreadable = Vec::new();
            let made = up::make(self.conn, self.shapes, half, usize::MAX, &mut unreadable);
            self.unreadable(skip, report, unreadable);
            if let Some(p) = made? {
                queue.push_back(p);
            }
        }
        Ok(())
    }

    /// The suspects of a call: set aside when the uplink took other
    /// uploads (it refuses those rows alone); when it took none, it
    /// refuses everything, and every row waits.
    fn settle(&mut self, suspects: Vec<Note>, refused: Option<String>, report: &mut SentUp) {
        if suspects.is_empty() {
            return;
        }
        if report.uploads > 0 {
            for (t, k, _) in suspects {
                self.set_aside.insert((t.clone(), k.clone()));
                report.set_aside.push((t, k));
            }
        } else if report.waits.is_none() {
            report.waits = Some(format!(
                "the uplink refuses every upload: {}",
                refused.unwrap_or_default()
            ));
        }
    }
}

/// What halving a refused upload updates of the call's bookkeeping.
struct Halving<'a> {
    skip: &'a mut HashSet<(String, String)>,
    report: &'a mut SentUp,
    suspects: &'a mut Vec<Note>,
    queue: &'a mut VecDeque<Pending>,
}

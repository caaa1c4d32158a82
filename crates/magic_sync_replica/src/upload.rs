//! Uploads: what the host wrote gathered into an upload and recorded as
//! sent, sent through the host's uplink, and let go of once the server
//! answers that it filed it; and how long to wait for that answer.

use crate::envelope;
use crate::{sign, up, uplink, write_transaction};
use crate::{Error, Pending, Replica, Result, SentUp, Uplink};

/// Answers to unknown sends kept at most.
const EARLY_ANSWERS: usize = 256;

impl Replica {
    /// What the host wrote that is due to go up, as one upload of at most
    /// about `max_bytes` of rows, for the host's uplink; `None` when nothing
    /// is. Rows go as they are now, each once however often written; a row
    /// sent and not answered for `resend_after` goes again, under a new
    /// send id. See the `up` module.
    /// The upload is recorded as sent: hand it over only once this returns.
    pub fn upload(
        &mut self,
        max_bytes: usize,
        resend_after: std::time::Duration,
    ) -> Result<Option<envelope::Up>> {
        let Some(pending) = self.prepare_upload(max_bytes, resend_after)? else {
            return Ok(None);
        };
        self.sent(&pending)?;
        Ok(Some(pending.up))
    }

    /// The same upload as [`upload`](Self::upload), not yet recorded as
    /// sent: for a host that hands it over first and calls
    /// [`sent`](Self::sent) once its uplink took it. Rows set aside are
    /// left out, and so are rows that cannot be read as their table
    /// declares them, which are set aside.
    pub fn prepare_upload(
        &mut self,
        max_bytes: usize,
        resend_after: std::time::Duration,
    ) -> Result<Option<Pending>> {
        let due = up::due(&self.conn, resend_after, &self.set_aside)?;
        let mut unreadable = Vec::new();
        let made = up::make(
            &mut self.conn,
            &self.shapes,
            &due,
            max_bytes,
            &mut unreadable,
        );
        for (table, key, _) in unreadable {
            self.set_aside.insert((table, key));
        }
        made
    }

    /// Records `pending` as sent. An answer to it that came first lets go of
    /// its rows now; returns how many.
    pub fn sent(&mut self, pending: &Pending) -> Result<usize> {
        self.sender().sent(pending)
    }

    /// Sends what is due through `uplink`, at most `most` uploads; finds
    /// and sets aside a row the uplink refuses for good (see the `uplink`
    /// module). Stops early, with why, when the uplink cannot reach the
    /// server or refuses everything.
    pub fn send_up(
        &mut self,
        uplink: &impl Uplink,
        resend_after: std::time::Duration,
        most: usize,
    ) -> Result<SentUp> {
        self.sender().send_up(uplink, resend_after, most)
    }

    fn sender(&mut self) -> uplink::Sender<'_> {
        uplink::Sender {
            conn: &mut self.conn,
            shapes: &self.shapes,
            set_aside: &mut self.set_aside,
            early: &mut self.early,
            patience: &mut self.patience,
        }
    }

    /// The server filed an upload: lets go of what that send carried and
    /// was not written since. Returns how many rows were let go of; none for
    /// a send this replica does not know (one not recorded as sent yet is
    /// remembered a while, and counts once it is).
    ///
    /// An answer that is not the server's (see
    /// [`Outcome::Forged`](crate::Outcome::Forged)) is [`Error::Forged`],
    /// counted, and lets go of nothing. The receipt an
    /// answer carries, signed with it, is kept when it is the newest: the
    /// replica's acknowledgements give it back (see [`ack`](Self::ack)).
    pub fn filed(&mut self, filed: &envelope::Filed) -> Result<usize> {
        let trusted = self.trusted.ok_or(Error::NoServerKey)?;
        let signer = match sign::verify_filed(&trusted, &self.id, filed) {
            Ok(signer) => signer,
            Err(why) => {
                self.forgeries
                    .count(&self.conn, &self.id, &why.to_string())?;
                return Err(Error::Forged {
                    what: "an answer to an upload".into(),
                    why,
                });
            }
        };
        self.forgeries.write_if_due(&self.conn, &self.id)?;
        self.follow(trusted, signer)?;
        self.patience.answered(&filed.send_id);
        // One transaction: one commit, and the host's writes wait for it
        // rather than interleave.
        let tx = write_transaction(&mut self.conn)?;
        let released = up::filed(&tx, &filed.send_id)?;
        if let Some(receipt) = &filed.receipt {
            up::keep_receipt(&tx, receipt)?;
        }
        tx.commit()?;
        self.ring();
        if released == 0 && !up::knows(&self.conn, &filed.send_id)? {
            if self.early.len() >= EARLY_ANSWERS {
                self.early.clear();
            }
            self.early.insert(filed.send_id.clone());
        }
        Ok(released)
    }

    /// How long to let an upload go unanswered before sending its rows
    /// again: `floor`, or four times the smoothed time answers took to
    /// come when that is longer. Each resend draws a new id, and only the
    /// newest send's answer lets go of a row: a replica resending faster
    /// than a loaded server answers would keep every row in flight, and
    /// add to the load. The runner's loop waits this long.
    pub fn patience(&self, floor: std::time::Duration) -> std::time::Duration {
        self.patience.after(floor)
    }
}

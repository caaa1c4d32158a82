//! The chain of messages, as a replica follows it: whether an incoming
//! [`ToReplica`] is the next one to apply. No I/O: the replica keeps a
//! [`Chain`] in its database and asks it about each message.
//!
//! Every message of an epoch names the one sent before it (`previous`,
//! `previous_nonce`). A replica applies a message only when that is the last
//! one it applied, so it applies each message once, in the order they were
//! sent, and the last one it applied is the server's latest. A message that
//! follows one the replica never got (lost on the way, or the replica's
//! database restored from an older copy) opens a gap: the replica applies
//! nothing more until a message that begins a snapshot arrives, and tells the
//! server the newest message it could not follow.
//!
//! Epochs are ordered ([`EpochId::precedes`]): a message of an epoch older
//! than the one the replica follows is one the server sent before it began
//! a new epoch, replayed. It changes nothing, not even a gap: a snapshot of
//! an old epoch would put back what the server no longer holds, and a gap
//! would have the replica provisioned again for a replay.
//!
//! The seal is not checked here. It is an HMAC under a secret only the server
//! knows; the replica keeps it as it came and gives it back in its
//! [`Ack`](envelope::Ack), and the server checks it there (see [`crate::seal`]).

use crate::envelope::{self, ToReplica};
use crate::ids::{BeyondAnyMessage, EpochId, MessageNo};

/// The last message a replica applied, as it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The epoch it belongs to.
    pub epoch: EpochId,
    /// Its number.
    pub number: MessageNo,
    /// Its nonce.
    pub nonce: Vec<u8>,
    /// Its seal, unchecked: the server checks it when the replica acknowledges.
    pub seal: Vec<u8>,
}

impl Applied {
    /// The head of `message`, once applied; refused when its number is
    /// one the server never gives (a replica refuses such a message before
    /// it asks the chain about it).
    pub fn of(message: &ToReplica) -> Result<Self, BeyondAnyMessage> {
        Ok(Applied {
            epoch: EpochId::from(message.epoch.as_slice()),
            number: MessageNo::from_wire(message.number)?,
            nonce: message.nonce.clone(),
            seal: message.seal.clone(),
        })
    }

    /// What the replica tells the server it applied.
    pub fn ack(&self) -> envelope::Ack {
        envelope::Ack {
            epoch: self.epoch.to_vec(),
            number: self.number.wire(),
            nonce: self.nonce.clone(),
            seal: self.seal.clone(),
            // The replica's to say: the chain knows nothing of uploads.
            answered: 0,
            receipt: None,
            // This build's `sign::verify_message` reads them.
            reads_batches: true,
        }
    }
}

/// The newest message a replica in a gap could not follow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapAt {
    /// The epoch of that message.
    pub epoch: EpochId,
    /// Its number.
    pub number: MessageNo,
}

impl GapAt {
    /// What the replica tells the server.
    pub fn envelope(&self) -> envelope::Gap {
        envelope::Gap {
            epoch: self.epoch.to_vec(),
            number: self.number.wire(),
        }
    }
}

/// What a replica knows of the chain: the last message it applied, and
/// whether it is in a gap.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain {
    /// The last message applied; `None` before the first.
    pub applied: Option<Applied>,
    /// Set while the replica waits for a snapshot.
    pub gap: Option<GapAt>,
}

/// What to do with an incoming message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// It is the next one: apply it.
    Apply,
    /// Applied before (below the last one applied in this epoch, or that
    /// one itself, nonce and all): it changes nothing.
    Duplicate,
    /// It cannot be followed: apply nothing until a snapshot begins.
    Gap(Break),
    /// It is addressed to another replica.
    WrongReplica,
    /// It is of an epoch older than the one the replica follows: sent
    /// before the server began a new epoch, and replayed. It changes
    /// nothing, however it begins.
    Superseded,
}

/// Why a message could not be followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// The replica has applied nothing yet, and the message begins no snapshot.
    NothingApplied,
    /// The replica is already in a gap, and the message begins no snapshot.
    InGap,
    /// The message is of another epoch, and begins no snapshot.
    OtherEpoch,
    /// The message names as previous one the replica did not apply last.
    NotNext,
}

impl Chain {
    /// Whether the replica called `ours` applies `message` now.
    pub fn decide(&self, ours: &str, message: &ToReplica) -> Decision {
        if message.replica != ours {
            return Decision::WrongReplica;
        }
        if self.is_superseded(message) {
            return Decision::Superseded;
        }
        if self.is_duplicate(message) {
            return Decision::Duplicate;
        }
        if message.begins_snapshot {
            // A snapshot replaces what the replica holds, so it needs no
            // predecessor: it ends a gap and opens an epoch.
            return Decision::Apply;
        }
        match self.follows(message) {
            Ok(()) => Decision::Apply,
            Err(why) => Decision::Gap(why),
        }
    }

    /// The chain once the message whose head is `applied` is applied: it
    /// is the last, and no gap is open (in a gap, only a message that
    /// begins a snapshot applies).
    pub fn applied(&self, applied: Applied) -> Chain {
        Chain {
            applied: Some(applied),
            gap: None,
        }
    }

    /// The gap once `message` could not be followed: it names the newest
    /// such message, of the newest epoch seen. Refused as
    /// [`Applied::of`] refuses.
    pub fn newest_gap(&self, message: &ToReplica) -> Result<GapAt, BeyondAnyMessage> {
        Ok(match &self.gap {
            Some(g) if g.epoch == message.epoch && g.number.wire() >= message.number => g.clone(),
            _ => GapAt {
                epoch: EpochId::from(message.epoch.as_slice()),
                number: MessageNo::from_wire(message.number)?,
            },
        })
    }

    /// The chain once it is in `gap` ([`newest_gap`](Self::newest_gap)).
    pub fn gapped(&self, gap: GapAt) -> Chain {
        Chain {
            applied: self.applied.clone(),
            gap: Some(gap),
        }
    }

    /// Of an epoch that began before the one of the last message applied.
    fn is_superseded(&self, message: &ToReplica) -> bool {
        self.applied
            .as_ref()
            .is_some_and(|a| EpochId::from(message.epoch.as_slice()).precedes(&a.epoch))
    }

    /// At or below the last applied, in its epoch; of the last one's own
    /// number only with its nonce. A message of that number with another
    /// nonce is not the one applied: a server restored from an older copy
    /// drew the number again, for other content, and skipping it as a
    /// duplicate would leave the replica stale without a word.
    fn is_duplicate(&self, message: &ToReplica) -> bool {
        self.applied.as_ref().is_some_and(|a| {
            a.epoch == message.epoch
                && (message.number < a.number.wire()
                    || (message.number == a.number.wire() && message.nonce == a.nonce))
        })
    }

    fn follows(&self, message: &ToReplica) -> Result<(), Break> {
        let Some(last) = &self.applied else {
            return Err(Break::NothingApplied);
        };
        if self.gap.is_some() {
            return Err(Break::InGap);
        }
        if last.epoch != message.epoch {
            return Err(Break::OtherEpoch);
        }
        if message.previous != last.number.wire() || message.previous_nonce != last.nonce {
            return Err(Break::NotNext);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Applied, Break, Chain, Decision, GapAt};
    use crate::envelope::ToReplica;
    use crate::ids::{EpochId, MessageNo};

    const EPOCH: [u8; 16] = [1; 16];
    const OTHER_EPOCH: [u8; 16] = [2; 16];

    fn nonce(n: u64) -> Vec<u8> {
        let mut bytes = vec![0xA5; 8];
        bytes.extend_from_slice(&n.to_be_bytes());
        bytes
    }

    /// Message `number` of `EPOCH`, following message `previous`.
    fn message(number: u64, previous: u64) -> ToReplica {
        ToReplica {
            replica: "unit-1".into(),
            epoch: EPOCH.to_vec(),
            number,
            nonce: nonce(number),
            previous,
            previous_nonce: if previous == 0 {
                Vec::new()
            } else {
                nonce(previous)
            },
            begins_snapshot: false,
            seal: vec![number as u8; 32],
            ..ToReplica::default()
        }
    }

    fn snapshot(number: u64, previous: u64) -> ToReplica {
        ToReplica {
            begins_snapshot: true,
            ..message(number, previous)
        }
    }

    /// A chain whose last applied message is `number` of `EPOCH`.
    fn after(number: u64) -> Chain {
        Chain::default().applied(head(&message(number, 0)))
    }

    /// The head of `m`, once applied.
    fn head(m: &ToReplica) -> Applied {
        Applied::of(m).expect("a number the server gives")
    }

    /// `chain` once `m` could not be followed.
    fn gapped(chain: &Chain, m: &ToReplica) -> Chain {
        chain.gapped(chain.newest_gap(m).expect("a number the server gives"))
    }

    #[test]
    fn the_next_message_applies() {
        assert_eq!(after(5).decide("unit-1", &message(6, 5)), Decision::Apply);
        // Numbers are drawn from a sequence shared by every replica: the next
        // one for this replica need not be the next integer.
        assert_eq!(after(5).decide("unit-1", &message(90, 5)), Decision::Apply);
    }

    #[test]
    fn a_message_at_or_below_the_last_is_a_duplicate() {
        let chain = after(5);
        assert_eq!(chain.decide("unit-1", &message(5, 4)), Decision::Duplicate);
        assert_eq!(chain.decide("unit-1", &message(3, 2)), Decision::Duplicate);
        // Even one that begins a snapshot: it was applied already.
        assert_eq!(chain.decide("unit-1", &snapshot(5, 0)), Decision::Duplicate);
    }

    #[test]
    fn the_last_number_with_another_nonce_is_no_duplicate() {
        // What a server restored from an older copy sends: a number it drew
        // again, for other content. It cannot be followed.
        let mut again = message(5, 4);
        again.nonce = vec![9; 16];
        assert_eq!(
            after(5).decide("unit-1", &again),
            Decision::Gap(Break::NotNext)
        );
        // The same message delivered again is still a duplicate.
        assert_eq!(
            after(5).decide("unit-1", &message(5, 4)),
            Decision::Duplicate
        );
    }

    #[test]
    fn a_skipped_message_is_a_gap() {
        let chain = after(5);
        assert_eq!(
            chain.decide("unit-1", &message(8, 7)),
            Decision::Gap(Break::NotNext)
        );
    }

    #[test]
    fn a_wrong_previous_nonce_is_a_gap() {
        let mut m = message(6, 5);
        m.previous_nonce = nonce(99);
        assert_eq!(after(5).decide("unit-1", &m), Decision::Gap(Break::NotNext));
    }

    #[test]
    fn another_epoch_without_a_snapshot_is_a_gap() {
        let mut m = message(1, 0);
        m.epoch = OTHER_EPOCH.to_vec();
        assert_eq!(
            after(5).decide("unit-1", &m),
            Decision::Gap(Break::OtherEpoch)
        );
        // Even at a lower number: numbers of another epoch are not comparable.
        m.number = 2;
        assert_eq!(
            after(5).decide("unit-1", &m),
            Decision::Gap(Break::OtherEpoch)
        );
    }

    #[test]
    fn a_fresh_replica_waits_for_a_snapshot() {
        let chain = Chain::default();
        assert_eq!(
            chain.decide("unit-1", &message(1, 0)),
            Decision::Gap(Break::NothingApplied)
        );
        assert_eq!(chain.decide("unit-1", &snapshot(1, 0)), Decision::Apply);
    }

    #[test]
    fn in_a_gap_only_a_snapshot_applies() {
        let chain = gapped(&after(5), &message(8, 7));
        // Even the message that would have followed the last applied.
        assert_eq!(
            chain.decide("unit-1", &message(6, 5)),
            Decision::Gap(Break::InGap)
        );
        assert_eq!(chain.decide("unit-1", &snapshot(9, 8)), Decision::Apply);
        let healed = chain.applied(head(&snapshot(9, 8)));
        assert_eq!(healed.gap, None);
        assert_eq!(healed.decide("unit-1", &message(10, 9)), Decision::Apply);
    }

    #[test]
    fn a_snapshot_opens_a_new_epoch() {
        let mut m = snapshot(1, 0);
        m.epoch = OTHER_EPOCH.to_vec();
        let chain = after(5);
        assert_eq!(chain.decide("unit-1", &m), Decision::Apply);
        let next = chain.applied(head(&m));
        let mut second = message(2, 1);
        second.epoch = OTHER_EPOCH.to_vec();
        assert_eq!(next.decide("unit-1", &second), Decision::Apply);
    }

    #[test]
    fn a_message_of_an_older_epoch_changes_nothing_however_it_begins() {
        let epoch = |g| EpochId::ordered(g, [3; 16]).into_bytes();
        let of = |m: ToReplica, g| ToReplica {
            epoch: epoch(g),
            ..m
        };
        let chain = Chain::default().applied(head(&of(snapshot(40, 0), 8)));
        // A snapshot, a message, a message beyond the last: all older.
        for old in [snapshot(90, 0), message(41, 40), message(2, 1)] {
            assert_eq!(chain.decide("unit-1", &of(old, 7)), Decision::Superseded);
        }
        // In a gap too: only a snapshot of its epoch or a newer one ends it.
        let gapped = gapped(&chain, &of(message(50, 45), 8));
        assert_eq!(
            gapped.decide("unit-1", &of(snapshot(60, 0), 7)),
            Decision::Superseded
        );
        assert_eq!(
            gapped.decide("unit-1", &of(snapshot(60, 0), 9)),
            Decision::Apply
        );
        // A newer epoch, or one of 16 random bytes (begun before epochs
        // were ordered): a snapshot applies, a message is a gap.
        assert_eq!(
            chain.decide("unit-1", &of(snapshot(1, 0), 9)),
            Decision::Apply
        );
        assert_eq!(
            chain.decide("unit-1", &of(message(1, 0), 9)),
            Decision::Gap(Break::OtherEpoch)
        );
        assert_eq!(chain.decide("unit-1", &snapshot(1, 0)), Decision::Apply);
        // A replica following an epoch of before: any snapshot applies.
        assert_eq!(
            after(5).decide("unit-1", &of(snapshot(1, 0), 1)),
            Decision::Apply
        );
    }

    #[test]
    fn a_message_for_another_replica_is_refused() {
        let mut m = message(6, 5);
        m.replica = "unit-2".into();
        assert_eq!(after(5).decide("unit-1", &m), Decision::WrongReplica);
        m.begins_snapshot = true;
        assert_eq!(after(5).decide("unit-1", &m), Decision::WrongReplica);
    }

    #[test]
    fn the_gap_names_the_newest_message_not_followed() {
        let chain = gapped(&gapped(&after(5), &message(8, 7)), &message(7, 6));
        assert_eq!(
            chain.gap,
            Some(GapAt {
                epoch: EPOCH.to_vec().into(),
                number: MessageNo::from_store(8)
            })
        );
        let mut other = message(2, 1);
        other.epoch = OTHER_EPOCH.to_vec();
        let chain = gapped(&chain, &other);
        assert_eq!(
            chain.gap.map(|g| (g.epoch.into_bytes(), g.number.wire())),
            Some((OTHER_EPOCH.to_vec(), 2))
        );
    }

    #[test]
    fn the_ack_is_the_last_applied_as_it_came() {
        let m = message(6, 5);
        let applied = head(&m);
        let ack = applied.ack();
        assert_eq!(
            (ack.epoch, ack.number, ack.nonce, ack.seal),
            (m.epoch, m.number, m.nonce, m.seal)
        );
    }
}

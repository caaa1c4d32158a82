//! The order a mailbox feeds its replica's loop in: the order the broker
//! stored the messages, whatever order it hands them over in.
//!
//! The replica's chain applies a message only after the one before it; a
//! message that overtakes another opens a gap, and the replica is
//! provisioned again. The broker hands a message over again when it was not
//! acknowledged in time, or was handed to a connection that was lost, and
//! meanwhile hands over the messages after it that it had not handed yet:
//! those overtake it. A consumer made afresh would begin at the first
//! message not acknowledged, but the replica may not make a consumer (the
//! server makes its one consumer, see `broker`), so the mailbox puts the
//! messages back in order itself.
//!
//! Every message carries its sequence in the replica's stream, the order
//! the server's sends were stored in. [`InOrder`] feeds them by it:
//!
//! - the next message in sequence goes at once, with any held after it;
//! - one further on is held while the one before it may still come. It
//!   comes again once the broker's wait for its acknowledgement ends (held,
//!   the broker hands over nothing newer past the consumer's limit, so what
//!   is held is bounded by it);
//! - a sequence below where the stream now begins (the broker dropped it
//!   for its age, or it was acknowledged) will not come: the stream's first
//!   sequence moves the next one on ([`InOrder::begins_at`]);
//! - one that never comes for another reason is given up on after a while
//!   ([`InOrder::give_up`]): the replica's chain then finds a gap, and the
//!   replica is provisioned again, as for any message lost;
//! - one that comes again, after it was fed, is not fed twice.
//!
//! No I/O here: the mailbox asks the broker where the stream begins and
//! does the feeding.

use std::collections::BTreeMap;

/// Messages, by stream sequence, put back in order.
#[derive(Debug)]
pub(crate) struct InOrder<T> {
    /// The sequence to feed next; 0 until the stream's first is known.
    next: u64,
    held: BTreeMap<u64, T>,
}

/// What became of a message that arrived.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Arrival<T> {
    /// These go to the loop, in this order: the message, and those held
    /// after it.
    Feed(Vec<(u64, T)>),
    /// Held until the ones before it come.
    Held,
    /// Fed before: not again.
    Fed(T),
    /// Held already: this is the same message handed over again.
    HeldAlready(T),
}

impl<T> Default for InOrder<T> {
    fn default() -> Self {
        InOrder {
            next: 0,
            held: BTreeMap::new(),
        }
    }
}

impl<T> InOrder<T> {
    /// The stream now begins at `first`: nothing before it will come. What
    /// was held only for those goes.
    pub(crate) fn begins_at(&mut self, first: u64) -> Vec<(u64, T)> {
        self.next = self.next.max(first);
        self.release()
    }

    /// Message `sequence` arrived.
    pub(crate) fn arrive(&mut self, sequence: u64, message: T) -> Arrival<T> {
        if sequence < self.next {
            return Arrival::Fed(message);
        }
        if self.held.contains_key(&sequence) {
            return Arrival::HeldAlready(message);
        }
        self.held.insert(sequence, message);
        let fed = self.release();
        if fed.is_empty() {
            Arrival::Held
        } else {
            Arrival::Feed(fed)
        }
    }

    /// Stops waiting for what is missing: what is held goes, in order.
    pub(crate) fn give_up(&mut self) -> Vec<(u64, T)> {
        if let Some(first) = self.held.keys().next() {
            self.next = self.next.max(*first);
        }
        self.release()
    }

    /// Whether messages are held, waiting for one before them.
    pub(crate) fn is_waiting(&self) -> bool {
        !self.held.is_empty()
    }

    /// Everything held, in order, and a fresh start: for a stream made
    /// anew, or for a mailbox that stops.
    pub(crate) fn clear(&mut self) -> Vec<(u64, T)> {
        self.next = 0;
        std::mem::take(&mut self.held).into_iter().collect()
    }

    /// The held messages from `next` on, while they follow one another.
    fn release(&mut self) -> Vec<(u64, T)> {
        let mut fed = Vec::new();
        if self.next == 0 {
            // Where the stream begins is not known yet.
            return fed;
        }
        while let Some(entry) = self.held.first_entry() {
            if *entry.key() > self.next {
                break;
            }
            let (sequence, message) = entry.remove_entry();
            self.next = self.next.max(sequence + 1);
            fed.push((sequence, message));
        }
        fed
    }
}

#[cfg(test)]
mod tests {
    use super::{Arrival, InOrder};

    fn fed(arrival: Arrival<&'static str>) -> Vec<u64> {
        match arrival {
            Arrival::Feed(fed) => fed.into_iter().map(|(s, _)| s).collect(),
            other => panic!("nothing fed: {other:?}"),
        }
    }

    #[test]
    fn what_overtakes_a_message_handed_again_waits_for_it() {
        let mut order = InOrder::default();
        // Until the stream's first is known, everything waits.
        assert_eq!(order.arrive(7, "7"), Arrival::Held);
        assert_eq!(
            order.begins_at(5).len(),
            0,
            "5 and 6 are in the stream: they come"
        );
        assert_eq!(order.arrive(8, "8"), Arrival::Held);
        assert_eq!(order.arrive(8, "8 again"), Arrival::HeldAlready("8 again"));
        assert_eq!(fed(order.arrive(5, "5")), vec![5]);
        assert!(order.is_waiting());
        assert_eq!(fed(order.arrive(6, "6")), vec![6, 7, 8]);
        assert!(!order.is_waiting());
        assert_eq!(order.arrive(6, "6 again"), Arrival::Fed("6 again"));
        assert_eq!(fed(order.arrive(9, "9")), vec![9]);
    }

    #[test]
    fn what_left_the_stream_is_not_waited_for() {
        let mut order = InOrder::default();
        order.begins_at(1);
        assert_eq!(fed(order.arrive(1, "1")), vec![1]);
        // 2 and 3 were dropped by the broker for their age.
        assert_eq!(order.arrive(4, "4"), Arrival::Held);
        assert_eq!(order.begins_at(4), vec![(4, "4")]);
        // A stream whose first is behind what was fed moves nothing back.
        assert_eq!(order.begins_at(2), vec![]);
        assert_eq!(order.arrive(3, "3"), Arrival::Fed("3"));
    }

    #[test]
    fn giving_up_feeds_what_is_held_in_order() {
        let mut order = InOrder::default();
        order.begins_at(1);
        assert_eq!(order.arrive(3, "3"), Arrival::Held);
        assert_eq!(order.arrive(5, "5"), Arrival::Held);
        let given: Vec<u64> = order.give_up().into_iter().map(|(s, _)| s).collect();
        assert_eq!(given, vec![3]);
        let given: Vec<u64> = order.give_up().into_iter().map(|(s, _)| s).collect();
        assert_eq!(given, vec![5]);
        // The one given up on comes late: it is behind, and not fed.
        assert_eq!(order.arrive(1, "1"), Arrival::Fed("1"));
        assert_eq!(order.arrive(9, "9"), Arrival::Held);
        assert_eq!(order.clear(), vec![(9, "9")]);
        assert_eq!(order.arrive(1, "1"), Arrival::Held, "a fresh start");
    }
}

//! The chain's decisions under any delivery: the server sends a replica a
//! run of chained messages (snapshots among them, and a new epoch now and
//! then); the network loses, duplicates and reorders them at will. Whatever
//! arrives, the replica applies each message at most once, in the order the
//! server sent them, and never one that does not follow the last it applied
//! unless it begins a snapshot. Messages arrive in any order, but once one
//! the server sent after a restore or a new epoch arrived, none sent before
//! it does (the server that sent those is gone; what a late one of them does
//! is the server's acknowledgement check's to catch, not the chain's).
//! Epochs are ordered, as the server draws them: once the replica applied
//! a message of an epoch, any message of an epoch before it, replayed
//! afterwards, changes nothing.
//!
//! Seeded: the seed is printed, and `PROPTEST_RNG_SEED=N` replays it.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a test says what it saw, for whoever reads its output"
)]

use magic_sync_core::chain::{Applied, Chain, Decision};
use magic_sync_core::envelope::ToReplica;
use magic_sync_core::EpochId;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};

const REPLICA: &str = "till-1";

/// What the server does next for the replica.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// A message following the last (numbers skip what went to others).
    Next { skip: u8 },
    /// A message that begins a snapshot.
    Snapshot { skip: u8 },
    /// A new epoch (a new installation): begins with a snapshot.
    NewEpoch,
    /// The server's database restored from an older copy, in the same
    /// epoch: it numbers again from the message it had sent `back` messages
    /// ago, under nonces of its own.
    Restore { back: u8 },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        8 => (0u8..3).prop_map(|skip| Step::Next { skip }),
        2 => (0u8..3).prop_map(|skip| Step::Snapshot { skip }),
        1 => Just(Step::NewEpoch),
        1 => (1u8..4).prop_map(|back| Step::Restore { back }),
    ]
}

/// A message the server sent, and the one it follows (by place in the
/// order sent), if any.
struct Sent {
    message: ToReplica,
    follows: Option<usize>,
    /// Restores and new epochs so far.
    generation: u32,
}

/// The messages the server sent, in the order it sent them.
fn sent(steps: &[Step]) -> Vec<Sent> {
    let mut epoch = 0u8;
    let mut number = 0u64;
    // The last message sent in this epoch, as the server's database knows it.
    let mut previous: Option<usize> = None;
    // What this epoch sent, oldest first, as the database knew it then.
    let mut history: Vec<usize> = Vec::new();
    let mut out: Vec<Sent> = Vec::new();
    let mut generation = 0;
    for (i, step) in steps.iter().enumerate() {
        let (skip, snapshot) = match *step {
            Step::Next { skip } => (skip, false),
            Step::Snapshot { skip } => (skip, true),
            Step::NewEpoch => {
                epoch += 1;
                generation += 1;
                previous = None;
                history.clear();
                (0, true)
            }
            Step::Restore { back } => {
                generation += 1;
                let keep = history.len().saturating_sub(usize::from(back));
                history.truncate(keep);
                previous = history.last().copied();
                number = previous.map_or(0, |p| out[p].message.number);
                (0, false)
            }
        };
        number += 1 + u64::from(skip);
        // The first message of an epoch begins a snapshot.
        let snapshot = snapshot || previous.is_none();
        let (prev, prev_nonce) = previous.map_or((0, Vec::new()), |p| {
            (out[p].message.number, out[p].message.nonce.clone())
        });
        out.push(Sent {
            message: ToReplica {
                replica: REPLICA.into(),
                epoch: EpochId::ordered(u64::from(epoch), [0xE0; 16]).into_bytes(),
                number,
                nonce: (i as u64).to_be_bytes().to_vec(),
                previous: prev,
                previous_nonce: prev_nonce,
                begins_snapshot: snapshot,
                ..ToReplica::default()
            },
            follows: previous,
            generation,
        });
        previous = Some(i);
        history.push(i);
    }
    out
}

/// How the network delivers: each arrival is one of the sent messages, any
/// of them, any number of times, in any order within an epoch; some never
/// arrive.
fn deliveries(sent: &[Sent]) -> impl Strategy<Value = Vec<usize>> {
    let generations: Vec<u32> = sent.iter().map(|s| s.generation).collect();
    proptest::collection::vec(0..sent.len(), 0..sent.len() * 3).prop_map(move |mut arrivals| {
        arrivals.sort_by_key(|&i| generations[i]);
        arrivals
    })
}

fn check(steps: &[Step], arrivals: &[usize]) -> Result<(), TestCaseError> {
    let sent = sent(steps);
    let mut chain = Chain::default();
    let mut applied: Vec<usize> = Vec::new();
    for &i in arrivals {
        let message = &sent[i].message;
        match chain.decide(REPLICA, message) {
            Decision::Apply => {
                prop_assert!(
                    !applied.contains(&i),
                    "message {} applied twice (arrivals {arrivals:?})",
                    message.number
                );
                if let Some(&last) = applied.last() {
                    prop_assert!(
                        i > last,
                        "message {} applied after {}, which the server sent later",
                        message.number,
                        sent[last].message.number
                    );
                    if !message.begins_snapshot {
                        prop_assert_eq!(
                            sent[i].follows,
                            Some(last),
                            "message {} applied though it does not follow {}",
                            message.number,
                            sent[last].message.number
                        );
                    }
                } else {
                    prop_assert!(
                        message.begins_snapshot,
                        "the first applied begins a snapshot"
                    );
                }
                applied.push(i);
                chain = chain.applied(Applied::of(message).expect("a number the server gives"));
            }
            Decision::Duplicate => {}
            Decision::Gap(_) => {
                chain = chain.gapped(
                    chain
                        .newest_gap(message)
                        .expect("a number the server gives"),
                )
            }
            Decision::Superseded => prop_assert!(false, "arrivals keep to their epochs' order"),
            Decision::WrongReplica => prop_assert!(false, "every message is for {REPLICA}"),
        }
    }
    // Every message of an epoch before the one followed, replayed now.
    if let Some(last) = &chain.applied {
        for old in sent.iter().map(|s| &s.message) {
            if EpochId::from(old.epoch.as_slice()).precedes(&last.epoch) {
                prop_assert_eq!(chain.decide(REPLICA, old), Decision::Superseded);
            }
        }
    }
    Ok(())
}

fn seeded(cases: u32) -> TestRunner {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    println!("chain property seed: {seed} (replay with PROPTEST_RNG_SEED={seed})");
    TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    })
}

#[test]
fn any_delivery_applies_each_message_at_most_once_and_in_order() {
    let mut runner = seeded(2_000);
    let case = proptest::collection::vec(step(), 1..24).prop_flat_map(|steps| {
        let arrivals = deliveries(&sent(&steps));
        (Just(steps), arrivals)
    });
    runner
        .run(&case, |(steps, arrivals)| check(&steps, &arrivals))
        .unwrap();
}

#[test]
fn delivered_in_order_everything_applies() {
    let mut runner = seeded(500);
    runner
        .run(&proptest::collection::vec(step(), 1..24), |steps| {
            // Without restores, each message follows the one sent before it.
            let steps: Vec<Step> = steps
                .into_iter()
                .filter(|s| !matches!(s, Step::Restore { .. }))
                .collect();
            let mut chain = Chain::default();
            for Sent { message, .. } in &sent(&steps) {
                prop_assert_eq!(chain.decide(REPLICA, message), Decision::Apply);
                chain = chain.applied(Applied::of(message).expect("a number the server gives"));
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn a_lost_message_stops_the_replica_until_a_snapshot_begins() {
    let mut runner = seeded(500);
    let case = proptest::collection::vec(step(), 3..24).prop_flat_map(|steps| {
        let n = sent(&steps).len();
        (Just(steps), 1..n)
    });
    runner
        .run(&case, |(steps, lost)| {
            let steps: Vec<Step> = steps
                .into_iter()
                .filter(|s| !matches!(s, Step::Restore { .. }))
                .collect();
            let sent: Vec<ToReplica> = sent(&steps).into_iter().map(|s| s.message).collect();
            if lost >= sent.len() {
                return Ok(());
            }
            let mut chain = Chain::default();
            let mut gapped = false;
            for (i, message) in sent.iter().enumerate() {
                if i == lost {
                    continue;
                }
                let decision = chain.decide(REPLICA, message);
                if i > lost && !message.begins_snapshot && (gapped || i == lost + 1) {
                    prop_assert!(
                        matches!(decision, Decision::Gap(_)),
                        "message {} applied after losing {}: {decision:?}",
                        message.number,
                        sent[lost].number
                    );
                    gapped = true;
                    chain = chain.gapped(
                        chain
                            .newest_gap(message)
                            .expect("a number the server gives"),
                    );
                    continue;
                }
                prop_assert_eq!(decision, Decision::Apply, "message {}", message.number);
                if message.begins_snapshot {
                    gapped = false;
                }
                chain = chain.applied(Applied::of(message).expect("a number the server gives"));
            }
            Ok(())
        })
        .unwrap();
}

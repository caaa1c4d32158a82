//! Hostile input, fuzzed: bytes made by mutating what the engine really
//! sends and hears (bits flipped, bytes set, ranges cut, copied or spliced
//! from another input, tails cut off), handed to a replica as messages from
//! its server and to the server as what a replica says (uploads,
//! acknowledgements, gaps, digests, backlogs). Nothing panics; a replica
//! applies no message that is not one the server sealed, its file stays
//! intact, and the genuine messages still bring it where it should be; the
//! server hears every input without failing (each is refused on its own),
//! files nothing for a replica but the one the transport authenticated, and
//! no other replica's record or rows change. The fleet's check ends each.
//!
//! `MAGIC_SYNC_FUZZ_INPUTS` sets the inputs per target (default 5,000);
//! `MAGIC_SYNC_SEED` replays a seed.

use crate::fleet::Fleet;
use crate::scenarios::shop;
use magic_sync::envelope::{Gap, ToReplica, Up};
use magic_sync::replica::Outcome;
use magic_sync::run::{self, Report};
use magic_sync::ReplicaId;
use magic_sync_testkit::walk::env;
use prost::Message as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn inputs() -> u64 {
    env("MAGIC_SYNC_FUZZ_INPUTS").unwrap_or(5_000)
}

fn seed(default: u64) -> u64 {
    env("MAGIC_SYNC_SEED").unwrap_or(default)
}

/// `corpus[i]` changed one to four times.
fn mutate(rng: &mut StdRng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = corpus[rng.gen_range(0..corpus.len())].clone();
    for _ in 0..rng.gen_range(1..=4) {
        let len = bytes.len();
        match rng.gen_range(0..8) {
            0 if len > 0 => {
                let i = rng.gen_range(0..len);
                bytes[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.gen_range(0..len);
                bytes[i] = *[0x00, 0x01, 0x7f, 0x80, 0xff]
                    .get(rng.gen_range(0..5))
                    .unwrap();
            }
            2 if len > 0 => {
                let i = rng.gen_range(0..len);
                bytes[i] = rng.gen();
            }
            3 if len > 0 => {
                let from = rng.gen_range(0..len);
                let to = rng.gen_range(from..=len.min(from + 16));
                bytes.drain(from..to);
            }
            4 => {
                let at = rng.gen_range(0..=len);
                let n = rng.gen_range(1..=8);
                let noise: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
                bytes.splice(at..at, noise);
            }
            5 if len > 0 => bytes.truncate(rng.gen_range(0..len)),
            6 => {
                // Spliced: this input's head, another's tail.
                let other = &corpus[rng.gen_range(0..corpus.len())];
                let cut = rng.gen_range(0..=len);
                let from = rng.gen_range(0..=other.len());
                bytes.truncate(cut);
                bytes.extend_from_slice(&other[from..]);
            }
            _ if len > 0 => {
                // A range repeated: lengths and counts that lie.
                let from = rng.gen_range(0..len);
                let to = rng.gen_range(from..=len.min(from + 8));
                let copy = bytes[from..to].to_vec();
                let at = rng.gen_range(0..=bytes.len());
                bytes.splice(at..at, copy);
            }
            _ => bytes.push(rng.gen()),
        }
    }
    bytes
}

/// Messages the server sealed for u1 and has not delivered, with some for
/// u2: passes over changes of every table u1 holds rows of.
async fn sealed_messages(fleet: &mut Fleet) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut for_u1 = Vec::new();
    let mut for_u2 = Vec::new();
    for sql in [
        "UPDATE products SET name = 'green tea', price = 3 WHERE id = 1",
        "INSERT INTO orders (id, unit_id, customer_id) VALUES (40, 'u1', 9);
         INSERT INTO order_lines VALUES (40, 1, 3, 2)",
        "UPDATE customers SET name = 'Ada L' WHERE id = 7; DELETE FROM order_lines WHERE order_id = 1 AND line_no = 2",
        "UPDATE stock SET on_hand = 9 WHERE unit_id = 'u1'; UPDATE notices SET body = 'closed' WHERE id = 1",
        "UPDATE orders SET unit_id = 'u2' WHERE id = 40",
    ] {
        fleet.write(sql).await;
        fleet.record().await;
        fleet.publish().await;
        for_u1.extend(fleet.network.take("u1"));
        for_u2.extend(fleet.network.take("u2"));
    }
    // u3's, left where they are, go with the last sync.
    (for_u1, for_u2)
}

/// A replica handed mutated messages applies only what its server sealed,
/// keeps its file intact, and the genuine messages still bring it where it
/// should be.
#[tokio::test]
async fn a_replica_applies_nothing_its_server_did_not_seal() {
    let seed = seed(0xf022);
    let n = inputs();
    println!(
        "fuzzing a replica's apply: seed {seed}, {n} inputs; replay with MAGIC_SYNC_SEED={seed}"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fleet = shop().await;
    let (genuine, others) = sealed_messages(&mut fleet).await;
    assert!(genuine.len() >= 5, "{} messages", genuine.len());
    let decoded: Vec<ToReplica> = genuine
        .iter()
        .map(|m| ToReplica::decode(m.as_slice()).unwrap())
        .collect();
    let mut corpus = genuine.clone();
    corpus.extend(others.iter().cloned());
    let mut tally = std::collections::BTreeMap::<&str, u64>::new();
    for i in 0..n {
        let input = mutate(&mut rng, &corpus);
        let outcome = fleet.unit("u1").replica.apply(&input);
        let kind = match &outcome {
            Ok(Outcome::Applied { .. }) => {
                // Only a message the server sealed, however it was framed.
                let as_sent = ToReplica::decode(input.as_slice()).ok();
                assert!(
                    as_sent.is_some_and(|m| decoded.contains(&m)),
                    "input {i} (seed {seed}) applied but was never sealed: {input:?}"
                );
                "applied"
            }
            Ok(Outcome::Duplicate { .. }) => "duplicate",
            Ok(Outcome::Gap { .. }) => "gap",
            Ok(Outcome::WrongReplica { .. }) => "wrong replica",
            Ok(Outcome::Superseded { .. }) => "superseded",
            Ok(Outcome::Forged { .. }) => "forged",
            Err(magic_sync::replica::Error::Envelope(_)) => "not a message",
            Err(magic_sync::replica::Error::Malformed { .. }) => "malformed",
            Err(magic_sync::replica::Error::Forged { .. }) => "refused as forged",
            Err(e) => panic!("input {i} (seed {seed}): the replica failed on bad input: {e}"),
        };
        *tally.entry(kind).or_default() += 1;
    }
    println!("  outcomes: {tally:?}");
    let intact: String = fleet
        .unit("u1")
        .replica
        .connection()
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(intact, "ok");
    // The genuine messages, in order; a gap the fuzzing opened is said,
    // and a snapshot closes it.
    for (unit, messages) in [("u1", &genuine), ("u2", &others)] {
        for message in messages {
            if let Some(report) =
                run::replica::deliver(&mut fleet.unit(unit).replica, message).unwrap()
            {
                fleet.network.report(unit, report);
            }
        }
    }
    fleet.heed().await;
    fleet.sync().await;
    fleet.check().await;
}

/// What u1 really says, each as the one `Up` the wire carries.
async fn what_u1_says(fleet: &mut Fleet) -> Vec<Vec<u8>> {
    let max = fleet.network.max_message_bytes();
    let replica = &mut fleet.unit("u1").replica;
    replica
        .connection()
        .execute_batch(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s1', 'u1', 7, '9.50', 1);
             UPDATE stock SET counted = 4 WHERE unit_id = 'u1'",
        )
        .unwrap();
    let upload = replica
        .upload(max, std::time::Duration::from_secs(3600))
        .unwrap()
        .expect("the sale and the count go up");
    let ack = replica.ack().expect("it applied messages");
    let gap = Gap {
        epoch: ack.epoch.clone(),
        number: ack.number + 1,
    };
    let mut said = vec![
        upload.encode_to_vec(),
        Up {
            applied: Some(ack),
            ..Up::default()
        }
        .encode_to_vec(),
        Up {
            gap: Some(gap),
            ..Up::default()
        }
        .encode_to_vec(),
    ];
    for report in [
        run::replica::digest(replica).unwrap(),
        run::replica::progress(replica).unwrap(),
    ] {
        let Report::Upload(up) = report else {
            unreachable!("digests and backlogs are uploads")
        };
        said.push(up.encode_to_vec());
    }
    said
}

/// Everything the server records of the replicas but u1, and their rows
/// the host's tables hold for them.
async fn the_others(fleet: &Fleet) -> Vec<String> {
    fleet
        .writer
        .query(
            "SELECT format('replica %s', row_to_json(r)) FROM sync.replicas r WHERE id <> 'u1'
             UNION ALL SELECT format('ack %s', row_to_json(a)) FROM sync.acks a WHERE replica <> 'u1'
             UNION ALL SELECT format('held %s %s %s %s', replica, table_name, key, version)
                 FROM sync.held WHERE replica <> 'u1'
             UNION ALL SELECT format('stock %s', row_to_json(s)) FROM stock s WHERE unit_id <> 'u1'
             UNION ALL SELECT format('sale %s', row_to_json(s)) FROM sales s WHERE unit_id <> 'u1'
             ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The server hears mutated uploads, acknowledgements, gaps, digests and
/// backlogs from u1 without failing, files nothing for anyone but u1, and
/// no other replica's record or rows change.
#[tokio::test]
async fn the_server_hears_anything_a_replica_sends_and_it_changes_only_that_replica() {
    let seed = seed(0xf023);
    let n = inputs();
    println!(
        "fuzzing the server's intake: seed {seed}, {n} inputs; replay with MAGIC_SYNC_SEED={seed}"
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fleet = shop().await;
    let corpus = what_u1_says(&mut fleet).await;
    let before = the_others(&fleet).await;
    let (mut decoded, mut undecodable) = (0u64, 0u64);
    let mut batch = Vec::new();
    for i in 0..n {
        let input = mutate(&mut rng, &corpus);
        match Up::decode(input.as_slice()) {
            Ok(up) => {
                decoded += 1;
                batch.push((ReplicaId::from("u1"), Report::from_up(up)));
            }
            Err(_) => undecodable += 1,
        }
        if batch.len() == 16 || i + 1 == n {
            let reports = std::mem::take(&mut batch);
            let said = format!("{reports:?}");
            if let Err(e) =
                run::server::heed(&mut fleet.client, &fleet.engine, &fleet.network, reports).await
            {
                panic!("input {i} (seed {seed}): the server failed on what a replica said: {e}\n{said}");
            }
            // What it answered goes nowhere: u1 never sees it.
            fleet.network.take_answers("u1");
        }
    }
    println!("  {decoded} decoded and heard, {undecodable} not an Up (the transport drops those)");
    assert_eq!(
        the_others(&fleet).await,
        before,
        "seed {seed}: another replica's record or rows changed"
    );
    fleet.sync().await;
    fleet.check().await;
}

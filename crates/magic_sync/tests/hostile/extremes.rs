//! Every report kind a replica sends, and every field of each, at its
//! extremes: 0, the largest, past what the store holds (negative as it
//! reads it), absent, another replica's, another epoch's. Heard from u1,
//! none changes anything the server records of u2 and u3, their outboxes,
//! their held rows or their rows on the server; no new epoch begins, and
//! afterwards only u1 may have been provisioned again.
//!
//! | report | field | what it can change |
//! | --- | --- | --- |
//! | acknowledgement | epoch, number, nonce, seal | u1's acknowledgement (if the seal is the server's), u1's provisioning; a new epoch only under the server's own seal |
//! | | answered | with no receipt, u1's provisioning |
//! | | receipt | a new epoch, only if the server made it for u1, in this epoch, above its record |
//! | | reads batches | how u1's own messages are signed |
//! | gap | epoch, number | u1's provisioning |
//! | upload | tables | rows of u1's own, or refused into u1's inbox |
//! | | lane, send id, takes receipts | the answer to u1 |
//! | | sequence | u1's filing order, u1's record of answers (at most `int8`'s largest) |
//! | | backlog | u1's backlog |
//! | | digest, with applied and refused | u1's provisioning |
//! | | applied, gap beside anything else | nothing |

use crate::{ack_of, epoch_of, settle, shop, the_others};
use magic_sync::envelope::{
    Ack, Backlog, Digest, Gap, Receipt, Refused, RowData, TableBacklog, TableDigest, Up, UpRows,
};
use magic_sync::run::{self, Report};
use magic_sync::{EpochId, ReplicaId};
use magic_sync_testkit::fleet::Fleet;
use std::time::Duration;

/// Numbers at their extremes, named.
fn numbers() -> Vec<(&'static str, u64)> {
    vec![
        ("0", 0),
        ("1", 1),
        ("the store's largest", i64::MAX.unsigned_abs()),
        (
            "negative as the store reads it",
            i64::MAX.unsigned_abs() + 1,
        ),
        ("the largest", u64::MAX),
    ]
}

/// Bytes at their extremes, named: `own` altered, and `others` beside.
fn bytes(own: &[u8], others: &[(&'static str, Vec<u8>)]) -> Vec<(String, Vec<u8>)> {
    let mut flipped = own.to_vec();
    if let Some(b) = flipped.first_mut() {
        *b ^= 1;
    }
    let mut values = vec![
        ("absent".to_string(), Vec::new()),
        ("one zero byte".into(), vec![0]),
        ("16 zero bytes".into(), vec![0; 16]),
        (
            "an epoch of the largest generation".into(),
            EpochId::ordered(u64::MAX, [0; 16]).into_bytes(),
        ),
        ("64 KiB".into(), vec![0xff; 64 << 10]),
        ("its own, a bit flipped".into(), flipped),
    ];
    values.extend(others.iter().map(|(n, v)| (n.to_string(), v.clone())));
    values
}

/// What the tills really say, to start each case from.
struct Said {
    ack: Ack,
    receipt: Receipt,
    u2_ack: Ack,
    u2_receipt: Receipt,
    u2_send_id: Vec<u8>,
    old_epoch: Vec<u8>,
    upload: Up,
    digest: Up,
}

async fn what_the_tills_say(fleet: &mut Fleet) -> Said {
    // An epoch before this one: a restore found, and the fleet following.
    let old_epoch = epoch_of(fleet).await;
    fleet
        .write("UPDATE sync.replicas SET last_number = last_number - 1 WHERE id = 'u3'; DELETE FROM sync.acks")
        .await;
    let ack = ack_of(fleet, "u3");
    fleet.network.report("u3", Report::Applied(ack));
    fleet.heed().await;
    settle(fleet).await;
    assert_ne!(epoch_of(fleet).await, old_epoch);
    for (unit, sale, customer) in [("u1", "s1", 7), ("u2", "s2", 8)] {
        fleet
            .unit(unit)
            .replica
            .connection()
            .execute_batch(&format!(
                "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('{sale}', '{unit}', {customer}, '1', 1)"
            ))
            .unwrap();
    }
    fleet.upload(Duration::ZERO).await;
    settle(fleet).await;
    let ack = ack_of(fleet, "u1");
    let u2_ack = ack_of(fleet, "u2");
    // A send of u2's, made and not sent.
    let u2 = &mut fleet.unit("u2").replica;
    u2.connection()
        .execute_batch(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s4', 'u2', 8, '4', 1)",
        )
        .unwrap();
    let u2_send_id = u2
        .prepare_upload(1 << 20, Duration::from_secs(3600))
        .unwrap()
        .expect("u2's sale")
        .up
        .send_id;
    let replica = &mut fleet.unit("u1").replica;
    replica
        .connection()
        .execute_batch(
            "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s3', 'u1', 7, '3', 1);
             UPDATE stock SET counted = 4 WHERE unit_id = 'u1'",
        )
        .unwrap();
    let upload = replica
        .prepare_upload(1 << 20, Duration::from_secs(3600))
        .unwrap()
        .expect("the sale and the count go up")
        .up;
    let Report::Upload(digest) = run::replica::digest(replica).unwrap() else {
        unreachable!("a digest is an upload")
    };
    Said {
        receipt: ack.receipt.clone().expect("u1 was answered"),
        u2_receipt: u2_ack.receipt.clone().expect("u2 was answered"),
        ack,
        u2_ack,
        u2_send_id,
        old_epoch,
        upload,
        digest,
    }
}

/// Every acknowledgement u1 might send.
fn acks(s: &Said) -> Vec<(String, Ack)> {
    let a = &s.ack;
    let mut cases = Vec::new();
    let epochs = [
        ("another epoch's", s.old_epoch.clone()),
        ("u2's", s.u2_ack.epoch.clone()),
    ];
    for (what, epoch) in bytes(&a.epoch, &epochs) {
        cases.push((format!("epoch: {what}"), Ack { epoch, ..a.clone() }));
    }
    let mut numbers_and_u2s = numbers();
    numbers_and_u2s.push(("u2's", s.u2_ack.number));
    for (what, number) in numbers_and_u2s {
        cases.push((
            format!("number: {what}"),
            Ack {
                number,
                ..a.clone()
            },
        ));
    }
    for (what, nonce) in bytes(&a.nonce, &[("u2's", s.u2_ack.nonce.clone())]) {
        cases.push((format!("nonce: {what}"), Ack { nonce, ..a.clone() }));
    }
    for (what, seal) in bytes(&a.seal, &[("u2's", s.u2_ack.seal.clone())]) {
        cases.push((format!("seal: {what}"), Ack { seal, ..a.clone() }));
    }
    for (what, answered) in numbers() {
        for receipt in [None, Some(s.receipt.clone())] {
            cases.push((
                format!("answered: {what}, receipt: {}", receipt.is_some()),
                Ack {
                    answered,
                    receipt,
                    ..a.clone()
                },
            ));
        }
    }
    let r = &s.receipt;
    let mut receipts = vec![
        ("absent".to_string(), None),
        ("u2's".into(), Some(s.u2_receipt.clone())),
        ("empty".into(), Some(Receipt::default())),
    ];
    let epochs = [("another epoch's", s.old_epoch.clone())];
    for (what, epoch) in bytes(&r.epoch, &epochs) {
        let receipt = Receipt { epoch, ..r.clone() };
        receipts.push((format!("its epoch: {what}"), Some(receipt)));
    }
    for (what, sequence) in numbers() {
        let receipt = Receipt {
            sequence,
            ..r.clone()
        };
        receipts.push((format!("its sequence: {what}"), Some(receipt)));
    }
    for (what, seal) in bytes(&r.seal, &[("u2's", s.u2_receipt.seal.clone())]) {
        let receipt = Receipt { seal, ..r.clone() };
        receipts.push((format!("its seal: {what}"), Some(receipt)));
    }
    for (what, receipt) in receipts {
        cases.push((
            format!("receipt: {what}"),
            Ack {
                receipt,
                answered: u64::MAX,
                ..a.clone()
            },
        ));
    }
    // Whether it reads batches: what it says changes only how its own
    // messages are signed (`sync.acks` of the others is compared).
    for reads_batches in [false, true] {
        cases.push((
            format!("reads batches: {reads_batches}"),
            Ack {
                reads_batches,
                ..a.clone()
            },
        ));
        cases.push((
            format!("u2's whole, reads batches: {reads_batches}"),
            Ack {
                reads_batches,
                ..s.u2_ack.clone()
            },
        ));
    }
    cases.push(("u2's whole".into(), s.u2_ack.clone()));
    cases
}

/// Every gap u1 might say.
fn gaps(s: &Said) -> Vec<(String, Gap)> {
    let a = &s.ack;
    let mut cases = Vec::new();
    let epochs = [("another epoch's", s.old_epoch.clone())];
    for (what, epoch) in bytes(&a.epoch, &epochs) {
        let gap = Gap {
            epoch,
            number: a.number + 1,
        };
        cases.push((format!("epoch: {what}"), gap));
    }
    for (what, number) in numbers() {
        let gap = Gap {
            epoch: a.epoch.clone(),
            number,
        };
        cases.push((format!("number: {what}"), gap));
    }
    let u2 = Gap {
        epoch: s.u2_ack.epoch.clone(),
        number: s.u2_ack.number,
    };
    cases.push(("u2's".into(), u2));
    cases
}

/// Every upload u1 might send.
fn uploads(s: &Said) -> Vec<(String, Up)> {
    let u = &s.upload;
    let mut cases = vec![("as it is".to_string(), u.clone())];
    for lane in ["", "\0", &"l".repeat(64 << 10)] {
        let up = Up {
            lane: lane.to_string(),
            ..u.clone()
        };
        cases.push((format!("lane of {} bytes", lane.len()), up));
    }
    for (what, send_id) in bytes(&u.send_id, &[("u2's", s.u2_send_id.clone())]) {
        cases.push((
            format!("send id: {what}"),
            Up {
                send_id,
                ..u.clone()
            },
        ));
    }
    for (what, sequence) in numbers() {
        for takes_receipts in [false, true] {
            let up = Up {
                sequence,
                takes_receipts,
                ..u.clone()
            };
            cases.push((format!("sequence: {what}, receipts: {takes_receipts}"), up));
        }
    }
    let others = [
        (
            "sales",
            r#"["s2"]"#,
            r#"{"id":"s2","unit_id":"u2","customer_id":8,"total":"99","version":2}"#,
        ),
        (
            "sales",
            r#"["s9"]"#,
            r#"{"id":"s9","unit_id":"u2","customer_id":8,"total":"1","version":1}"#,
        ),
        (
            "stock",
            r#"["u2",2]"#,
            r#"{"unit_id":"u2","product_id":2,"on_hand":3,"counted":77}"#,
        ),
        (
            "products",
            "[1]",
            r#"{"id":1,"name":"mine","price":"0","barcode":null}"#,
        ),
        ("no such table", "[1]", "{}"),
        ("", "", ""),
    ];
    for (table, key, data) in others {
        let up = Up {
            tables: vec![UpRows {
                table: table.into(),
                rows: vec![RowData {
                    key: key.as_bytes().to_vec(),
                    data: data.as_bytes().to_vec(),
                }],
                gone: vec![key.as_bytes().to_vec()],
            }],
            ..u.clone()
        };
        cases.push((format!("a row of {table} {key}"), up));
    }
    let beside = [
        ("u2's acknowledgement beside", Some(s.u2_ack.clone()), None),
        (
            "its acknowledgement, answered the largest, beside",
            Some(Ack {
                answered: u64::MAX,
                receipt: None,
                ..s.ack.clone()
            }),
            None,
        ),
        (
            "a gap of the largest number beside",
            None,
            Some(Gap {
                epoch: s.ack.epoch.clone(),
                number: u64::MAX,
            }),
        ),
    ];
    for (what, applied, gap) in beside {
        cases.push((
            what.to_string(),
            Up {
                applied,
                gap,
                ..u.clone()
            },
        ));
    }
    for (what, n) in numbers() {
        let backlog = Backlog {
            tables: vec![
                TableBacklog {
                    table: "sales".into(),
                    unsent: n,
                    unfiled: n,
                },
                TableBacklog {
                    table: "x".repeat(1 << 10),
                    unsent: n,
                    unfiled: 0,
                },
            ],
        };
        let up = Up {
            backlog: Some(backlog),
            ..u.clone()
        };
        cases.push((format!("backlog: {what}"), up));
    }
    let d = &s.digest;
    for (what, n) in numbers() {
        let digest = Digest {
            tables: vec![
                TableDigest {
                    table: "products".into(),
                    rows: n,
                    fingerprint: n,
                    summed: (n % 2 == 0).then_some(n),
                },
                TableDigest {
                    table: "no such table".into(),
                    rows: n,
                    fingerprint: 0,
                    summed: (n % 2 == 0).then_some(0),
                },
            ],
            // Both forms, summed beside the first or not, and (at 2^63)
            // one no build reads.
            form: (n % 3) as i32,
        };
        let refused = vec![Refused {
            table: "products".into(),
            key: b"[2]".to_vec(),
            number: n,
            reason: "r".repeat(1 << 10),
        }];
        for applied in [d.applied.clone(), Some(s.u2_ack.clone()), None] {
            let up = Up {
                digest: Some(digest.clone()),
                refused: refused.clone(),
                applied,
                ..d.clone()
            };
            cases.push((format!("digest: {what}"), up));
        }
    }
    cases
}

#[tokio::test]
async fn no_report_of_one_replica_moves_another_whatever_its_fields_hold() {
    let mut fleet = shop().await;
    let said = what_the_tills_say(&mut fleet).await;
    let before = the_others(&fleet, "u1").await;
    let epoch = epoch_of(&fleet).await;
    let mut cases: Vec<(String, Report)> = Vec::new();
    cases.extend(
        acks(&said)
            .into_iter()
            .map(|(w, a)| (format!("acknowledgement, {w}"), Report::Applied(a))),
    );
    cases.extend(
        gaps(&said)
            .into_iter()
            .map(|(w, g)| (format!("gap, {w}"), Report::Gap(g))),
    );
    cases.extend(
        uploads(&said)
            .into_iter()
            .map(|(w, u)| (format!("upload, {w}"), Report::Upload(u))),
    );
    println!("{} cases", cases.len());
    for (what, report) in cases {
        let reports = vec![(ReplicaId::from("u1"), report)];
        run::server::heed(&mut fleet.client, &fleet.engine, &fleet.network, reports)
            .await
            .unwrap_or_else(|e| panic!("{what}: the server failed on it: {e}"));
        fleet.network.take_answers("u1");
        assert_eq!(epoch_of(&fleet).await, epoch, "{what}: a new epoch");
        assert_eq!(
            the_others(&fleet, "u1").await,
            before,
            "{what}: another replica's record or rows changed"
        );
    }
    let provisioned = settle(&mut fleet).await;
    assert!(
        provisioned.iter().all(|r| r == "u1"),
        "provisioned: {provisioned:?}"
    );
    fleet.check().await;
}

//! Uploads end to end: a till's writes noted in its SQLite file, gathered,
//! filed on the server under the replica the transport named, and let go
//! of on the till once filed.

use crate::fleet::Fleet;
use crate::relay::epoch_of;
use crate::scenarios::{shop, SHOP};
use magic_sync::envelope::{RowData, Up, UpRows};
use magic_sync::file::{self, Filing, Refusal};
use std::time::Duration;

const MAX: usize = 1 << 20;
const PATIENT: Duration = Duration::from_secs(3600);

/// The till's upload, filed as sent by `sender`; then, when filed, the
/// answer given to the till. Returns the filing.
async fn send(fleet: &mut Fleet, till: &str, sender: &str) -> Filing {
    let up = fleet
        .unit(till)
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .expect("something to upload");
    let filing = file_as(fleet, sender, &up).await;
    if let Filing::Filed { answer, .. } = &filing {
        let taken = fleet.unit(till).replica.filed(answer);
        if sender == till {
            taken.unwrap();
        } else {
            // The answer is signed for the sender: another till refuses it.
            assert!(
                matches!(taken, Err(magic_sync::replica::Error::Forged { .. })),
                "{taken:?}"
            );
        }
    }
    filing
}

async fn file_as(fleet: &Fleet, sender: &str, up: &Up) -> Filing {
    let mut client = fleet.db.connect().await;
    file::file(&mut client, &fleet.engine, &sender.into(), up)
        .await
        .expect("the upload is filed")
}

fn till_writes(fleet: &mut Fleet, till: &str, sql: &str) {
    fleet
        .unit(till)
        .replica
        .connection()
        .execute_batch(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn sales(fleet: &Fleet) -> Vec<(String, String, Option<i64>, String, i64)> {
    fleet
        .writer
        .query(
            "SELECT id, unit_id, customer_id, total::text, version FROM sales ORDER BY id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// An upload of one stock row, `key` with `data` (JSON).
fn stock_up(send_id: u8, key: &[u8], data: &[u8]) -> Up {
    Up {
        send_id: vec![send_id; 16],
        tables: vec![UpRows {
            table: "stock".into(),
            rows: vec![RowData {
                key: key.to_vec(),
                data: data.to_vec(),
            }],
            gone: vec![],
        }],
        ..Up::default()
    }
}

fn counts(filing: &Filing) -> (usize, usize, usize) {
    match filing {
        Filing::Filed {
            taken,
            unchanged,
            refused,
            ..
        } => (*taken, *unchanged, refused.len()),
        Filing::Waits { reason } => panic!("the upload waits: {reason}"),
    }
}

fn refusals(filing: &Filing) -> Vec<Refusal> {
    match filing {
        Filing::Filed { refused, .. } => refused.clone(),
        Filing::Waits { reason } => panic!("the upload waits: {reason}"),
    }
}

#[tokio::test]
async fn a_tills_sales_are_filed_under_the_till_the_transport_named_and_let_go_of() {
    let mut fleet = shop().await;
    // The row claims another till: the server files it under u1.
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u2', 7, '12.50', 1), ('s2', 'u1', NULL, '3', 1)",
    );
    let filing = send(&mut fleet, "u1", "u1").await;
    assert_eq!(counts(&filing), (2, 0, 0));
    assert_eq!(
        sales(&fleet).await,
        [
            ("s1".into(), "u1".into(), Some(7), "12.50".into(), 1),
            ("s2".into(), "u1".into(), None, "3".into(), 1),
        ]
    );
    let backlog = fleet.unit("u1").replica.progress().unwrap();
    assert!(backlog.tables.is_empty(), "{backlog:?}");
    // The down path goes on as before.
    fleet.sync().await;
    fleet.check().await;
}

#[tokio::test]
async fn the_hosts_stamp_sets_what_it_knows_of_the_sender_and_may_refuse_a_row() {
    // The host knows each till's house customer, and refuses sales over
    // 1,000; its stamp also tries to claim another till, in vain.
    let engine = crate::shop::builder()
        .stamp::<crate::shop::Sale>(|till, row| {
            let house = match till {
                "u1" => 7,
                _ => 8,
            };
            if row["customer_id"].is_null() {
                row.insert("customer_id".into(), house.into());
            }
            row.insert("unit_id".into(), "u2".into());
            let total = &row["total"];
            let total = total
                .as_f64()
                .or_else(|| total.as_str().and_then(|t| t.parse().ok()))
                .ok_or("a total that is not a number")?;
            if total > 1000.0 {
                return Err(format!("a sale of {total} needs a manager"));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let mut fleet = Fleet::of(&format!("{}{SHOP}", crate::shop::SQL), engine).await;
    fleet.add("u1", Some("north"));
    fleet.sync().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', NULL, '12.50', 1), ('s2', 'u1', 9, '3', 1),
                                  ('s3', 'u1', NULL, '5000', 1)",
    );
    let filing = send(&mut fleet, "u1", "u1").await;
    assert_eq!(counts(&filing), (2, 0, 1));
    let refused = refusals(&filing);
    assert!(
        refused[0]
            .reason
            .contains("the host's stamp refused it: a sale of 5000 needs a manager"),
        "{refused:?}"
    );
    assert_eq!(
        sales(&fleet).await,
        [
            ("s1".into(), "u1".into(), Some(7), "12.50".into(), 1),
            ("s2".into(), "u1".into(), Some(9), "3".into(), 1),
        ]
    );
}

#[tokio::test]
async fn a_stamp_on_a_table_replicas_do_not_write_is_refused() {
    let err = crate::shop::builder()
        .stamp::<crate::shop::Product>(|_, _| Ok(()))
        .build()
        .unwrap_err();
    assert!(
        err.to_string().contains("products") && err.to_string().contains("do not write"),
        "{err}"
    );
}

#[tokio::test]
async fn an_upload_filed_twice_changes_nothing_the_second_time() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '12.50', 1)",
    );
    let up = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    assert_eq!(counts(&file_as(&fleet, "u1", &up).await), (1, 0, 0));
    assert_eq!(counts(&file_as(&fleet, "u1", &up).await), (0, 1, 0));
    assert_eq!(sales(&fleet).await.len(), 1);
}

#[tokio::test]
async fn the_newest_version_of_a_record_wins_and_an_older_one_changes_nothing() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '10', 1)",
    );
    let first = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE sales SET total = '11', version = 2 WHERE id = 's1'",
    );
    let second = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    // Delivered out of order: the newer first.
    assert_eq!(counts(&file_as(&fleet, "u1", &second).await), (1, 0, 0));
    assert_eq!(counts(&file_as(&fleet, "u1", &first).await), (0, 1, 0));
    assert_eq!(
        sales(&fleet).await,
        [("s1".into(), "u1".into(), Some(7), "11".into(), 2)]
    );
}

#[tokio::test]
async fn another_tills_record_is_never_overwritten_and_the_refusal_is_kept() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '10', 1)",
    );
    send(&mut fleet, "u1", "u1").await;
    // u2 reports a sale of the same id, at a higher version, and one of
    // its own (filed in bulk, the one refused alone).
    till_writes(
        &mut fleet,
        "u2",
        "INSERT INTO sales VALUES ('s1', 'u2', NULL, '99', 5), ('s2', 'u2', NULL, '1', 1)",
    );
    let filing = send(&mut fleet, "u2", "u2").await;
    assert_eq!(counts(&filing), (1, 0, 1));
    let refused = refusals(&filing);
    assert_eq!(refused.len(), 1);
    assert!(
        refused[0].reason.contains("another replica (`u1`)"),
        "{refused:?}"
    );
    assert_eq!(
        sales(&fleet).await,
        [
            ("s1".into(), "u1".into(), Some(7), "10".into(), 1),
            ("s2".into(), "u2".into(), None, "1".into(), 1)
        ]
    );
    let inbox: Vec<(String, String, String, Option<Vec<u8>>)> = fleet
        .writer
        .query("SELECT replica, table_name, key, data FROM sync.inbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(inbox.len(), 1);
    assert_eq!(
        (&inbox[0].0[..], &inbox[0].1[..], &inbox[0].2[..]),
        ("u2", "sales", "[\"s1\"]")
    );
    assert!(inbox[0].3.is_some(), "the row is kept as it came");
    // The till let go of it: the refusal is the server's to show.
    assert!(fleet
        .unit("u2")
        .replica
        .progress()
        .unwrap()
        .tables
        .is_empty());
}

#[tokio::test]
async fn a_tills_count_is_filed_into_the_column_it_owns_of_a_row_it_holds() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 4 WHERE product_id = 1",
    );
    let filing = send(&mut fleet, "u1", "u1").await;
    assert_eq!(counts(&filing), (1, 0, 0));
    // An upload that also says what the stock level is: not the till's.
    let up = Up {
        send_id: vec![3; 16],
        tables: vec![UpRows {
            table: "stock".into(),
            rows: vec![RowData {
                key: br#"["u1",1]"#.to_vec(),
                data: br#"{"unit_id":"u1","product_id":1,"on_hand":100,"counted":6}"#.to_vec(),
            }],
            gone: vec![],
        }],
        ..Up::default()
    };
    assert_eq!(counts(&file_as(&fleet, "u1", &up).await), (1, 0, 0));
    let row: (i32, Option<i32>) = fleet
        .writer
        .query_one(
            "SELECT on_hand, counted FROM stock WHERE unit_id = 'u1' AND product_id = 1",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1)))
        .unwrap();
    assert_eq!(row, (5, Some(6)), "only the owned column is taken");
    // The filed count is a server write like any other; the till converges.
    fleet.sync().await;
    fleet.check().await;
}

/// With the record of the rows a rule gives thinned
/// (`Settings::record_ruled_rows` off), a till's stock row has no record
/// row: whether the till holds it is read by its rule at its position.
/// Its count is filed; another till's edit of it is refused; and a row
/// moved to it on the server is its own only once the move is planned.
#[tokio::test]
async fn a_count_of_a_row_left_to_its_rule_is_filed_by_the_rule() {
    let mut fleet = Fleet::new(SHOP).await;
    fleet.reconfigure(|s| s.record_ruled_rows = false).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("north"));
    fleet.sync().await;
    fleet.check().await;
    let recorded = "SELECT count(*) FROM sync.held WHERE table_name = 'stock'";
    assert_eq!(fleet.count(recorded).await, 0, "left to their rule");
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 4 WHERE product_id = 1",
    );
    assert_eq!(counts(&send(&mut fleet, "u1", "u1").await), (1, 0, 0));
    let counted = "SELECT count(*) FROM stock WHERE unit_id = 'u1' AND counted = 4";
    assert_eq!(fleet.count(counted).await, 1);
    // u2 edits u1's row: its rule does not give it the row.
    let up = stock_up(
        1,
        br#"["u1",1]"#,
        br#"{"unit_id":"u1","product_id":1,"on_hand":5,"counted":9}"#,
    );
    let refused = refusals(&file_as(&fleet, "u2", &up).await);
    assert_eq!(refused.len(), 1);
    assert!(refused[0].reason.contains("does not hold"), "{refused:?}");
    // u2's row moved to u1 on the server, the move not planned yet: at
    // u1's position the row is not its own, and its edit is refused; once
    // planned, it is.
    fleet
        .writer
        .batch_execute("UPDATE stock SET unit_id = 'u1' WHERE product_id = 2")
        .await
        .unwrap();
    let edit = |send_id: u8| {
        stock_up(
            send_id,
            br#"["u1",2]"#,
            br#"{"unit_id":"u1","product_id":2,"on_hand":3,"counted":2}"#,
        )
    };
    let refused = refusals(&file_as(&fleet, "u1", &edit(2)).await);
    assert_eq!(refused.len(), 1, "not u1's at its position");
    fleet.sync().await;
    assert_eq!(counts(&file_as(&fleet, "u1", &edit(3)).await), (1, 0, 0));
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(fleet.count(recorded).await, 0);
}

#[tokio::test]
async fn an_edit_of_a_row_the_till_does_not_hold_is_refused() {
    let fleet = shop().await;
    // u2's stock row, edited by u1 in an upload it forged.
    let up = stock_up(
        1,
        br#"["u2",2]"#,
        br#"{"unit_id":"u2","product_id":2,"on_hand":3,"counted":1}"#,
    );
    let refused = refusals(&file_as(&fleet, "u1", &up).await);
    assert_eq!(refused.len(), 1);
    assert!(refused[0].reason.contains("does not hold"), "{refused:?}");
    let counted: Option<i32> = fleet
        .writer
        .query_one(
            "SELECT counted FROM stock WHERE unit_id = 'u2' AND product_id = 2",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, None);
}

#[tokio::test]
async fn an_edit_while_the_till_is_provisioned_again_waits_and_files_nothing() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 4 WHERE product_id = 1;
         INSERT INTO sales VALUES ('s1', 'u1', 7, '10', 1);",
    );
    // The till is provisioned again: its snapshot begins, so what it holds
    // is no longer recorded until the snapshot is.
    fleet
        .writer
        .batch_execute("UPDATE sync.replicas SET provision = true WHERE id = 'u1'")
        .await
        .unwrap();
    assert!(fleet.pass().await.waiting.contains(&"u1".into()));
    let snapshot = fleet.begin_snapshot("u1").await.expect("u1 waits");
    let up = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    let filing = file_as(&fleet, "u1", &up).await;
    assert!(matches!(filing, Filing::Waits { .. }), "{filing:?}");
    assert!(sales(&fleet).await.is_empty(), "nothing filed");
    // The snapshot recorded, the same rows sent again are filed.
    let mut worker = fleet.db.connect().await;
    let streamed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect("the snapshot streams");
    assert!(streamed.recorded);
    fleet.sync().await;
    let again = fleet
        .unit("u1")
        .replica
        .upload(MAX, Duration::ZERO)
        .unwrap()
        .unwrap();
    assert_eq!(counts(&file_as(&fleet, "u1", &again).await), (2, 0, 0));
}

#[tokio::test]
async fn catalogs_unknown_tables_bad_keys_and_records_not_a_tills_to_delete_are_refused() {
    let fleet = shop().await;
    let row = |key: &[u8], data: &[u8]| RowData {
        key: key.to_vec(),
        data: data.to_vec(),
    };
    let up = Up {
        send_id: vec![2; 16],
        tables: vec![
            UpRows {
                table: "products".into(),
                rows: vec![row(
                    br#"[1]"#,
                    br#"{"id":1,"name":"free tea","price":"0","barcode":"B1"}"#,
                )],
                gone: vec![],
            },
            UpRows {
                table: "payroll".into(),
                rows: vec![row(br#"[1]"#, br#"{"id":1}"#)],
                gone: vec![],
            },
            UpRows {
                table: "sales".into(),
                rows: vec![
                    // The key it came under is not the row's.
                    row(
                        br#"["s9"]"#,
                        br#"{"id":"s8","unit_id":"u1","customer_id":null,"total":"1","version":1}"#,
                    ),
                    // Not a row of sales at all.
                    row(br#"["s7"]"#, br#"{"id":"s7"}"#),
                ],
                // Sales are keyed by their own id: not a till's to delete.
                gone: vec![br#"["s1"]"#.to_vec()],
            },
        ],
        ..Up::default()
    };
    let refused = refusals(&file_as(&fleet, "u1", &up).await);
    let reasons: Vec<(String, String)> = refused
        .iter()
        .map(|r| (r.table.clone(), r.reason.clone()))
        .collect();
    assert_eq!(reasons.len(), 5, "{reasons:#?}");
    assert!(reasons[0].1.contains("a catalog"), "{reasons:#?}");
    assert!(reasons[1].1.contains("no table `payroll`"), "{reasons:#?}");
    assert!(
        reasons[2].1.contains("not the key it came under"),
        "{reasons:#?}"
    );
    assert!(reasons[3].1.contains("does not decode"), "{reasons:#?}");
    assert!(
        reasons[4].1.contains("not a replica's to delete"),
        "{reasons:#?}"
    );
    let tea: String = fleet
        .writer
        .query_one("SELECT name FROM products WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(tea, "tea");
}

#[tokio::test]
async fn a_row_postgresql_refuses_is_refused_alone_and_the_rest_is_filed() {
    let mut fleet = shop().await;
    // Customer 404 does not exist: the foreign key refuses that sale.
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 404, '1', 1), ('s2', 'u1', 7, '2', 1)",
    );
    let filing = send(&mut fleet, "u1", "u1").await;
    assert_eq!(counts(&filing), (1, 0, 1));
    let refused = refusals(&filing);
    assert_eq!(refused[0].key, "[\"s1\"]");
    // In the database's own words: which constraint, and the missing key.
    assert!(
        refused[0]
            .reason
            .contains("PostgreSQL refused it: insert or update on table \"sales\"")
            && refused[0].reason.contains("foreign key")
            && refused[0].reason.contains("(customer_id)=(404)"),
        "{refused:?}"
    );
    assert_eq!(sales(&fleet).await.len(), 1);
}

#[tokio::test]
async fn an_upload_from_a_replica_the_server_does_not_know_is_an_error() {
    let fleet = Fleet::new(SHOP).await;
    let mut client = fleet.db.connect().await;
    let err = file::file(
        &mut client,
        &fleet.engine,
        &"stranger".into(),
        &Up::default(),
    )
    .await
    .expect_err("refused");
    assert!(err.to_string().contains("`stranger`"), "{err}");
}

/// An upload larger than a message may be (a replica's uplink never sends
/// one) is refused whole by the runner: nothing of it is filed, nothing is
/// kept, no answer goes; an upload beside it is filed as usual.
#[tokio::test]
async fn an_oversized_upload_is_refused_and_files_nothing() {
    let mut fleet = shop().await;
    let max = fleet.network.max_message_bytes();
    let oversized = Up {
        send_id: vec![1; 16],
        tables: vec![UpRows {
            table: "sales".into(),
            rows: vec![RowData {
                key: br#"["big"]"#.to_vec(),
                data: vec![b' '; max + 1],
            }],
            ..UpRows::default()
        }],
        ..Up::default()
    };
    fleet
        .network
        .report("u1", magic_sync::run::Report::Upload(oversized));
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '1', 1)",
    );
    let up = fleet
        .unit("u1")
        .replica
        .upload(max, Duration::ZERO)
        .unwrap()
        .unwrap();
    fleet
        .network
        .report("u1", magic_sync::run::Report::Upload(up.clone()));
    fleet.heed().await;
    let ids: Vec<String> = sales(&fleet).await.into_iter().map(|s| s.0).collect();
    assert_eq!(ids, ["s1"], "only the upload within the limit is filed");
    let answers: Vec<Vec<u8>> = fleet
        .network
        .take_answers("u1")
        .into_iter()
        .map(|f| f.send_id)
        .collect();
    assert_eq!(answers, [up.send_id], "only it is answered");
    let kept: i64 = fleet.count("SELECT count(*) FROM sync.inbox").await;
    assert_eq!(kept, 0, "nothing of the oversized upload is kept");
}

/// What a till wrote, as the test remembers it: its sales by id (customer,
/// total, version) and its counts by product.
#[derive(Default)]
struct Written {
    sales: std::collections::BTreeMap<String, (Option<i64>, String, i64)>,
    counts: std::collections::BTreeMap<i64, i32>,
}

/// The till's upload, and what becomes of it: filed and answered, lost on
/// the way, filed with its answer lost, filed twice, filed with its answer
/// held back (into `late`, to be given later), or itself held back (into
/// `held_back`, to be filed later, out of order).
async fn deliver_upload(
    fleet: &mut Fleet,
    till: &str,
    fate: u32,
    patience: Duration,
    late: &mut Vec<(String, magic_sync::envelope::Filed)>,
    held_back: &mut Vec<(String, Up)>,
) {
    let max = fleet.network.max_message_bytes();
    let Some(up) = fleet.unit(till).replica.upload(max, patience).unwrap() else {
        return;
    };
    match fate {
        0 => return, // lost on the way
        5 => {
            // Delivered later, after uploads made after it.
            held_back.push((till.to_string(), up));
            return;
        }
        3 => {
            // Delivered twice.
            fleet
                .network
                .report(till, magic_sync::run::Report::Upload(up.clone()));
        }
        _ => {}
    }
    fleet
        .network
        .report(till, magic_sync::run::Report::Upload(up));
    fleet.heed().await;
    let answers = fleet.network.take_answers(till);
    match fate {
        1 => {}
        4 => late.extend(answers.into_iter().map(|f| (till.to_string(), f))),
        _ => {
            for filed in answers {
                fleet.unit(till).replica.filed(&filed).unwrap();
            }
        }
    }
}

#[tokio::test]
async fn every_write_of_every_till_is_filed_once_whatever_uploads_and_answers_are_lost() {
    let steps = crate::walk::env("MAGIC_SYNC_STEPS").unwrap_or(40);
    for seed in crate::walk::seeds(8, 11) {
        println!("up walk: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        up_walk(seed, steps).await;
    }
}

async fn up_walk(seed: u64, steps: u64) {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    let mut rng = StdRng::seed_from_u64(seed);
    let mut fleet = shop().await;
    let tills = ["u1", "u2", "u3"];
    let mut written: std::collections::BTreeMap<&str, Written> = Default::default();
    let stock = |till: &str| match till {
        "u1" => Some(1),
        "u2" => Some(2),
        _ => None,
    };
    let mut next_sale = 0;
    let mut late = Vec::new();
    let mut held_back = Vec::new();
    for step in 0..steps {
        // A till whose upload is held back writes again, often: its newer
        // upload may then be filed before the older one.
        let till = match held_back.last() {
            Some((t, _)) if rng.gen_bool(0.5) => tills.iter().find(|x| **x == t).copied().unwrap(),
            _ => tills[rng.gen_range(0..tills.len())],
        };
        let mine = written.entry(till).or_default();
        let what = rng.gen_range(0..10);
        let done = if what < 3 || mine.sales.is_empty() {
            next_sale += 1;
            let id = format!("{till}-{next_sale}");
            // A sale names a customer the till holds (through its orders),
            // or none.
            let held = match till {
                "u1" => Some(7),
                "u2" => Some(8),
                _ => None,
            };
            let customer = if rng.gen_bool(0.5) { held } else { None };
            let total = format!("{}.{:02}", rng.gen_range(1..100), rng.gen_range(0..100));
            mine.sales.insert(id.clone(), (customer, total.clone(), 1));
            format!(
                "INSERT INTO sales VALUES ('{id}', '{till}', {}, '{total}', 1)",
                customer.map_or("NULL".into(), |c| c.to_string())
            )
        } else if what < 5 || stock(till).is_none() {
            let ids: Vec<String> = mine.sales.keys().cloned().collect();
            let id = ids[rng.gen_range(0..ids.len())].clone();
            let sale = mine.sales.get_mut(&id).unwrap();
            sale.1 = format!("{}.{:02}", rng.gen_range(1..100), rng.gen_range(0..100));
            sale.2 += 1;
            format!(
                "UPDATE sales SET total = '{}', version = {} WHERE id = '{id}'",
                sale.1, sale.2
            )
        } else {
            let product = stock(till).unwrap();
            let count = rng.gen_range(0..20);
            mine.counts.insert(product, count);
            format!("UPDATE stock SET counted = {count} WHERE product_id = {product}")
        };
        till_writes(&mut fleet, till, &done);
        let fate = rng.gen_range(0..6);
        println!("seed {seed} step {step}: {till}: {done}; upload fate {fate}");
        // Now and then an upload goes for each till; now and then the
        // server's own changes go down.
        if rng.gen_bool(0.7) {
            let patience = if rng.gen_bool(0.3) {
                Duration::ZERO
            } else {
                PATIENT
            };
            deliver_upload(&mut fleet, till, fate, patience, &mut late, &mut held_back).await;
        }
        if rng.gen_bool(0.3) {
            // The server edits a till's stock level while the till counts.
            let unit = tills[rng.gen_range(0..2)];
            fleet
                .write(&format!(
                    "UPDATE stock SET on_hand = on_hand + 1 WHERE unit_id = '{unit}'"
                ))
                .await;
        }
        if !held_back.is_empty() && rng.gen_bool(0.2) {
            // Uploads held back arrive, after newer ones were filed.
            for (till, up) in held_back.drain(..).rev() {
                fleet
                    .network
                    .report(&till, magic_sync::run::Report::Upload(up));
            }
            fleet.heed().await;
            for till in tills {
                late.extend(
                    fleet
                        .network
                        .take_answers(till)
                        .into_iter()
                        .map(|f| (till.to_string(), f)),
                );
            }
        }
        if !late.is_empty() && rng.gen_bool(0.3) {
            // Answers held back arrive, after whatever was written since.
            for (till, filed) in late.drain(..) {
                fleet.unit(&till).replica.filed(&filed).unwrap();
            }
        }
        if rng.gen_bool(0.2) {
            fleet.sync().await;
        }
    }
    // Every till sends until nothing is left: what was lost goes again.
    for _ in 0..50 {
        if tills
            .iter()
            .all(|t| fleet.unit(t).replica.progress().unwrap().tables.is_empty())
        {
            break;
        }
        fleet.upload(Duration::ZERO).await;
    }
    for till in tills {
        let backlog = fleet.unit(till).replica.progress().unwrap();
        assert!(
            backlog.tables.is_empty(),
            "seed {seed}: {till} still has {backlog:?}"
        );
    }
    let mut expected = Vec::new();
    for (till, w) in &written {
        for (id, (customer, total, version)) in &w.sales {
            expected.push((
                id.clone(),
                till.to_string(),
                *customer,
                total.clone(),
                *version,
            ));
        }
    }
    expected.sort();
    let mut filed = sales(&fleet).await;
    // Totals as PostgreSQL prints numerics: compare as numbers.
    for row in filed.iter_mut().chain(expected.iter_mut()) {
        row.3 = format!("{:.2}", row.3.parse::<f64>().unwrap());
    }
    assert_eq!(filed, expected, "seed {seed}: the server's sales");
    for (till, w) in &written {
        for (product, count) in &w.counts {
            let counted: Option<i32> = fleet
                .writer
                .query_one(
                    "SELECT counted FROM stock WHERE unit_id = $1 AND product_id = $2",
                    &[&till.to_string(), product],
                )
                .await
                .unwrap()
                .get(0);
            assert_eq!(
                counted,
                Some(*count),
                "seed {seed}: {till}'s count of {product}"
            );
        }
    }
    // Everything each till wrote was filed; once the passes caught up, each
    // reads its own writes back.
    let marks: Vec<_> = tills
        .iter()
        .map(|t| (*t, fleet.unit(t).replica.mark().unwrap()))
        .collect();
    fleet.sync().await;
    fleet.check().await;
    for (till, mark) in marks {
        assert_eq!(
            fleet.unit(till).replica.written(mark).unwrap(),
            magic_sync::replica::Written::Reached,
            "seed {seed}: {till} does not read its own writes back"
        );
    }
}

/// What the server records of u1's backlog.
async fn backlog(fleet: &Fleet) -> Option<serde_json::Value> {
    fleet
        .writer
        .query_opt("SELECT tables FROM sync.backlogs WHERE replica = 'u1'", &[])
        .await
        .unwrap()
        .map(|r| r.get(0))
}

#[tokio::test]
async fn the_server_shows_what_a_till_has_not_had_filed() {
    let mut fleet = shop().await;
    assert_eq!(backlog(&fleet).await, None, "nothing said yet");
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '1', 1), ('s2', 'u1', 7, '2', 1);
         UPDATE stock SET counted = 3 WHERE product_id = 1;",
    );
    // An upload lost on the way still said it: the backlog it carried is
    // recorded with the next upload that is filed.
    let up = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    assert_eq!(
        up.backlog.as_ref().map(|b| b.tables.len()),
        Some(2),
        "{:?}",
        up.backlog
    );
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s3', 'u1', NULL, '3', 1)",
    );
    // Filed: the server hears the upload's backlog, then, once the till let
    // go of what was filed, what is left.
    fleet.upload(PATIENT).await;
    assert_eq!(
        backlog(&fleet).await,
        Some(serde_json::json!({
            "sales": {"unsent": 0, "unfiled": 2},
            "stock": {"unsent": 0, "unfiled": 1},
        })),
        "the first upload is still unanswered"
    );
    fleet.upload(Duration::ZERO).await;
    assert_eq!(backlog(&fleet).await, Some(serde_json::json!({})));
}

#[tokio::test]
async fn an_older_count_filed_after_a_newer_one_changes_nothing() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 4 WHERE product_id = 1",
    );
    let older = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 9 WHERE product_id = 1",
    );
    let newer = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .unwrap();
    assert!(newer.sequence > older.sequence);
    assert_eq!(counts(&file_as(&fleet, "u1", &newer).await), (1, 0, 0));
    assert_eq!(counts(&file_as(&fleet, "u1", &older).await), (0, 1, 0));
    let counted: Option<i32> = fleet
        .writer
        .query_one(
            "SELECT counted FROM stock WHERE unit_id = 'u1' AND product_id = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, Some(9));
}

#[tokio::test]
async fn uploads_filed_together_wait_or_are_refused_each_on_its_own() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 4 WHERE product_id = 1;
         INSERT INTO sales VALUES ('s1', 'u1', 7, '10', 1);",
    );
    till_writes(
        &mut fleet,
        "u2",
        "INSERT INTO sales VALUES ('s2', 'u2', 8, '20', 1)",
    );
    fleet
        .writer
        .batch_execute("UPDATE sync.replicas SET provision = true WHERE id = 'u1'")
        .await
        .unwrap();
    fleet.pass().await;
    let _snapshot = fleet.begin_snapshot("u1").await.expect("u1 waits");
    let mut uploads = Vec::new();
    for till in ["u1", "u2"] {
        let up = fleet
            .unit(till)
            .replica
            .upload(MAX, PATIENT)
            .unwrap()
            .unwrap();
        uploads.push((till.into(), up));
    }
    uploads.push(("stranger".into(), Up::default()));
    let mut client = fleet.db.connect().await;
    let filings = file::file_all(&mut client, &fleet.engine, &uploads)
        .await
        .expect("filed");
    assert!(
        matches!(filings[0], Ok(Filing::Waits { .. })),
        "{:?}",
        filings[0]
    );
    assert!(
        matches!(filings[1], Ok(Filing::Filed { taken: 1, .. })),
        "{:?}",
        filings[1]
    );
    assert!(filings[2].is_err(), "a replica the server does not know");
    let ids: Vec<String> = sales(&fleet).await.into_iter().map(|s| s.0).collect();
    assert_eq!(ids, ["s2"], "u1's upload filed nothing of its own");
}

/// The uploads of one replica each, in one call: each one's filing.
async fn file_each(fleet: &mut Fleet, tills: &[&str]) -> Vec<magic_sync::Result<Filing>> {
    let mut uploads = Vec::new();
    for till in tills {
        let up = fleet
            .unit(till)
            .replica
            .upload(MAX, PATIENT)
            .unwrap()
            .expect("something to upload");
        uploads.push(((*till).into(), up));
    }
    let mut client = fleet.db.connect().await;
    file::file_all(&mut client, &fleet.engine, &uploads)
        .await
        .expect("the call itself succeeds")
}

/// The uploads of one replica each, in one call, each filed.
async fn file_together(fleet: &mut Fleet, tills: &[&str]) -> Vec<Filing> {
    file_each(fleet, tills)
        .await
        .into_iter()
        .map(|f| f.expect("each filed"))
        .collect()
}

/// Uploads of records only are filed a statement per table for them all;
/// each still gets its own counts, and a key another till wrote first is
/// refused in the upload that carried it.
#[tokio::test]
async fn records_filed_together_are_counted_per_upload() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s0', 'u1', 7, '1', 1)",
    );
    send(&mut fleet, "u1", "u1").await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '1', 1), ('s2', 'u1', NULL, '2', 1)",
    );
    // u2 names s0, filed from u1 before: refused, whatever its row says.
    till_writes(
        &mut fleet,
        "u2",
        "INSERT INTO sales VALUES ('s3', 'u2', 8, '3', 1), ('s0', 'u1', 8, '9', 5)",
    );
    let filings = file_together(&mut fleet, &["u1", "u2"]).await;
    assert_eq!(counts(&filings[0]), (2, 0, 0));
    assert_eq!(counts(&filings[1]), (1, 0, 1));
    let refused = refusals(&filings[1]);
    assert_eq!(refused[0].key, "[\"s0\"]");
    assert!(refused[0].reason.contains("`u1`"), "{refused:?}");
    let all = sales(&fleet).await;
    let owners: Vec<(&str, &str, &str)> = all
        .iter()
        .map(|s| (s.0.as_str(), s.1.as_str(), s.3.as_str()))
        .collect();
    assert_eq!(
        owners,
        [
            ("s0", "u1", "1"),
            ("s1", "u1", "1"),
            ("s2", "u1", "2"),
            ("s3", "u2", "3")
        ]
    );
}

/// Two tills sending the same new key together, or a row PostgreSQL
/// refuses among the others' rows: the uploads are filed one by one, so
/// the refusal falls on the row that earned it and the rest is filed.
#[tokio::test]
async fn a_refusal_among_records_filed_together_falls_on_its_own_row() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '1', 1), ('s2', 'u1', 404, '2', 1)",
    );
    till_writes(
        &mut fleet,
        "u2",
        "INSERT INTO sales VALUES ('s1', 'u2', 8, '5', 1), ('s3', 'u2', 8, '3', 1)",
    );
    let filings = file_together(&mut fleet, &["u1", "u2"]).await;
    assert_eq!(counts(&filings[0]), (1, 0, 1));
    assert!(refusals(&filings[0])[0].reason.contains("foreign key"));
    assert_eq!(counts(&filings[1]), (1, 0, 1));
    assert!(refusals(&filings[1])[0].reason.contains("`u1`"));
    let ids: Vec<(String, String)> = sales(&fleet)
        .await
        .into_iter()
        .map(|s| (s.0, s.1))
        .collect();
    assert_eq!(
        ids,
        [("s1".into(), "u1".into()), ("s3".into(), "u2".into())]
    );
}

/// A host's own trigger refusing one till's sale among records filed
/// together: that upload fails alone (unanswered, it comes again), the
/// others are filed.
#[tokio::test]
async fn a_hosts_trigger_failing_one_upload_files_the_others() {
    let mut fleet = shop().await;
    fleet
        .writer
        .batch_execute(
            "CREATE FUNCTION no_666() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.total = 666 THEN RAISE EXCEPTION 'not this total'; END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER no_666 BEFORE INSERT ON sales FOR EACH ROW EXECUTE FUNCTION no_666();",
        )
        .await
        .unwrap();
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', 7, '666', 1), ('s2', 'u1', 7, '2', 1)",
    );
    till_writes(
        &mut fleet,
        "u2",
        "INSERT INTO sales VALUES ('s3', 'u2', 8, '3', 1), ('s4', 'u2', 8, '4', 1)",
    );
    let filings = file_each(&mut fleet, &["u1", "u2"]).await;
    let err = filings[0].as_ref().expect_err("u1's upload fails");
    assert!(err.to_string().contains("not this total"), "{err}");
    assert_eq!(counts(filings[1].as_ref().unwrap()), (2, 0, 0));
    let ids: Vec<String> = sales(&fleet).await.into_iter().map(|s| s.0).collect();
    assert_eq!(ids, ["s3", "s4"]);
}

#[tokio::test]
async fn a_till_whose_inbox_is_full_has_its_uploads_wait_and_loses_nothing() {
    let mut fleet = shop().await;
    // What u1 sent before and the server could not file fills its inbox.
    fleet
        .writer
        .execute(
            "INSERT INTO sync.inbox (replica, table_name, key, data, reason)
             SELECT 'u1', 'sales', format('[\"old-%s\"]', i),
                    convert_to(format('{\"customer_id\":null,\"id\":\"old-%s\",\"total\":\"1\",\"unit_id\":\"u1\",\"version\":1}', i), 'UTF8'),
                    'a trigger of the host refused it (fixed in the next build)'
             FROM generate_series(1, $1::int8) i",
            &[&magic_sync::file::INBOX_ROWS],
        )
        .await
        .unwrap();
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', NULL, '3', 1)",
    );
    let up = fleet
        .unit("u1")
        .replica
        .upload(MAX, PATIENT)
        .unwrap()
        .expect("the sale goes up");
    let filing = file_as(&fleet, "u1", &up).await;
    let Filing::Waits { reason } = &filing else {
        panic!("filed into a full inbox: {filing:?}");
    };
    assert!(
        reason.contains("inbox of replica `u1` is full") && reason.contains("10000 refused rows"),
        "{reason}"
    );
    assert!(sales(&fleet).await.is_empty());
    // Unanswered, the till keeps the sale; another till is filed as ever.
    assert!(!fleet
        .unit("u1")
        .replica
        .progress()
        .unwrap()
        .tables
        .is_empty());
    till_writes(
        &mut fleet,
        "u2",
        "INSERT INTO sales VALUES ('s2', 'u2', NULL, '4', 1)",
    );
    assert_eq!(counts(&send(&mut fleet, "u2", "u2").await), (1, 0, 0));
    // The next build files what the inbox held by itself: the inbox
    // empties, and u1's sale goes in as it comes again.
    fleet.deploy(crate::shop::engine()).await;
    fleet.pass().await;
    let held: i64 = fleet.count("SELECT count(*) FROM sync.inbox").await;
    assert_eq!(held, 0);
    let filing = file_as(&fleet, "u1", &up).await;
    assert_eq!(counts(&filing), (1, 0, 0));
    assert_eq!(
        sales(&fleet).await.len(),
        2 + magic_sync::file::INBOX_ROWS as usize
    );
}

/// The till's SQLite file, closed and copied to `to` (its journal
/// checkpointed into it as the last connection closes), then opened again.
fn copy_till(fleet: &mut Fleet, till: &str, partition: &str, to: &std::path::Path) {
    let from = fleet.dir.path().join(format!("{till}.sqlite"));
    drop(fleet.units.remove(till));
    std::fs::copy(&from, to).unwrap();
    fleet.add_at(till, Some(partition), from);
}

/// The till's SQLite file replaced by the copy at `from`, as a restore
/// from an older backup leaves it, then opened again.
fn restore_till(fleet: &mut Fleet, till: &str, partition: &str, from: &std::path::Path) {
    let path = fleet.dir.path().join(format!("{till}.sqlite"));
    drop(fleet.units.remove(till));
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    std::fs::copy(from, &path).unwrap();
    fleet.add_at(till, Some(partition), path);
}

async fn counted(fleet: &Fleet) -> Option<i32> {
    fleet
        .writer
        .query_one(
            "SELECT counted FROM stock WHERE unit_id = 'u1' AND product_id = 1",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// A till restored from a backup older than its last filed edits counts its
/// uploads on from its copy: the edits it makes after the restore are filed
/// all the same, none dropped as older than what it sent before. The server
/// hears of the restore from its acknowledgements, and provisions it again.
#[tokio::test]
async fn a_till_restored_from_an_older_copy_has_its_next_edits_filed() {
    let mut fleet = shop().await;
    let backup = fleet.dir.path().join("u1-backup.sqlite");
    copy_till(&mut fleet, "u1", "north", &backup);
    for count in [4, 5, 6] {
        till_writes(
            &mut fleet,
            "u1",
            &format!("UPDATE stock SET counted = {count} WHERE product_id = 1"),
        );
        assert_eq!(counts(&send(&mut fleet, "u1", "u1").await), (1, 0, 0));
    }
    fleet
        .settle("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    assert_eq!(counted(&fleet).await, Some(6));

    restore_till(&mut fleet, "u1", "north", &backup);
    till_writes(
        &mut fleet,
        "u1",
        "UPDATE stock SET counted = 2 WHERE product_id = 1",
    );
    assert_eq!(
        counts(&send(&mut fleet, "u1", "u1").await),
        (1, 0, 0),
        "filed, not dropped as older"
    );
    assert_eq!(counted(&fleet).await, Some(2));
    // It says what it applied, as it does when it connects: behind what it
    // said before. It is provisioned again, its filing state started
    // afresh, and the fleet converges with its edit.
    let ack = fleet.unit("u1").replica.ack().expect("it applied messages");
    fleet
        .network
        .report("u1", magic_sync::run::Report::Applied(ack));
    fleet.heed().await;
    let row = fleet
        .writer
        .query_one(
            "SELECT (SELECT count(*) FROM sync.filed WHERE replica = 'u1'),
                    (SELECT provision FROM sync.replicas WHERE id = 'u1')",
            &[],
        )
        .await
        .unwrap();
    let (filed, provision): (i64, bool) = (row.get(0), row.get(1));
    assert_eq!(filed, 0, "its filing state started afresh");
    assert!(provision, "it is provisioned again");
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(counted(&fleet).await, Some(2));
}

/// Rows the server refused (constraints the host has since dropped) are
/// filed by themselves once the next build starts: nobody replays them by
/// hand. A till's count refused and then written again keeps the newer
/// value: the refused one, filed late, does not come back over it.
#[tokio::test]
async fn rows_the_server_refused_are_filed_again_once_a_fix_is_deployed() {
    let mut fleet = shop().await;
    fleet
        .write(
            "ALTER TABLE sales ADD CONSTRAINT positive CHECK (total > 0);
             ALTER TABLE stock ADD CONSTRAINT counted_positive CHECK (counted >= 0)",
        )
        .await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales VALUES ('s1', 'u1', NULL, '-3', 1);
         UPDATE stock SET counted = -1 WHERE unit_id = 'u1'",
    );
    assert_eq!(refusals(&send(&mut fleet, "u1", "u1").await).len(), 2);
    till_writes(
        &mut fleet,
        "u2",
        "UPDATE stock SET counted = -5 WHERE unit_id = 'u2'",
    );
    assert_eq!(counts(&send(&mut fleet, "u2", "u2").await), (0, 0, 1));
    till_writes(
        &mut fleet,
        "u2",
        "UPDATE stock SET counted = 7 WHERE unit_id = 'u2'",
    );
    assert_eq!(counts(&send(&mut fleet, "u2", "u2").await), (1, 0, 0));
    // The same build starting again files nothing of u1's: refused again,
    // kept. u2's refused count is let go of: a newer one was filed since.
    fleet.deploy(crate::shop::engine()).await;
    fleet.pass().await;
    assert!(sales(&fleet).await.is_empty());
    assert_eq!(inbox_rows(&fleet).await, 2);
    // The fix: the constraints go, and a build starts.
    fleet
        .write(
            "ALTER TABLE sales DROP CONSTRAINT positive;
             ALTER TABLE stock DROP CONSTRAINT counted_positive",
        )
        .await;
    fleet.deploy(crate::shop::engine()).await;
    fleet.sync().await;
    assert_eq!(
        sales(&fleet).await,
        [("s1".into(), "u1".into(), None, "-3".into(), 1)]
    );
    let counted: Vec<(String, Option<i32>)> = fleet
        .writer
        .query("SELECT unit_id, counted FROM stock ORDER BY unit_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        counted,
        [("u1".to_string(), Some(-1)), ("u2".to_string(), Some(7))]
    );
    assert_eq!(inbox_rows(&fleet).await, 0);
    fleet.check().await;
}

async fn inbox_rows(fleet: &Fleet) -> i64 {
    fleet.count("SELECT count(*) FROM sync.inbox").await
}

/// What a till's own columns were last taken from is kept while it holds
/// the row, and let go of once it no longer does: `sync.filed` does not
/// grow by every row a till ever edited.
#[tokio::test]
async fn the_record_of_a_tills_edits_goes_with_the_row_it_no_longer_holds() {
    let mut fleet = shop().await;
    fleet
        .settle("INSERT INTO stock VALUES ('u1', 2, 8, NULL)")
        .await;
    till_writes(&mut fleet, "u1", "UPDATE stock SET counted = 4");
    assert_eq!(counts(&send(&mut fleet, "u1", "u1").await), (2, 0, 0));
    assert_eq!(
        filed_keys(&fleet, "u1").await,
        [r#"["u1", 1]"#, r#"["u1", 2]"#]
    );
    // The server deletes one row: taken back from the till, and its record
    // with it; the other stays.
    fleet
        .settle("DELETE FROM stock WHERE unit_id = 'u1' AND product_id = 2")
        .await;
    assert_eq!(filed_keys(&fleet, "u1").await, [r#"["u1", 1]"#]);
}

/// The keys `sync.filed` records `replica`'s edits of.
async fn filed_keys(fleet: &Fleet, replica: &str) -> Vec<String> {
    fleet
        .writer
        .query(
            "SELECT key FROM sync.filed WHERE replica = $1 ORDER BY key",
            &[&replica],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A server restored from a copy older than an upload it answered has
/// forgotten that filing, and the till let go of the sale once answered.
/// The till's next acknowledgement says it was answered more than the
/// record holds: a new epoch begins, and the till, provisioned again, sends
/// up what it wrote, so the sale is filed again. Nothing answered is lost.
#[tokio::test]
async fn a_sale_filed_after_the_copy_a_server_is_restored_from_is_filed_again() {
    let mut fleet = shop().await;
    till_writes(
        &mut fleet,
        "u1",
        "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES ('s1', 'u1', 7, '9.50', 1)",
    );
    assert_eq!(fleet.upload(std::time::Duration::ZERO).await, 1);
    assert_eq!(sale_total(&fleet, "s1").await.as_deref(), Some("9.50"));
    assert!(
        fleet
            .unit("u1")
            .replica
            .progress()
            .unwrap()
            .tables
            .is_empty(),
        "answered, the till has nothing left to send"
    );
    let before = epoch_of(&fleet).await;
    // What restoring a copy taken before the sale leaves: no sale, and no
    // record of answering it. Triggers do not fire on a restore.
    fleet
        .write(
            "BEGIN; SET LOCAL session_replication_role = replica;
             DELETE FROM sales WHERE id = 's1'; DELETE FROM sync.uploads_answered; COMMIT;",
        )
        .await;
    let ack = fleet.unit("u1").replica.ack().expect("it applied messages");
    assert!(ack.answered > 0, "{ack:?}");
    fleet
        .network
        .report("u1", magic_sync::run::Report::Applied(ack));
    fleet.heed().await;
    assert_ne!(epoch_of(&fleet).await, before, "a new epoch");
    // Provisioned again, every till sends up what it wrote.
    fleet.sync().await;
    while fleet.upload(std::time::Duration::ZERO).await > 0 {
        fleet.sync().await;
    }
    fleet.check().await;
    assert_eq!(sale_total(&fleet, "s1").await.as_deref(), Some("9.50"));
    let answered: i64 = fleet
        .writer
        .query_one(
            "SELECT sequence FROM sync.uploads_answered WHERE replica = 'u1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(answered > 0, "answering it again is recorded");
}

async fn sale_total(fleet: &Fleet, id: &str) -> Option<String> {
    fleet
        .writer
        .query_opt("SELECT total::text FROM sales WHERE id = $1", &[&id])
        .await
        .unwrap()
        .map(|r| r.get(0))
}

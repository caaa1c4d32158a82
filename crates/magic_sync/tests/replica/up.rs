//! What the replica writes, on its way up: noted in the writing
//! transaction, gathered as the rows are now, let go of when filed.

use crate::support::*;
use magic_sync::envelope::{Filed, TableBacklog, Up};
use magic_sync::replica::{Replica, SentUp, Uplink, UplinkError, Written};
use std::time::Duration;

const MAX: usize = 1 << 20;
/// Long enough that nothing is sent again within a test.
const PATIENT: Duration = Duration::from_secs(3600);

fn write(replica: &Replica, sql: &str) {
    replica
        .connection()
        .execute_batch(sql)
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn notes(replica: &Replica) -> Vec<(String, String, i64)> {
    replica
        .connection()
        .prepare("SELECT table_name, key, writes FROM _magic_sync_up ORDER BY 1, 2")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// The upload's rows as (table, key, row JSON or "gone"): per table, the
/// rows, then the keys gone.
fn shown(up: &Up) -> Vec<(String, String, String)> {
    let mut rows = Vec::new();
    for t in &up.tables {
        for r in &t.rows {
            rows.push((
                t.table.clone(),
                String::from_utf8(r.key.clone()).unwrap(),
                String::from_utf8(r.data.clone()).unwrap(),
            ));
        }
        for k in &t.gone {
            rows.push((
                t.table.clone(),
                String::from_utf8(k.clone()).unwrap(),
                "gone".into(),
            ));
        }
    }
    rows
}

fn filed(up: &Up) -> Filed {
    answer(&up.send_id)
}

#[test]
fn a_row_written_a_thousand_times_is_one_note_and_goes_up_once_as_it_is_now() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id, customer_id) VALUES ('s1', 'unit-1', NULL)",
    );
    for i in 0..1000 {
        write(
            &replica,
            &format!("UPDATE sales SET customer_id = {i} WHERE id = 's1'"),
        );
    }
    assert_eq!(notes(&replica), [("sales".into(), "[\"s1\"]".into(), 1001)]);
    let up = replica
        .upload(MAX, PATIENT)
        .unwrap()
        .expect("something to send");
    assert_eq!(
        shown(&up),
        [(
            "sales".into(),
            "[\"s1\"]".into(),
            r#"{"customer_id":999,"id":"s1","unit_id":"unit-1"}"#.into()
        )]
    );
    assert_eq!(up.send_id.len(), 16);
    // Sent and unanswered: nothing more is due.
    assert!(replica.upload(MAX, PATIENT).unwrap().is_none());
    assert_eq!(replica.filed(&filed(&up)).unwrap(), 1);
    assert!(notes(&replica).is_empty());
}

#[test]
fn a_row_gone_goes_as_its_key_only_from_a_table_keyed_by_its_replica() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO shelf_counts VALUES ('unit-1', 1, 7, 3), ('unit-1', 2, 8, 4);
         INSERT INTO sales (id, unit_id) VALUES ('s1', 'unit-1');
         DELETE FROM shelf_counts WHERE n = 2;
         DELETE FROM sales WHERE id = 's1';",
    );
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(
        shown(&up),
        [
            (
                "shelf_counts".into(),
                "[\"unit-1\",1]".into(),
                r#"{"n":1,"product_id":7,"qty":3,"unit_id":"unit-1"}"#.into()
            ),
            (
                "shelf_counts".into(),
                "[\"unit-1\",2]".into(),
                "gone".into()
            ),
        ],
        "the sale pruned before it went up is not the server's to delete"
    );
    assert_eq!(notes(&replica).len(), 2, "the sale's note is let go of");
}

#[test]
fn a_key_changed_goes_up_as_the_new_row_and_the_old_key_gone() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO shelf_counts VALUES ('unit-1', 1, 7, 3);
         UPDATE shelf_counts SET n = 5 WHERE n = 1;",
    );
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    let keys: Vec<(String, String)> = shown(&up).into_iter().map(|(_, k, d)| (k, d)).collect();
    assert_eq!(
        keys,
        [
            (
                "[\"unit-1\",5]".into(),
                r#"{"n":5,"product_id":7,"qty":3,"unit_id":"unit-1"}"#.into()
            ),
            ("[\"unit-1\",1]".into(), "gone".into()),
        ]
    );
}

#[test]
fn filed_lets_go_of_exactly_what_its_send_carried() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1'), ('b', 'unit-1'), ('c', 'unit-1')",
    );
    let first = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(shown(&first).len(), 3);
    // Written since it went: goes again, under another send.
    write(&replica, "UPDATE sales SET customer_id = 1 WHERE id = 'b'");
    let second = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_ne!(second.send_id, first.send_id);
    assert_eq!(
        shown(&second)
            .iter()
            .map(|r| r.1.as_str())
            .collect::<Vec<_>>(),
        ["[\"b\"]"]
    );
    // The first answer: a and c go; b waits for the second send's answer.
    assert_eq!(replica.filed(&filed(&first)).unwrap(), 2);
    assert_eq!(notes(&replica), [("sales".into(), "[\"b\"]".into(), 2)]);
    // An answer to a send the replica never made lets go of nothing.
    let stranger = answer(&[7; 16]);
    assert_eq!(replica.filed(&stranger).unwrap(), 0);
    // Answered twice: the second time, nothing is left to let go of.
    assert_eq!(replica.filed(&filed(&second)).unwrap(), 1);
    assert_eq!(replica.filed(&filed(&second)).unwrap(), 0);
    assert!(notes(&replica).is_empty());
}

#[test]
fn a_row_written_after_its_send_goes_up_again_when_the_old_answer_comes() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
    );
    let first = replica.upload(MAX, PATIENT).unwrap().unwrap();
    write(&replica, "UPDATE sales SET customer_id = 4 WHERE id = 'a'");
    // The answer to the send that carried the first version.
    assert_eq!(replica.filed(&filed(&first)).unwrap(), 0);
    let again = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(
        shown(&again)[0].2,
        r#"{"customer_id":4,"id":"a","unit_id":"unit-1"}"#
    );
}

#[test]
fn an_upload_unanswered_for_a_while_goes_again_under_a_new_id() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
    );
    let first = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert!(replica.upload(MAX, PATIENT).unwrap().is_none());
    // Out of patience: every send unanswered so far goes again.
    let again = replica.upload(MAX, Duration::ZERO).unwrap().unwrap();
    assert_ne!(again.send_id, first.send_id);
    assert_eq!(shown(&again), shown(&first));
    // The late answer to the first send no longer names the note.
    assert_eq!(replica.filed(&filed(&first)).unwrap(), 0);
    assert_eq!(replica.filed(&filed(&again)).unwrap(), 1);
}

#[test]
fn an_upload_stays_within_its_size_and_the_rest_waits_for_the_next() {
    let site = Site::new();
    let mut replica = site.open();
    let values: Vec<String> = (0..50)
        .map(|i| format!("('sale-{i:02}', 'unit-1')"))
        .collect();
    write(
        &replica,
        &format!(
            "INSERT INTO sales (id, unit_id) VALUES {}",
            values.join(", ")
        ),
    );
    let mut sent = Vec::new();
    while let Some(up) = replica.upload(400, PATIENT).unwrap() {
        let size: usize = up
            .tables
            .iter()
            .flat_map(|t| &t.rows)
            .map(|r| r.key.len() + r.data.len())
            .sum();
        assert!(size <= 400, "an upload of {size} bytes of rows");
        sent.extend(shown(&up).into_iter().map(|r| r.1));
    }
    assert!(
        sent.len() == 50,
        "every sale went once, over several uploads: {sent:?}"
    );
}

#[test]
fn only_the_columns_a_replica_owns_are_noted_and_the_servers_messages_note_nothing() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    let stock = Stock {
        unit_id: UNIT.into(),
        product_id: 1,
        on_hand: 5,
        counted: None,
    };
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![
                upserts(&[product(1, "tea")]),
                upserts(std::slice::from_ref(&stock)),
            ],
            &["products", "stock"],
        ),
    );
    // The server's next version of the row: noted by nothing.
    let moved = Stock {
        on_hand: 9,
        ..stock.clone()
    };
    apply_all(&mut replica, &[server.down(vec![upserts(&[moved])])]);
    assert!(notes(&replica).is_empty());
    assert!(replica.upload(MAX, PATIENT).unwrap().is_none());
    // The till counts the shelf: its column.
    write(
        &replica,
        "UPDATE stock SET counted = 8 WHERE product_id = 1;
         UPDATE stock SET counted = 8 WHERE product_id = 1;",
    );
    assert_eq!(
        notes(&replica),
        [("stock".into(), "[\"unit-1\",1]".into(), 1)],
        "writing the same count again changes nothing"
    );
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(
        shown(&up),
        [(
            "stock".into(),
            "[\"unit-1\",1]".into(),
            r#"{"counted":8,"on_hand":9,"product_id":1,"unit_id":"unit-1"}"#.into()
        )]
    );
}

#[test]
fn the_backlog_counts_rows_not_sent_and_rows_not_filed() {
    let site = Site::new();
    let mut replica = site.open();
    assert!(replica.progress().unwrap().tables.is_empty());
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1'), ('b', 'unit-1');
         INSERT INTO shelf_counts VALUES ('unit-1', 1, 7, 3);",
    );
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    write(
        &replica,
        "UPDATE sales SET customer_id = 2 WHERE id = 'a';
         INSERT INTO sales (id, unit_id) VALUES ('c', 'unit-1');",
    );
    let backlog = |replica: &Replica| replica.progress().unwrap().tables;
    assert_eq!(
        backlog(&replica),
        [
            TableBacklog {
                table: "sales".into(),
                unsent: 2,
                unfiled: 1
            },
            TableBacklog {
                table: "shelf_counts".into(),
                unsent: 0,
                unfiled: 1
            },
        ]
    );
    replica.filed(&filed(&up)).unwrap();
    assert_eq!(
        backlog(&replica),
        [TableBacklog {
            table: "sales".into(),
            unsent: 2,
            unfiled: 0
        }]
    );
}

#[test]
fn the_notes_survive_the_replica_closing_and_opening_again() {
    let site = Site::new();
    {
        let replica = site.open();
        write(
            &replica,
            "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
        );
    }
    let mut replica = site.open();
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(shown(&up).len(), 1);
}

#[derive(magic_sync::Row, Debug, Clone, PartialEq)]
#[row(table = "tokens", up, key(unit_id, token))]
struct Token {
    #[row(origin)]
    unit_id: String,
    token: Vec<u8>,
}

#[test]
fn an_up_table_keyed_by_bytes_is_refused_when_the_replica_opens() {
    let engine = &magic_sync::Engine::builder()
        .table::<Token>()
        .build()
        .unwrap();
    let site = Site::new();
    let err = Replica::open(site.dir.path().join("t.sqlite3"), UNIT, engine).expect_err("refused");
    let message = err.to_string();
    assert!(
        message.contains("table `tokens`, column `token`") && message.contains("bytes"),
        "{message}"
    );
}

/// An uplink for the tests: takes uploads of at most `max` encoded bytes
/// with no row containing `poison`, unless it is down or refuses all.
struct Picky {
    max: usize,
    poison: Option<&'static str>,
    down: bool,
    refuse_all: bool,
    taken: std::cell::RefCell<Vec<Up>>,
}

impl Picky {
    fn new(max: usize) -> Self {
        Picky {
            max,
            poison: None,
            down: false,
            refuse_all: false,
            taken: Default::default(),
        }
    }

    /// Every row key taken, in order.
    fn keys(&self) -> Vec<String> {
        self.taken
            .borrow()
            .iter()
            .flat_map(shown)
            .map(|(_, k, _)| k)
            .collect()
    }
}

impl Uplink for Picky {
    fn max_bytes(&self) -> usize {
        self.max
    }

    fn send(&self, up: &Up) -> Result<(), UplinkError> {
        use prost::Message;
        if self.down {
            return Err(UplinkError::unreachable("no signal"));
        }
        if self.refuse_all {
            return Err(UplinkError::refused("closed for good"));
        }
        if up.encoded_len() > self.max {
            return Err(UplinkError::refused("too large"));
        }
        if let Some(poison) = self.poison {
            if shown(up).iter().any(|(_, _, data)| data.contains(poison)) {
                return Err(UplinkError::refused("a row it will not carry"));
            }
        }
        self.taken.borrow_mut().push(up.clone());
        Ok(())
    }
}

fn twenty_sales(replica: &Replica) {
    let values: Vec<String> = (0..20)
        .map(|i| format!("('sale-{i:02}', 'unit-1', {i})"))
        .collect();
    write(
        replica,
        &format!(
            "INSERT INTO sales (id, unit_id, customer_id) VALUES {}",
            values.join(", ")
        ),
    );
}

fn unsent(replica: &Replica) -> u64 {
    replica
        .progress()
        .unwrap()
        .tables
        .iter()
        .map(|t| t.unsent)
        .sum()
}

#[test]
fn a_row_the_uplink_refuses_for_good_is_found_and_set_aside_and_the_rest_goes() {
    let site = Site::new();
    let mut replica = site.open();
    twenty_sales(&replica);
    let uplink = Picky {
        poison: Some("\"customer_id\":13"),
        ..Picky::new(300)
    };
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert_eq!(sent.set_aside, [("sales".into(), "[\"sale-13\"]".into())]);
    assert_eq!(sent.waits, None);
    let mut keys = uplink.keys();
    keys.sort();
    let expected: Vec<String> = (0..20)
        .filter(|i| *i != 13)
        .map(|i| format!("[\"sale-{i:02}\"]"))
        .collect();
    assert_eq!(keys, expected, "every other row went, once");
    // Still noted, and counted as not sent.
    assert_eq!(unsent(&replica), 1);
    assert_eq!(
        replica.send_up(&uplink, PATIENT, 100).unwrap(),
        SentUp::default()
    );
    // Opened again, the replica tries it again.
    drop(replica);
    let mut replica = site.open();
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert_eq!(sent.uploads, 0);
    assert_eq!(
        sent.waits.as_deref(),
        Some("the uplink refuses every upload: a row it will not carry"),
        "alone, it cannot be told from an uplink refusing everything"
    );
}

#[test]
fn a_row_too_large_for_any_upload_is_set_aside() {
    let site = Site::new();
    let mut replica = site.open();
    twenty_sales(&replica);
    let long = "x".repeat(2000);
    write(
        &replica,
        &format!("INSERT INTO sales (id, unit_id) VALUES ('{long}', 'unit-1')"),
    );
    let uplink = Picky::new(1000);
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert_eq!(sent.set_aside.len(), 1);
    assert_eq!(sent.set_aside[0].1, format!("[\"{long}\"]"));
    assert_eq!(uplink.keys().len(), 20);
    assert_eq!(unsent(&replica), 1);
}

#[test]
fn a_row_written_in_a_form_its_table_does_not_take_is_set_aside_with_why_and_holds_back_no_other() {
    let site = Site::new();
    let mut replica = site.open();
    twenty_sales(&replica);
    // SQLite takes any 64-bit integer; the declaration's column is 32-bit.
    write(
        &replica,
        "INSERT INTO shelf_counts (unit_id, n, product_id, qty) VALUES ('unit-1', 1, 1, 5000000000)",
    );
    let uplink = Picky::new(MAX);
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    let bad = "[\"unit-1\",1]";
    assert_eq!(sent.set_aside, [("shelf_counts".into(), bad.into())]);
    let (table, key, why) = &sent.unreadable[0];
    assert_eq!((table.as_str(), key.as_str()), ("shelf_counts", bad));
    assert!(why.contains("table `shelf_counts`, row"), "{why}");
    assert_eq!(uplink.keys().len(), 20, "every other row went");
    assert_eq!(unsent(&replica), 1);
    // Once the host writes it right, it goes (after the replica runs
    // again, as any row set aside).
    write(&replica, "UPDATE shelf_counts SET qty = 5 WHERE n = 1");
    drop(replica);
    let mut replica = site.open();
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert!(sent.unreadable.is_empty());
    assert_eq!(uplink.keys().last().map(String::as_str), Some(bad));
}

#[test]
fn an_uplink_that_refuses_everything_sets_nothing_aside() {
    let site = Site::new();
    let mut replica = site.open();
    twenty_sales(&replica);
    let uplink = Picky {
        refuse_all: true,
        ..Picky::new(MAX)
    };
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert!(sent.set_aside.is_empty());
    assert_eq!(sent.uploads, 0);
    assert!(sent.waits.is_some());
    // Once it takes uploads again, everything goes.
    let uplink = Picky::new(MAX);
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert_eq!((sent.uploads, uplink.keys().len()), (1, 20));
}

#[test]
fn an_uplink_out_of_reach_records_nothing_as_sent() {
    let site = Site::new();
    let mut replica = site.open();
    twenty_sales(&replica);
    let uplink = Picky {
        down: true,
        ..Picky::new(MAX)
    };
    let sent = replica.send_up(&uplink, PATIENT, 100).unwrap();
    assert_eq!(sent.waits.as_deref(), Some("no signal"));
    assert_eq!(unsent(&replica), 20);
    let uplink = Picky::new(MAX);
    assert_eq!(replica.send_up(&uplink, PATIENT, 100).unwrap().uploads, 1);
    assert_eq!(unsent(&replica), 0);
}

#[test]
fn an_answer_that_arrives_before_its_send_is_recorded_still_counts() {
    let site = Site::new();
    let mut replica = site.open();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
    );
    let pending = replica.prepare_upload(MAX, PATIENT).unwrap().unwrap();
    // The server filed it and answered before the replica wrote it down.
    assert_eq!(replica.filed(&filed(&pending.up)).unwrap(), 0);
    assert_eq!(replica.sent(&pending).unwrap(), 1);
    assert!(notes(&replica).is_empty());
}

/// Reading one's own writes: a mark of what the host wrote is here until
/// every send that carried it was filed, filed until the server's `Reached`
/// for those sends was applied, and reached then; a row written since its
/// send holds back only marks after the send.
#[test]
fn a_host_reads_its_own_writes_once_the_server_reached_every_send_that_carried_them() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
    );
    let first = replica.mark().unwrap();
    assert_eq!(replica.written(first).unwrap(), Written::Here);
    let up_a = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(
        replica.written(first).unwrap(),
        Written::Here,
        "sent, not filed"
    );

    // Written again after its send, and another row.
    write(&replica, "UPDATE sales SET customer_id = 1 WHERE id = 'a'");
    let second = replica.mark().unwrap();
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('b', 'unit-1')",
    );
    let third = replica.mark().unwrap();
    assert!(first < second && second < third);

    // The send's answer: what it carried is filed, what came since is not.
    replica.filed(&filed(&up_a)).unwrap();
    assert_eq!(replica.written(first).unwrap(), Written::Filed);
    assert_eq!(replica.written(second).unwrap(), Written::Here);
    // Another replica's upload reached changes nothing.
    apply_all(&mut replica, &[server.reached(&[&[9; 16]])]);
    assert_eq!(replica.written(first).unwrap(), Written::Filed);
    apply_all(&mut replica, &[server.reached(&[&up_a.send_id])]);
    assert_eq!(replica.written(first).unwrap(), Written::Reached);
    assert_eq!(replica.written(third).unwrap(), Written::Here);

    // The server may say a send reached before its answer comes.
    let up_rest = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(shown(&up_rest).len(), 2);
    apply_all(&mut replica, &[server.reached(&[&up_rest.send_id])]);
    assert_eq!(replica.written(third).unwrap(), Written::Here);
    replica.filed(&filed(&up_rest)).unwrap();
    assert_eq!(replica.written(third).unwrap(), Written::Reached);
    assert_eq!(replica.written(first).unwrap(), Written::Reached);

    // A host on a connection of its own marks and asks the same way.
    let host = rusqlite::Connection::open(replica.connection().path().unwrap()).unwrap();
    host.execute_batch("INSERT INTO sales (id, unit_id) VALUES ('c', 'unit-1')")
        .unwrap();
    let fourth = magic_sync::replica::mark(&host).unwrap();
    assert!(fourth > third);
    assert_eq!(
        magic_sync::replica::written(&host, fourth).unwrap(),
        Written::Here
    );
    assert_eq!(
        magic_sync::replica::written(&host, third).unwrap(),
        Written::Reached
    );
}

/// A host waits for its writes to go far enough: until the time runs out
/// (it says how far they went), or until the replica's loop, applying the
/// answer and then the server's `Reached`, moves them there.
#[test]
fn a_host_waits_for_its_writes_to_go_far_enough() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let path = replica.connection().path().unwrap().to_string();
    let host = rusqlite::Connection::open(&path).unwrap();
    host.execute_batch("INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')")
        .unwrap();
    let mark = magic_sync::replica::mark(&host).unwrap();
    let waited =
        magic_sync::replica::wait_written(&host, mark, Written::Filed, Duration::from_millis(30))
            .unwrap();
    assert_eq!(waited, Written::Here, "nothing sent: the time ran out");
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    let waiting = std::thread::spawn(move || {
        magic_sync::replica::wait_written(&host, mark, Written::Reached, Duration::from_secs(60))
            .unwrap()
    });
    replica.filed(&filed(&up)).unwrap();
    apply_all(&mut replica, &[server.reached(&[&up.send_id])]);
    assert_eq!(waiting.join().unwrap(), Written::Reached);
}

/// A replica waits longer than its floor before sending again once answers
/// take time: four times their smoothed round trip. Before any answer, and
/// for a host's own calls, the floor is what counts.
#[test]
fn patience_grows_with_the_time_answers_take() {
    let site = Site::new();
    let mut replica = site.open();
    assert_eq!(replica.patience(Duration::ZERO), Duration::ZERO);
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
    );
    let sent_at = std::time::Instant::now();
    let up = replica.upload(MAX, PATIENT).unwrap().unwrap();
    // An answer to a send never made times nothing.
    replica.filed(&answer(&[3; 16])).unwrap();
    assert_eq!(replica.patience(Duration::ZERO), Duration::ZERO);
    replica.filed(&filed(&up)).unwrap();
    let round_trip = sent_at.elapsed();
    let patience = replica.patience(Duration::ZERO);
    assert!(
        patience > Duration::ZERO && patience <= round_trip * 4,
        "{patience:?} against a round trip of at most {round_trip:?}"
    );
    assert_eq!(replica.patience(PATIENT), PATIENT, "never below the floor");
}

/// A table written often goes on a lane of its own: each round of sending
/// makes one upload per lane, so a till's sale goes up beside a flood of
/// readings instead of behind it, and each upload names its lane.
#[test]
fn a_table_on_a_lane_of_its_own_never_holds_back_the_others() {
    struct Taking(std::cell::RefCell<Vec<Up>>);
    impl Uplink for Taking {
        fn max_bytes(&self) -> usize {
            400
        }
        fn send(&self, up: &Up) -> Result<(), UplinkError> {
            self.0.borrow_mut().push(up.clone());
            Ok(())
        }
    }
    let site = Site::new();
    let mut replica = site.open();
    for i in 0..100 {
        write(
            &replica,
            &format!("INSERT INTO readings (id, unit_id, value) VALUES ('r{i:03}', 'unit-1', {i})"),
        );
    }
    write(
        &replica,
        "INSERT INTO sales (id, unit_id) VALUES ('a', 'unit-1')",
    );
    let uplink = Taking(Default::default());
    // Two uploads at most: without lanes both would be readings
    // ("readings" sorts before "sales").
    let sent = replica.send_up(&uplink, PATIENT, 2).unwrap();
    assert_eq!(sent.uploads, 2);
    let ups = uplink.0.borrow();
    let lanes: Vec<(&str, Vec<&str>)> = ups
        .iter()
        .map(|u| {
            (
                u.lane.as_str(),
                u.tables.iter().map(|t| t.table.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        lanes,
        [("", vec!["sales"]), ("telemetry", vec!["readings"])],
        "the first lane, then the readings' own"
    );
    assert!(
        ups[1].tables[0].rows.len() < 100,
        "the readings are split by size"
    );
    // A host's own upload goes on one lane too: the first note's.
    drop(ups);
    let rest = replica.upload(MAX, PATIENT).unwrap().unwrap();
    assert_eq!(rest.lane, "telemetry");
    assert!(rest.tables.iter().all(|t| t.table == "readings"));
}

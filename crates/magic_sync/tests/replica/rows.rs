//! How rows apply: owned columns, rows that cannot be taken, and a unique
//! value moving between rows.

use crate::support::*;
use magic_sync::envelope::{RowData, TableRows};
use magic_sync::replica::Outcome;

fn stock(product_id: i64, on_hand: i32, counted: Option<i32>) -> Stock {
    Stock {
        unit_id: UNIT.into(),
        product_id,
        on_hand,
        counted,
    }
}

fn stock_rows(replica: &magic_sync::replica::Replica) -> Vec<(i64, i64, Option<i64>)> {
    let mut stmt = replica
        .connection()
        .prepare("SELECT product_id, on_hand, counted FROM stock ORDER BY product_id")
        .expect("prepares");
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("queries");
    rows.collect::<Result<_, _>>().expect("reads")
}

#[test]
fn owned_columns_are_kept_on_overwrite() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    apply_all(
        &mut replica,
        &[server.snapshot(vec![upserts(&[stock(1, 5, Some(4))])])],
    );
    assert_eq!(
        stock_rows(&replica),
        vec![(1, 5, Some(4))],
        "a new row takes the server's value of an owned column"
    );

    replica
        .connection()
        .execute("UPDATE stock SET counted = 7 WHERE product_id = 1", [])
        .expect("the host counts its stock");
    apply_all(
        &mut replica,
        &[server.down(vec![upserts(&[stock(1, 9, None)])])],
    );
    assert_eq!(
        stock_rows(&replica),
        vec![(1, 9, Some(7))],
        "the server's columns change, the replica's own stay"
    );
}

#[test]
fn a_row_that_does_not_decode_is_refused_and_the_rest_applies() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    apply_all(
        &mut replica,
        &[server.snapshot(vec![upserts(&[product(2, "jam")])])],
    );

    let mut rows = upserts(&[product(1, "tea"), product(3, "honey")]);
    rows.upserts.insert(
        1,
        RowData {
            key: b"[2]".to_vec(),
            data: br#"{"id": 2, "name": 5, "barcode": null}"#.to_vec(),
        },
    );
    let message = server.down(vec![rows]);
    let outcome = replica.apply(&bytes(&message)).expect("applies");
    assert_eq!(
        outcome,
        Outcome::Applied {
            number: message.number,
            refused: 1,
            purged: 0
        }
    );
    assert_eq!(
        products(&replica),
        vec![
            (1, "tea".into(), None),
            (2, "jam".into(), None),
            (3, "honey".into(), None)
        ],
        "the rest applies; the refused row keeps the version it had"
    );
    let refused = replica.refused().expect("reads");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].table, "products");
    assert_eq!(refused[0].key, b"[2]");
    assert_eq!(refused[0].number, message.number);
    assert!(
        refused[0].reason.contains("`name`"),
        "{}",
        refused[0].reason
    );

    // The server sends it again once fixed: the refusal is forgotten.
    apply_all(
        &mut replica,
        &[server.down(vec![upserts(&[product(2, "plum jam")])])],
    );
    assert_eq!(replica.refused().expect("reads"), vec![]);
    assert_eq!(products(&replica)[1], (2, "plum jam".into(), None));
}

#[test]
fn a_row_whose_key_disagrees_with_its_data_is_refused() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    let mut rows = upserts(&[product(1, "tea")]);
    rows.upserts[0].key = b"[9]".to_vec();
    rows.upserts.push(RowData {
        key: b"not json".to_vec(),
        data: Vec::new(),
    });
    let message = server.snapshot(vec![rows]);
    let outcome = replica.apply(&bytes(&message)).expect("applies");
    assert!(
        matches!(outcome, Outcome::Applied { refused: 2, .. }),
        "{outcome:?}"
    );
    assert_eq!(live_products(&replica), Vec::<i64>::new());
    let reasons: Vec<String> = replica
        .refused()
        .expect("reads")
        .into_iter()
        .map(|r| r.reason)
        .collect();
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("[1]") && r.contains("[9]")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("not JSON")),
        "{reasons:?}"
    );
}

#[test]
fn rows_of_a_table_the_replica_does_not_hold_are_refused() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    let ghosts = TableRows {
        table: "ghosts".into(),
        deletes: vec![b"[1]".to_vec()],
        upserts: vec![RowData {
            key: b"[1]".to_vec(),
            data: b"{}".to_vec(),
        }],
    };
    let sales = upserts(&[Sale {
        id: "s1".into(),
        unit_id: UNIT.into(),
        customer_id: None,
    }]);
    let message = server.snapshot(vec![ghosts, sales, upserts(&[product(1, "tea")])]);
    let outcome = replica.apply(&bytes(&message)).expect("applies");
    assert!(
        matches!(outcome, Outcome::Applied { refused: 2, .. }),
        "{outcome:?}"
    );
    assert_eq!(live_products(&replica), vec![1], "the rest applies");

    let refused = replica.refused().expect("reads");
    let reason = |table: &str| {
        refused
            .iter()
            .find(|r| r.table == table)
            .map(|r| r.reason.clone())
            .unwrap_or_default()
    };
    assert!(
        reason("ghosts").contains("no table `ghosts`"),
        "{refused:?}"
    );
    assert!(
        reason("sales").contains("does not travel down"),
        "{refused:?}"
    );
    let sales: i64 = replica
        .connection()
        .query_row("SELECT count(*) FROM sales", [], |r| r.get(0))
        .expect("counts");
    assert_eq!(
        sales, 0,
        "the server never writes the replica's own records"
    );
}

fn barcodes(replica: &magic_sync::replica::Replica) -> Vec<(i64, Option<String>)> {
    let mut stmt = replica
        .connection()
        .prepare("SELECT id, barcode FROM products ORDER BY id")
        .expect("prepares");
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("queries");
    rows.collect::<Result<_, _>>().expect("reads")
}

fn with_barcode(id: i64, barcode: Option<&str>) -> Product {
    Product {
        id,
        name: format!("product {id}"),
        barcode: barcode.map(str::to_string),
    }
}

/// A replica whose products have unique barcodes, holding 1 with `X` and 2 without.
fn unique_barcodes(site: &Site, server: &mut Server) -> magic_sync::replica::Replica {
    let mut replica = site.open();
    replica
        .connection()
        .execute_batch("CREATE UNIQUE INDEX products_barcode ON products (barcode)")
        .expect("the host adds a unique index");
    let first = server.snapshot(vec![upserts(&[
        with_barcode(1, Some("X")),
        with_barcode(2, None),
    ])]);
    apply_all(&mut replica, &[first]);
    replica
}

#[test]
fn a_unique_value_moves_between_two_rows_in_one_message_in_either_order() {
    for order in [[1, 2], [2, 1]] {
        let site = Site::new();
        let mut server = Server::new();
        let mut replica = unique_barcodes(&site, &mut server);
        let moved: Vec<Product> = order
            .iter()
            .map(|&id| with_barcode(id, (id == 2).then_some("X")))
            .collect();
        let message = server.down(vec![upserts(&moved)]);
        let outcome = replica.apply(&bytes(&message)).expect("applies");
        assert!(
            matches!(outcome, Outcome::Applied { refused: 0, .. }),
            "order {order:?}: {outcome:?}"
        );
        assert_eq!(
            barcodes(&replica),
            vec![(1, None), (2, Some("X".into()))],
            "order {order:?}"
        );
    }
}

#[test]
fn a_unique_value_nothing_gives_up_is_refused() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = unique_barcodes(&site, &mut server);
    let message = server.down(vec![upserts(&[
        with_barcode(2, Some("X")),
        with_barcode(3, Some("Y")),
    ])]);
    let outcome = replica.apply(&bytes(&message)).expect("applies");
    assert!(
        matches!(outcome, Outcome::Applied { refused: 1, .. }),
        "{outcome:?}"
    );
    assert_eq!(
        barcodes(&replica),
        vec![(1, Some("X".into())), (2, None), (3, Some("Y".into()))]
    );
    let refused = replica.refused().expect("reads");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].key, b"[2]");
    assert!(
        refused[0].reason.contains("UNIQUE"),
        "{}",
        refused[0].reason
    );
}

/// A host's own field type that checks more than its kind: codes are
/// upper case.
#[derive(Debug, Clone, PartialEq)]
struct Code(String);

impl magic_sync::value::Field for Code {
    const KIND: magic_sync::value::Kind = magic_sync::value::Kind::Text;
    fn to_value(&self) -> magic_sync::Value {
        magic_sync::Value::Text(self.0.clone())
    }
    fn from_value(value: magic_sync::Value) -> Result<Self, magic_sync::value::ValueError> {
        match value {
            magic_sync::Value::Text(s) if s == s.to_uppercase() => Ok(Code(s)),
            v => Err(magic_sync::value::ValueError {
                column: None,
                expected: "an upper-case code".into(),
                found: format!("{v:?}"),
            }),
        }
    }
}

#[derive(magic_sync::Row, Debug, Clone, PartialEq)]
#[row(table = "badges", down, all, key(id))]
struct Badge {
    id: i64,
    code: Code,
}

#[test]
fn a_field_of_the_hosts_own_type_checks_every_row_it_takes() {
    let engine = &magic_sync::Engine::builder()
        .table::<Badge>()
        .build()
        .unwrap();
    let site = Site::new();
    let mut replica =
        magic_sync::replica::Replica::open(site.dir.path().join("b.sqlite3"), UNIT, engine)
            .unwrap();
    replica.trust(&signer().public()).unwrap();
    let mut server = Server::new();
    let mut rows = upserts(&[Badge {
        id: 1,
        code: Code("GOLD".into()),
    }]);
    // Text, as the column's kind takes, but not a code the type accepts.
    rows.upserts.push(RowData {
        key: b"[2]".to_vec(),
        data: br#"{"id": 2, "code": "silver"}"#.to_vec(),
    });
    let messages = server.whole_snapshot(vec![rows], &["badges"]);
    let outcome = replica.apply(&bytes(&messages[0])).expect("applies");
    assert_eq!(
        outcome,
        Outcome::Applied {
            number: messages[0].number,
            refused: 1,
            purged: 0
        }
    );
    replica.apply(&bytes(&messages[1])).expect("applies");
    let codes: Vec<(i64, String)> = replica
        .connection()
        .prepare("SELECT id, code FROM badges ORDER BY id")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(codes, [(1, "GOLD".to_string())]);
    let refused = replica.refused().unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].key, b"[2]");
}

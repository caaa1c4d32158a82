//! The end of a snapshot: of the tables it names, what the snapshot did not
//! send goes (or is retired, when the replica's own records point at it).

use crate::support::*;

fn count(replica: &magic_sync::replica::Replica<'_>, table: &str) -> i64 {
    replica
        .connection()
        .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
        .expect("counts")
}

#[test]
fn the_end_of_a_snapshot_lets_go_of_what_it_did_not_name_in_its_tables_only() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let order = order(10, None);
    let first = server.whole_snapshot(
        vec![
            upserts(&[product(1, "tea"), product(2, "jam"), product(3, "honey")]),
            upserts(&[customer(1, "Ada"), customer(2, "Bob")]),
            upserts(&[order]),
        ],
        &["products", "customers", "orders"],
    );
    apply_all(&mut replica, &first);
    record_sale(&replica, "s1", 2);

    // A snapshot over several messages, naming products 1 and 3 and customer
    // 1; its end names products and customers, not orders.
    let again = [
        server.snapshot(vec![upserts(&[product(1, "tea")])]),
        server.down(vec![
            upserts(&[product(3, "honey")]),
            upserts(&[customer(1, "Ada")]),
        ]),
        server.end(&["products", "customers"]),
    ];
    apply_all(&mut replica, &again[..2]);
    assert_eq!(
        live_products(&replica),
        vec![1, 2, 3],
        "nothing goes before the end"
    );
    apply_all(&mut replica, &again[2..]);

    assert_eq!(live_products(&replica), vec![1, 3]);
    let number = i64::try_from(again[2].number).expect("fits");
    assert_eq!(
        customers(&replica),
        vec![(1, "Ada".into(), None), (2, "Bob".into(), Some(number))],
        "the sale keeps its customer, retired"
    );
    assert_eq!(
        count(&replica, "orders"),
        1,
        "a table the end does not name keeps its rows"
    );
    assert_eq!(
        count(&replica, "sales"),
        1,
        "the replica's own records stay"
    );

    // A later snapshot's end with nothing in progress lets go of nothing.
    apply_all(&mut replica, &[server.end(&["products"])]);
    assert_eq!(live_products(&replica), vec![1, 3]);
}

#[test]
fn an_empty_snapshot_empties_its_tables() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    apply_all(
        &mut replica,
        &server.whole_snapshot(vec![upserts(&[product(1, "tea")])], &["products"]),
    );
    let mut empty = server.end(&["products"]);
    empty.begins_snapshot = true;
    apply_all(&mut replica, &[empty]);
    assert_eq!(count(&replica, "products"), 0);
}

#[test]
fn a_row_let_go_of_during_the_snapshot_is_not_named_any_more() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let messages = vec![
        server.snapshot(vec![upserts(&[product(1, "tea"), product(2, "jam")])]),
        server.down(vec![deletes("products", &[2])]),
        server.end(&["products"]),
    ];
    apply_all(&mut replica, &messages);
    assert_eq!(live_products(&replica), vec![1]);
}

#[test]
fn a_snapshot_supersedes_the_refusals_before_it() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let mut rows = upserts(&[product(1, "tea")]);
    rows.upserts[0].data = b"{}".to_vec();
    apply_all(&mut replica, &[server.snapshot(vec![rows])]);
    assert_eq!(replica.refused().expect("reads").len(), 1);

    // The next snapshot no longer sends product 1: its refusal is over.
    apply_all(
        &mut replica,
        &server.whole_snapshot(vec![upserts(&[product(2, "jam")])], &["products"]),
    );
    assert_eq!(replica.refused().expect("reads"), vec![]);
    assert_eq!(live_products(&replica), vec![2]);
}

/// The indexes on a table's foreign keys, by name.
fn foreign_key_indexes(replica: &magic_sync::replica::Replica<'_>, table: &str) -> Vec<String> {
    let mut stmt = replica
        .connection()
        .prepare(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1
               AND name LIKE '\\_magic\\_sync\\_fk\\_%' ESCAPE '\\' ORDER BY name",
        )
        .expect("prepares");
    let names = stmt
        .query_map([table], |r| r.get(0))
        .expect("reads")
        .collect::<Result<Vec<String>, _>>()
        .expect("names");
    names
}

#[test]
fn a_snapshot_fills_an_empty_table_without_its_foreign_key_indexes_and_builds_them_at_its_end() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let both = vec![
        "_magic_sync_fk_order_lines_order_id".to_string(),
        "_magic_sync_fk_order_lines_product_id".to_string(),
    ];
    assert_eq!(foreign_key_indexes(&replica, "order_lines"), both);
    let order = order(10, Some(1));
    let line = OrderLine {
        order_id: 10,
        line_no: 1,
        product_id: 1,
        qty: 2,
    };
    let first = [
        server.snapshot(vec![
            upserts(&[product(1, "tea")]),
            upserts(&[customer(1, "Ada")]),
            upserts(std::slice::from_ref(&order)),
        ]),
        server.down(vec![upserts(std::slice::from_ref(&line))]),
        server.end(&["products", "customers", "orders", "order_lines"]),
    ];
    apply_all(&mut replica, &first[..2]);
    assert!(
        foreign_key_indexes(&replica, "order_lines").is_empty(),
        "filled from empty, the table has no foreign key index until the end"
    );
    apply_all(&mut replica, &first[2..]);
    assert_eq!(foreign_key_indexes(&replica, "order_lines"), both);
    assert_eq!(count(&replica, "order_lines"), 1);

    // A snapshot over a table holding rows keeps its indexes throughout:
    // letting go of its rows asks what points at them.
    let again = [
        server.snapshot(vec![upserts(&[product(1, "tea")])]),
        server.down(vec![upserts(&[order]), upserts(&[line])]),
    ];
    apply_all(&mut replica, &again);
    assert_eq!(foreign_key_indexes(&replica, "order_lines"), both);
    assert_eq!(
        foreign_key_indexes(&replica, "orders"),
        vec!["_magic_sync_fk_orders_customer_id".to_string()]
    );
}

#[test]
fn a_replica_reopened_in_the_middle_of_a_snapshot_has_its_indexes_back() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let order = order(10, None);
    apply_all(&mut replica, &[server.snapshot(vec![upserts(&[order])])]);
    assert!(foreign_key_indexes(&replica, "orders").is_empty());
    drop(replica);
    let replica = site.open();
    assert_eq!(
        foreign_key_indexes(&replica, "orders"),
        vec!["_magic_sync_fk_orders_customer_id".to_string()]
    );
}

//! The end of a snapshot: of the tables it names, what the snapshot did not
//! send goes (or is retired, when the replica's own records point at it).

use crate::support::*;
use magic_sync::envelope::TableRows;

fn count(replica: &magic_sync::replica::Replica, table: &str) -> i64 {
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
fn foreign_key_indexes(replica: &magic_sync::replica::Replica, table: &str) -> Vec<String> {
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

/// Every index of `table` by name, the replica's own and the host's.
fn indexes(replica: &magic_sync::replica::Replica, table: &str) -> Vec<String> {
    let mut stmt = replica
        .connection()
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?1 AND sql IS NOT NULL ORDER BY name")
        .expect("prepares");
    let names = stmt
        .query_map([table], |r| r.get(0))
        .expect("reads")
        .collect::<Result<Vec<String>, _>>()
        .expect("names");
    names
}

/// `(order_id, line_no, qty)` of every order line.
fn lines(replica: &magic_sync::replica::Replica) -> Vec<(i64, i64, i64)> {
    let mut stmt = replica
        .connection()
        .prepare("SELECT order_id, line_no, qty FROM order_lines ORDER BY order_id, line_no")
        .expect("prepares");
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("reads")
        .collect::<Result<Vec<_>, _>>()
        .expect("rows");
    rows
}

fn line(order_id: i64, line_no: i32, qty: i32) -> OrderLine {
    OrderLine {
        order_id,
        line_no,
        product_id: 1,
        qty,
    }
}

#[test]
fn a_table_that_starts_empty_and_one_that_holds_rows_both_end_exact() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![upserts(&[
                product(1, "tea"),
                product(2, "jam"),
                product(3, "honey"),
                product(4, "salt"),
            ])],
            &["products"],
        ),
    );

    // Products hold rows, order lines none. The snapshot sends products 1,
    // 3 and 5, a line twice and one it lets go of again; product 3 is let go
    // of after it was sent.
    let again = [
        server.snapshot(vec![
            upserts(&[product(1, "tea"), product(3, "honey"), product(5, "rye")]),
            upserts(&[line(10, 1, 1), line(10, 2, 2), line(11, 1, 3)]),
        ]),
        server.down(vec![
            deletes("products", &[3]),
            upserts(&[line(10, 1, 4)]),
            TableRows {
                table: "order_lines".into(),
                deletes: vec![b"[11,1]".to_vec()],
                upserts: Vec::new(),
            },
        ]),
        server.end(&["products", "order_lines"]),
    ];
    apply_all(&mut replica, &again);
    assert_eq!(live_products(&replica), vec![1, 5]);
    assert_eq!(
        products(&replica).len(),
        2,
        "nothing points at what went: deleted, not retired"
    );
    assert_eq!(lines(&replica), vec![(10, 1, 4), (10, 2, 2)]);
    assert_eq!(
        foreign_key_indexes(&replica, "order_lines"),
        vec![
            "_magic_sync_fk_order_lines_order_id".to_string(),
            "_magic_sync_fk_order_lines_product_id".to_string(),
        ]
    );
}

#[test]
fn a_row_refused_during_a_snapshot_keeps_its_previous_copy() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![upserts(&[product(1, "tea"), product(2, "jam")])],
            &["products"],
        ),
    );
    let mut rows = upserts(&[product(1, "green tea"), product(3, "rye")]);
    rows.upserts[0].data = br#"{"id": 1, "name": 5, "barcode": null}"#.to_vec();
    apply_all(
        &mut replica,
        &server.whole_snapshot(vec![rows], &["products"]),
    );
    assert_eq!(
        products(&replica),
        vec![(1, "tea".into(), None), (3, "rye".into(), None)],
        "product 1 was sent, so it stays as it was; product 2 was not"
    );
    let refused = replica.refused().expect("reads");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].key, b"[1]".to_vec());
}

#[test]
fn a_unique_value_held_by_a_row_the_snapshot_has_not_sent_moves_to_the_row_it_sends() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    replica
        .connection()
        .execute_batch("CREATE UNIQUE INDEX products_barcode ON products (barcode)")
        .expect("the host's unique index");
    let with = |id: i64, barcode: &str| Product {
        id,
        name: format!("p{id}"),
        barcode: Some(barcode.into()),
    };
    apply_all(
        &mut replica,
        &server.whole_snapshot(vec![upserts(&[with(1, "X"), with(2, "Y")])], &["products"]),
    );
    // Product 1 is stale: product 3 takes its barcode at once. Product 2 was
    // sent already: product 4 cannot take its barcode, and is refused.
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![upserts(&[with(2, "Y"), with(3, "X"), with(4, "Y")])],
            &["products"],
        ),
    );
    assert_eq!(live_products(&replica), vec![2, 3]);
    let refused = replica.refused().expect("reads");
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].key, b"[4]".to_vec());
}

#[test]
fn a_replica_stopped_in_the_middle_of_a_snapshot_builds_what_it_set_aside_and_ends_exact() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    replica
        .connection()
        .execute_batch(
            "CREATE INDEX host_lines_qty ON order_lines (qty);
             CREATE UNIQUE INDEX host_lines_unique ON order_lines (order_id, line_no, qty);",
        )
        .expect("the host's indexes");
    let before = indexes(&replica, "order_lines");
    assert_eq!(before.len(), 4, "{before:?}");
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![upserts(&[
                product(1, "tea"),
                product(2, "jam"),
                product(3, "rye"),
            ])],
            &["products"],
        ),
    );

    // Order lines start empty: their indexes that are not unique are set
    // aside; products hold rows and keep theirs.
    apply_all(
        &mut replica,
        &[server.snapshot(vec![
            upserts(&[product(1, "tea")]),
            upserts(&[line(10, 1, 1)]),
        ])],
    );
    assert_eq!(
        indexes(&replica, "order_lines"),
        vec!["host_lines_unique".to_string()]
    );
    drop(replica);

    let mut replica = site.open();
    assert_eq!(
        indexes(&replica, "order_lines"),
        before,
        "built again on opening"
    );
    let set_aside: i64 = replica
        .connection()
        .query_row(
            "SELECT count(*) FROM _magic_sync_snapshot_indexes",
            [],
            |r| r.get(0),
        )
        .expect("counts");
    assert_eq!(set_aside, 0);

    apply_all(
        &mut replica,
        &[
            server.down(vec![
                upserts(&[product(3, "rye")]),
                upserts(&[line(10, 1, 5), line(10, 2, 2)]),
            ]),
            server.end(&["products", "order_lines"]),
        ],
    );
    assert_eq!(live_products(&replica), vec![1, 3]);
    assert_eq!(lines(&replica), vec![(10, 1, 5), (10, 2, 2)]);
    assert_eq!(indexes(&replica, "order_lines"), before);
}

#[test]
fn a_snapshot_begun_before_the_last_one_ended_builds_its_indexes_and_starts_over() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let before = indexes(&replica, "order_lines");
    apply_all(
        &mut replica,
        &[server.snapshot(vec![
            upserts(&[product(1, "tea"), product(2, "jam")]),
            upserts(&[line(10, 1, 1)]),
        ])],
    );
    assert_eq!(indexes(&replica, "order_lines"), Vec::<String>::new());
    // Begun again: products and order lines now hold rows, so both keep
    // their indexes, and what this one does not send goes at its end.
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![upserts(&[product(2, "jam")]), upserts(&[line(10, 2, 2)])],
            &["products", "order_lines"],
        ),
    );
    assert_eq!(indexes(&replica, "order_lines"), before);
    assert_eq!(live_products(&replica), vec![2]);
    assert_eq!(lines(&replica), vec![(10, 2, 2)]);
}

#[test]
fn a_snapshot_in_progress_under_an_earlier_version_ends_exact() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![upserts(&[
                product(1, "tea"),
                product(2, "jam"),
                product(3, "rye"),
            ])],
            &["products"],
        ),
    );
    apply_all(
        &mut replica,
        &[server.snapshot(vec![upserts(&[product(1, "tea")])])],
    );
    drop(replica);

    // As an earlier version left it: the keys sent so far in one table, and
    // no stale set.
    {
        let conn =
            rusqlite::Connection::open(site.dir.path().join("replica.sqlite3")).expect("opens");
        conn.execute_batch(
            "CREATE TABLE _magic_sync_snapshot_keys (
                 table_name TEXT NOT NULL, key TEXT NOT NULL, PRIMARY KEY (table_name, key)
             ) STRICT, WITHOUT ROWID;
             INSERT INTO _magic_sync_snapshot_keys VALUES ('products', '[1]');
             DELETE FROM _magic_sync_stale_products;",
        )
        .expect("the earlier version's bookkeeping");
    }

    let mut replica = site.open();
    apply_all(
        &mut replica,
        &[
            server.down(vec![upserts(&[product(3, "rye")])]),
            server.end(&["products"]),
        ],
    );
    assert_eq!(live_products(&replica), vec![1, 3]);
    let old: i64 = replica
        .connection()
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE name = '_magic_sync_snapshot_keys'",
            [],
            |r| r.get(0),
        )
        .expect("counts");
    assert_eq!(old, 0, "the earlier version's table is gone");
}

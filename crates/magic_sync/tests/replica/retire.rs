//! Letting go of a row the replica's own records still point at: it is
//! retired, purged once nothing points at it, and back to life when offered.

use crate::support::*;
use magic_sync::replica::Outcome;

/// A replica holding customers 1 and 2, and a sale of its own for customer 1.
fn with_a_sale(site: &Site, server: &mut Server) -> magic_sync::replica::Replica {
    let mut replica = site.open();
    let first = server.snapshot(vec![upserts(&[customer(1, "Ada"), customer(2, "Bob")])]);
    apply_all(&mut replica, &[first]);
    record_sale(&replica, "s1", 1);
    replica
}

#[test]
fn a_customer_a_sale_points_at_is_retired_and_purged_once_the_sale_is_gone() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = with_a_sale(&site, &mut server);

    let letting_go = server.down(vec![deletes("customers", &[1, 2])]);
    apply_all(&mut replica, std::slice::from_ref(&letting_go));
    let number = i64::try_from(letting_go.number).expect("fits");
    assert_eq!(
        customers(&replica),
        vec![(1, "Ada".into(), Some(number))],
        "the sale keeps its customer, retired; the other one goes"
    );

    replica
        .connection()
        .execute("DELETE FROM sales WHERE id = 's1'", [])
        .expect("the host prunes its sale");
    let next = server.down(vec![upserts(&[product(1, "tea")])]);
    let outcome = replica.apply(&bytes(&next)).expect("applies");
    assert_eq!(
        outcome,
        Outcome::Applied {
            number: next.number,
            refused: 0,
            purged: 1
        }
    );
    assert_eq!(customers(&replica), vec![]);
}

#[test]
fn only_the_replicas_own_records_keep_a_row_it_is_told_to_let_go_of() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let order = order(10, Some(1));
    let line = OrderLine {
        order_id: 10,
        line_no: 1,
        product_id: 5,
        qty: 2,
    };
    apply_all(
        &mut replica,
        &[server.snapshot(vec![
            upserts(&[customer(1, "Ada")]),
            upserts(&[product(5, "tea")]),
            upserts(&[order]),
            upserts(&[line]),
        ])],
    );
    record_sale(&replica, "s1", 1);

    // Parents first: the customer and the product are still pointed at when
    // let go of. The product only by a line the server sent, which is the
    // server's to let go of: it goes at once. The customer by the replica's
    // own sale: it is retired, and stays.
    let mut line_rows = deletes("order_lines", &[]);
    line_rows.deletes.push(b"[10,1]".to_vec());
    let message = server.down(vec![
        deletes("customers", &[1]),
        deletes("products", &[5]),
        line_rows,
        deletes("orders", &[10]),
    ]);
    let outcome = replica.apply(&bytes(&message)).expect("applies");
    assert!(
        matches!(outcome, Outcome::Applied { purged: 0, .. }),
        "{outcome:?}"
    );
    assert_eq!(products(&replica), vec![]);
    let number = i64::try_from(message.number).expect("fits");
    assert_eq!(customers(&replica), vec![(1, "Ada".into(), Some(number))]);
}

#[test]
fn a_retired_row_offered_again_comes_back_to_life() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = with_a_sale(&site, &mut server);
    apply_all(
        &mut replica,
        &[server.down(vec![deletes("customers", &[1])])],
    );
    assert!(customers(&replica)[0].2.is_some(), "retired");

    apply_all(
        &mut replica,
        &[server.down(vec![upserts(&[customer(1, "Ada Lovelace")])])],
    );
    assert_eq!(
        customers(&replica),
        vec![(1, "Ada Lovelace".into(), None), (2, "Bob".into(), None)]
    );
    let digest = replica.digest().expect("digests");
    let customers_held = digest
        .tables
        .iter()
        .find(|t| t.table == "customers")
        .map(|t| t.rows);
    assert_eq!(customers_held, Some(2), "a live row counts again");
}

#[test]
fn a_table_without_a_retired_column_lets_go_regardless() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let order = order(10, None);
    let line = OrderLine {
        order_id: 10,
        line_no: 1,
        product_id: 5,
        qty: 2,
    };
    apply_all(
        &mut replica,
        &[server.snapshot(vec![upserts(&[order]), upserts(&[line])])],
    );
    apply_all(&mut replica, &[server.down(vec![deletes("orders", &[10])])]);
    let orders: i64 = replica
        .connection()
        .query_row("SELECT count(*) FROM orders", [], |r| r.get(0))
        .expect("counts");
    assert_eq!(orders, 0, "orders have no retired column");
}

#[test]
fn a_foreign_key_naming_what_is_not_declared_is_refused_at_open() {
    let site = Site::new();
    let mut fks = foreign_keys();
    fks.push(magic_sync::replica::ForeignKey::new(
        "sales",
        &["product_id"],
        "products",
        &["id"],
    ));
    let err = magic_sync::replica::Replica::open_with_foreign_keys(
        site.dir.path().join("replica.sqlite3"),
        UNIT,
        engine(),
        fks,
    )
    .expect_err("sales has no product_id");
    let text = err.to_string();
    assert!(
        text.contains("`sales`") && text.contains("`product_id`"),
        "{text}"
    );
}

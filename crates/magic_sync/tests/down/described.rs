//! Replicas learn the foreign keys among their tables from the server, which
//! reads them from its catalogue: the host opens a replica with its build's
//! declarations alone.

use crate::fleet::Fleet;
use crate::shop;
use magic_sync::replica::{ForeignKey, Replica};
use magic_sync::Engine;

fn sorted(mut fks: Vec<ForeignKey>) -> Vec<ForeignKey> {
    fks.sort();
    fks
}

fn points(fks: &[ForeignKey], child: &str, parent: &str) -> bool {
    fks.iter()
        .any(|fk| fk.child == child && fk.parent == parent)
}

#[tokio::test]
async fn a_replica_opened_without_foreign_keys_gets_them_from_the_server() {
    let mut fleet = Fleet::new(shop::ROWS).await;
    fleet.add("u1", Some("north"));
    assert!(
        fleet.unit("u1").replica.schema().foreign_keys().is_empty(),
        "its host told it none"
    );
    assert!(!fleet.configured(), "nor did the server yet");
    fleet.sync().await;
    fleet.check().await;
    let told = sorted(fleet.unit("u1").replica.schema().foreign_keys());
    assert_eq!(told, sorted(fleet.foreign_keys()));
    assert!(points(&told, "sales", "customers"), "{told:?}");
    let configuration = fleet.unit("u1").replica.configuration().unwrap();
    assert!(
        configuration.complete && configuration.disagreements.is_empty(),
        "{configuration:?}"
    );
    // The description is whole: it reads back as the server's schema, to
    // the fingerprint, with nothing of the replica's build.
    let described = fleet.unit("u1").replica.described().unwrap().clone();
    let server = magic_sync::core::schema::Schema::new(&fleet.engine, &fleet.foreign_keys());
    assert_eq!(
        magic_sync::core::schema::Schema::from_described(&described),
        Ok(server)
    );
    // Kept in its file: opened again with nothing, it follows them still.
    let path = fleet.unit("u1").path.clone();
    let again = Replica::open(&path, "u1", &fleet.engine).unwrap();
    assert_eq!(sorted(again.schema().foreign_keys()), told);
}

/// The shop without its sales: nothing of a till's own points at anything.
fn without_sales() -> Engine {
    Engine::builder()
        .table::<shop::Product>()
        .table::<shop::Customer>()
        .table::<shop::Order>()
        .table::<shop::OrderLine>()
        .table::<shop::Notice>()
        .table::<shop::Promotion>()
        .table::<shop::Stock>()
        .table::<shop::Event>()
        .table::<shop::Shipment>()
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_replica_kept_up_learns_a_new_foreign_key_before_anything_of_the_build_that_brings_it() {
    let schema = format!("{}\n{}", shop::SQL, shop::ROWS);
    let mut fleet = Fleet::of(&schema, without_sales()).await;
    fleet.add("u1", Some("north"));
    fleet.sync().await;
    fleet.check().await;
    let before = fleet.unit("u1").replica.schema().foreign_keys();
    assert!(points(&before, "orders", "customers"), "{before:?}");
    assert!(!points(&before, "sales", "customers"), "{before:?}");

    // A build that declares the tills' sales, which point at customers.
    fleet.redeploy(shop::engine()).await;
    let reopened = fleet.unit("u1").replica.schema().foreign_keys();
    assert_eq!(
        sorted(reopened),
        sorted(before),
        "the old description stands"
    );
    let configuration = fleet.unit("u1").replica.configuration().unwrap();
    assert!(!configuration.complete, "{configuration:?}");
    assert!(
        configuration
            .disagreements
            .iter()
            .any(|d| d.contains("`sales`")),
        "the server's description lacks the table this build declares: {configuration:?}"
    );
    let step = fleet.record().await;
    assert_eq!(step.described, 1, "{step:?}");
    fleet.deliver().await;
    let after = fleet.unit("u1").replica.schema().foreign_keys();
    assert!(points(&after, "sales", "customers"), "{after:?}");
    assert_eq!(sorted(after), sorted(fleet.foreign_keys()));
    fleet.sync().await;
    fleet.check().await;
    assert!(fleet.configured());
    assert!(fleet
        .unit("u1")
        .replica
        .configuration()
        .unwrap()
        .disagreements
        .is_empty());
    assert_eq!(fleet.provisionings, 1, "nobody was provisioned again");

    // What the new foreign key decides: a sale of the till's keeps the
    // customer the server takes back.
    fleet
        .unit("u1")
        .replica
        .connection()
        .execute_batch(
            "INSERT INTO sales (id, unit_id, customer_id, total, version)
             VALUES ('s1', 'u1', 7, '9.50', 1)",
        )
        .unwrap();
    fleet
        .settle("UPDATE orders SET customer_id = NULL WHERE id = 1")
        .await;
    let retired: Option<i64> = fleet
        .unit("u1")
        .replica
        .connection()
        .query_row("SELECT retired FROM customers WHERE id = 7", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(retired.is_some(), "customer 7 is retired, not deleted");
}

/// A till with no declarations of its own, beside one built with the
/// shop's: it holds exactly what the server describes and sends, and what
/// its app writes with a plain SQLite connection goes up and is filed.
#[tokio::test]
async fn a_replica_with_no_declarations_follows_the_server_and_its_app_writes_go_up() {
    let mut fleet = Fleet::new(shop::ROWS).await;
    fleet.add("u1", Some("north"));
    fleet.add_described("u2", Some("north"));
    assert!(
        fleet.unit("u2").replica.schema().tables().is_empty(),
        "before the server says, it holds no table"
    );
    fleet.sync().await;
    fleet.check().await;
    // It holds what the server's build declares, to the fingerprint.
    let server = magic_sync::core::schema::Schema::new(&fleet.engine, &fleet.foreign_keys());
    assert_eq!(fleet.unit("u2").replica.schema(), &server);
    let configuration = fleet.unit("u2").replica.configuration().unwrap();
    assert!(configuration.complete, "{configuration:?}");
    assert_eq!(configuration.own, server.fingerprint());

    // The app writes a sale and counts its shelf, on a connection of its
    // own, knowing nothing of magic_sync.
    let path = fleet.unit("u2").path.clone();
    let app = rusqlite::Connection::open(&path).unwrap();
    app.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    app.execute_batch(
        "INSERT INTO sales (id, unit_id, customer_id, total, version)
             VALUES ('s-u2-1', 'u2', 8, '9.50', 1);
         UPDATE stock SET counted = 4 WHERE unit_id = 'u2' AND product_id = 2;",
    )
    .unwrap();
    drop(app);
    fleet.upload(std::time::Duration::ZERO).await;
    let sale: (String, Option<i64>, String) = fleet
        .writer
        .query_one(
            "SELECT unit_id, customer_id, total::text FROM sales WHERE id = 's-u2-1'",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    assert_eq!(sale, ("u2".into(), Some(8), "9.50".into()));
    let counted: Option<i32> = fleet
        .writer
        .query_one(
            "SELECT counted FROM stock WHERE unit_id = 'u2' AND product_id = 2",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(counted, Some(4));
    assert_eq!(fleet.unit("u2").replica.status().unwrap().unfiled, 0);

    // The server's changes keep coming; opened again, it follows the
    // description it kept.
    fleet
        .settle("UPDATE products SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.check().await;
    let again = Replica::open_described(&path, "u2").unwrap();
    assert_eq!(again.schema(), &server);
}

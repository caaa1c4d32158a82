//! The table graph, read from the catalogue.

use crate::shop;
use magic_sync::catalog::{Catalog, ForeignKey};

fn fk(
    child: &'static str,
    cc: &[&str],
    parent: &'static str,
    pc: &[&str],
) -> (String, Vec<String>, String, Vec<String>) {
    (
        child.to_string(),
        cc.iter().map(|c| c.to_string()).collect(),
        parent.to_string(),
        pc.iter().map(|c| c.to_string()).collect(),
    )
}

fn shape(f: &ForeignKey) -> (String, Vec<String>, String, Vec<String>) {
    (
        f.child.to_string(),
        f.child_columns.clone(),
        f.parent.to_string(),
        f.parent_columns.clone(),
    )
}

#[tokio::test]
async fn foreign_keys_between_declared_tables_are_read_from_the_catalogue() {
    let (_db, client) = shop::installed().await;
    let catalog = Catalog::read(&client, &shop::engine()).await.unwrap();
    let mut found: Vec<_> = catalog.foreign_keys.iter().map(shape).collect();
    found.sort();
    let mut expected = vec![
        fk("orders", &["customer_id"], "customers", &["id"]),
        fk("order_lines", &["order_id"], "orders", &["id"]),
        fk("order_lines", &["product_id"], "products", &["id"]),
        fk("promotions", &["product_id"], "products", &["id"]),
        fk("stock", &["product_id"], "products", &["id"]),
        fk("sales", &["customer_id"], "customers", &["id"]),
        // Composite, to a partitioned table, from another schema.
        fk(
            "shipments",
            &["region", "event_id"],
            "events",
            &["region", "id"],
        ),
        // Self-referencing.
        fk("shipments", &["parent_id"], "shipments", &["id"]),
    ];
    expected.sort();
    assert_eq!(found, expected);
    // promotion_members -> promotions is between a group table and a declared one: not in the graph.
    assert!(catalog
        .foreign_keys
        .iter()
        .all(|f| f.child != "promotion_members"));
}

#[tokio::test]
async fn partitions_columns_and_unique_keys_are_read() {
    let (_db, client) = shop::installed().await;
    let catalog = Catalog::read(&client, &shop::engine()).await.unwrap();
    let events = catalog.relation("public", "events").expect("events");
    assert!(events.partitioned);
    assert_eq!(
        events.partitions,
        vec![
            ("public".to_string(), "events_north".to_string()),
            ("public".to_string(), "events_south".to_string())
        ]
    );
    assert!(events.is_unique(&["id", "region"]));
    let products = catalog.relation("public", "products").unwrap();
    assert!(products.is_unique(&["id"]));
    assert!(products.is_unique(&["barcode"]));
    assert!(!products.is_unique(&["name"]));
    assert_eq!(products.column("price").unwrap().type_name, "numeric(10,2)");
    assert!(catalog.relation("logistics", "shipments").is_some());
    assert_eq!(
        catalog.pointing_columns("shipments"),
        vec![
            "parent_id".to_string(),
            "region".to_string(),
            "event_id".to_string()
        ]
    );
}

/// The schema a replica's database is made of, as the server builds it from
/// its catalogue, is the one a replica opened with the catalogue's foreign
/// keys has: same tables, same foreign keys, same fingerprints.
#[tokio::test]
async fn the_servers_schema_and_a_replicas_agree() {
    let (_db, client) = shop::installed().await;
    let engine = shop::engine();
    let catalog = Catalog::read(&client, &engine).await.unwrap();
    let schema = catalog.schema(&engine);
    assert_eq!(schema.tables().len(), engine.tables().count());
    let orders = schema.table("orders").unwrap();
    assert_eq!(
        orders.foreign_keys,
        vec![magic_sync::replica::ForeignKey::new(
            "orders",
            &["customer_id"],
            "customers",
            &["id"]
        )]
    );
    let dir = tempfile::tempdir().unwrap();
    let replica = magic_sync::replica::Replica::open_with_foreign_keys(
        dir.path().join("u1.sqlite"),
        "u1",
        &engine,
        catalog.replica_foreign_keys(),
    )
    .unwrap();
    assert_eq!(replica.schema(), &schema);
    assert_eq!(replica.schema().fingerprint(), schema.fingerprint());
    // Without its foreign keys, `orders` is another table to a replica
    // (what it retires rather than deletes depends on them); the others
    // that point at nothing are not.
    let bare = magic_sync::core::schema::Schema::new(&engine, &[]);
    assert_ne!(
        bare.table("orders").unwrap().fingerprint(),
        orders.fingerprint()
    );
    assert_eq!(
        bare.table("products").unwrap().fingerprint(),
        schema.table("products").unwrap().fingerprint()
    );
}

//! The server refuses to start while a trigger or a declaration is wrong, and
//! says which.

use crate::shop;
use magic_sync::{check, Engine, Error, Numeric, Row};

fn message(result: magic_sync::Result<magic_sync::catalog::Catalog>) -> String {
    match result {
        Ok(_) => panic!("start-up should have been refused"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn a_correct_installation_starts() {
    let (_db, client) = shop::installed().await;
    let catalog = check::startup(&shop::engine(), &client)
        .await
        .expect("starts");
    assert_eq!(catalog.relations.len(), 12);
}

#[tokio::test]
async fn a_missing_trigger_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("DROP TRIGGER magic_sync_note ON orders")
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("trigger `magic_sync_note` on `public.orders`: is missing"),
        "{m}"
    );
}

#[tokio::test]
async fn a_missing_truncate_trigger_on_a_new_partition_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("CREATE TABLE events_east PARTITION OF events FOR VALUES IN ('east')")
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("trigger `magic_sync_no_truncate` on `public.events_east`: is missing"),
        "{m}"
    );
    // Reinstalling covers the new partition.
    let mut client = client;
    magic_sync::trigger::install(&shop::engine(), &mut client)
        .await
        .unwrap();
    check::startup(&shop::engine(), &client)
        .await
        .expect("starts after reinstall");
}

#[tokio::test]
async fn a_disabled_trigger_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("ALTER TABLE notices DISABLE TRIGGER magic_sync_note")
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("trigger `magic_sync_note` on `public.notices`: is disabled"),
        "{m}"
    );
}

#[tokio::test]
async fn a_trigger_disabled_on_one_partition_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("ALTER TABLE events_south DISABLE TRIGGER magic_sync_note")
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("trigger `magic_sync_note` on `public.events_south`: is disabled"),
        "{m}"
    );
}

#[tokio::test]
async fn a_trigger_enabled_only_for_origin_sessions_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute("ALTER TABLE notices ENABLE TRIGGER magic_sync_note")
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("on `public.notices`: is not ENABLE ALWAYS"),
        "{m}"
    );
}

#[tokio::test]
async fn a_tampered_trigger_function_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "CREATE OR REPLACE FUNCTION sync.note_public_products() RETURNS trigger
             LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$",
        )
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("trigger `magic_sync_note` on `public.products`: function sync.note_public_products() differs"),
        "{m}"
    );
}

#[tokio::test]
async fn a_trigger_pointed_at_another_function_or_events_refuses_start_up() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "CREATE FUNCTION public.quiet() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
             DROP TRIGGER magic_sync_note ON customers;
             CREATE TRIGGER magic_sync_note AFTER INSERT ON customers FOR EACH ROW EXECUTE FUNCTION public.quiet();
             ALTER TABLE customers ENABLE ALWAYS TRIGGER magic_sync_note;
             DROP TRIGGER magic_sync_note ON notices;
             CREATE TRIGGER magic_sync_note AFTER INSERT ON notices FOR EACH ROW EXECUTE FUNCTION sync.note_public_notices();
             ALTER TABLE notices ENABLE ALWAYS TRIGGER magic_sync_note;",
        )
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains("on `public.customers`: calls public.quiet()"),
        "{m}"
    );
    assert!(
        m.contains("on `public.notices`: fires on other events"),
        "{m}"
    );
}

#[tokio::test]
async fn a_schema_behind_the_build_refuses_start_up() {
    let db = magic_sync_testdb::database().await;
    let client = db.connect().await;
    client.batch_execute(shop::SQL).await.unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(m.contains("run the migrations first"), "{m}");
}

// Declarations that disagree with the database, one table each.

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
pub(crate) struct ProductWithColour {
    id: i64,
    name: String,
    colour: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct ProductPricedInCents {
    id: i64,
    price: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id))]
struct ProductWithRequiredBarcode {
    id: i64,
    barcode: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(name))]
struct ProductKeyedByName {
    id: i64,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "notices", down, follows = "region_id", key(id))]
struct NoticeFollowingNothing {
    id: i64,
    region_id: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "notices", down, referenced, key(id))]
struct NoticeReferencedByNothing {
    id: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "invoices", down, all, key(id))]
struct Invoice {
    id: i64,
    total: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "promotions",
    down,
    group(
        members = "promo_members",
        member = "promotion_id",
        grants = "unit_groups",
        replica = "till_id"
    ),
    key(id)
)]
struct PromotionWithWrongGroups {
    id: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id), retired = "name")]
struct ProductRetiredOverAColumn {
    id: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "rates", down, referenced, key(code))]
struct Rate {
    code: Numeric,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "tabs", down, all, key(id))]
struct Tab {
    id: i64,
    rate: Numeric,
}

/// What the start-up check says refusing `engine` over a database of its
/// own holding `schema`.
async fn refused_over(schema: &str, engine: Engine) -> String {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(schema).await.unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let err = check::startup(&engine, &client).await.expect_err("refused");
    assert!(matches!(err, Error::Declarations(_)), "{err}");
    err.to_string()
}

#[tokio::test]
async fn a_foreign_key_that_prints_differently_from_its_key_is_refused() {
    let engine = Engine::builder()
        .table::<Rate>()
        .table::<Tab>()
        .build()
        .unwrap();
    let m = refused_over(
        "CREATE TABLE rates (code numeric(12, 4) PRIMARY KEY);
         CREATE TABLE tabs (id bigint PRIMARY KEY, rate numeric(10, 2) NOT NULL REFERENCES rates);",
        engine,
    )
    .await;
    assert!(
        m.contains("table `tabs`, column `rate`")
            && m.contains("numeric(10,2) but points at `rates.code`, which is numeric(12,4)"),
        "{m}"
    );
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "bays", down, all, key(id))]
struct Bay {
    id: i64,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "crates", both, all, key(id))]
struct Crate {
    id: i64,
    /// The replica may move a crate to another bay: not its to say.
    #[row(owned)]
    bay_id: i64,
    #[row(owned)]
    note: String,
}

#[tokio::test]
async fn an_owned_column_that_points_at_a_parent_is_refused() {
    let engine = Engine::builder()
        .table::<Bay>()
        .table::<Crate>()
        .build()
        .unwrap();
    let m = refused_over(
        "CREATE TABLE bays (id bigint PRIMARY KEY);
         CREATE TABLE crates (id bigint PRIMARY KEY, bay_id bigint NOT NULL REFERENCES bays,
                              note text NOT NULL);",
        engine,
    )
    .await;
    assert!(
        m.contains("table `crates`, column `bay_id`: is owned by the replica")
            && m.contains("part of foreign key `crates_bay_id_fkey` to `bays`"),
        "{m}"
    );
    assert!(!m.contains("column `note`"), "{m}");
}

async fn refused<R: Row>() -> String {
    let (_db, client) = shop::installed().await;
    let engine = Engine::builder().table::<R>().build().unwrap();
    let err = check::startup(&engine, &client).await.expect_err("refused");
    assert!(matches!(err, Error::Declarations(_)), "{err}");
    err.to_string()
}

#[tokio::test]
async fn each_declaration_mismatch_names_table_and_column() {
    let cases: Vec<(String, &str)> = vec![
        (
            refused::<ProductWithColour>().await,
            "table `products`, column `colour`: declared by field `ProductWithColour::colour`, but the table has no such column",
        ),
        (
            refused::<ProductPricedInCents>().await,
            "table `products`, column `price`: the field is i64, which does not fit the column's type numeric(10,2)",
        ),
        (
            refused::<ProductWithRequiredBarcode>().await,
            "table `products`, column `barcode`: the column can be NULL, but its field is not an Option",
        ),
        (
            refused::<ProductKeyedByName>().await,
            "table `products`: the declared key (name) is not unique in the database",
        ),
        (
            refused::<NoticeFollowingNothing>().await,
            "table `notices`, column `region_id`: the table follows its parent through these columns, but no foreign key",
        ),
        (
            refused::<NoticeReferencedByNothing>().await,
            "table `notices`: declared `referenced`, but no foreign key of a declared table points at it",
        ),
        (
            refused::<Invoice>().await,
            "table `invoices`: declared by `Invoice`, but schema `public` has no such table",
        ),
        (
            refused::<PromotionWithWrongGroups>().await,
            "table `promo_members`: a group rule names this table, but schema `public` has no such table",
        ),
        (
            refused::<ProductRetiredOverAColumn>().await,
            "table `products`, column `name`: is declared as the replica's retired column, but the server table has a column of that name",
        ),
    ];
    for (message, expected) in cases {
        assert!(
            message.contains(expected),
            "expected {expected:?} in:\n{message}"
        );
    }
    let m = refused::<PromotionWithWrongGroups>().await;
    assert!(
        m.contains("table `unit_groups`, column `till_id`: a group rule names this column"),
        "{m}"
    );
}

#[tokio::test]
async fn a_missing_index_the_relay_needs_refuses_start_up_and_names_the_statement() {
    let (_db, client) = shop::installed().await;
    client
        .batch_execute(
            "DROP INDEX logistics.shipments_event; DROP INDEX promotion_members_promotion;",
        )
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains(
            r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "shipments_region_event_id_idx" ON "logistics"."shipments" ("region", "event_id")"#
        ),
        "{m}"
    );
    assert!(
        m.contains(
            r#"CREATE INDEX CONCURRENTLY IF NOT EXISTS "promotion_members_promotion_id_idx" ON "public"."promotion_members" ("promotion_id")"#
        ),
        "{m}"
    );
    // The same list, for a host to print; each statement makes its index,
    // and then the relay starts.
    let missing = check::missing_indexes(&shop::engine(), &client)
        .await
        .unwrap();
    assert_eq!(missing.len(), 2, "{missing:?}");
    for index in &missing {
        client.batch_execute(&index.create_sql()).await.unwrap();
    }
    assert!(check::missing_indexes(&shop::engine(), &client)
        .await
        .unwrap()
        .is_empty());
    check::startup(&shop::engine(), &client)
        .await
        .expect("starts once the indexes are made");
}

#[tokio::test]
async fn any_index_leading_with_the_following_columns_will_do() {
    let (_db, client) = shop::installed().await;
    // Columns in another order, and more of them, still find a parent's
    // followers; a unique constraint is an index too.
    client
        .batch_execute(
            "DROP INDEX logistics.shipments_event;
             CREATE INDEX shipments_wide ON logistics.shipments (event_id, region, id);",
        )
        .await
        .unwrap();
    check::startup(&shop::engine(), &client)
        .await
        .expect("starts");
    client
        .batch_execute(
            "DROP INDEX logistics.shipments_wide;
             CREATE INDEX shipments_partial ON logistics.shipments (region, event_id) WHERE id > 0;",
        )
        .await
        .unwrap();
    let m = message(check::startup(&shop::engine(), &client).await);
    assert!(
        m.contains(r#"ON "logistics"."shipments" ("region", "event_id")"#),
        "{m}"
    );
}

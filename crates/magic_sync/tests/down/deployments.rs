//! Deploying changed declarations: a new build starts, and replicas get only
//! what its declarations change. Nobody is provisioned again; the record and
//! every replica stay exact throughout; a table nobody declares any more is
//! taken back without reading it.

use crate::fleet::{replica_rows, Fleet};
use magic_sync::deploy::{self, Action};
use magic_sync::{Engine, Row};

/// The schema of every build here: regions, the shops in them, the items of
/// each shop, and tips per region.
const SCHEMA: &str = "
CREATE TABLE regions (id text PRIMARY KEY, name text NOT NULL);
CREATE TABLE shops (
    id bigint PRIMARY KEY,
    unit text NOT NULL,
    region text NOT NULL REFERENCES regions,
    name text NOT NULL
);
CREATE TABLE items (
    id bigint PRIMARY KEY,
    shop bigint NOT NULL REFERENCES shops,
    label text NOT NULL,
    price numeric
);
CREATE INDEX ON items (shop);
CREATE TABLE tips (id bigint PRIMARY KEY, region text NOT NULL REFERENCES regions, body text NOT NULL);
INSERT INTO regions VALUES ('north', 'North'), ('south', 'South');
INSERT INTO shops VALUES (1, 'u1', 'north', 'one'), (2, 'u2', 'north', 'two'), (3, 'u2', 'south', 'three');
INSERT INTO items SELECT i, 1 + i % 3, 'item ' || i, i * 1.5 FROM generate_series(1, 30) i;
INSERT INTO tips SELECT i, CASE WHEN i % 2 = 0 THEN 'north' ELSE 'south' END, 'tip ' || i
    FROM generate_series(1, 10) i;
";

/// The first build's declarations.
mod v1 {
    use magic_sync::Row;

    #[derive(Row, Debug, Clone)]
    #[row(table = "regions", down, referenced, key(id))]
    pub struct Region {
        pub id: String,
        pub name: String,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "shops", down, replica = "unit", key(id))]
    pub struct Shop {
        pub id: i64,
        pub unit: String,
        pub region: String,
        pub name: String,
    }

    #[derive(Row, Debug, Clone)]
    #[row(table = "items", down, follows = "shop", key(id))]
    pub struct Item {
        pub id: i64,
        pub shop: i64,
        pub label: String,
    }
}

/// Later builds' declarations of the same tables.
mod v2 {
    use magic_sync::Row;

    /// Shops by region rather than by unit.
    #[derive(Row, Debug, Clone)]
    #[row(table = "shops", down, partition = "region", key(id))]
    pub struct ShopByRegion {
        pub id: i64,
        pub unit: String,
        pub region: String,
        pub name: String,
    }

    /// Items with their price.
    #[derive(Row, Debug, Clone)]
    #[row(table = "items", down, follows = "shop", key(id))]
    pub struct PricedItem {
        pub id: i64,
        pub shop: i64,
        pub label: String,
        pub price: Option<magic_sync::Numeric>,
    }

    /// Each replica's own region by its rule, rather than only as the
    /// shops' parent.
    #[derive(Row, Debug, Clone)]
    #[row(table = "regions", down, partition = "id", key(id))]
    pub struct OwnRegion {
        pub id: String,
        pub name: String,
    }

    /// Tips, to every replica of their region.
    #[derive(Row, Debug, Clone)]
    #[row(table = "tips", down, partition = "region", key(id))]
    pub struct Tip {
        pub id: i64,
        pub region: String,
        pub body: String,
    }

    /// Tips under the name the host renamed them to.
    #[derive(Row, Debug, Clone)]
    #[row(table = "hints", down, partition = "region", key(id))]
    pub struct Hint {
        pub id: i64,
        pub region: String,
        pub body: String,
    }

    /// The first build's shops, declared by another struct, in another
    /// engine order: nothing replicas can tell apart.
    #[derive(Row, Debug, Clone)]
    #[row(table = "shops", down, replica = "unit", key(id))]
    pub struct Store {
        pub id: i64,
        pub unit: String,
        pub region: String,
        pub name: String,
    }
}

fn first_build() -> Engine {
    Engine::builder()
        .table::<v1::Region>()
        .table::<v1::Shop>()
        .table::<v1::Item>()
        .build()
        .unwrap()
}

/// The first build with the tips declared.
fn with_tips() -> Engine {
    Engine::builder()
        .table::<v1::Region>()
        .table::<v1::Shop>()
        .table::<v1::Item>()
        .table::<v2::Tip>()
        .build()
        .unwrap()
}

/// The first build's fleet, provisioned and checked: u1 in the north, u2
/// in the south.
async fn fleet() -> Fleet {
    let mut fleet = Fleet::of(SCHEMA, first_build()).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    assert!(
        fleet.configured(),
        "a snapshot's end says the configuration is whole"
    );
    fleet
}

/// What a deployment sent and took back, over every replica, until the
/// fleet settled; checked as it goes, every pass.
#[derive(Debug, Default, PartialEq, Eq)]
struct Moved {
    sends: u64,
    deletes: u64,
    passes: u64,
}

async fn settle(fleet: &mut Fleet) -> Moved {
    let mut moved = Moved::default();
    for _ in 0..100 {
        let step = fleet.record().await;
        assert!(step.provisioned.is_empty(), "nobody is provisioned again");
        let applied = fleet.deliver().await;
        moved.sends += step.planned.sends;
        moved.deletes += step.planned.deletes;
        if step.deployed.is_some() {
            moved.passes += 1;
        }
        // At no point does a replica hold a row without its parents.
        fleet.check_orphans();
        let busy = step.messages > 0
            || step.planned.notes > 0
            || step.deployed.is_some()
            || !step.waiting.is_empty();
        if !busy && applied == 0 {
            return moved;
        }
    }
    panic!("the deployment did not settle in 100 passes");
}

/// Rows of `table` recorded held, over every replica.
async fn held(fleet: &Fleet, table: &str) -> i64 {
    fleet
        .writer
        .query_one(
            "SELECT count(*) FROM sync.held WHERE table_name = $1",
            &[&table],
        )
        .await
        .unwrap()
        .get(0)
}

/// The message that last carried each held row of `table`, per replica.
async fn carried(fleet: &Fleet, table: &str) -> Vec<(String, String, i64)> {
    fleet
        .writer
        .query(
            "SELECT replica, key, message FROM sync.held WHERE table_name = $1 ORDER BY 1, 2",
            &[&table],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

async fn deployment_done(fleet: &Fleet) -> Vec<(String, String, bool)> {
    deploy::progress(&fleet.writer)
        .await
        .unwrap()
        .into_iter()
        .map(|p| (p.table, p.work, p.done))
        .collect()
}

#[tokio::test]
async fn a_new_table_reaches_every_replica_that_wants_it_and_nobody_is_provisioned_again() {
    let mut fleet = fleet().await;
    let regions_before = carried(&fleet, "regions").await;
    let second = with_tips();
    let dry = deploy::dry_run(&mut fleet.writer, &second).await.unwrap();
    assert_eq!(dry.reused, ["items", "regions", "shops"]);
    assert_eq!(dry.changes.len(), 1, "{dry}");
    assert_eq!(
        (dry.changes[0].table.as_str(), dry.changes[0].action),
        ("tips", Action::Add)
    );
    let ensured = fleet.redeploy(second).await;
    assert!(
        ensured.provisioned.is_empty(),
        "a table new to the sync provisions no one: {ensured:?}"
    );
    // The tills run the new build: until the deployment is done, what they
    // hold is not its configuration whole.
    assert!(!fleet.configured());
    let first = fleet.record().await;
    assert_eq!(first.deployed, Some(("tips".to_string(), 4)));
    fleet.deliver().await;
    assert!(!fleet.configured(), "a deployment part way is not whole");
    // The operator sees it under way: not settled, and how far it got.
    let mut operator = fleet.db.connect().await;
    let read = magic_sync::ops::settled(&mut operator, &magic_sync::ops::Scope::All)
        .await
        .unwrap();
    assert!(!read.settled && read.deploying == 1, "{read:?}");
    assert!(
        read.says
            .contains("a deployment is under way: 1 tables, 4 of about 10 rows"),
        "{}",
        read.says
    );
    let moved = settle(&mut fleet).await;
    assert!(
        fleet.configured(),
        "the deployment done, the replicas are told"
    );
    let read = magic_sync::ops::settled(&mut operator, &magic_sync::ops::Scope::All)
        .await
        .unwrap();
    assert!(read.settled, "{read:?}");
    let overview = magic_sync::ops::overview(&mut operator, &magic_sync::ops::Scope::All, 5)
        .await
        .unwrap();
    assert_eq!(overview.deployment.len(), 1);
    assert_eq!(
        (
            overview.deployment[0].rows_done,
            overview.deployment[0].done
        ),
        (10, true)
    );
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2, "nobody was provisioned again");
    // u1 (north) wants the five even tips, u2 (south) the five odd ones;
    // each holds its region already.
    assert_eq!(moved.sends + first.planned.sends, 10, "{moved:?}");
    assert_eq!(moved.deletes, 0);
    // Ten tips, four a pass: three passes.
    assert_eq!(moved.passes + 1, 3, "{moved:?}");
    assert_eq!(
        carried(&fleet, "regions").await,
        regions_before,
        "the regions the tips point at were held already, and not sent again"
    );
    assert_eq!(
        deployment_done(&fleet).await,
        [("tips".into(), "plan".into(), true)]
    );
    // The next build with the same declarations has nothing to do.
    let third = with_tips();
    assert!(deploy::dry_run(&mut fleet.writer, &third)
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn a_changed_rule_sends_exactly_the_difference_with_parents_and_followers() {
    let mut fleet = fleet().await;
    let items_u1_before: Vec<_> = carried(&fleet, "items")
        .await
        .into_iter()
        .filter(|(r, _, _)| r == "u1")
        .collect();
    let second = Engine::builder()
        .table::<v1::Region>()
        .table::<v2::ShopByRegion>()
        .table::<v1::Item>()
        .build()
        .unwrap();
    let dry = deploy::dry_run(&mut fleet.writer, &second).await.unwrap();
    assert_eq!(dry.changes.len(), 1, "{dry}");
    assert_eq!(dry.changes[0].action, Action::Replan, "{dry}");
    assert!(
        dry.changes[0]
            .why
            .contains("rule replica(unit) → partition(region)"),
        "{dry}"
    );
    // Per replica and table, before anything changes: shop 2 and its ten
    // items move from u2 to u1, and u2 lets go of the north.
    assert!(dry.moves.exact, "{dry}");
    let per_replica: Vec<(&str, &str, u64, u64)> = dry
        .moves
        .moves
        .iter()
        .flat_map(|(r, tables)| {
            tables
                .iter()
                .map(move |(t, m)| (r.as_str(), t.as_str(), m.send, m.take_back))
        })
        .collect();
    assert_eq!(
        per_replica,
        [
            ("u1", "items", 10, 0),
            ("u1", "shops", 1, 0),
            ("u2", "items", 0, 10),
            ("u2", "regions", 0, 1),
            ("u2", "shops", 0, 1),
        ],
        "{dry}"
    );
    assert!(dry.to_string().contains("u2: items +0 -10"), "{dry}");
    fleet.redeploy(second).await;
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    // Before: u1 held shop 1, u2 shops 2 and 3, each with its ten items and
    // its regions. After: u1 (north) holds shops 1 and 2, u2 (south) shop 3.
    // Shop 2 and its ten items move from u2 to u1; u2 lets go of the north.
    // Shop 1 and 3 stay where they were, held by their rule then and now:
    // not sent at all.
    assert_eq!(moved.sends, 11, "{moved:?}");
    assert_eq!(moved.deletes, 12, "{moved:?}");
    let counted = dry.moves.totals();
    assert_eq!(
        (counted.send, counted.take_back),
        (moved.sends, moved.deletes),
        "the dry run counted what the deployment moved"
    );
    let items_u1_after: Vec<_> = carried(&fleet, "items")
        .await
        .into_iter()
        .filter(|(r, k, _)| r == "u1" && items_u1_before.iter().any(|(_, b, _)| b == k))
        .collect();
    assert_eq!(
        items_u1_after, items_u1_before,
        "the items u1 held stay as they were carried"
    );
}

#[tokio::test]
async fn a_rule_change_that_moves_no_row_sends_nothing_and_keeps_every_row_as_it_was_carried() {
    let mut fleet = fleet().await;
    let regions_before = carried(&fleet, "regions").await;
    // u1 (north) holds the north as shop 1's parent; u2 (south) holds the
    // north and the south as the parents of shops 2 and 3. By the partition
    // rule, each also wants its own region: which it holds already.
    let by_partition = Engine::builder()
        .table::<v2::OwnRegion>()
        .table::<v1::Shop>()
        .table::<v1::Item>()
        .build()
        .unwrap();
    let dry = deploy::dry_run(&mut fleet.writer, &by_partition)
        .await
        .unwrap();
    assert_eq!(dry.changes.len(), 1, "{dry}");
    assert_eq!(dry.changes[0].action, Action::Replan, "{dry}");
    assert!(dry.moves.moves.is_empty(), "{dry}");
    fleet.redeploy(by_partition).await;
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!((moved.sends, moved.deletes), (0, 0), "{moved:?}");
    assert_eq!(carried(&fleet, "regions").await, regions_before);
    assert!(fleet.configured());
    // And back to rows held only as parents: still nothing moves.
    fleet.redeploy(first_build()).await;
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!((moved.sends, moved.deletes), (0, 0), "{moved:?}");
    assert_eq!(carried(&fleet, "regions").await, regions_before);
    assert_eq!(fleet.provisionings, 2);
    assert!(fleet.configured());
}

#[tokio::test]
async fn a_column_added_sends_that_table_again_and_nothing_else() {
    let mut fleet = fleet().await;
    let shops_before = carried(&fleet, "shops").await;
    let regions_before = carried(&fleet, "regions").await;
    let items_held = held(&fleet, "items").await;
    let second = Engine::builder()
        .table::<v1::Region>()
        .table::<v1::Shop>()
        .table::<v2::PricedItem>()
        .build()
        .unwrap();
    let dry = deploy::dry_run(&mut fleet.writer, &second).await.unwrap();
    assert_eq!(dry.changes.len(), 1, "{dry}");
    let change = &dry.changes[0];
    assert_eq!(change.action, Action::Resend, "{dry}");
    assert_eq!(change.why, "columns added: price");
    assert_eq!(change.held_total, items_held as u64);
    fleet.redeploy(second).await;
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    assert_eq!(
        moved.sends, items_held as u64,
        "every held item once: {moved:?}"
    );
    assert_eq!(moved.deletes, 0);
    assert_eq!(
        carried(&fleet, "shops").await,
        shops_before,
        "shops not sent"
    );
    assert_eq!(
        carried(&fleet, "regions").await,
        regions_before,
        "regions not sent"
    );
    // The replicas hold the prices now (the check compares every column).
    let priced = replica_rows(&fleet.units["u1"].replica, &v2::PricedItem::TABLE);
    assert!(
        priced.values().all(|row| !row.ends_with("null]")),
        "{priced:?}"
    );
}

#[tokio::test]
async fn a_removed_table_is_taken_back_from_the_record_without_reading_it() {
    let mut fleet = fleet().await;
    let second = Engine::builder()
        .table::<v1::Region>()
        .table::<v1::Shop>()
        .build()
        .unwrap();
    let items_held = held(&fleet, "items").await;
    assert!(items_held > 0);
    // The host drops the table with its declaration: whatever reads it now
    // fails, so a deployment that settles did not read it.
    fleet
        .writer
        .batch_execute("DROP TABLE items")
        .await
        .unwrap();
    let dry = deploy::dry_run(&mut fleet.writer, &second).await.unwrap();
    assert_eq!(dry.changes.len(), 1, "{dry}");
    assert_eq!(dry.changes[0].action, Action::Remove);
    assert_eq!(dry.changes[0].held_total, items_held as u64);
    assert_eq!(dry.moves.totals().take_back, items_held as u64, "{dry}");
    assert_eq!(dry.moves.totals().send, 0, "{dry}");
    // The tills still run the build that had items: they let go of them.
    fleet.redeploy_server(second).await;
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    assert_eq!(moved.deletes, items_held as u64, "{moved:?}");
    assert_eq!(moved.sends, 0);
    assert_eq!(held(&fleet, "items").await, 0);
    for unit in fleet.units.values() {
        assert!(replica_rows(&unit.replica, &v1::Item::TABLE).is_empty());
    }
}

#[tokio::test]
async fn a_dry_run_before_the_first_start_says_every_replica_is_provisioned() {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    client.batch_execute(SCHEMA).await.unwrap();
    let dry = deploy::dry_run(&mut client, &first_build()).await.unwrap();
    assert!(dry.first, "{dry}");
    assert_eq!(dry.reused, ["items", "regions", "shops"]);
    assert!(dry.changes.is_empty());
    assert!(dry.to_string().starts_with("first start"), "{dry}");
    // Migrated, with no build recorded yet: the same.
    magic_sync::schema::migrate(&mut client).await.unwrap();
    let dry = deploy::dry_run(&mut client, &first_build()).await.unwrap();
    assert!(dry.first, "{dry}");
}

/// Whether the replica's file still has a table called `name`.
fn has_table(replica: &magic_sync::replica::Replica, name: &str) -> bool {
    replica
        .connection()
        .query_row(
            "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = ?1",
            [name],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
        > 0
}

/// The first build without items.
fn without_items() -> Engine {
    Engine::builder()
        .table::<v1::Region>()
        .table::<v1::Shop>()
        .build()
        .unwrap()
}

#[tokio::test]
async fn a_removed_table_leaves_replicas_that_run_the_new_build_once_the_deployment_is_whole() {
    let mut fleet = fleet().await;
    assert!(held(&fleet, "items").await > 0);
    // Server and tills move to the build without items together: the tills
    // can no longer read items, nor let go of them one by one.
    fleet.redeploy(without_items()).await;
    for unit in fleet.units.values() {
        let configuration = unit.replica.configuration().unwrap();
        assert!(has_table(&unit.replica, "items"));
        assert_eq!(configuration.former_tables, ["items"]);
        assert!(
            !configuration.complete,
            "a replica still holding rows the server takes back is not complete"
        );
    }
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    assert_eq!(moved.sends, 0, "{moved:?}");
    assert_eq!(held(&fleet, "items").await, 0);
    for (id, unit) in &fleet.units {
        assert!(
            !has_table(&unit.replica, "items"),
            "{id} still has the table the server took back"
        );
        assert!(!has_table(&unit.replica, "_magic_sync_stale_items"));
        let configuration = unit.replica.configuration().unwrap();
        assert!(configuration.complete, "{id}: {configuration:?}");
        assert!(configuration.former_tables.is_empty());
        // Read beside the replica, on a connection of the host's own.
        let beside = rusqlite::Connection::open(&unit.path).unwrap();
        let read = magic_sync::replica::configuration(&beside, &without_items()).unwrap();
        assert_eq!(read, configuration);
    }
    assert!(fleet.configured());
}

/// A replica with no declarations follows the server's build: the new
/// description no longer names the table, and it goes once the server
/// says the configuration is whole.
#[tokio::test]
async fn a_replica_following_the_description_drops_a_removed_table_once_the_deployment_is_whole() {
    let mut fleet = Fleet::of(SCHEMA, first_build()).await;
    fleet.add_described("u1", Some("north"));
    fleet.sync().await;
    fleet.check().await;
    assert!(has_table(&fleet.unit("u1").replica, "items"));
    assert!(held(&fleet, "items").await > 0);
    fleet.redeploy_server(without_items()).await;
    settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(held(&fleet, "items").await, 0);
    let server = magic_sync::core::schema::Schema::new(&without_items(), &fleet.foreign_keys());
    let unit = fleet.unit("u1");
    assert!(!has_table(&unit.replica, "items"));
    assert!(!has_table(&unit.replica, "_magic_sync_stale_items"));
    let configuration = unit.replica.configuration().unwrap();
    assert!(configuration.complete, "{configuration:?}");
    assert!(configuration.former_tables.is_empty(), "{configuration:?}");
    assert_eq!(unit.replica.schema(), &server);
    assert_eq!(fleet.provisionings, 1, "nobody is provisioned again");
}

#[tokio::test]
async fn a_till_moving_to_the_new_build_after_the_deployment_drops_the_table_as_it_opens() {
    let mut fleet = fleet().await;
    // The server first: the tills, still on the build with items, let go
    // of every row, and are told the new build's configuration is whole.
    fleet.redeploy_server(without_items()).await;
    settle(&mut fleet).await;
    fleet.check().await;
    for unit in fleet.units.values() {
        assert!(has_table(&unit.replica, "items"));
        assert!(replica_rows(&unit.replica, &v1::Item::TABLE).is_empty());
        assert!(!unit.replica.configuration().unwrap().complete);
    }
    // Then each till's new build opens its file: nothing more will come
    // for items, and the table goes at once.
    fleet.redeploy(without_items()).await;
    for (id, unit) in &fleet.units {
        assert!(!has_table(&unit.replica, "items"), "{id}");
        assert!(unit.replica.configuration().unwrap().complete, "{id}");
    }
    let moved = settle(&mut fleet).await;
    assert_eq!((moved.sends, moved.deletes), (0, 0), "{moved:?}");
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
}

#[tokio::test]
async fn a_till_ahead_of_its_server_keeps_the_table_until_the_server_deploys() {
    let mut fleet = fleet().await;
    // The tills' new build opens first: the server still sends items.
    let ids: Vec<String> = fleet.units.keys().cloned().collect();
    let key = fleet.key;
    for id in &ids {
        let path = fleet.units[id].path.clone();
        let mut replica = magic_sync::replica::Replica::open(&path, id, &without_items()).unwrap();
        replica.trust(&key).unwrap();
        fleet.unit(id).replica = replica;
    }
    for unit in fleet.units.values() {
        assert!(has_table(&unit.replica, "items"));
        assert!(!unit.replica.configuration().unwrap().complete);
    }
    // Then the server: once its deployment is whole, the tills drop items.
    fleet.redeploy(without_items()).await;
    settle(&mut fleet).await;
    fleet.check().await;
    for (id, unit) in &fleet.units {
        assert!(!has_table(&unit.replica, "items"), "{id}");
        assert!(unit.replica.configuration().unwrap().complete, "{id}");
    }
}

#[tokio::test]
async fn a_renamed_table_is_a_removal_and_an_addition() {
    let mut fleet = fleet().await;
    let with_tips = with_tips();
    fleet.redeploy(with_tips).await;
    settle(&mut fleet).await;
    fleet.check().await;
    fleet
        .writer
        .batch_execute("ALTER TABLE tips RENAME TO hints")
        .await
        .unwrap();
    let renamed = Engine::builder()
        .table::<v1::Region>()
        .table::<v1::Shop>()
        .table::<v1::Item>()
        .table::<v2::Hint>()
        .build()
        .unwrap();
    let dry = deploy::dry_run(&mut fleet.writer, &renamed).await.unwrap();
    let actions: Vec<(&str, Action)> = dry
        .changes
        .iter()
        .map(|c| (c.table.as_str(), c.action))
        .collect();
    assert_eq!(actions, [("hints", Action::Add), ("tips", Action::Remove)]);
    fleet.redeploy(renamed).await;
    let moved = settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    assert_eq!((moved.sends, moved.deletes), (10, 10), "{moved:?}");
    assert_eq!(held(&fleet, "tips").await, 0);
    assert_eq!(held(&fleet, "hints").await, 10);
    for unit in fleet.units.values() {
        assert!(!has_table(&unit.replica, "tips"));
        assert!(unit.replica.configuration().unwrap().complete);
    }
}

#[tokio::test]
async fn a_change_replicas_cannot_tell_sends_nothing() {
    let mut fleet = fleet().await;
    let same = Engine::builder()
        .table::<v1::Item>()
        .table::<v2::Store>()
        .table::<v1::Region>()
        .build()
        .unwrap();
    let dry = deploy::dry_run(&mut fleet.writer, &same).await.unwrap();
    assert!(dry.is_empty(), "{dry}");
    fleet.redeploy(same).await;
    let moved = settle(&mut fleet).await;
    assert_eq!(moved, Moved::default());
    fleet.check().await;
}

#[tokio::test]
async fn writes_during_a_deployment_are_neither_lost_nor_sent_stale() {
    writes_during_a_deployment(false).await;
}

/// The same with the record of the rows a rule gives thinned from the
/// start: a table new to the sync, and one whose rule changes, are read by
/// no rule while their deployment runs (nothing holds the new one's rows
/// until they are sent), and every count of what points at a region stays
/// exact.
#[tokio::test]
async fn writes_during_a_deployment_over_a_thinned_record_are_neither_lost_nor_sent_stale() {
    writes_during_a_deployment(true).await;
}

async fn writes_during_a_deployment(thinned: bool) {
    let mut fleet = Fleet::of(SCHEMA, first_build()).await;
    fleet.reconfigure(|s| s.record_ruled_rows = !thinned).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    assert!(
        fleet.configured(),
        "a snapshot's end says the configuration is whole"
    );
    let second = Engine::builder()
        .table::<v1::Region>()
        .table::<v2::ShopByRegion>()
        .table::<v2::PricedItem>()
        .table::<v2::Tip>()
        .build()
        .unwrap();
    fleet.redeploy(second).await;
    // Between the deployment's passes the host writes around the rows it
    // works through: rows it did, rows it has yet to do, rows moving
    // between replicas, rows new and gone.
    let writes = [
        "UPDATE items SET price = price + 1, label = label || '!' WHERE id % 4 = 0",
        "INSERT INTO tips VALUES (11, 'north', 'tip 11'), (12, 'south', 'tip 12')",
        "UPDATE shops SET region = 'south' WHERE id = 1",
        "DELETE FROM items WHERE id IN (3, 9)",
        "UPDATE tips SET region = 'north', body = 'moved' WHERE id = 1",
        "INSERT INTO items VALUES (31, 2, 'new', 9.5)",
        "UPDATE shops SET region = 'north' WHERE id = 1",
        "DELETE FROM tips WHERE id = 2",
    ];
    for write in writes {
        fleet.write(write).await;
        let step = fleet.record().await;
        assert!(step.provisioned.is_empty());
        fleet.deliver().await;
        fleet.check_orphans();
    }
    settle(&mut fleet).await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2);
    assert!(deployment_done(&fleet)
        .await
        .iter()
        .all(|(_, _, done)| *done));
}

//! A fleet of five replicas, each in one of the states an operator tells
//! apart, built through the engine's own steps:
//!
//! - `a` (north): caught up;
//! - `b` (north): a task of its own written and recorded, not published:
//!   on its way;
//! - `c` (south): cut off when item 1 changed: out of reach;
//! - `d` (south): its upload of sale `s1` refused (`a` filed that key
//!   first): waiting on a fix;
//! - `e` (north): listed last, waiting for its snapshot: provisioning.

use crate::fleet::Fleet;
use magic_sync::{Engine, Row};
use std::time::Duration;

pub const SCHEMA: &str = "
    CREATE TABLE items (id bigint PRIMARY KEY, name text NOT NULL);
    CREATE TABLE tasks (id bigint PRIMARY KEY, unit_id text NOT NULL, title text NOT NULL);
    CREATE TABLE sales (id text PRIMARY KEY, unit_id text NOT NULL, total bigint NOT NULL,
                        version bigint NOT NULL);
    INSERT INTO items VALUES (1, 'tea'), (2, 'milk'), (3, 'jam'), (4, 'bread');
    INSERT INTO tasks VALUES (1, 'a', 'open'), (2, 'b', 'count'), (3, 'b', 'sweep'),
                             (4, 'c', 'open'), (5, 'd', 'open');
";

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "items", down, all, key(id))]
pub struct Item {
    pub id: i64,
    pub name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "tasks", down, replica = "unit_id", key(id))]
pub struct Task {
    pub id: i64,
    pub unit_id: String,
    pub title: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(id), key_without_origin)]
pub struct Sale {
    pub id: String,
    #[row(origin)]
    pub unit_id: String,
    pub total: i64,
    #[row(version)]
    pub version: i64,
}

pub fn engine() -> Engine {
    Engine::builder()
        .table::<Item>()
        .table::<Task>()
        .table::<Sale>()
        .build()
        .expect("the declarations agree")
}

/// `a` to `d` provisioned and caught up.
pub async fn settled() -> Fleet {
    settled_as(None).await
}

/// [`settled`], with every row a holder's own rule gives it recorded
/// (`Some(true)`), left to the rule (`Some(false)`), or as the suite runs
/// (`None`, `MAGIC_SYNC_RECORD_RULED`).
pub async fn settled_as(recorded: Option<bool>) -> Fleet {
    let mut fleet = Fleet::of(SCHEMA, engine()).await;
    if let Some(recorded) = recorded {
        fleet.reconfigure(|s| s.record_ruled_rows = recorded).await;
    }
    fleet.add("a", Some("north"));
    fleet.add("b", Some("north"));
    fleet.add("c", Some("south"));
    fleet.add("d", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    fleet
}

/// The fleet in the state the module's doc describes.
pub async fn known() -> Fleet {
    known_as(None).await
}

/// [`known`], recorded as [`settled_as`] says.
pub async fn known_as(recorded: Option<bool>) -> Fleet {
    let mut fleet = settled_as(recorded).await;
    for till in ["a", "d"] {
        fleet
            .unit(till)
            .replica
            .connection()
            .execute_batch("INSERT INTO sales VALUES ('s1', 'x', 10, 1)")
            .unwrap();
    }
    // `a` is filed first (replicas upload in order of id), `d` refused.
    fleet.upload(Duration::from_secs(3600)).await;
    fleet.cut("c", true);
    fleet
        .settle("UPDATE items SET name = 'green tea' WHERE id = 1")
        .await;
    fleet.add("e", Some("north"));
    fleet
        .write("INSERT INTO tasks VALUES (10, 'b', 'new')")
        .await;
    let recorded = fleet.pass().await;
    assert_eq!(recorded.waiting, ["e"]);
    fleet
}

/// A connection of the operator's.
pub async fn operator(fleet: &Fleet) -> tokio_postgres::Client {
    fleet.db.connect().await
}

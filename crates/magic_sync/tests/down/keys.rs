//! Keys as `sync.held` compares them: as the text of the planner's `jsonb`
//! keys (decision 51). A foreign key may have another type than the key it
//! points at when both print a value the same way (integers of any width,
//! `text` and `varchar`); what a child points at must still name its
//! parent's record. (Types that print differently are refused at start-up:
//! see the foundation's start-up tests.)

use crate::fleet::Fleet;
use magic_sync::{Engine, Row};

#[derive(Row, Debug, Clone)]
#[row(table = "rates", down, referenced, key(code))]
struct Rate {
    code: i64,
    label: String,
}

#[derive(Row, Debug, Clone)]
#[row(table = "desks", down, referenced, key(name))]
struct Desk {
    name: String,
}

#[derive(Row, Debug, Clone)]
#[row(table = "tabs", down, replica = "unit", key(id))]
struct Tab {
    id: i64,
    unit: String,
    rate: Option<i32>,
    desk: Option<String>,
}

const SCHEMA: &str = "
CREATE TABLE rates (code bigint PRIMARY KEY, label text NOT NULL);
CREATE TABLE desks (name text PRIMARY KEY);
CREATE TABLE tabs (
    id bigint PRIMARY KEY,
    unit text NOT NULL,
    rate integer REFERENCES rates,
    desk varchar(20) REFERENCES desks
);
INSERT INTO rates VALUES (15, 'fifteen'), (225, 'two and a quarter');
INSERT INTO desks VALUES ('front'), ('back');
INSERT INTO tabs VALUES (1, 'u1', 15, 'front'), (2, 'u1', 15, 'front'), (3, 'u2', 225, 'back');
";

#[tokio::test]
async fn parents_pointed_at_through_columns_of_other_widths_are_counted_and_let_go() {
    let engine = Engine::builder()
        .table::<Rate>()
        .table::<Desk>()
        .table::<Tab>()
        .build()
        .unwrap();
    let mut fleet = Fleet::of(SCHEMA, engine).await;
    fleet.add("u1", None);
    fleet.add("u2", None);
    // Provisioned: u1 holds rate 15 and the front desk for two tabs.
    fleet.sync().await;
    fleet.check().await;
    // A tab re-pointed, another gone: one tab of u1 still points at each.
    fleet
        .settle("UPDATE tabs SET rate = 225, desk = 'back' WHERE id = 2")
        .await;
    fleet.settle("DELETE FROM tabs WHERE id = 3").await;
    // The last tab pointing at them gone: u1 lets go of rate 15 and the
    // front desk, and keeps what tab 2 points at.
    fleet.settle("DELETE FROM tabs WHERE id = 1").await;
    let held: Vec<(String, String)> = fleet
        .client
        .query(
            "SELECT table_name, key FROM sync.held
             WHERE replica = 'u1' AND table_name <> 'tabs' ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(
        held,
        [
            ("desks".to_string(), "[\"back\"]".to_string()),
            ("rates".to_string(), "[225]".to_string())
        ]
    );
}

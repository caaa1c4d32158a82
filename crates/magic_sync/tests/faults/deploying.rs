//! A relay dying in the middle of a deployment: the one that starts next
//! goes on from the last chunk committed, works no row twice, and sends
//! nothing twice that a replica would apply twice.

use super::{cut_before_commit, failing_pass, injected};
use fail::FailScenario;
use magic_sync::{Engine, Row};
use magic_sync_testkit::fleet::Fleet;

const SCHEMA: &str = "
CREATE TABLE regions (id text PRIMARY KEY, name text NOT NULL);
CREATE TABLE tips (id bigint PRIMARY KEY, region text NOT NULL REFERENCES regions, body text NOT NULL);
CREATE INDEX ON tips (region);
INSERT INTO regions VALUES ('north', 'North'), ('south', 'South');
INSERT INTO tips SELECT i, CASE WHEN i % 2 = 0 THEN 'north' ELSE 'south' END, 'tip ' || i
    FROM generate_series(1, 30) i;
";

#[derive(Row, Debug, Clone)]
#[row(table = "regions", down, all, key(id))]
struct Region {
    id: String,
    name: String,
}

#[derive(Row, Debug, Clone)]
#[row(table = "tips", down, partition = "region", key(id))]
struct Tip {
    id: i64,
    region: String,
    body: String,
}

async fn rows_done(fleet: &Fleet) -> (i64, bool) {
    let row = fleet
        .writer
        .query_one(
            "SELECT rows_done, done_at IS NOT NULL FROM sync.deployment WHERE table_name = 'tips'",
            &[],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

#[tokio::test]
async fn a_relay_killed_mid_deployment_goes_on_from_the_last_chunk_committed() {
    let scenario = FailScenario::setup();
    let first = Engine::builder().table::<Region>().build().unwrap();
    let mut fleet = Fleet::of(SCHEMA, first).await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("south"));
    fleet.sync().await;
    let second = Engine::builder()
        .table::<Region>()
        .table::<Tip>()
        .build()
        .unwrap();
    fleet.redeploy(second).await;
    // A chunk (four tips) committed and sent.
    let step = fleet.record().await;
    assert_eq!(step.deployed, Some(("tips".to_string(), 4)));
    fleet.deliver().await;
    // The next chunk commits, and the relay dies before publishing it.
    fail::cfg("relay-after-commit", "1*return").unwrap();
    let died = failing_pass(&mut fleet).await;
    assert!(injected(&died, "relay-after-commit"), "{died}");
    assert_eq!(
        rows_done(&fleet).await,
        (8, false),
        "the second chunk committed"
    );
    fleet.reconnect().await;
    // The chunk after loses its session before it commits: nothing of it
    // stays.
    cut_before_commit(&mut fleet).await;
    assert_eq!(
        rows_done(&fleet).await,
        (8, false),
        "nothing of the lost chunk stayed"
    );
    fleet.reconnect().await;
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(fleet.provisionings, 2, "nobody was provisioned again");
    // Every tip worked through once: no chunk twice, none skipped.
    assert_eq!(rows_done(&fleet).await, (30, true));
    for unit in fleet.units.values() {
        let status = unit.replica.status().unwrap();
        assert_eq!((status.refused, status.forged), (0, 0), "{status:?}");
        assert!(unit.replica.configuration().unwrap().complete);
    }
    scenario.teardown();
}

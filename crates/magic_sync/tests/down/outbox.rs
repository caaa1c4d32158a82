//! The outbox while a replica is away: its messages wait, up to the bound,
//! and cost the others' passes and publishing nothing. Counted in rows read
//! through PostgreSQL's statistics views, never in time.

use crate::fleet::Fleet;
use crate::shop;
use std::collections::BTreeMap;
use tokio_postgres::Client;

/// Messages put in the away till's outbox: several of the publisher's pages
/// (512 messages each).
const WAITING: i64 = 3_000;

/// Past any message number the relay draws in a test.
const FAR: i64 = 1_000_000_000;

/// Rows read so far from each table of the `sync` schema, by sequential
/// and index scans, by `client`'s statements among others.
async fn reads(client: &Client) -> BTreeMap<String, i64> {
    crate::cost::reads_in(client, "sync")
        .await
        .into_iter()
        .map(|(t, (rows, _))| (t, rows))
        .collect()
}

/// Puts `WAITING` messages in `replica`'s outbox, as if written while it
/// was away: numbered past any message the relay draws, each with a body
/// of its own. `then` runs in the same batch.
async fn put_waiting(fleet: &Fleet, replica: &str, then: &str) {
    fleet
        .writer
        .batch_execute(&format!(
            "WITH b AS (
                 INSERT INTO sync.bodies (hash, bytes)
                 SELECT sha256(('away ' || i)::bytea), ('away ' || i)::bytea
                 FROM generate_series(1, {WAITING}) i RETURNING id)
             INSERT INTO sync.outbox (replica, number, nonce, head, body, seal)
             SELECT '{replica}', {FAR} + row_number() OVER (), '\\x00', '\\x00', id, '\\x00' FROM b;
             {then}"
        ))
        .await
        .unwrap();
}

/// Publishes the fleet's outboxes, passing over the replicas `away` holds.
async fn publish(
    fleet: &Fleet,
    away: &mut magic_sync::relay::Away,
) -> magic_sync::relay::Published {
    magic_sync::relay::publish_beside(
        &fleet.client,
        &fleet.network,
        16,
        magic_sync_testkit::fleet::BATCHED_FROM,
        away,
    )
    .await
    .unwrap()
}

/// What reading `after` counted beyond `before`, of `table`.
fn read_of(before: &BTreeMap<String, i64>, after: &BTreeMap<String, i64>, table: &str) -> i64 {
    after.get(table).copied().unwrap_or(0) - before.get(table).copied().unwrap_or(0)
}

/// Bodies that no message or batch carries and no pass will look at:
/// leaked.
async fn leaked(client: &Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM sync.bodies b
             WHERE NOT EXISTS (SELECT 1 FROM sync.outbox o WHERE o.body = b.id)
               AND NOT EXISTS (SELECT 1 FROM sync.batches c WHERE c.body = b.id)
               AND NOT EXISTS (SELECT 1 FROM sync.freed f WHERE f.body = b.id)",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_till_away_with_its_outbox_grown_costs_the_others_passes_and_publishing_nothing() {
    let mut fleet = Fleet::new(shop::ROWS).await;
    fleet.per_replica().await;
    fleet.add("u1", Some("north"));
    fleet.add("u3", Some("north"));
    // The outboxes' bound is checked once an hour, as a pass reads them
    // whole for it (every 10 s by default; every pass in tests).
    fleet
        .reconfigure(|s| s.outbox_check_every = std::time::Duration::from_secs(3600))
        .await;
    // The relay's connection, its statements counted.
    let (client, counter) = crate::wire::connect(&fleet.db).await;
    fleet.reconnect_on(client).await;
    fleet.sync().await;
    fleet.network.cut("u3", true);
    // u3's outbox, grown while it is away.
    put_waiting(&fleet, "u3", "").await;
    fleet
        .write("UPDATE orders SET placed_at = placed_at + interval '1 hour' WHERE id = 1")
        .await;

    let before = reads(&fleet.client).await;
    let recorded = fleet.pass().await;
    let after = reads(&fleet.client).await;
    assert_eq!(recorded.messages, 1, "u1's order: {recorded:?}");
    let bodies = read_of(&before, &after, "bodies");
    assert!(
        bodies < 100,
        "the pass read {bodies} rows of sync.bodies with {WAITING} messages waiting for u3"
    );

    let before = counter.counts();
    fleet.publish().await;
    let statements = (counter.counts() - before).statements;
    // The first page holds u3's first 512 messages; its send fails, and
    // the rest of its outbox is skipped, not read page after page (six
    // pages would be).
    assert!(
        statements <= 6,
        "publishing ran {statements} statements with {WAITING} messages waiting for u3"
    );
    assert_eq!(fleet.network.queued("u1"), 1, "u1's message went");

    // u3 back: the messages put there go first, and it takes what it missed.
    fleet
        .writer
        .batch_execute(&format!(
            "DELETE FROM sync.outbox WHERE replica = 'u3' AND number > {FAR}"
        ))
        .await
        .unwrap();
    fleet.network.cut("u3", false);
    fleet.sync().await;
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    fleet.sync().await;
    fleet.check().await;
    let left: i64 = fleet
        .client
        .query_one("SELECT count(*) FROM sync.bodies", &[])
        .await
        .unwrap()
        .get(0);
    assert!(
        left < 10,
        "{left} bodies left: those of the messages put there are forgotten"
    );
    assert_eq!(leaked(&fleet.client).await, 0);
}

#[tokio::test]
async fn a_body_several_tills_share_stays_until_the_last_of_them_acknowledges() {
    let mut fleet = synced(&["u1", "u2", "u3"]).await;
    fleet.network.cut("u3", true);
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    let recorded = fleet.pass().await;
    assert_eq!(recorded.messages, 3, "{recorded:?}");
    let shared: i64 = fleet
        .client
        .query_one("SELECT DISTINCT body FROM sync.outbox", &[])
        .await
        .unwrap()
        .get(0);
    // u1 and u2 take it and acknowledge: their messages go, u3's stays.
    fleet.deliver().await;
    fleet
        .write("UPDATE products SET price = 4 WHERE id = 2")
        .await;
    fleet.record().await;
    let kept = bodies_with(&fleet.client, shared).await;
    assert_eq!(kept, 1, "u3's message still carries the body");

    // u3 back: it takes both, and the next pass that writes forgets them.
    fleet.network.cut("u3", false);
    fleet.sync().await;
    fleet
        .write("UPDATE products SET price = 5 WHERE id = 3")
        .await;
    fleet.sync().await;
    fleet.check().await;
    let kept = bodies_with(&fleet.client, shared).await;
    assert_eq!(kept, 0, "no message carries the body any more");
    assert_eq!(leaked(&fleet.client).await, 0);
}

#[tokio::test]
async fn publishing_passes_over_a_till_away_until_it_is_back() {
    let mut fleet = Fleet::new(shop::ROWS).await;
    fleet.per_replica().await;
    fleet.add("u1", Some("north"));
    fleet.add("u3", Some("north"));
    fleet.sync().await;
    fleet.network.cut("u3", true);
    // As autovacuum would once this many rows came: PostgreSQL plans the
    // open range's scan of the outbox by what it knows.
    put_waiting(&fleet, "u3", "ANALYZE sync.outbox").await;
    // Waits long enough that only its being back ends them here.
    let hour = std::time::Duration::from_secs(3600);
    let mut away = magic_sync::relay::Away::new(hour, hour);
    let published = publish(&fleet, &mut away).await;
    assert_eq!(published.failed.len(), 1, "{published:?}");
    assert!(away.next_try().is_some(), "u3 is away");

    // A product every till holds changes: u1 takes it, and the publish
    // reads nothing of what waits for u3.
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    let recorded = fleet.pass().await;
    assert_eq!(recorded.messages, 2, "{recorded:?}");
    let before = reads(&fleet.client).await;
    let published = publish(&fleet, &mut away).await;
    let after = reads(&fleet.client).await;
    let outbox = read_of(&before, &after, "outbox");
    assert!(
        outbox < 100,
        "publishing read {outbox} rows of sync.outbox with u3 away and {WAITING} messages waiting for it"
    );
    assert_eq!(published.sent, 1, "u1's message: {published:?}");
    assert!(
        published.failed.is_empty(),
        "u3 was not tried: {published:?}"
    );
    assert_eq!(fleet.network.queued("u1"), 1);

    // u3 back: the next publish sends it what waits, its wait not over.
    fleet
        .writer
        .batch_execute(&format!(
            "DELETE FROM sync.outbox WHERE replica = 'u3' AND number > {FAR}"
        ))
        .await
        .unwrap();
    fleet.network.cut("u3", false);
    let published = publish(&fleet, &mut away).await;
    assert!(published.sent >= 1, "{published:?}");
    assert_eq!(away.next_try(), None, "u3 is back");
    fleet.sync().await;
    fleet.check().await;
}

/// The shop, with the tills `ids` in the north, each holding its share.
async fn synced(ids: &[&str]) -> Fleet {
    let mut fleet = Fleet::new(shop::ROWS).await;
    fleet.per_replica().await;
    for id in ids {
        fleet.add(id, Some("north"));
    }
    fleet.sync().await;
    fleet
}

/// How many rows of `sync.bodies` have the id `body`.
async fn bodies_with(client: &Client, body: i64) -> i64 {
    client
        .query_one("SELECT count(*) FROM sync.bodies WHERE id = $1", &[&body])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn a_body_a_cohorts_batch_carries_stays_until_the_batch_goes() {
    let mut fleet = synced(&["u1", "u2"]).await;
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    fleet.record().await;
    let shared: i64 = fleet
        .client
        .query_one("SELECT DISTINCT body FROM sync.outbox", &[])
        .await
        .unwrap()
        .get(0);
    // The catalogue's cohort carries the same body in a batch of its own,
    // as the record by rule writes them (the cohort made by hand, unless
    // the relay records by rule).
    fleet
        .client
        .execute(
            "INSERT INTO sync.cohorts (id, kind) VALUES (E'\\x01all', 'all') ON CONFLICT DO NOTHING;",
            &[],
        )
        .await
        .unwrap();
    fleet
        .client
        .execute(
            "INSERT INTO sync.batches (cohort, number, pass_last, nonce, body)
             VALUES (E'\\x01all', 1, 1, '\\x00', $1)",
            &[&shared],
        )
        .await
        .unwrap();

    // Both tills take it and acknowledge: no message carries the body, and
    // a pass that writes looks at it.
    fleet.deliver().await;
    fleet
        .write("UPDATE products SET price = 4 WHERE id = 2")
        .await;
    fleet.sync().await;
    assert_eq!(
        bodies_with(&fleet.client, shared).await,
        1,
        "the batch still carries the body"
    );

    // The batch goes (and the cohort, if it was made by hand, holding
    // nothing): the next pass that writes forgets the body.
    fleet
        .client
        .batch_execute(
            "DELETE FROM sync.batches;
             DELETE FROM sync.cohorts c
             WHERE NOT EXISTS (SELECT 1 FROM sync.held h WHERE h.replica = c.id);",
        )
        .await
        .unwrap();
    fleet
        .write("UPDATE products SET price = 5 WHERE id = 3")
        .await;
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        bodies_with(&fleet.client, shared).await,
        0,
        "nothing carries the body any more"
    );
    assert_eq!(leaked(&fleet.client).await, 0);
}

#[tokio::test]
async fn an_acknowledgement_is_recorded_with_the_nonce_of_the_message_it_names() {
    let mut fleet = synced(&["u1", "u2"]).await;
    fleet
        .write("UPDATE products SET price = 3 WHERE id = 1")
        .await;
    fleet.sync().await;
    // Caught up: each acknowledged the last message sent it, whose number
    // and nonce head its chain.
    let heads: Vec<(String, bool)> = fleet
        .client
        .query(
            "SELECT r.id, a.number = r.last_number AND a.nonce = r.last_nonce
             FROM sync.replicas r JOIN sync.acks a ON a.replica = r.id ORDER BY r.id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(heads, [("u1".to_string(), true), ("u2".to_string(), true)]);
}

#[tokio::test]
async fn every_replicas_last_message_of_a_pass_shares_one_number_and_carries_its_rows() {
    let mut fleet = synced(&["u1", "u2", "u3"]).await;
    let before: i64 = fleet
        .client
        .query_one(
            "SELECT coalesce(max(message), 0) FROM sync.held_carried",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    // A price every till holds, and enough orders of u1's that its stream
    // takes several messages.
    fleet
        .write(
            "UPDATE products SET price = 3 WHERE id = 1;
             INSERT INTO orders (id, unit_id) SELECT 1000 + i, 'u1' FROM generate_series(1, 200) i;",
        )
        .await;
    fleet.record().await;
    let streams: Vec<(String, i64, i64, i64)> = fleet
        .client
        .query(
            "SELECT replica, count(*), min(number), max(number) FROM sync.outbox GROUP BY 1 ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect();
    assert_eq!(streams.len(), 3, "{streams:?}");
    assert!(
        streams[0].1 > 2,
        "u1's stream takes several messages: {streams:?}"
    );
    let last = streams[0].3;
    for (replica, _, first, at) in &streams {
        assert_eq!(*at, last, "{replica}'s last message: {streams:?}");
        assert!(*first <= last);
    }
    // Each of u1's other messages comes before it, and its rows are
    // counted as carried by the last, recorded or left to their rule.
    let carried: Vec<i64> = fleet
        .client
        .query(
            "SELECT DISTINCT message FROM sync.held_carried WHERE message > $1",
            &[&before],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(carried, [last]);
    fleet.sync().await;
    fleet.check().await;
}

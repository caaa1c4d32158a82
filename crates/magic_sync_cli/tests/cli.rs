//! The real `magic-sync` binary against a real database whose `sync`
//! schema holds a fleet in a known state, written as the engine writes
//! it: `--json` output and exit codes.

use serde_json::{json, Value};
use std::process::{Command, Output};

/// Three replicas: `a` caught up, `b` with a row in a message it has not
/// acknowledged, `c` (south) caught up. No host table is needed: the reads
/// use the `sync` schema alone.
const FLEET: &str = "
    INSERT INTO sync.replicas (id, live, partition_id, provision, last_number) VALUES
        ('a', true, 'north', false, 5), ('b', true, 'north', false, 7),
        ('c', true, 'south', false, 7), ('gone', false, NULL, true, 0);
    INSERT INTO sync.acks (replica, number, at) VALUES
        ('a', 5, now()), ('b', 5, now()), ('c', 7, now());
    INSERT INTO sync.held (replica, table_name, key, version, message) VALUES
        ('a', 'items', '[1]', 0, 5), ('a', 'items', '[2]', 0, 5),
        ('b', 'items', '[1]', 0, 5), ('b', 'items', '[2]', 0, 7),
        ('c', 'items', '[1]', 0, 7), ('c', 'items', '[2]', 0, 7);
";

async fn fleet() -> magic_sync_testdb::TestDb {
    let db = magic_sync_testdb::database().await;
    let mut client = db.connect().await;
    magic_sync::schema::migrate(&mut client).await.unwrap();
    client.batch_execute(FLEET).await.unwrap();
    db
}

fn magic_sync(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("the binary runs")
}

/// The JSON printed, with the read's time (which changes) taken out.
fn json_of(output: &Output) -> Value {
    let mut v: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    let now = v.as_object_mut().unwrap().remove("now");
    assert!(now.is_some_and(|n| n.is_string()));
    v
}

fn summary(id: &str, partition: &str, state: &str, last: i64, acked: i64, on_way: i64) -> Value {
    json!({
        "id": id, "partition": partition, "state": state,
        "last_message": last, "acknowledged": acked, "outbox": 0,
        "rows_on_their_way": on_way, "rows_outdated": 0, "rows_refused": 0,
        "changes_kept": 0, "provisioning": false, "snapshot_began_at": null,
        "last_error": null, "alarm": null,
    })
}

/// `acknowledged_at` is the server's time of the acknowledgement: present.
fn without_ack_times(v: &mut Value, list: &str) {
    for r in v[list].as_array_mut().unwrap() {
        let at = r.as_object_mut().unwrap().remove("acknowledged_at");
        assert!(at.is_some_and(|t| t.is_string()));
    }
}

#[tokio::test]
async fn overview_replicas_progress_and_row_as_json() {
    let db = fleet().await;
    let url = db.url();

    let out = magic_sync(&url, &["overview", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut v = json_of(&out);
    without_ack_times(&mut v, "worst");
    assert_eq!(
        v,
        json!({
            "replicas": 3,
            "states": {"caught_up": 2, "on_its_way": 1, "provisioning": 0,
                       "out_of_reach": 0, "waiting_on_fix": 0},
            "worst": [summary("b", "north", "on_its_way", 7, 5, 1)],
            "tables": [{"table": "items", "replicas": 1, "rows_on_their_way": 1,
                        "rows_outdated": 0, "rows_refused": 0}],
            "pending_notes": 0,
            "deployment": [],
        })
    );

    let out = magic_sync(&url, &["replicas", "--limit", "2", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut v = json_of(&out);
    without_ack_times(&mut v, "replicas");
    assert_eq!(
        v,
        json!({
            "replicas": [summary("a", "north", "caught_up", 5, 5, 0),
                         summary("b", "north", "on_its_way", 7, 5, 1)],
            "next": "b",
        })
    );
    let out = magic_sync(&url, &["replicas", "--after", "b", "--json"]);
    let v = json_of(&out);
    assert_eq!(v["replicas"][0]["id"], "c");
    assert_eq!(v["next"], Value::Null);

    let out = magic_sync(&url, &["progress", "b", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json_of(&out);
    assert_eq!(
        v["tables"],
        json!([{"table": "items", "should": 2, "holds": 1, "outdated": 0,
                "on_its_way": 1, "set_aside": 0, "up": null}])
    );
    assert_eq!(v["backlog_at"], Value::Null);

    let out = magic_sync(&url, &["row", "items", "2", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v = json_of(&out);
    let states: Vec<(&str, &str)> = v["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["replica"].as_str().unwrap(), r["state"].as_str().unwrap()))
        .collect();
    assert_eq!(
        states,
        [("a", "holds"), ("b", "on_its_way"), ("c", "holds")]
    );
    assert_eq!(v["key"], "[2]");
    // In words, for people.
    let table = String::from_utf8(magic_sync(&url, &["row", "items", "2"]).stdout).unwrap();
    assert!(
        table.contains("on its way") && table.contains("holds") && !table.contains("OnItsWay"),
        "{table}"
    );
    let table = String::from_utf8(magic_sync(&url, &["row", "items", "9"]).stdout).unwrap();
    assert!(table.contains("does not hold"), "{table}");

    // The tables for people name what they show.
    let out = magic_sync(&url, &["progress", "b"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("replica b (on its way)"), "{text}");
    assert!(text.contains("1 of 2"), "{text}");
}

#[tokio::test]
async fn a_refused_upload_exits_with_2_and_says_deploy_a_fix() {
    let db = fleet().await;
    let url = db.url();
    let out = magic_sync(&url, &["health", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        json_of(&out),
        json!({"healthy": true, "pending": {"notes": 0, "rows": 0}, "items": []})
    );

    let client = db.connect().await;
    client
        .batch_execute(
            "INSERT INTO sync.inbox (replica, table_name, key, data, reason, at)
             VALUES ('c', 'sales', '[\"s1\"]', NULL, 'a record of another replica', '2026-01-02T03:04:05Z');
             UPDATE sync.replicas SET last_error = 'sending message 8: unreachable' WHERE id = 'a';",
        )
        .await
        .unwrap();
    let out = magic_sync(&url, &["health", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        json_of(&out),
        json!({
            "healthy": false,
            "pending": {"notes": 0, "rows": 0},
            "items": [
                {"action": "deploy_fix", "kind": "refused", "table": "sales",
                 "reason": "a record of another replica", "rows": 1, "replicas": 1,
                 "since": "2026-01-02T03:04:05Z"},
                {"action": "wait", "kind": "send_failing", "replica": "a",
                 "error": "sending message 8: unreachable", "outbox": 0},
            ],
        })
    );
    let out = magic_sync(&url, &["overview"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("1 waiting on a fix"), "{text}");
    // The north has nothing to fix.
    let out = magic_sync(&url, &["health", "--partition", "north"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = magic_sync(&url, &["row", "sales", "s1", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(json_of(&out)["replicas"][2]["state"], "set_aside");
}

#[tokio::test]
async fn errors_exit_with_1_and_name_the_thing() {
    let db = fleet().await;
    let url = db.url();
    let out = magic_sync(&url, &["progress", "zz"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "magic-sync: the server knows no replica `zz`\n"
    );
    let out = magic_sync(&url, &["row", "items", "1", "2"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("keyed by 1 values"));

    let bare = magic_sync_testdb::database().await;
    let out = magic_sync(&bare.url(), &["overview"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8(out.stderr)
        .unwrap()
        .contains("no sync schema"));
}

#[test]
fn a_password_in_database_url_is_never_printed() {
    // Nothing listens on port 1.
    let url = "postgres://someone:s3cret-pw@127.0.0.1:1/nowhere";
    let out = magic_sync(url, &["health"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains("connecting to the database"), "{all}");
    assert!(!all.contains("s3cret"), "{all}");

    let out = Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .arg("health")
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[tokio::test]
async fn key_prints_the_servers_key_and_rotate_replaces_it() {
    let db = fleet().await;
    let client = db.connect().await;
    let stored = magic_sync::store::keys::public(&client).await.unwrap();
    let out = magic_sync(&db.url(), &["key"]);
    assert!(out.status.success(), "{out:?}");
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(printed.trim(), stored.to_string());
    let out = magic_sync(&db.url(), &["--json", "key"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json, json!({ "key": stored.to_string() }));

    let out = magic_sync(&db.url(), &["key", "--rotate"]);
    assert!(out.status.success(), "{out:?}");
    let rotated: magic_sync::sign::ServerKey = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(rotated, stored);
    assert_eq!(
        magic_sync::store::keys::public(&client).await.unwrap(),
        rotated
    );
}

#[tokio::test]
async fn sealed_seeds_sign_only_where_the_seed_key_is_given() {
    let db = fleet().await;
    let client = db.connect().await;
    let stored = magic_sync::store::keys::public(&client).await.unwrap();
    let key = magic_sync::store::keys::SeedKey::draw();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("seed.key");
    std::fs::write(&file, key.to_hex()).unwrap();
    assert_eq!(
        magic_sync::store::keys::seal_with(&client, &key)
            .await
            .unwrap(),
        1
    );
    let raw: Vec<u8> = client
        .query_one("SELECT seed FROM sync.keys WHERE ordinal = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert!(raw.starts_with(b"ms-seal-1"), "{raw:?}");
    // Whoever reads the database, or a backup of it, cannot sign.
    let why = magic_sync::store::keys::public(&client)
        .await
        .unwrap_err()
        .to_string();
    assert!(why.contains("MAGIC_SYNC_SEED_KEY"), "{why}");
    let without = magic_sync(&db.url(), &["key"]);
    assert_eq!(without.status.code(), Some(1), "{without:?}");
    // The server's process, given the key, signs as before, and a rotation
    // stores the new seed sealed.
    let with = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_magic-sync"))
            .args(args)
            .env("DATABASE_URL", db.url())
            .env("MAGIC_SYNC_SEED_KEY", &file)
            .output()
            .unwrap()
    };
    let out = with(&["key"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        stored.to_string()
    );
    let out = with(&["key", "--rotate"]);
    assert!(out.status.success(), "{out:?}");
    let sealed: i64 = client
        .query_one(
            "SELECT count(*) FROM sync.keys WHERE substring(seed FROM 1 FOR 9) = 'ms-seal-1'::bytea",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(sealed, 2);
}

/// `magic-sync wait` with `args`: its exit code and what it printed.
fn wait(url: &str, args: &[&str]) -> (i32, String) {
    let mut all = vec!["wait", "--every", "0.05"];
    all.extend_from_slice(args);
    let out = magic_sync(url, &all);
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap().trim().to_string(),
    )
}

#[tokio::test]
async fn wait_says_when_the_fleet_is_settled_caught_up_or_waiting_for_a_fix() {
    let db = fleet().await;
    let client = db.connect().await;
    let url = db.url();
    // No relay has started: nothing can be settled yet, and it says why.
    let (code, said) = wait(&url, &["--timeout", "0.2"]);
    assert_eq!(
        (code, said.as_str()),
        (
            1,
            "no relay has started on this database yet: nothing is recorded"
        )
    );

    client
        .batch_execute("INSERT INTO sync.tables (name, mirror, fingerprint) VALUES ('items', 'down', decode(repeat('00', 32), 'hex'))")
        .await
        .unwrap();
    // b has not acknowledged its last message.
    assert_eq!(
        wait(&url, &["--caught-up", "--timeout", "0.2"]),
        (1, "1 of 3 replicas are not caught up".to_string())
    );
    client
        .batch_execute(
            "UPDATE sync.acks SET number = 7 WHERE replica = 'b';
             INSERT INTO sync.notes (table_name, source, key) VALUES ('items', 'items', '[9]');",
        )
        .await
        .unwrap();
    // Caught up, but a note is pending: not settled.
    assert_eq!(
        wait(&url, &["--caught-up"]),
        (0, "all 3 replicas caught up; 1 notes pending".to_string())
    );
    assert_eq!(
        wait(&url, &["--settled", "--timeout", "0.2"]),
        (1, "all 3 replicas caught up; 1 notes pending".to_string())
    );
    client
        .batch_execute("DELETE FROM sync.notes")
        .await
        .unwrap();
    assert_eq!(
        wait(&url, &[]),
        (
            0,
            "settled: all 3 replicas caught up, no note pending".to_string()
        )
    );
    let out = magic_sync(&url, &["--json", "wait"]);
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["settled"], true);
    assert_eq!(json["replicas"], 3);

    // Something waits for a fix: it says so at once, with 2.
    client
        .batch_execute(
            "INSERT INTO sync.inbox (replica, table_name, key, data, reason)
             VALUES ('c', 'items', '[1]', NULL, 'a codec bug')",
        )
        .await
        .unwrap();
    assert_eq!(
        wait(&url, &["--timeout", "30"]),
        (2, "1 of 3 replicas wait for a fix".to_string())
    );
}

#[tokio::test]
async fn deployment_lists_the_last_deployment_and_settled_waits_for_it() {
    let db = fleet().await;
    let client = db.connect().await;
    let url = db.url();
    let out = magic_sync(&url, &["deployment"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8(out.stdout)
        .unwrap()
        .contains("no deployment"));
    client
        .batch_execute(
            "UPDATE sync.acks SET number = 7 WHERE replica = 'b';
             INSERT INTO sync.tables (name, mirror, fingerprint)
                 VALUES ('items', 'down', decode(repeat('00', 32), 'hex'));
             INSERT INTO sync.deployment (table_name, work, why, rows_done, rows_total) VALUES
                 ('items', 'plan', 'rule all → replica(unit)', 4, 10),
                 ('tips', 'remove', 'no longer declared', 3, 3);
             UPDATE sync.deployment SET done_at = now() WHERE table_name = 'tips';",
        )
        .await
        .unwrap();
    let out = magic_sync(&url, &["--json", "deployment"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        json!([
            {"table": "items", "work": "plan", "why": "rule all → replica(unit)",
             "rows_done": 4, "rows_total": 10, "done": false},
            {"table": "tips", "work": "remove", "why": "no longer declared",
             "rows_done": 3, "rows_total": 3, "done": true},
        ])
    );
    let text = String::from_utf8(magic_sync(&url, &["deployment"]).stdout).unwrap();
    assert!(
        text.contains("4 of about 10") && text.contains("under way"),
        "{text}"
    );
    // Every replica caught up, nothing pending: the deployment alone holds
    // the fleet back from settled.
    assert_eq!(
        wait(&url, &["--timeout", "0.2"]),
        (
            1,
            "a deployment is under way: 1 tables, 4 of about 10 rows worked through".to_string()
        )
    );
    let overview = String::from_utf8(magic_sync(&url, &["overview"]).stdout).unwrap();
    assert!(overview.contains("A deployment is under way"), "{overview}");
    client
        .batch_execute("UPDATE sync.deployment SET done_at = now(), rows_done = 10")
        .await
        .unwrap();
    assert_eq!(wait(&url, &["--timeout", "5"]).0, 0);
}

mod declared {
    use magic_sync::Row;

    #[derive(Row, Debug, Clone)]
    #[row(table = "shops", down, all, key(id))]
    pub struct Shop {
        pub id: i64,
    }

    /// Follows its shop: the relay finds a shop's items by `shop_id`.
    #[derive(Row, Debug, Clone)]
    #[row(table = "items", down, follows = "shop_id", key(id))]
    pub struct Item {
        pub id: i64,
        pub shop_id: i64,
    }

    /// Given through groups: the relay finds an offer's groups by
    /// `offer_groups.offer_id`, a group's offers by `group_id`.
    #[derive(Row, Debug, Clone)]
    #[row(
        table = "offers",
        down,
        group(
            members = "offer_groups",
            member = "offer_id",
            grants = "offer_grants",
            replica = "unit_id"
        ),
        key(id)
    )]
    pub struct Offer {
        pub id: i64,
    }
}

#[tokio::test]
async fn indexes_names_each_missing_index_and_the_statement_that_makes_it() {
    let db = magic_sync_testdb::database().await;
    let client = db.connect().await;
    // Keys alone, as a host may have them: the members' key leads with the
    // group, so only a row's groups and a shop's items lack an index.
    client
        .batch_execute(
            "CREATE TABLE shops (id bigint PRIMARY KEY);
             CREATE TABLE items (id bigint PRIMARY KEY, shop_id bigint NOT NULL REFERENCES shops);
             CREATE TABLE offers (id bigint PRIMARY KEY);
             CREATE TABLE offer_groups (group_id bigint, offer_id bigint REFERENCES offers,
                                        PRIMARY KEY (group_id, offer_id));
             CREATE TABLE offer_grants (unit_id text, group_id bigint,
                                        PRIMARY KEY (unit_id, group_id));",
        )
        .await
        .unwrap();
    let engine = magic_sync::Engine::builder()
        .table::<declared::Shop>()
        .table::<declared::Item>()
        .table::<declared::Offer>()
        .build()
        .unwrap();
    let json = magic_sync_cli::Indexes { json: true };
    let mut out = Vec::new();
    let outcome = magic_sync_cli::indexes(&client, &engine, &json, &mut out)
        .await
        .unwrap();
    assert_eq!(outcome.exit_code(), 2, "missing indexes are a fix to make");
    let v: Value = serde_json::from_slice(&out).unwrap();
    let named: Vec<(String, Vec<String>)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["table"].as_str().unwrap().to_string(),
                serde_json::from_value(m["columns"].clone()).unwrap(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            ("items".to_string(), vec!["shop_id".to_string()]),
            ("offer_groups".to_string(), vec!["offer_id".to_string()]),
        ]
    );
    let mut text = Vec::new();
    magic_sync_cli::indexes(&client, &engine, &Default::default(), &mut text)
        .await
        .unwrap();
    let text = String::from_utf8(text).unwrap();
    assert!(
        text.contains("until 2 indexes are made")
            && text.contains("CREATE INDEX CONCURRENTLY IF NOT EXISTS \"items_shop_id_idx\" ON \"public\".\"items\" (\"shop_id\");")
            && text.contains("the rows of `items` that follow a parent"),
        "{text}"
    );
    // The statements printed are the ones to run: once they ran, nothing
    // is missing.
    for m in v.as_array().unwrap() {
        client
            .batch_execute(m["sql"].as_str().unwrap())
            .await
            .unwrap();
    }
    let mut out = Vec::new();
    let outcome = magic_sync_cli::indexes(&client, &engine, &Default::default(), &mut out)
        .await
        .unwrap();
    assert_eq!(outcome.exit_code(), 0);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "every index the relay needs is in place\n"
    );
}

#[tokio::test]
async fn a_database_not_migrated_says_to_migrate_and_migrate_installs_the_schema() {
    let db = magic_sync_testdb::database().await;
    // Before the relay ever ran: every command that reads the database
    // says what to do, rather than that a relation does not exist.
    for args in [&["overview"][..], &["key"], &["broker", "enrol", "till-1"]] {
        let out = magic_sync(&db.url(), args);
        assert_eq!(
            out.status.code(),
            Some(i32::from(magic_sync_cli::EXIT_ERROR)),
            "{args:?}: {out:?}"
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains("run `magic-sync migrate`"),
            "{args:?}: {said}"
        );
        assert!(!said.contains("does not exist"), "{args:?}: {said}");
    }
    let out = magic_sync(&db.url(), &["--json", "migrate"]);
    assert!(out.status.success(), "{out:?}");
    let migrated: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        migrated["schema_version"].as_i64(),
        Some(i64::from(magic_sync::schema::CURRENT))
    );
    // Again: nothing to do, the same version.
    let out = magic_sync(&db.url(), &["migrate"]);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!(
            "the sync schema is at version {}",
            magic_sync::schema::CURRENT
        )
    );
    let out = magic_sync(&db.url(), &["broker", "enrol", "till-1"]);
    assert!(out.status.success(), "{out:?}");
    let out = magic_sync(&db.url(), &["key"]);
    assert!(out.status.success(), "{out:?}");
}

#[test]
fn broker_server_draws_a_key_pair_without_a_database() {
    let out = Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["--json", "broker", "server"])
        .env_remove("DATABASE_URL")
        .output()
        .expect("the binary runs");
    assert!(out.status.success(), "{out:?}");
    let drawn: Value = serde_json::from_slice(&out.stdout).unwrap();
    let server =
        magic_sync_nats::access::Credentials::from_seed(drawn["seed"].as_str().unwrap()).unwrap();
    assert_eq!(drawn["public_key"], server.public_key());
}

#[tokio::test]
async fn broker_enrols_revokes_and_writes_the_block_from_the_keys_kept() {
    let db = fleet().await;
    let out = magic_sync(&db.url(), &["--json", "broker", "server"]);
    let drawn: Value = serde_json::from_slice(&out.stdout).unwrap();
    let server =
        magic_sync_nats::access::Credentials::from_seed(drawn["seed"].as_str().unwrap()).unwrap();
    assert_eq!(drawn["public_key"], server.public_key());
    let out = magic_sync(&db.url(), &["broker", "enrol", "till-1"]);
    assert!(out.status.success(), "{out:?}");
    let seed = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let till = magic_sync_nats::access::Credentials::from_seed(&seed).expect("a seed");
    let out = magic_sync(&db.url(), &["--json", "broker", "enrol", "till-2"]);
    let enrolled: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(enrolled["replica"], "till-2");
    let out = magic_sync(
        &db.url(),
        &["broker", "authorization", "--server", server.public_key()],
    );
    assert!(out.status.success(), "{out:?}");
    let block = String::from_utf8(out.stdout).unwrap();
    assert!(block.starts_with("authorization {"), "{block}");
    assert!(block.contains(server.public_key()) && block.contains(till.public_key()));
    assert!(block.contains(enrolled["public_key"].as_str().unwrap()));
    assert!(!block.contains(&seed), "a seed in the block");

    let out = magic_sync(&db.url(), &["broker", "revoke", "till-2"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "revoked");
    let out = magic_sync(&db.url(), &["broker", "revoke", "till-2"]);
    assert_eq!(String::from_utf8(out.stdout).unwrap().trim(), "had no key");
    let out = magic_sync(
        &db.url(),
        &["broker", "authorization", "--server", server.public_key()],
    );
    let block = String::from_utf8(out.stdout).unwrap();
    assert!(
        !block.contains(enrolled["public_key"].as_str().unwrap()),
        "revoked, still let in"
    );

    let out = magic_sync(
        &db.url(),
        &["broker", "authorization", "--server", till.seed()],
    );
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("not a user's public nkey"), "{said}");
    assert!(!said.contains(till.seed()), "the seed was printed: {said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_status_says_which_replicas_read_and_takes_no_report() {
    use magic_sync::relay::Transport;
    use magic_sync::run::replica::Link;
    use magic_sync::run::server::Reports;
    use magic_sync::ReplicaId;
    use magic_sync_nats::broker::{self, Broker};

    let db = fleet().await;
    let nats = magic_sync_testkit::nats::Nats::start(&["till-1", "till-2"]);
    for till in ["till-1", "till-2"] {
        magic_sync(&db.url(), &["broker", "enrol", till]);
    }
    let dir = tempfile::tempdir().unwrap();
    let seed_file = dir.path().join("server.seed");
    std::fs::write(&seed_file, format!("{}\n", nats.server.seed())).unwrap();
    let url = nats.url();
    // `broker status` with the seed in `seed`, as JSON or a table.
    let run = |json: bool, seed: &std::path::Path, replicas: &[&str]| {
        let mut args = vec!["broker", "status", "--broker", &url, "--seed-file"];
        args.push(seed.to_str().unwrap());
        args.extend_from_slice(replicas);
        if json {
            args.insert(0, "--json");
        }
        magic_sync(&db.url(), &args)
    };
    let status = |replicas: &[&str]| {
        let out = run(true, &seed_file, replicas);
        assert!(out.status.success(), "{out:?}");
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };

    // The relay has sent till-1 two messages, and till-2 none; till-1 has
    // reported once, and the relay has not drained it yet.
    let relay = Broker::connect(broker::Settings::new(url.clone()), nats.server.seed())
        .await
        .unwrap();
    let till_1 = ReplicaId::from("till-1".to_string());
    for id in ["e-1-n", "e-2-n"] {
        relay.send(&till_1, id, b"rows".to_vec()).await.unwrap();
    }
    let mailbox = magic_sync_nats::mailbox::Mailbox::open(magic_sync_nats::mailbox::Settings::new(
        url.clone(),
        "till-1",
        nats.seed("till-1"),
    ))
    .unwrap();
    let first = tokio::task::block_in_place(|| mailbox.next(std::time::Duration::from_secs(20)));
    assert!(
        matches!(first, magic_sync::run::Delivery::Message(_)),
        "{first:?}"
    );
    mailbox.report(magic_sync::run::Report::Applied(
        magic_sync::envelope::Ack {
            number: 1,
            ..Default::default()
        },
    ));
    // The relay's consumer takes the report; it waits there, not drained.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let read = loop {
        let read = status(&[]);
        if read["uploads"]["consumer"]["not_acknowledged"] == 1 {
            break read;
        }
        assert!(std::time::Instant::now() < deadline, "{read:#}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    // Every replica enrolled, by id. till-1 reads: it dealt with the first
    // message when it reported, and holds the second. Nothing was sent to
    // till-2 yet, so it has no stream.
    assert_eq!(read["replicas"][0]["replica"], "till-1");
    let one = &read["replicas"][0]["standing"];
    assert_eq!(one["waiting"], 1, "{read:#}");
    assert_eq!(one["consumer"]["handed_up_to"], 2, "{read:#}");
    assert_eq!(one["consumer"]["not_acknowledged"], 1, "{read:#}");
    assert_eq!(read["replicas"][1]["replica"], "till-2");
    let two = &read["replicas"][1]["standing"];
    assert_eq!(two["waiting"], Value::Null, "{read:#}");
    assert_eq!(two["consumer"], Value::Null, "{read:#}");

    // Asking took nothing from the relay: the report is still its own.
    let heard = relay.drain();
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert_eq!(heard[0].0, till_1);

    // A replica named; and the table for people.
    assert_eq!(status(&["till-2"])["replicas"].as_array().unwrap().len(), 1);
    let table = String::from_utf8(run(false, &seed_file, &["till-2"]).stdout).unwrap();
    assert!(
        table.contains("till-2") && table.contains("no stream"),
        "{table}"
    );
    assert!(table.contains("waiting in `MAGIC_SYNC_UP`"), "{table}");

    // Replicas named, no database is needed: only the broker is asked.
    let offline = Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args([
            "--json",
            "broker",
            "status",
            "--broker",
            &url,
            "--seed-file",
        ])
        .arg(&seed_file)
        .arg("till-1")
        .env_remove("DATABASE_URL")
        .output()
        .expect("the binary runs");
    assert!(offline.status.success(), "{offline:?}");
    let read: Value = serde_json::from_slice(&offline.stdout).unwrap();
    assert_eq!(read["replicas"][0]["replica"], "till-1", "{read:#}");
    assert_eq!(read["replicas"][0]["standing"]["waiting"], 1, "{read:#}");

    // A seed file that cannot serve is named, and never printed.
    let empty = dir.path().join("empty.seed");
    std::fs::write(&empty, "\n").unwrap();
    let out = run(false, &empty, &[]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("empty.seed") && said.contains("empty"),
        "{said}"
    );
}

/// `magic-sync --json wait --deployed [FINGERPRINT]`, given a moment: its
/// exit code and its read.
fn deployed(url: &str, build: Option<&str>) -> (i32, Value) {
    let mut args = vec![
        "--json",
        "wait",
        "--every",
        "0.05",
        "--timeout",
        "0.1",
        "--deployed",
    ];
    args.extend(build);
    let out = magic_sync(url, &args);
    (out.status.code().unwrap(), json_of(&out))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_deployed_answers_once_the_new_build_is_held_whole_by_every_replica() {
    use magic_sync_testkit::{fleet::Fleet, shop};

    // Notices go to their region's tills; the second build sends them to
    // every till, so its deployment plans them again.
    let mut fleet = Fleet::new(
        "INSERT INTO notices (id, region_id, body) VALUES
             (1, 'north', 'one'), (2, 'south', 'two'), (3, 'north', 'three');",
    )
    .await;
    fleet.add("u1", Some("north"));
    fleet.add("u2", Some("south"));
    fleet.sync().await;
    fleet.check().await;
    let url = fleet.db.url();
    let own = |fleet: &mut Fleet, unit: &str| {
        let configuration = fleet.unit(unit).replica.configuration().unwrap();
        (configuration.own.to_string(), configuration.complete)
    };

    // The first build is deployed: its fingerprint is the one its replicas
    // print as their own.
    let (first, complete) = own(&mut fleet, "u1");
    assert!(complete);
    let (code, read) = deployed(&url, None);
    assert_eq!(code, 0, "{read:#}");
    assert_eq!(read["running"], first.as_str());
    assert_eq!(read["wanted"], Value::Null);

    // A host that knows its new build's fingerprint waits for that build:
    // the server still runs the first.
    let engine = shop::redeclared();
    let second = magic_sync::catalog::Catalog::read(&fleet.client, &engine)
        .await
        .unwrap()
        .schema(&engine)
        .fingerprint()
        .to_string();
    assert_ne!(first, second);
    let (code, read) = deployed(&url, Some(&second));
    assert_eq!(code, 1, "{read:#}");
    assert_eq!(
        read["says"],
        format!(
            "the server runs the declarations {}, not {} yet: a relay of that build has not \
             started",
            &first[..12],
            &second[..12]
        )
    );

    // The second build starts: what the server last started with is the
    // second build, its deployment not worked through yet.
    fleet.redeploy(engine).await;
    for build in [None, Some(second.as_str())] {
        let (code, read) = deployed(&url, build);
        assert_eq!(code, 1, "{read:#}");
        assert_eq!(read["running"], second.as_str());
        assert!(
            read["says"]
                .as_str()
                .unwrap()
                .starts_with(&format!("the deployment of {} is under way", &second[..12])),
            "{read:#}"
        );
    }
    // Nor is it the first build any more that is deployed.
    assert_eq!(deployed(&url, Some(&first)).0, 1);

    // Pass by pass, each delivered: `wait --deployed` answers 0 exactly
    // when every replica holds the second build whole by its own account,
    // and not before each was told so and acknowledged it.
    let mut said = Vec::new();
    for step in 0.. {
        assert!(step < 20, "not deployed after 20 passes: {said:#?}");
        fleet.record().await;
        let (code, read) = deployed(&url, None);
        assert_eq!(code, 1, "answered before anything was delivered: {read:#}");
        said.push(read["says"].as_str().unwrap().to_string());
        fleet.deliver().await;
        let (code, read) = deployed(&url, Some(&second));
        assert_eq!(
            code == 0,
            fleet.configured(),
            "the server's answer and the replicas' own differ: {read:#}"
        );
        if code == 0 {
            assert_eq!(read["complete"], true);
            assert_eq!(
                read["says"],
                format!("deployed: all 2 replicas hold {} whole", &second[..12])
            );
            break;
        }
        said.push(read["says"].as_str().unwrap().to_string());
    }
    let told = |words: &str| said.iter().any(|s| s.contains(words));
    assert!(told("replicas not told yet that they hold"), "{said:#?}");
    assert!(told("have not acknowledged it yet"), "{said:#?}");
    for unit in ["u1", "u2"] {
        assert_eq!(own(&mut fleet, unit), (second.clone(), true));
    }
    fleet.check().await;
    // And as people read it.
    assert_eq!(
        wait(&url, &["--deployed"]),
        (
            0,
            format!("deployed: all 2 replicas hold {} whole", &second[..12])
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_with_a_timeout_waits_for_the_first_relay_to_make_the_sync_schema() {
    let db = magic_sync_testdb::database().await;
    let url = db.url();
    // Without a timeout, the answer stays: migrate.
    let out = magic_sync(&url, &["wait"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("run `magic-sync migrate`"));
    // With one, it waits, and says what it waited for.
    for args in [
        &["--timeout", "0.2"][..],
        &["--deployed", "--timeout", "0.2"],
    ] {
        assert_eq!(
            wait(&url, args),
            (
                1,
                "the database has no sync schema yet: no relay has started on it".to_string()
            ),
            "{args:?}"
        );
    }
    let out = magic_sync(&url, &["--json", "wait", "--timeout", "0.1"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let read: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(read["migrated"], false);
    assert_eq!(read["relay_started"], false);

    // A schema the server's migrations have not brought to this build's
    // version is waited on too.
    let behind = magic_sync_testdb::database().await;
    magic_sync::schema::migrate_to(&mut behind.connect().await, magic_sync::schema::CURRENT - 1)
        .await
        .unwrap();
    let (code, said) = wait(&behind.url(), &["--timeout", "0.2"]);
    assert_eq!(code, 1);
    assert!(
        said.contains("the server's migrations have not run yet"),
        "{said}"
    );

    // A wait running from before the schema exists answers once the first
    // relay started.
    let waiter_url = format!(
        "{url}{}application_name=magic-sync%20waiter",
        if url.contains('?') { '&' } else { '?' }
    );
    let mut waiter = tokio::process::Command::new(env!("CARGO_BIN_EXE_magic-sync"))
        .args(["wait", "--every", "0.05", "--timeout", "120"])
        .env("DATABASE_URL", &waiter_url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut client = db.connect().await;
    // Its reads find no schema (each ends in a rollback) while it waits.
    loop {
        if let Some(status) = waiter.try_wait().unwrap() {
            let out = waiter.wait_with_output().await.unwrap();
            panic!("the wait ended before the schema was made: {status} {out:?}");
        }
        let reading: bool = client
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                                WHERE application_name = 'magic-sync waiter'
                                  AND query = 'ROLLBACK')",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if reading {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // The relay's first start: it migrates, installs its triggers, records
    // its declarations.
    client
        .batch_execute("CREATE TABLE shops (id bigint PRIMARY KEY)")
        .await
        .unwrap();
    let engine = magic_sync::Engine::builder()
        .table::<declared::Shop>()
        .build()
        .unwrap();
    magic_sync::schema::migrate(&mut client).await.unwrap();
    magic_sync::trigger::install(&engine, &mut client)
        .await
        .unwrap();
    magic_sync::relay::Relay::new(&client, engine, Default::default())
        .await
        .unwrap();
    let out = waiter.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        "settled: all 0 replicas caught up, no note pending"
    );
}

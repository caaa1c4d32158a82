//! Per-test databases on the shared server.

use std::collections::HashSet;

use magic_sync_testdb::{database, server, TestDb};

async fn exists(observer: &TestDb, name: &str) -> bool {
    let client = observer.connect().await;
    let row = client
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = $1",
            &[&name],
        )
        .await
        .unwrap();
    row.get::<_, i64>(0) == 1
}

#[tokio::test]
async fn each_test_database_is_separate() {
    let first = database().await;
    let second = database().await;
    assert_ne!(first.name(), second.name());

    let a = first.connect().await;
    let b = second.connect().await;
    for (client, value) in [(&a, 1), (&b, 2)] {
        client
            .batch_execute(&format!(
                "CREATE TABLE items (id int PRIMARY KEY); INSERT INTO items VALUES ({value})"
            ))
            .await
            .unwrap();
    }
    for (client, db, value) in [(&a, &first, 1), (&b, &second, 2)] {
        let rows = client.query("SELECT id FROM items", &[]).await.unwrap();
        let ids: Vec<i32> = rows.iter().map(|row| row.get(0)).collect();
        assert_eq!(ids, [value]);
        let current: String = client
            .query_one("SELECT current_database()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(current, db.name());
    }
}

#[tokio::test]
async fn database_is_dropped_with_its_test_db() {
    let observer = database().await;
    let doomed = database().await;
    let name = doomed.name().to_owned();
    // An open connection must not keep the database alive.
    let client = doomed.connect().await;
    client
        .batch_execute("CREATE TABLE t (x int)")
        .await
        .unwrap();
    assert!(exists(&observer, &name).await);

    drop(doomed);

    assert!(!exists(&observer, &name).await, "{name} still exists");
    assert!(client.simple_query("SELECT 1").await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_databases_at_once() {
    const COUNT: usize = 16;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..COUNT {
        tasks.spawn(async move {
            let db = database().await;
            let client = db.connect().await;
            let n: i32 = client
                .query_one("SELECT $1::int + 1", &[&(i as i32)])
                .await
                .unwrap()
                .get(0);
            assert_eq!(n, i as i32 + 1);
            db
        });
    }
    let mut dbs = Vec::new();
    while let Some(db) = tasks.join_next().await {
        dbs.push(db.unwrap());
    }
    let names: HashSet<&str> = dbs.iter().map(TestDb::name).collect();
    assert_eq!(names.len(), COUNT);
}

#[tokio::test]
async fn conninfo_works_for_psql() {
    let db = database().await;
    db.connect()
        .await
        .batch_execute(
            "CREATE TABLE marker (note text); INSERT INTO marker VALUES ('psql sees me')",
        )
        .await
        .unwrap();
    let output = tokio::process::Command::new(server().bin("psql"))
        .arg(db.conninfo())
        .args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c"])
        .arg("SELECT note FROM marker")
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "psql failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).trim(),
        "psql sees me"
    );
}

#[tokio::test]
async fn url_and_config_reach_the_same_database() {
    let db = database().await;
    let from_url: tokio_postgres::Config = db.url().parse().unwrap();
    assert_eq!(from_url.get_dbname(), Some(db.name()));
    assert_eq!(db.config().get_dbname(), Some(db.name()));
    let (client, connection) = from_url.connect(tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    let current: String = client
        .query_one("SELECT current_database()", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(current, db.name());
}

#[tokio::test]
async fn private_cluster_only_without_database_url() {
    let url_set = std::env::var("DATABASE_URL").is_ok_and(|url| !url.trim().is_empty());
    let server = server();
    match server.cluster() {
        Some(cluster) => {
            assert!(
                !url_set,
                "a cluster was started although DATABASE_URL is set"
            );
            assert!(cluster.data_dir().join("PG_VERSION").is_file());
            assert_eq!(server.admin_config().get_ports(), [cluster.port()]);
        }
        None => assert!(url_set, "no cluster and no DATABASE_URL"),
    }
    let db = database().await;
    let client = db.connect().await;
    let ours: bool = client
        .query_one("SELECT current_setting('fsync') = 'off'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(ours, server.cluster().is_some());
}

//! How long a fresh replica with no declarations of its own
//! (`Replica::open_described`) takes to hold a schema of 50 tables once
//! the server's description reaches it: from the moment the first message
//! (the description, beginning a snapshot) is handed to `apply` until it
//! is applied, tables, triggers, indexes and statements made. Issue 43's
//! target: at most 100 ms.
//!
//! cargo bench -p magic_sync --features sqlite --bench described
//!
//! No PostgreSQL: the description is the one a server of these
//! declarations sends (`Schema::described`), numbered, sealed and signed
//! as the server does. The 50 tables are a chain of parents and children
//! (each points at the one before) of eight columns of every common kind;
//! one in five is written by the replica (`up`), one in five is two-way.
//! Its time is set against opening a replica with the same declarations
//! compiled in (`Replica::open_with_foreign_keys`), which makes the same
//! tables, in the same run.
//!
//! MAGIC_SYNC_BENCH_RUNS sets how many fresh replicas are timed (default 20).

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::envelope::{to_replica::Body, ToReplica};
use magic_sync::replica::{ForeignKey, Outcome, Replica};
use magic_sync::{Engine, Numeric, Row};
use std::time::{Duration, Instant};

const REPLICA: &str = "r1";
const SECRET: &[u8] = b"a stand-in for the epoch's secret";

macro_rules! down_tables {
    ($($name:ident = $table:literal),* $(,)?) => {$(
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = $table, down, all, key(id))]
        #[allow(dead_code)]
        struct $name {
            id: i64,
            parent_id: Option<i64>,
            name: String,
            price: Numeric,
            quantity: i32,
            weight: f64,
            active: bool,
            at: chrono::DateTime<chrono::Utc>,
        }
    )*};
}

macro_rules! up_tables {
    ($($name:ident = $table:literal),* $(,)?) => {$(
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = $table, up, key(id), key_without_origin)]
        #[allow(dead_code)]
        struct $name {
            id: String,
            #[row(origin)]
            till: String,
            parent_id: Option<i64>,
            name: String,
            price: Numeric,
            quantity: i32,
            weight: f64,
            at: chrono::DateTime<chrono::Utc>,
        }
    )*};
}

macro_rules! both_tables {
    ($($name:ident = $table:literal),* $(,)?) => {$(
        #[derive(Row, Debug, Clone, PartialEq)]
        #[row(table = $table, both, replica = "till", key(till, id))]
        #[allow(dead_code)]
        struct $name {
            till: String,
            id: i64,
            parent_id: Option<i64>,
            name: String,
            price: Numeric,
            on_hand: i32,
            #[row(owned)]
            counted: Option<i32>,
            at: chrono::DateTime<chrono::Utc>,
        }
    )*};
}

down_tables!(
    T00 = "t00",
    T01 = "t01",
    T02 = "t02",
    T03 = "t03",
    T05 = "t05",
    T06 = "t06",
    T07 = "t07",
    T08 = "t08",
    T10 = "t10",
    T11 = "t11",
    T12 = "t12",
    T13 = "t13",
    T15 = "t15",
    T16 = "t16",
    T17 = "t17",
    T18 = "t18",
    T20 = "t20",
    T21 = "t21",
    T22 = "t22",
    T23 = "t23",
    T25 = "t25",
    T26 = "t26",
    T27 = "t27",
    T28 = "t28",
    T30 = "t30",
    T31 = "t31",
    T32 = "t32",
    T33 = "t33",
    T35 = "t35",
    T36 = "t36",
);
up_tables!(
    T04 = "t04",
    T09 = "t09",
    T14 = "t14",
    T19 = "t19",
    T24 = "t24",
    T29 = "t29",
    T34 = "t34",
    T39 = "t39",
    T44 = "t44",
    T49 = "t49",
);
both_tables!(
    T37 = "t37",
    T38 = "t38",
    T40 = "t40",
    T41 = "t41",
    T42 = "t42",
    T43 = "t43",
    T45 = "t45",
    T46 = "t46",
    T47 = "t47",
    T48 = "t48",
);

macro_rules! engine_of {
    ($($name:ident),*) => {
        Engine::builder()$(.table::<$name>())*.build().expect("the declarations hold")
    };
}

fn engine() -> Engine {
    engine_of!(
        T00, T01, T02, T03, T04, T05, T06, T07, T08, T09, T10, T11, T12, T13, T14, T15, T16, T17,
        T18, T19, T20, T21, T22, T23, T24, T25, T26, T27, T28, T29, T30, T31, T32, T33, T34, T35,
        T36, T37, T38, T39, T40, T41, T42, T43, T44, T45, T46, T47, T48, T49
    )
}

/// Every table's `parent_id` points at the nearest down table before it
/// (a table of the server's points at nothing a replica writes).
fn foreign_keys() -> Vec<ForeignKey> {
    let goes_down = |i: usize| i % 5 != 4 && !(37..=48).contains(&i);
    let mut fks = Vec::new();
    let mut last_down = None;
    for i in 0..50 {
        if let Some(p) = last_down {
            let (child, parent) = (format!("t{i:02}"), format!("t{p:02}"));
            fks.push(ForeignKey::new(&child, &["parent_id"], &parent, &["id"]));
        }
        if goes_down(i) {
            last_down = Some(i);
        }
    }
    fks
}

fn signer() -> magic_sync::sign::Signer {
    magic_sync::sign::Signer::new(&[0x42; 32], Vec::new())
}

/// The description as the first message of a snapshot, signed.
fn described_message(engine: &Engine) -> (Vec<u8>, usize) {
    let described = magic_sync::core::schema::Schema::new(engine, &foreign_keys()).described();
    let epoch = vec![0xE1; 16];
    let nonce = vec![0xA5; 16];
    let seal = magic_sync::seal::seal(
        SECRET,
        REPLICA,
        &epoch,
        magic_sync::MessageNo::from_store(1),
        &nonce,
    );
    let message = ToReplica {
        replica: REPLICA.into(),
        epoch,
        number: 1,
        nonce,
        begins_snapshot: true,
        body: Some(Body::Described(described)),
        seal: seal.to_vec(),
        ..ToReplica::default()
    };
    let bytes = signer().to_replica(&message);
    let size = bytes.len();
    (bytes, size)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::var("MAGIC_SYNC_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .max(1);
    let engine = engine();
    let (message, bytes) = described_message(&engine);
    let fks = foreign_keys();
    println!(
        "a description of {} tables ({} foreign keys among them): one message of {bytes} bytes",
        engine.tables().count(),
        fks.len()
    );
    let dir = tempfile::tempdir().expect("a directory");
    let (mut described, mut declared) = (Vec::new(), Vec::new());
    for run in 0..runs {
        let path = dir.path().join(format!("described-{run}.sqlite"));
        let mut replica = Replica::open_described(&path, REPLICA).expect("opens");
        replica.trust(&signer().public()).expect("pins the key");
        let started = Instant::now();
        match replica.apply(&message).expect("applies") {
            Outcome::Applied { .. } => {}
            other => panic!("the description did not apply: {other:?}"),
        }
        described.push(started.elapsed());
        assert_eq!(replica.schema().tables().len(), 50);

        // The same tables from declarations compiled in.
        let path = dir.path().join(format!("declared-{run}.sqlite"));
        let started = Instant::now();
        let replica =
            Replica::open_with_foreign_keys(&path, REPLICA, &engine, fks.clone()).expect("opens");
        declared.push(started.elapsed());
        drop(replica);
    }
    let (d, c) = (median(described), median(declared));
    println!(
        "a fresh replica takes the description and holds the 50 tables in {:.1} ms (median of {runs}); opening one with them declared takes {:.1} ms: {:.2}x",
        d.as_secs_f64() * 1e3,
        c.as_secs_f64() * 1e3,
        d.as_secs_f64() / c.as_secs_f64()
    );
}

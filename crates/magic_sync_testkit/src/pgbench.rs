//! pgbench's tables as the benchmarks declare them: every table to the
//! replica of its branch (`replica = "bid"`, the replicas named "1" to
//! "10" at scale 10), and the history keyed by a `hid` column pgbench's
//! own history lacks.

use chrono::NaiveDateTime;
use magic_sync::{Engine, Row};

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "pgbench_branches", down, replica = "bid", key(bid))]
pub struct Branch {
    pub bid: i32,
    pub bbalance: Option<i32>,
    pub filler: Option<String>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "pgbench_tellers", down, replica = "bid", key(tid))]
pub struct Teller {
    pub tid: i32,
    pub bid: Option<i32>,
    pub tbalance: Option<i32>,
    pub filler: Option<String>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "pgbench_accounts", down, replica = "bid", key(aid))]
pub struct Account {
    pub aid: i32,
    pub bid: Option<i32>,
    pub abalance: Option<i32>,
    pub filler: Option<String>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "pgbench_history", down, replica = "bid", key(hid))]
pub struct History {
    pub hid: i64,
    pub tid: Option<i32>,
    pub bid: Option<i32>,
    pub aid: Option<i32>,
    pub delta: Option<i32>,
    pub mtime: Option<NaiveDateTime>,
    pub filler: Option<String>,
}

/// The four tables.
pub fn engine() -> Engine {
    Engine::builder()
        .table::<Branch>()
        .table::<Teller>()
        .table::<Account>()
        .table::<History>()
        .build()
        .expect("pgbench's declarations")
}

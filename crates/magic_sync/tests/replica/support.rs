//! A small shop, a stand-in for the server that numbers, chains and seals
//! messages, and helpers to read what a replica holds.

use magic_sync::envelope::{
    to_replica::Body, Down, EndSnapshot, Reached, RowData, TableRows, ToReplica,
};
use magic_sync::replica::{canonical_key, ForeignKey, Replica};
use magic_sync::{Engine, Row};
use std::sync::OnceLock;

pub const UNIT: &str = "unit-1";
pub const SECRET: &[u8] = b"the test epoch's secret";

/// The key the stand-in server signs with; every replica a test opens pins it.
pub fn signer() -> magic_sync::sign::Signer {
    magic_sync::sign::Signer::new(&[0x51; 32], Vec::new())
}

/// The stand-in server's answer to the upload `send_id`, signed.
pub fn answer(send_id: &[u8]) -> magic_sync::envelope::Filed {
    signer().filed(UNIT, send_id.to_vec())
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "products", down, all, key(id), retired = "retired")]
pub struct Product {
    pub id: i64,
    pub name: String,
    pub barcode: Option<String>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "customers", down, referenced, key(id), retired = "retired")]
pub struct Customer {
    pub id: i64,
    pub name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "orders", down, replica = "unit_id", key(id))]
pub struct Order {
    pub id: i64,
    pub unit_id: String,
    pub customer_id: Option<i64>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "order_lines",
    down,
    follows = "order_id",
    key(order_id, line_no)
)]
pub struct OrderLine {
    pub order_id: i64,
    pub line_no: i32,
    pub product_id: i64,
    pub qty: i32,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "stock", both, replica = "unit_id", key(unit_id, product_id))]
pub struct Stock {
    pub unit_id: String,
    pub product_id: i64,
    pub on_hand: i32,
    #[row(owned)]
    pub counted: Option<i32>,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "sales", up, key(id), key_without_origin)]
pub struct Sale {
    pub id: String,
    #[row(origin)]
    pub unit_id: String,
    pub customer_id: Option<i64>,
}

/// Shelf counts a till takes, numbered by the till: keyed by the replica
/// that wrote them, so a count it deletes is deleted on the server too.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "shelf_counts", up, key(unit_id, n))]
pub struct ShelfCount {
    #[row(origin)]
    pub unit_id: String,
    pub n: i64,
    pub product_id: i64,
    pub qty: i32,
}

/// Readings a till takes all the time, on a lane of their own so they
/// never hold back its sales.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(
    table = "readings",
    up,
    lane = "telemetry",
    key(id),
    key_without_origin
)]
pub struct Reading {
    pub id: String,
    #[row(origin)]
    pub unit_id: String,
    pub value: i64,
}

/// The engine over the shop, built once.
pub fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| {
        Engine::builder()
            .table::<Product>()
            .table::<Customer>()
            .table::<Order>()
            .table::<OrderLine>()
            .table::<Stock>()
            .table::<Sale>()
            .table::<ShelfCount>()
            .table::<Reading>()
            .build()
            .expect("the shop's declarations agree")
    })
}

/// The shop's foreign keys, as the server's catalogue would list them.
pub fn foreign_keys() -> Vec<ForeignKey> {
    vec![
        ForeignKey::new("orders", &["customer_id"], "customers", &["id"]),
        ForeignKey::new("order_lines", &["order_id"], "orders", &["id"]),
        ForeignKey::new("order_lines", &["product_id"], "products", &["id"]),
        ForeignKey::new("stock", &["product_id"], "products", &["id"]),
        ForeignKey::new("sales", &["customer_id"], "customers", &["id"]),
    ]
}

/// A replica database in a directory of its own.
pub struct Site {
    pub dir: tempfile::TempDir,
}

impl Site {
    pub fn new() -> Self {
        Site {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    pub fn open(&self) -> Replica {
        let mut replica = self.bare();
        replica
            .trust(&signer().public())
            .expect("the replica pins the stand-in server's key");
        replica
    }

    /// The replica, opened with no server key pinned.
    pub fn bare(&self) -> Replica {
        Replica::open_with_foreign_keys(
            self.dir.path().join("replica.sqlite3"),
            UNIT,
            engine(),
            foreign_keys(),
        )
        .expect("the replica opens")
    }
}

/// Numbers, chains and seals messages for one replica, like the server.
pub struct Server {
    pub replica: String,
    pub epoch: Vec<u8>,
    next: u64,
    last: Option<(u64, Vec<u8>)>,
}

impl Server {
    pub fn new() -> Self {
        Server {
            replica: UNIT.to_string(),
            epoch: vec![0xE1; 16],
            next: 1,
            last: None,
        }
    }

    /// A new installation: another epoch, a chain that starts again.
    pub fn new_epoch(&mut self) {
        self.epoch = vec![0xE2; 16];
        self.last = None;
    }

    fn message(&mut self, begins_snapshot: bool, body: Body) -> ToReplica {
        let number = self.next;
        // Numbers come from a sequence every replica shares: leave holes.
        self.next += 3;
        let mut nonce = self.epoch[..4].to_vec();
        nonce.extend_from_slice(&number.to_be_bytes());
        nonce.extend_from_slice(&[0x5A; 4]);
        let (previous, previous_nonce) = self.last.clone().unwrap_or((0, Vec::new()));
        let seal = magic_sync::seal::seal(SECRET, &self.replica, &self.epoch, wire(number), &nonce);
        self.last = Some((number, nonce.clone()));
        ToReplica {
            replica: self.replica.clone(),
            epoch: self.epoch.clone(),
            number,
            nonce,
            previous,
            previous_nonce,
            begins_snapshot,
            body: Some(body),
            seal: seal.to_vec(),
            ..ToReplica::default()
        }
    }

    /// The next message: rows to hold and let go of.
    pub fn down(&mut self, tables: Vec<TableRows>) -> ToReplica {
        self.message(false, Body::Down(Down { tables }))
    }

    /// The first message of a snapshot.
    pub fn snapshot(&mut self, tables: Vec<TableRows>) -> ToReplica {
        self.message(true, Body::Down(Down { tables }))
    }

    /// The end of the snapshot: of `tables`, what it did not name goes.
    pub fn end(&mut self, tables: &[&str]) -> ToReplica {
        let tables = tables.iter().map(ToString::to_string).collect();
        self.message(
            false,
            Body::EndSnapshot(EndSnapshot {
                tables,
                schema: Vec::new(),
                described: None,
            }),
        )
    }

    /// The server did everything the uploads `send_ids` caused.
    pub fn reached(&mut self, send_ids: &[&[u8]]) -> ToReplica {
        let send_ids = send_ids.iter().map(|s| s.to_vec()).collect();
        self.message(false, Body::Reached(Reached { send_ids }))
    }

    /// A snapshot that is over in one message: `rows`, then the end.
    pub fn whole_snapshot(&mut self, rows: Vec<TableRows>, tables: &[&str]) -> Vec<ToReplica> {
        vec![self.snapshot(rows), self.end(tables)]
    }
}

/// The message as the server sends it: signed.
/// A message number from the wire, as the seal takes it.
fn wire(number: u64) -> magic_sync::MessageNo {
    magic_sync::MessageNo::from_wire(number).expect("a number the server could draw")
}

pub fn bytes(message: &ToReplica) -> Vec<u8> {
    signer().to_replica(message)
}

/// The wire key of a row.
pub fn key_of<R: Row>(row: &R) -> Vec<u8> {
    let values = row.to_values();
    let key: Vec<_> = R::TABLE
        .key_positions()
        .into_iter()
        .map(|i| values[i].clone())
        .collect();
    canonical_key(&key).into_bytes()
}

pub fn row_data<R: Row>(row: &R) -> RowData {
    RowData {
        key: key_of(row),
        data: R::codec().encode(row).expect("a test row encodes"),
    }
}

/// Rows of one table to hold.
pub fn upserts<R: Row>(rows: &[R]) -> TableRows {
    TableRows {
        table: R::TABLE.name.to_string(),
        deletes: Vec::new(),
        upserts: rows.iter().map(row_data).collect(),
    }
}

/// Rows of a table keyed by one integer, to let go of.
pub fn deletes(table: &str, ids: &[i64]) -> TableRows {
    TableRows {
        table: table.to_string(),
        deletes: ids
            .iter()
            .map(|id| format!("[{id}]").into_bytes())
            .collect(),
        upserts: Vec::new(),
    }
}

pub fn product(id: i64, name: &str) -> Product {
    Product {
        id,
        name: name.to_string(),
        barcode: None,
    }
}

/// An order of this till's, pointing at `customer_id`.
pub fn order(id: i64, customer_id: Option<i64>) -> Order {
    Order {
        id,
        unit_id: UNIT.into(),
        customer_id,
    }
}

pub fn customer(id: i64, name: &str) -> Customer {
    Customer {
        id,
        name: name.to_string(),
    }
}

/// Applies each message, expecting each to apply.
pub fn apply_all(replica: &mut Replica, messages: &[ToReplica]) {
    for m in messages {
        let outcome = replica.apply(&bytes(m)).expect("the message applies");
        assert!(
            matches!(outcome, magic_sync::replica::Outcome::Applied { .. }),
            "message {} did not apply: {outcome:?}",
            m.number
        );
    }
}

/// `(id, name, retired)` of every product, by id.
pub fn products(replica: &Replica) -> Vec<(i64, String, Option<i64>)> {
    rows3(
        replica,
        "SELECT id, name, retired FROM products ORDER BY id",
    )
}

/// `(id, name, retired)` of every customer, by id.
pub fn customers(replica: &Replica) -> Vec<(i64, String, Option<i64>)> {
    rows3(
        replica,
        "SELECT id, name, retired FROM customers ORDER BY id",
    )
}

fn rows3(replica: &Replica, sql: &str) -> Vec<(i64, String, Option<i64>)> {
    let mut stmt = replica.connection().prepare(sql).expect("prepares");
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .expect("queries");
    rows.collect::<Result<_, _>>().expect("reads")
}

/// The ids of the live products.
pub fn live_products(replica: &Replica) -> Vec<i64> {
    products(replica)
        .into_iter()
        .filter(|(_, _, retired)| retired.is_none())
        .map(|(id, _, _)| id)
        .collect()
}

/// The replica's own record of a sale.
pub fn record_sale(replica: &Replica, id: &str, customer_id: i64) {
    replica
        .connection()
        .execute(
            "INSERT INTO sales (id, unit_id, customer_id) VALUES (?1, ?2, ?3)",
            rusqlite::params![id, UNIT, customer_id],
        )
        .expect("the host writes its sale");
}

/// A replica in a fresh file, provisioned by a snapshot holding product 1, "tea".
/// Keep the `Site` alive: it owns the file's folder.
pub fn provisioned_with_tea() -> (Site, Replica, Server) {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    apply_all(
        &mut replica,
        &[server.snapshot(vec![upserts(&[product(1, "tea")])])],
    );
    (site, replica, server)
}

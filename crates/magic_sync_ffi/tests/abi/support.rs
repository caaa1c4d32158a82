//! A shop's server for the ABI's tests: a database, the relay and the
//! socket hub on loopback, run on a runtime of their own so that the test's
//! thread calls the library as an app's would, blocking.

use magic_sync::relay::{ReplicaInfo, Settings};
use magic_sync::{Engine, Numeric, Row};
use magic_sync_testkit::apart::{serve_hub, Served};
pub use magic_sync_testkit::counter::read;
use magic_sync_testkit::counter::{Order, Product, Sale};
use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// What the server makes of a till's sale: a receipt, written by a trigger
/// on the server as the sale is filed, which goes down to that till.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "receipts", down, replica = "till", key(sale_id))]
pub struct Receipt {
    pub sale_id: String,
    pub till: String,
    pub total_with_tax: Numeric,
}

/// The receipts, and the rows the tests start from, beside the counter's
/// tables.
const SCHEMA: &str = "
CREATE TABLE receipts (sale_id text PRIMARY KEY, till text NOT NULL, total_with_tax numeric(10, 2) NOT NULL);
CREATE FUNCTION receipt() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO receipts VALUES (NEW.id, NEW.till, NEW.total * 1.2);
    RETURN NEW;
END $$;
CREATE TRIGGER receipt AFTER INSERT ON sales FOR EACH ROW EXECUTE FUNCTION receipt();
INSERT INTO orders VALUES (1, 't1', 'first'), (2, 't2', 'not t1''s');
";

fn engine() -> Engine {
    Engine::builder()
        .table::<Product>()
        .table::<Order>()
        .table::<Receipt>()
        .table::<Sale>()
        .build()
        .expect("declarations")
}

/// The server, and what a till needs to reach it.
pub struct Server {
    pub runtime: tokio::runtime::Runtime,
    _db: magic_sync_testdb::TestDb,
    pub client: tokio_postgres::Client,
    pub url: String,
    /// The server's key, as `magic-sync key` prints it.
    pub key: String,
    secrets: Vec<(String, String)>,
    dir: tempfile::TempDir,
    _served: Served,
    relay: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Server {
    /// A server for the tills `t1` and `t2`, with 50 products.
    pub fn start() -> Server {
        Server::start_with(2, 50)
    }

    /// A server for the tills `t1` to `t<tills>`, with `products` products.
    pub fn start_with(tills: usize, products: i64) -> Server {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (db, client, served, relay, key) = runtime.block_on(async {
            let db = magic_sync_testdb::database().await;
            let mut client = db.connect().await;
            client
                .batch_execute(magic_sync_testkit::counter::SCHEMA)
                .await
                .unwrap();
            client.batch_execute(SCHEMA).await.unwrap();
            client
                .execute(
                    "INSERT INTO products SELECT i, 'product ' || i, i FROM generate_series(1, $1::bigint) i",
                    &[&products],
                )
                .await
                .unwrap();
            magic_sync::schema::migrate(&mut client).await.unwrap();
            magic_sync::trigger::ensure(&engine(), &mut client, &Default::default())
                .await
                .unwrap();
            let ids: Vec<String> = (1..=tills).map(|i| format!("t{i}")).collect();
            let served = serve_hub(db.config(), &client, &ids).await;
            let key = magic_sync::store::keys::public(&client).await.unwrap();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (config, hub) = (db.config(), served.hub.clone());
            tokio::spawn(async move {
                magic_sync::run::server::server(
                    config,
                    engine(),
                    Settings::default(),
                    &ids.into_iter()
                        .map(|id| ReplicaInfo::live(id, None))
                        .collect::<Vec<_>>(),
                    &hub,
                    &hub,
                    async {
                        stopped.await.ok();
                    },
                )
                .await
                .expect("the relay");
            });
            (db, client, served, stop, key)
        });
        Server {
            runtime,
            _db: db,
            client,
            url: served.url.clone(),
            key: key.to_string(),
            secrets: served.secrets.clone(),
            dir: tempfile::tempdir().unwrap(),
            _served: served,
            relay: Some(relay),
        }
    }

    pub fn secret(&self, till: &str) -> &str {
        &self.secrets.iter().find(|(id, _)| id == till).unwrap().1
    }

    pub fn path(&self, till: &str) -> PathBuf {
        self.dir.path().join(format!("{till}.sqlite"))
    }

    /// Rows of `sql` on the server, each as text.
    pub fn query(&self, sql: &str) -> Vec<String> {
        self.runtime.block_on(self.rows(sql))
    }

    async fn rows(&self, sql: &str) -> Vec<String> {
        let rows = self.client.query(sql, &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect()
    }

    /// Whether `till`'s file holds exactly what the server has for it:
    /// every product, and its own orders.
    pub fn agrees(&self, till: &str) -> bool {
        self.runtime.block_on(self.agreeing(till))
    }

    /// [`agrees`](Self::agrees), from within the server's runtime.
    pub async fn agreeing(&self, till: &str) -> bool {
        let orders =
            format!("SELECT id || ':' || note FROM orders WHERE till = '{till}' ORDER BY id");
        let products = "SELECT id || ':' || name FROM products ORDER BY id";
        let path = self.path(till);
        read(&path, &orders) == self.rows(&orders).await
            && read(&path, products) == self.rows(products).await
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.relay.take() {
            let _ = stop.send(());
        }
    }
}

pub fn c(s: &str) -> CString {
    CString::new(s).unwrap()
}

pub fn c_path(p: &Path) -> CString {
    c(p.to_str().unwrap())
}

/// The words of this thread's last failure.
pub fn last_error() -> Option<String> {
    let words = magic_sync_ffi::ms_last_error();
    // SAFETY: null, or the library's string, kept until this thread's next call.
    (!words.is_null()).then(|| {
        unsafe { CStr::from_ptr(words) }
            .to_string_lossy()
            .into_owned()
    })
}

/// Takes a string the library handed out, and frees it.
pub fn take(s: *mut std::ffi::c_char) -> String {
    assert!(!s.is_null());
    // SAFETY: the library's string, NUL-terminated; freed once, here.
    let text = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
    unsafe { magic_sync_ffi::ms_string_free(s) };
    text
}

/// The callback the tests give: each message applied goes down the
/// channel in `context`.
pub unsafe extern "C" fn applied(context: *mut c_void, message: u64) {
    // SAFETY: the tests give a `Sender<u64>` they keep alive while the
    // replica runs.
    let sender = unsafe { &*(context as *const mpsc::Sender<u64>) };
    let _ = sender.send(message);
}

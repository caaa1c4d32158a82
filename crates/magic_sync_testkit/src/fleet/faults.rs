//! What goes wrong around a fleet: the relay's session lost and replaced,
//! a replica's file restored from an older copy, a replica cut off by the
//! network.

use super::{fresh_memory, Fleet};
use magic_sync::relay::Relay;
use tokio_postgres::Client;

impl Fleet {
    /// A relay whose session was lost (and its lock with it) replaced by
    /// one on a new session: it takes the lock as a relay starting does,
    /// and the snapshots' session is new too.
    pub async fn reconnect(&mut self) {
        let client = self.db.connect().await;
        self.reconnect_on(client).await;
    }

    /// [`reconnect`](Self::reconnect), the relay's new session on `client`
    /// (one whose traffic is counted, say).
    pub async fn reconnect_on(&mut self, client: Client) {
        let engine = self.relay.engine().clone();
        let settings = self.relay.settings().clone();
        // A session still alive is ended first, and waited for: its lock
        // goes with it.
        if let Ok(row) = self.client.query_one("SELECT pg_backend_pid()", &[]).await {
            let pid: i32 = row.get(0);
            self.writer
                .execute("SELECT pg_terminate_backend($1, 10000)", &[&pid])
                .await
                .unwrap();
        }
        self.client = client;
        self.away = fresh_memory(self.relay.settings());
        self.client
            .batch_execute("SET TIME ZONE 'UTC'")
            .await
            .unwrap();
        assert!(
            Relay::lock(&self.client).await.unwrap(),
            "the new relay takes the lock"
        );
        self.relay = Relay::new(&self.client, engine, settings)
            .await
            .expect("the relay starts");
        self.snapshots = self.db.connect().await;
    }

    /// `id`'s SQLite file replaced by the copy at `path`, as a till restored
    /// from a backup starts.
    pub fn restore(&mut self, id: &str, path: std::path::PathBuf) {
        let (info, cut) = {
            let unit = self.unit(id);
            (unit.info.clone(), unit.cut)
        };
        self.units.remove(id);
        self.add_at(id, info.partition.as_deref(), path);
        let unit = self.unit(id);
        unit.info = info;
        unit.cut = cut;
    }

    pub fn cut(&mut self, id: &str, cut: bool) {
        self.network.cut(id, cut);
        self.unit(id).cut = cut;
    }
}

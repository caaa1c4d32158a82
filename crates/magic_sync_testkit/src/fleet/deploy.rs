//! New builds and settings: the relay of another build on the same lock,
//! a build deployed to the server alone or to every replica too, the relay
//! reconfigured, and what publishing remembers forgotten as time passing
//! would.

use super::{fresh_memory, Fleet};
use magic_sync::catalog::Catalog;
use magic_sync::relay::{Relay, Settings};
use magic_sync::Engine;

impl Fleet {
    /// A new build of the relay: `engine` (with the same declarations) in
    /// place of the running one's, on the same lock.
    pub async fn deploy(&mut self, engine: Engine) {
        let settings = self.relay.settings().clone();
        self.relay = Relay::new(&self.client, engine, settings)
            .await
            .expect("the relay starts");
        self.away = fresh_memory(self.relay.settings());
    }

    /// Whether every replica holds the configuration its build runs whole
    /// (`Replica::configuration`).
    pub fn configured(&self) -> bool {
        self.units.values().all(|u| {
            u.replica
                .configuration()
                .expect("read the configuration")
                .complete
        })
    }

    /// A new build deployed, declarations and all: its triggers ensured,
    /// the relay started with `engine` on the same lock, and every replica
    /// opened again on its file with `engine` (as a till's new build
    /// starts). The reference follows `engine` from then on.
    pub async fn redeploy(&mut self, engine: Engine) -> magic_sync::trigger::Ensured {
        let ensured = self.redeploy_server(engine).await;
        let ids: Vec<String> = self.units.keys().cloned().collect();
        for id in ids {
            let path = self.units[&id].path.clone();
            let replica = self.open_replica(&id, &path);
            self.unit(&id).replica = replica;
        }
        ensured
    }

    /// A new build of the server alone: its triggers ensured and the relay
    /// started with `engine`; the replicas keep the build they run. The
    /// reference follows `engine` from then on.
    pub async fn redeploy_server(&mut self, engine: Engine) -> magic_sync::trigger::Ensured {
        let ensured = magic_sync::trigger::ensure(
            &engine,
            &mut self.writer,
            &magic_sync::trigger::InstallSettings::default(),
        )
        .await
        .expect("the new build's triggers");
        self.catalog = Catalog::read(&self.client, &engine).await.unwrap();
        let settings = self.relay.settings().clone();
        self.relay = Relay::new(&self.client, engine.clone(), settings)
            .await
            .expect("the new build's relay starts");
        self.engine = engine;
        ensured
    }

    /// The relay again, its settings changed by `change`.
    pub async fn reconfigure(&mut self, change: impl FnOnce(&mut Settings)) {
        let mut settings = self.relay.settings().clone();
        change(&mut settings);
        self.relay = Relay::new(&self.client, self.engine.clone(), settings)
            .await
            .expect("the relay starts");
        self.away = fresh_memory(self.relay.settings());
    }

    /// What publishing remembers, as a few minutes' wait leaves it: the
    /// cohort's messages sent lately may go again, and replicas away are
    /// tried again. For tests that stand in for the wall clock by moving
    /// the record's clocks back.
    pub fn minutes_pass(&mut self) {
        self.away = fresh_memory(self.relay.settings());
    }

    /// The relay again, recording every replica's rows and messages
    /// for it alone, whatever `MAGIC_SYNC_RECORD_BY_RULE` says: for the
    /// tests that read the per-replica outbox and record themselves (their
    /// cohort counterparts are in `down/batches.rs`), and the walk and storm
    /// seeds that keep the setting's off side exercised.
    pub async fn per_replica(&mut self) {
        self.reconfigure(|s| s.record_by_rule = false).await;
    }
}

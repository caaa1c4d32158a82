//! The fleet's steps: a pass, the snapshots of the replicas waiting for
//! one, the outboxes published and delivered, what replicas say heeded,
//! their writes sent up and filed; and steps run until nothing moves.

use super::Fleet;
use magic_sync::relay::{Recorded, ReplicaInfo, Snapshot};
use magic_sync::run;
use magic_sync::ReplicaId;

/// What one step of the fleet did: the pass, and the snapshots recorded.
#[derive(Debug)]
pub struct Step {
    pub recorded: Recorded,
    /// Replicas provisioned from scratch, their snapshots recorded.
    pub provisioned: Vec<ReplicaId>,
}

impl std::ops::Deref for Step {
    type Target = Recorded;

    fn deref(&self) -> &Recorded {
        &self.recorded
    }
}

/// From how many messages to replicas that read batches a page of the
/// test fleet's outbox is signed together.
pub const BATCHED_FROM: usize = 2;

impl Fleet {
    fn infos(&self) -> Vec<ReplicaInfo> {
        self.units.values().map(|u| u.info.clone()).collect()
    }

    pub async fn write(&self, sql: &str) {
        self.writer
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The count `sql` (a `SELECT count(...)`) gives, read on the server.
    pub async fn count(&self, sql: &str) -> i64 {
        self.writer
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// A write, then passes until nothing moves, then the check.
    pub async fn settle(&mut self, sql: &str) {
        self.write(sql).await;
        self.sync().await;
        self.check().await;
    }

    /// One step that provisions exactly `unit` from scratch; then passes
    /// until nothing moves, and the check.
    pub async fn provisions(&mut self, unit: &str) {
        let step = self.record().await;
        assert_eq!(step.provisioned, vec![unit.to_string()]);
        self.deliver().await;
        self.sync().await;
        self.check().await;
    }

    /// One step: a pass, then the snapshot of every replica waiting for
    /// one, each streamed to the network on the snapshots' connection (a
    /// replica cut off fails its snapshot, and waits for the next step).
    pub async fn record(&mut self) -> Step {
        let recorded = self.pass().await;
        let mut provisioned = Vec::new();
        for replica in recorded.waiting.clone() {
            if let Some(streamed) = self.snapshot(&replica).await {
                provisioned.push(streamed);
            }
        }
        self.provisionings += provisioned.len();
        Step {
            recorded,
            provisioned,
        }
    }

    /// One step whose snapshots stream while the server writes: for each
    /// replica waiting for one, a transaction doing `open` is begun before
    /// the snapshot takes its view and committed while it streams, `during`
    /// is written beside it, and a pass plans both for the others, all while
    /// the snapshot stands still after taking its view. A write the schema
    /// refuses changes nothing.
    pub async fn record_amid(&mut self, open: &str, during: &str) -> Step {
        let recorded = self.pass().await;
        let mut provisioned = Vec::new();
        for replica in recorded.waiting.clone() {
            let Some(snapshot) = self.begin_snapshot(&replica).await else {
                continue;
            };
            let other = self.db.connect().await;
            let opened = other
                .batch_execute(&format!("BEGIN; {open};"))
                .await
                .is_ok();
            let gate = crate::gate::Gate::new(&self.network, &replica, 0);
            let mut worker = self.db.connect().await;
            let streaming = snapshot.stream(&mut worker, &gate);
            tokio::pin!(streaming);
            tokio::select! {
                () = gate.reached() => {}
                done = &mut streaming => {
                    // Out of reach, or nothing to hold it at.
                    if let Ok(s) = done {
                        if s.recorded {
                            provisioned.push(s.replica);
                        }
                    }
                    continue;
                }
            }
            let end = if opened { "COMMIT" } else { "ROLLBACK" };
            if other.batch_execute(end).await.is_err() {
                other.batch_execute("ROLLBACK").await.ok();
            }
            self.writer.batch_execute(during).await.ok();
            self.pass().await;
            gate.open();
            match streaming.await {
                Ok(s) if s.recorded => provisioned.push(s.replica),
                Ok(_) => {}
                Err(failed) => assert!(
                    self.network.is_cut(&replica),
                    "a snapshot failed with its replica in reach: {failed}"
                ),
            }
        }
        self.provisionings += provisioned.len();
        Step {
            recorded,
            provisioned,
        }
    }

    /// One pass, and nothing else.
    pub async fn pass(&mut self) -> Recorded {
        let infos = self.infos();
        let recorded = self
            .relay
            .record(&mut self.client, &infos, self.network.max_message_bytes())
            .await
            .expect("a pass records");
        self.dropped += recorded.dropped.len();
        recorded
    }

    /// Begins the snapshot of `replica`, waiting for one.
    pub async fn begin_snapshot(&mut self, replica: &str) -> Option<Snapshot> {
        self.relay
            .begin_snapshot(&mut self.client, replica)
            .await
            .expect("a snapshot begins")
    }

    /// Streams the snapshot of `replica` to the network, begun now; its
    /// replica if it was recorded.
    pub async fn snapshot(&mut self, replica: &str) -> Option<ReplicaId> {
        let snapshot = self.begin_snapshot(replica).await?;
        match snapshot.stream(&mut self.snapshots, &self.network).await {
            Ok(streamed) => streamed.recorded.then_some(streamed.replica),
            Err(failed) => {
                // A row it met that cannot go is set aside; the next
                // attempt goes around it.
                // One a test made die midway is begun again too.
                assert!(
                    self.network.is_cut(replica)
                        || matches!(
                            failed.source,
                            magic_sync::Error::Unsendable(_) | magic_sync::Error::Injected(_)
                        ),
                    "a snapshot failed with its replica in reach: {failed}"
                );
                None
            }
        }
    }

    /// Publishes every outbox to the network: a page's messages signed
    /// together whenever two or more go to replicas that read batches, so
    /// that every walk and storm runs the batches' signatures, which the
    /// relay uses only from [`magic_sync::relay::BATCH_FROM`] by default.
    pub async fn publish(&mut self) {
        magic_sync::relay::publish_beside(
            &self.client,
            &self.network,
            16,
            BATCHED_FROM,
            &mut self.away,
        )
        .await
        .expect("publishing");
    }

    /// Publishes, delivers every message to every replica that is live and
    /// reachable, and brings back what they say.
    pub async fn deliver(&mut self) -> usize {
        self.publish().await;
        let mut applied = 0;
        for (id, unit) in &mut self.units {
            if !unit.info.live || unit.cut {
                continue;
            }
            for message in self.network.take(id) {
                applied += 1;
                if let Some(report) = run::replica::deliver(&mut unit.replica, &message).unwrap() {
                    self.network.report(id, report);
                }
            }
        }
        self.heed().await;
        applied
    }

    /// Hands what replicas said to the relay.
    pub async fn heed(&mut self) {
        let reports = self.network.reports();
        run::server::heed(&mut self.client, &self.engine, &self.network, reports)
            .await
            .expect("the relay heeds what replicas say");
    }

    /// Every reachable live replica sends up what is due of what its host
    /// wrote (an upload unanswered for `patience` is due again); the server
    /// files it and answers, and each replica lets go of what was filed.
    /// Returns the uploads sent.
    pub async fn upload(&mut self, patience: std::time::Duration) -> usize {
        let max = self.network.max_message_bytes();
        let mut sent = 0;
        for (id, unit) in &mut self.units {
            if !unit.info.live || unit.cut {
                continue;
            }
            while let Some(up) = unit
                .replica
                .upload(max, patience)
                .expect("the replica gathers its writes")
            {
                self.network.report(id, run::Report::Upload(up));
                sent += 1;
                if patience.is_zero() {
                    // Everything due again at once: one upload each.
                    break;
                }
            }
        }
        self.heed().await;
        let mut told = false;
        for (id, unit) in &mut self.units {
            let mut released = 0;
            for filed in self.network.take_answers(id) {
                released += unit.replica.filed(&filed).expect("the replica lets go");
            }
            if released > 0 {
                let report = run::replica::progress(&unit.replica).expect("its progress");
                self.network.report(id, report);
                told = true;
            }
        }
        if told {
            self.heed().await;
        }
        sent
    }

    /// Steps until nothing moves; returns the messages applied.
    pub async fn sync(&mut self) -> usize {
        let mut total = 0;
        for _ in 0..100 {
            let step = self.record().await;
            let applied = self.deliver().await;
            total += applied;
            let moved = step.messages > 0
                || step.planned.notes > 0
                || step.planned.sends > 0
                || step.deployed.is_some()
                || !step.provisioned.is_empty();
            if !moved && applied == 0 {
                return total;
            }
        }
        panic!("the fleet did not settle in 100 steps");
    }
}

//! The storm: the random walk's server writes and tills' sales, through the
//! real relay and real SQLite replicas, while everything that can fail
//! does, at random and all together:
//!
//! - the transport refuses about a fifth of the sends (a replica out of
//!   reach for the step, now and then for several steps) and loses a few
//!   messages, uploads and answers;
//! - the relay dies at each of its fault points, and loses its lock mid-pass;
//! - replicas take only part of what waits for them, die after applying
//!   before they acknowledge, and go unheard;
//! - the server's database and tills' files are restored from older copies;
//! - the build's codec has a bug that sets rows aside, and the host's
//!   database refuses large sales, until a deploy fixes both; the fixed
//!   build also declares the notices to every till, so a deployment works
//!   through them amid the rest;
//! - the seeds that record by rule (every other seed; the rest record
//!   each till's rows for it alone) have that deployment change what the
//!   cohort of the `all` tables holds while its members come and go, are
//!   restored and provisioned again, and pass their outbox's bound.
//!
//! Each time the storm lets the fleet settle, every replica holds exactly
//! what it should given the rows set aside, and its digest matches what the
//! server records of it. Once the faults stop and the fix is deployed,
//! every replica holds exactly what its rules give it, nothing is left set
//! aside, and every sale a till holds is on the server. Provisionings are
//! counted and bounded by the faults that call for one.
//!
//! `MAGIC_SYNC_SEED=n` replays one seed; `MAGIC_SYNC_SEEDS` and
//! `MAGIC_SYNC_STEPS` change the budget.

use fail::FailScenario;
use magic_sync::relay::Compared;
use magic_sync::run::{self, Report};
use magic_sync_testkit::fleet::Fleet;
use magic_sync_testkit::shop;
use magic_sync_testkit::walk::{env, pick, seeds, write};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use tokio_postgres::Client;

const UNITS: [&str; 4] = ["u1", "u2", "u3", "u4"];
const PARTITIONS: [&str; 4] = ["north", "north", "south", "east"];

/// The places the server side dies at, one armed now and then.
const DEATHS: [&str; 5] = [
    "relay-after-commit",
    "relay-before-commit",
    "publish-after-send",
    "snapshot-mid-stream",
    "file-after-filing",
];

#[tokio::test]
async fn every_replica_holds_what_it_should_once_the_storm_passes() {
    let scenario = FailScenario::setup();
    let steps = env("MAGIC_SYNC_STEPS").unwrap_or(30);
    let mut totals = Tally::default();
    for seed in seeds(3, 0x5707) {
        println!("storm: seed {seed} ({steps} steps); replay with MAGIC_SYNC_SEED={seed}");
        let tally = storm(seed, steps).await;
        println!("storm: seed {seed}: {tally}");
        totals.add(&tally);
    }
    println!("storm: all seeds: {totals}");
    scenario.teardown();
}

/// What one storm did: the faults of each kind, and what they cost.
#[derive(Debug, Default)]
struct Tally {
    sends_refused: u64,
    out_for_long: u64,
    lost: u64,
    partial: u64,
    unheard: u64,
    uploads_lost: u64,
    answers_lost: u64,
    deaths: BTreeMap<&'static str, u64>,
    server_restores: u64,
    till_restores: u64,
    rows_set_aside: u64,
    settles: u64,
    digests_differed: u64,
    sales: u64,
    /// Sales the host refuses until the fix.
    sales_refused: u64,
    /// Tills found past their outbox's bound, or with their snapshot's
    /// end lost.
    dropped: u64,
    /// Provisionings after the fleet's first, and the most the faults
    /// above could call for.
    provisionings: u64,
    bound: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.sends_refused += other.sends_refused;
        self.out_for_long += other.out_for_long;
        self.lost += other.lost;
        self.partial += other.partial;
        self.unheard += other.unheard;
        self.uploads_lost += other.uploads_lost;
        self.answers_lost += other.answers_lost;
        for (point, n) in &other.deaths {
            *self.deaths.entry(point).or_default() += n;
        }
        self.server_restores += other.server_restores;
        self.till_restores += other.till_restores;
        self.rows_set_aside += other.rows_set_aside;
        self.settles += other.settles;
        self.digests_differed += other.digests_differed;
        self.sales += other.sales;
        self.sales_refused += other.sales_refused;
        self.dropped += other.dropped;
        self.provisionings += other.provisionings;
        self.bound += other.bound;
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sends refused {}, out of reach for long {}, messages lost {}, taken in part {}, \
             reports unheard {}, uploads lost {}, answers lost {}, deaths {:?}, \
             server restores {}, till restores {}, rows set aside {}, settles {}, \
             digests differed {}, sales {} ({} refused until the fix), dropped {}; \
             provisionings {} (bound {})",
            self.sends_refused,
            self.out_for_long,
            self.lost,
            self.partial,
            self.unheard,
            self.uploads_lost,
            self.answers_lost,
            self.deaths,
            self.server_restores,
            self.till_restores,
            self.rows_set_aside,
            self.settles,
            self.digests_differed,
            self.sales,
            self.sales_refused,
            self.dropped,
            self.provisionings,
            self.bound,
        )
    }
}

struct Storm {
    rng: StdRng,
    fleet: Fleet,
    step: u64,
    /// What the transport took for each till and has not handed it yet,
    /// oldest first.
    carried: BTreeMap<String, VecDeque<Vec<u8>>>,
    /// Tills out of reach until a step.
    out_until: BTreeMap<String, u64>,
    /// The step a copy of the server's database was taken at.
    server_copy: Option<u64>,
    /// Copies of tills' files.
    till_copies: BTreeMap<String, std::path::PathBuf>,
    fixed: bool,
    tally: Tally,
}

async fn storm(seed: u64, steps: u64) -> Tally {
    let mut fleet = Fleet::with_relay_engine(shop::ROWS, shop::buggy_engine()).await;
    if seed % 2 == 1 {
        // Every other seed records by rule: the catalogue's cohort lives
        // through the storm, and the fix's deployment changes what it
        // holds (the notices become an `all` table) mid-storm. Its
        // outboxes are bounded tight: a member out of reach for long passes
        // the bound with the cohort's messages it is owed, and is
        // provisioned again rather than keeping them for ever.
        fleet
            .reconfigure(|s| {
                s.record_by_rule = true;
                s.outbox_messages = 2;
                s.outbox_check_every = Duration::ZERO;
            })
            .await;
        println!("storm: seed {seed} records by rule");
    } else {
        fleet.per_replica().await;
        println!("storm: seed {seed} records each till's rows for it alone");
    }
    // The host refuses large sales until the fix: those wait in the inbox.
    fleet
        .write("ALTER TABLE sales ADD CONSTRAINT storm_small CHECK (total < 90)")
        .await;
    for (unit, partition) in UNITS.iter().zip(PARTITIONS) {
        fleet.add(unit, Some(partition));
    }
    fleet.sync().await;
    fleet.check().await;
    let first = fleet.provisionings;
    let mut storm = Storm {
        rng: StdRng::seed_from_u64(seed),
        fleet,
        step: 0,
        carried: BTreeMap::new(),
        out_until: BTreeMap::new(),
        server_copy: None,
        till_copies: BTreeMap::new(),
        fixed: false,
        tally: Tally::default(),
    };
    for step in 0..steps {
        storm.step = step;
        let did = storm.blow().await;
        println!("seed {seed} step {step}: {}", did.join(" | "));
        // Whatever the step left (notes pending, a pass cut short, a
        // database restored), the rows each holder kept up holds by its
        // rule are read right from the rows and the notes (decision 176).
        storm.fleet.check_rules().await;
        if step + 1 == steps * 2 / 3 {
            // The fix: a build whose codecs encode every row, and the
            // host's constraint gone.
            storm.fix().await;
            println!("seed {seed} step {step}: the fix is deployed");
        }
        if storm.rng.gen_bool(0.15) && storm.server_copy.is_none() {
            storm.settle().await;
        }
    }
    if !storm.fixed {
        storm.fix().await;
    }
    storm.settle().await;
    assert_eq!(
        storm.fleet.quarantined().await,
        BTreeSet::new(),
        "seed {seed}: the fixed build let go of every row set aside"
    );
    storm.every_sale_is_on_the_server().await;
    if seed % 2 == 1 {
        let members: i64 = storm.fleet.count("SELECT count(*) FROM sync.members").await;
        assert!(members > 0, "seed {seed}: tills are members of the cohort");
    }
    let mut tally = storm.tally;
    tally.provisionings = (storm.fleet.provisionings - first) as u64;
    tally.dropped = storm.fleet.dropped as u64;
    // A lost message or gap costs its till a snapshot; a restored till,
    // one; a digest that differed, one. A restored server, up to two per
    // till: the gap its older chain opens before anything shows it was
    // restored, then the new epoch once a till says it applied (or was
    // answered) more than the copy records. A till past its outbox's
    // bound, or whose snapshot's end was lost, one.
    tally.bound = tally.lost
        + tally.dropped
        + tally.till_restores
        + tally.server_restores * 2 * UNITS.len() as u64
        + tally.digests_differed;
    assert!(
        tally.provisionings <= tally.bound,
        "seed {seed}: {} provisionings, more than the faults call for ({})",
        tally.provisionings,
        tally.bound
    );
    tally
}

impl Storm {
    /// The fix deployed: the host lets large sales in, and a build whose
    /// codecs encode every row starts; its declarations send notices to
    /// every till, so a deployment runs through the rest of the storm.
    async fn fix(&mut self) {
        self.fleet
            .write("ALTER TABLE sales DROP CONSTRAINT storm_small")
            .await;
        self.fleet.redeploy_server(shop::redeclared()).await;
        self.fixed = true;
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.gen_bool(p)
    }

    /// One step of the storm; says what it did.
    async fn blow(&mut self) -> Vec<String> {
        let mut did = Vec::new();
        self.server_writes(&mut did).await;
        self.till_writes(&mut did);
        self.reach(&mut did);
        self.restores(&mut did).await;
        let death = match self.chance(0.3) {
            true => Some(DEATHS[self.rng.gen_range(0..DEATHS.len())]),
            false => None,
        };
        if let Some(point) = death {
            did.push(format!("armed {point}"));
        }
        self.relay(death, &mut did).await;
        self.publish(death == Some("publish-after-send"), &mut did)
            .await;
        self.hand_over(&mut did).await;
        // Uploads go on while a copy of the server waits to be restored:
        // what the restore loses of them, the tills send again once they
        // meet its new epoch.
        if self.chance(0.5) {
            self.uploads(death == Some("file-after-filing"), &mut did)
                .await;
        }
        did
    }

    async fn server_writes(&mut self, did: &mut Vec<String>) {
        for _ in 0..self.rng.gen_range(1..=3) {
            let sql = match self.rng.gen_range(0..10) {
                // Now and then a name this build's codec chokes on, and
                // back again.
                0 => {
                    let c = self.rng.gen_range(7..=10);
                    format!("UPDATE customers SET name = 'c{c} bug' WHERE id = {c}")
                }
                1 => {
                    let p = self.rng.gen_range(1..=6);
                    format!("UPDATE products SET name = 'p{p}' WHERE id = {p}")
                }
                2 => {
                    let p = self.rng.gen_range(1..=6);
                    format!("UPDATE products SET name = 'p{p} bug' WHERE id = {p}")
                }
                _ => write(&mut self.rng, &UNITS),
            };
            if sql.contains("bug") {
                self.tally.rows_set_aside += 1;
            }
            // A write the schema refuses changes nothing.
            let ok = self.fleet.writer.batch_execute(&sql).await.is_ok();
            did.push(format!("{sql} [{}]", if ok { "ok" } else { "refused" }));
        }
    }

    /// A till now and then rings up a sale.
    fn till_writes(&mut self, did: &mut Vec<String>) {
        if !self.chance(0.4) {
            return;
        }
        let unit = pick(&mut self.rng, &UNITS);
        self.tally.sales += 1;
        let id = format!("{unit}-s{}", self.tally.sales);
        let total = self.rng.gen_range(1..100);
        if total >= 90 {
            self.tally.sales_refused += 1;
        }
        self.fleet
            .unit(unit)
            .replica
            .connection()
            .execute(
                "INSERT INTO sales (id, unit_id, customer_id, total, version) VALUES (?1, ?2, NULL, ?3, 1)",
                rusqlite::params![id, unit, format!("{total}.50")],
            )
            .unwrap();
        did.push(format!("{unit} sells {id}"));
    }

    /// Which tills the transport reaches this step.
    fn reach(&mut self, did: &mut Vec<String>) {
        for unit in UNITS {
            let out = match self.out_until.get(unit) {
                Some(&until) if until > self.step => true,
                _ if self.rng.gen_bool(0.03) => {
                    let until = self.step + self.rng.gen_range(3..8);
                    self.out_until.insert(unit.to_string(), until);
                    self.tally.out_for_long += 1;
                    did.push(format!("{unit} out of reach until step {until}"));
                    true
                }
                _ if self.rng.gen_bool(0.2) => {
                    self.tally.sends_refused += 1;
                    did.push(format!("{unit} out of reach"));
                    true
                }
                _ => false,
            };
            self.fleet.cut(unit, out);
        }
    }

    async fn restores(&mut self, did: &mut Vec<String>) {
        let roll: f64 = self.rng.gen();
        match self.server_copy {
            None if roll < 0.05 => {
                copy_server(&self.fleet.writer).await;
                self.server_copy = Some(self.step);
                did.push("the server's database copied".into());
            }
            Some(at) if self.step >= at + 2 && roll < 0.5 => {
                restore_server(&self.fleet.writer).await;
                self.server_copy = None;
                self.tally.server_restores += 1;
                // A restored database is a server started again.
                self.fleet.reconnect().await;
                did.push(format!("the server restored from its copy of step {at}"));
                // Tills reaching it again say where they stand.
                self.say_where_they_stand(false).await;
            }
            _ => {}
        }
        let unit = pick(&mut self.rng, &UNITS);
        if self.chance(0.06) {
            let path = self
                .fleet
                .dir
                .path()
                .join(format!("{unit}-copy-{}.sqlite", self.step));
            self.fleet
                .unit(unit)
                .replica
                .connection()
                .execute("VACUUM INTO ?1", [path.to_str().unwrap()])
                .unwrap();
            self.till_copies.insert(unit.to_string(), path);
            did.push(format!("{unit}'s file copied"));
        } else if !self.till_copies.is_empty() && self.chance(0.15) {
            let copied: Vec<String> = self.till_copies.keys().cloned().collect();
            let unit = copied[self.rng.gen_range(0..copied.len())].clone();
            let unit = unit.as_str();
            if let Some(path) = self.till_copies.remove(unit) {
                // Restored, the till has lost what it got since, and its
                // sales since the copy that were not filed.
                self.carried.remove(unit);
                self.fleet.restore(unit, path);
                self.tally.till_restores += 1;
                did.push(format!("{unit} restored from its copy"));
            }
        }
    }

    /// A pass, and the snapshots it leaves waiting; the relay dies at
    /// `death` if that is one of its own.
    async fn relay(&mut self, death: Option<&'static str>, did: &mut Vec<String>) {
        match death {
            Some(point @ "relay-after-commit") => {
                fail::cfg(point, "1*return").unwrap();
                let died = self.pass().await;
                fail::remove(point);
                if let Err(e) = died {
                    assert!(injected(&e, point), "{e}");
                    self.died(point, did);
                    // The relay that starts next publishes what it recorded.
                    let engine = self.fleet.relay.engine().clone();
                    self.fleet.deploy(engine).await;
                }
            }
            Some(point @ "relay-before-commit") => {
                let pid: i32 = self
                    .fleet
                    .client
                    .query_one("SELECT pg_backend_pid()", &[])
                    .await
                    .unwrap()
                    .get(0);
                let config = self.fleet.db.config();
                fail::cfg_callback(point, move || super::end_session(config.clone(), pid)).unwrap();
                let lost = self.pass().await;
                fail::remove(point);
                // A pass with nothing to commit never gets there.
                if let Err(e) = lost {
                    assert!(e.is_transient(), "the session went: {e}");
                    self.died(point, did);
                    self.fleet.reconnect().await;
                }
            }
            Some(point @ "snapshot-mid-stream") => {
                fail::cfg(point, "1*return").unwrap();
                let step = self.fleet.record().await;
                fail::remove(point);
                if !step.recorded.waiting.is_empty() {
                    did.push(format!("snapshots of {:?}", step.recorded.waiting));
                    *self.tally.deaths.entry(point).or_default() += 1;
                }
            }
            _ => {
                let step = self.fleet.record().await;
                if !step.provisioned.is_empty() {
                    did.push(format!("provisioned {:?}", step.provisioned));
                }
            }
        }
    }

    /// One pass, whatever it comes to.
    async fn pass(&mut self) -> magic_sync::Result<magic_sync::relay::Recorded> {
        let infos = infos(&self.fleet);
        let max = self.fleet.network.max_message_bytes();
        let recorded = self
            .fleet
            .relay
            .record(&mut self.fleet.client, &infos, max)
            .await;
        if let Ok(recorded) = &recorded {
            self.fleet.dropped += recorded.dropped.len();
        }
        recorded
    }

    fn died(&mut self, point: &'static str, did: &mut Vec<String>) {
        *self.tally.deaths.entry(point).or_default() += 1;
        did.push(format!("the relay died at {point}"));
    }

    async fn publish(&mut self, dies: bool, did: &mut Vec<String>) {
        const POINT: &str = "publish-after-send";
        if dies {
            fail::cfg(POINT, "1*return").unwrap();
        }
        let published = magic_sync::relay::publish(
            &self.fleet.client,
            &self.fleet.network,
            16,
            magic_sync_testkit::fleet::BATCHED_FROM,
        )
        .await;
        if dies {
            fail::remove(POINT);
            // Nothing to send never gets there.
            if published.is_err() {
                *self.tally.deaths.entry(POINT).or_default() += 1;
                did.push(format!("the publisher died at {POINT}"));
            }
        } else {
            published.expect("publishing");
        }
    }

    /// The transport hands each till in reach what it took for it, losing
    /// a few; each till applies some or all of what came, dying now and
    /// then before it acknowledges; some of what they say goes unheard.
    async fn hand_over(&mut self, did: &mut Vec<String>) {
        for unit in UNITS {
            let reachable = !self.fleet.unit(unit).cut;
            let taken = self.fleet.network.take(unit);
            let carried = self.carried.entry(unit.to_string()).or_default();
            for message in taken {
                if self.rng.gen_bool(0.03) {
                    self.tally.lost += 1;
                    did.push(format!("a message to {unit} lost"));
                } else {
                    carried.push_back(message);
                }
            }
            if !reachable || carried.is_empty() {
                continue;
            }
            let mut take = carried.len();
            if self.rng.gen_bool(0.15) {
                take = self.rng.gen_range(0..take);
                self.tally.partial += 1;
                did.push(format!("{unit} takes {take} of {}", carried.len()));
            }
            let dies_at = match self.rng.gen_bool(0.05) && take > 0 {
                true => Some(self.rng.gen_range(0..take)),
                false => None,
            };
            let messages: Vec<Vec<u8>> = carried.drain(..take).collect();
            for (i, message) in messages.iter().enumerate() {
                let dies = dies_at == Some(i);
                if dies {
                    fail::cfg("replica-after-apply", "1*return").unwrap();
                }
                let said = run::replica::deliver(&mut self.fleet.unit(unit).replica, message);
                if dies {
                    fail::remove("replica-after-apply");
                    assert!(
                        matches!(
                            said,
                            Err(magic_sync::replica::Error::Injected("replica-after-apply"))
                        ),
                        "{said:?}"
                    );
                    *self.tally.deaths.entry("replica-after-apply").or_default() += 1;
                    did.push(format!("{unit} died before it acknowledged"));
                    // What it had not come to waits for it still.
                    let carried = self.carried.entry(unit.to_string()).or_default();
                    for message in messages[i + 1..].iter().rev() {
                        carried.push_front(message.clone());
                    }
                    break;
                }
                match said.expect("the till applies what its server sent") {
                    Some(_) if self.rng.gen_bool(0.1) => self.tally.unheard += 1,
                    Some(report) => self.fleet.network.report(unit, report),
                    None => {}
                }
            }
        }
        self.fleet.heed().await;
    }

    /// Tills send up what is due; the server files it (dying after filing
    /// when `dies`) and answers; some uploads and answers are lost.
    async fn uploads(&mut self, dies: bool, did: &mut Vec<String>) {
        const POINT: &str = "file-after-filing";
        let max = self.fleet.network.max_message_bytes();
        // Now and then long enough has passed for what went unanswered to
        // go again.
        let patience = match self.chance(0.3) {
            true => Duration::ZERO,
            false => Duration::from_secs(3600),
        };
        let mut reports = Vec::new();
        for unit in UNITS {
            if self.fleet.unit(unit).cut {
                continue;
            }
            for _ in 0..4 {
                let Some(up) = self
                    .fleet
                    .unit(unit)
                    .replica
                    .upload(max, patience)
                    .expect("the till gathers its writes")
                else {
                    break;
                };
                match self.rng.gen_bool(0.1) {
                    true => self.tally.uploads_lost += 1,
                    false => reports.push((unit.into(), Report::Upload(up))),
                }
            }
        }
        if dies {
            fail::cfg(POINT, "1*return").unwrap();
        }
        let heeded = run::server::heed(
            &mut self.fleet.client,
            &self.fleet.engine,
            &self.fleet.network,
            reports,
        )
        .await;
        if dies {
            fail::remove(POINT);
        }
        match heeded {
            Ok(_) => {}
            Err(e) if dies && e.is_transient() => {
                *self.tally.deaths.entry(POINT).or_default() += 1;
                did.push(format!("the server died at {POINT}"));
            }
            Err(e) => panic!("the relay heeds what tills say: {e}"),
        }
        for unit in UNITS {
            for filed in self.fleet.network.take_answers(unit) {
                if self.rng.gen_bool(0.1) {
                    self.tally.answers_lost += 1;
                    continue;
                }
                self.fleet
                    .unit(unit)
                    .replica
                    .filed(&filed)
                    .expect("the till lets go of what was filed");
            }
        }
    }

    /// Each till in reach says where it stands (what a quiet replica's
    /// loop says again), and the server hears it.
    async fn say_where_they_stand(&mut self, with_digests: bool) {
        for unit in UNITS {
            if self.fleet.unit(unit).cut {
                continue;
            }
            let replica = &self.fleet.units[unit].replica;
            let standing = run::replica::standing(replica);
            let digest = with_digests.then(|| run::replica::digest(replica).unwrap());
            for report in standing.into_iter().chain(digest) {
                self.fleet.network.report(unit, report);
            }
        }
        if with_digests {
            // As if the minute between comparisons had passed.
            a_minute_later(&mut self.fleet).await;
        }
        let reports = self.fleet.network.reports();
        let heeded = run::server::heed(
            &mut self.fleet.client,
            &self.fleet.engine,
            &self.fleet.network,
            reports,
        )
        .await
        .expect("the relay heeds what tills say");
        for (unit, compared) in heeded.digests {
            if let Compared::Differed(what) = compared {
                println!("  {unit}'s digest differed: {what:?}");
                self.tally.digests_differed += 1;
            }
        }
    }

    /// The faults stop for a while: every till in reach again, what the
    /// transport carries handed over whole, what each says heard, uploads
    /// sent until filed. Then every till holds exactly what it should, and
    /// its digest matches the record.
    async fn settle(&mut self) {
        self.tally.settles += 1;
        for unit in UNITS {
            self.fleet.cut(unit, false);
        }
        self.out_until.clear();
        for (unit, carried) in std::mem::take(&mut self.carried) {
            for message in carried {
                if let Some(report) =
                    run::replica::deliver(&mut self.fleet.unit(&unit).replica, &message).unwrap()
                {
                    self.fleet.network.report(&unit, report);
                }
            }
        }
        self.fleet.heed().await;
        for _ in 0..4 {
            a_minute_later(&mut self.fleet).await;
            self.say_where_they_stand(false).await;
            self.fleet.sync().await;
            for _ in 0..8 {
                if self.fleet.upload(Duration::ZERO).await == 0 {
                    break;
                }
            }
            self.fleet.sync().await;
            self.say_where_they_stand(true).await;
            if self.fleet.sync().await == 0 {
                break;
            }
        }
        self.fleet.check().await;
        // What every till holds is what the server records it holding.
        for unit in UNITS {
            let digest = run::replica::digest(&self.fleet.unit(unit).replica).unwrap();
            a_minute_later(&mut self.fleet).await;
            let heeded = run::server::heed(
                &mut self.fleet.client,
                &self.fleet.engine,
                &self.fleet.network,
                vec![(unit.into(), digest)],
            )
            .await
            .unwrap();
            assert_eq!(
                heeded.digests,
                vec![(magic_sync::ReplicaId::from(unit), Compared::Matched)],
                "step {}: {unit}'s digest against the record",
                self.step
            );
        }
    }

    /// Every sale a till holds reached the server as the till wrote it, and
    /// no till has anything left to send.
    async fn every_sale_is_on_the_server(&mut self) {
        let on_server: BTreeMap<String, String> = self
            .fleet
            .writer
            .query("SELECT id, total::text FROM sales", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        for unit in UNITS {
            let replica = &self.fleet.unit(unit).replica;
            let held: Vec<(String, String)> = replica
                .connection()
                .prepare("SELECT id, CAST(total AS TEXT) FROM sales")
                .unwrap()
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            for (id, total) in held {
                assert_eq!(
                    on_server.get(&id),
                    Some(&total),
                    "{unit}'s sale {id} on the server"
                );
            }
            assert!(
                replica.progress().unwrap().tables.is_empty(),
                "{unit} has writes the server has not filed"
            );
        }
    }
}

/// As if a few minutes passed: the minute a replica's digests wait
/// between comparisons, the seconds a replica asking for a snapshot again
/// waits for one, and those a message (or a snapshot's end) goes
/// unacknowledged before it is sent (or begun) again, in the record and in
/// what publishing remembers.
async fn a_minute_later(fleet: &mut Fleet) {
    fleet.minutes_pass();
    fleet
        .write(
            "UPDATE sync.replicas SET digest_compared_at = now() - interval '2 minutes',
                 asked_at = now() - interval '2 minutes',
                 snapshot_ended_at = now() - interval '2 minutes';
             UPDATE sync.outbox SET sent_at = now() - interval '2 minutes' WHERE sent_at IS NOT NULL;
             UPDATE sync.acks SET at = now() - interval '2 minutes';",
        )
        .await;
}

fn injected(e: &magic_sync::Error, at: &str) -> bool {
    matches!(e, magic_sync::Error::Injected(name) if *name == at)
}

fn infos(fleet: &Fleet) -> Vec<magic_sync::relay::ReplicaInfo> {
    fleet.units.values().map(|u| u.info.clone()).collect()
}

/// The tables and sequences of the server's database a restore brings back:
/// the host's and the `sync` schema's.
const SCHEMAS: &str = "('public', 'logistics', 'sync')";

/// Copies the server's database (its tables and sequences) aside, as a
/// backup does.
async fn copy_server(client: &Client) {
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS storm_copy CASCADE;
             CREATE SCHEMA storm_copy;
             CREATE TABLE storm_copy.sequences AS
                 SELECT schemaname, sequencename, last_value FROM pg_sequences
                 WHERE schemaname IN {SCHEMAS};"
        ))
        .await
        .unwrap();
    for (schema, table, _) in tables(client).await {
        client
            .batch_execute(&format!(
                "CREATE TABLE storm_copy.\"{schema}.{table}\" AS TABLE \"{schema}\".\"{table}\""
            ))
            .await
            .unwrap();
    }
}

/// Puts the copy back in place of everything since, with no trigger
/// firing: what restoring the backup does.
async fn restore_server(client: &Client) {
    let tables = tables(client).await;
    let names: Vec<String> = tables
        .iter()
        .map(|(s, t, _)| format!("\"{s}\".\"{t}\""))
        .collect();
    // Deleted rather than truncated: the engine refuses a TRUNCATE of its
    // tables. Its triggers fire whatever the session's role, so the host's
    // tables go first and the `sync` schema's last, in place of the notes
    // the host's tables' restore wrote.
    let mut sql = "BEGIN; SET LOCAL session_replication_role = replica;".to_string();
    for ((schema, table, columns), name) in tables.iter().zip(&names) {
        sql.push_str(&format!(
            "DELETE FROM {name};
             INSERT INTO {name} ({columns}) OVERRIDING SYSTEM VALUE
             SELECT {columns} FROM storm_copy.\"{schema}.{table}\";"
        ));
    }
    sql.push_str(
        "SELECT CASE WHEN last_value IS NULL
                     THEN setval(format('%I.%I', schemaname, sequencename), 1, false)
                     ELSE setval(format('%I.%I', schemaname, sequencename), last_value) END
         FROM storm_copy.sequences;
         COMMIT;
         DROP SCHEMA storm_copy CASCADE;",
    );
    client.batch_execute(&sql).await.unwrap();
}

/// The ordinary tables of the server's database, with their columns but
/// generated ones: the host's first, the `sync` schema's last.
async fn tables(client: &Client) -> Vec<(String, String, String)> {
    client
        .query(
            &format!(
                "SELECT n.nspname, c.relname,
                        string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum)
                 FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
                      AND NOT a.attisdropped AND a.attgenerated = ''
                 WHERE c.relkind = 'r' AND n.nspname IN {SCHEMAS}
                 GROUP BY 1, 2 ORDER BY n.nspname = 'sync', 1, 2"
            ),
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

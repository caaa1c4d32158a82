//! The rows a holder holds by its own rule, read at its position from the
//! host's rows and the pending notes alone (decision 176), agree with the
//! record while notes are pending: what each note says happened to its row
//! is what tells whether the key was there before them.

use crate::digests::digest_of;
use crate::fleet::Fleet;
use magic_sync::relay::Compared;
use magic_sync::trigger::{ensure, InstallSettings};
use magic_sync::{Engine, Row};

/// Tasks by till, under a key checked only at commit, titled by a domain
/// that refuses NULL (which reading the whole row type from a note's few
/// columns would trip on).
const SCHEMA: &str = "
    CREATE DOMAIN title AS text NOT NULL;
    CREATE TABLE tasks (
        id bigint PRIMARY KEY DEFERRABLE INITIALLY DEFERRED,
        unit_id text NOT NULL,
        title title);
    INSERT INTO tasks VALUES (1, 'a', 'open'), (2, 'b', 'count'), (3, 'a', 'sweep');
";

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "tasks", down, replica = "unit_id", key(id))]
struct Task {
    id: i64,
    unit_id: String,
    title: String,
}

/// Writes `sql`, checks the reading while its notes are pending, then
/// syncs and checks the fleet.
async fn pending_then_synced(fleet: &mut Fleet, sql: &str) {
    fleet.write(sql).await;
    let pending: i64 = fleet.count("SELECT count(*) FROM sync.notes").await;
    assert!(pending > 0, "{sql}: its notes are pending");
    fleet.check_rules().await;
    fleet.sync().await;
    fleet.check().await;
    fleet.check_rules().await;
}

#[tokio::test]
async fn a_holders_rows_are_read_at_its_position_from_what_each_note_says() {
    let engine = Engine::builder().table::<Task>().build().unwrap();
    let mut fleet = Fleet::of(SCHEMA, engine).await;
    fleet.add("a", None);
    fleet.add("b", None);
    fleet.sync().await;
    fleet.check().await;

    // Every key moves up by one, each taken before it is let go: key 2 is
    // noted inserted (task 1's new key) before it is noted deleted (task
    // 2's old one). It was b's before them, but a first note that inserts
    // a key that was there cannot say whose values it had (the last two
    // cases), so keys 2 and 3 are read as not known and stay recorded;
    // keys 1 and 4 are read.
    pending_then_synced(
        &mut fleet,
        "UPDATE tasks SET id = id + 1, title = title || '!'",
    )
    .await;
    // A key inserted then updated in one transaction was nobody's before:
    // its update's pre-image is the row just inserted, a's.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         INSERT INTO tasks VALUES (10, 'a', 'new');
         UPDATE tasks SET unit_id = 'b' WHERE id = 10;
         COMMIT;",
    )
    .await;
    // Inserted and deleted in one transaction: nobody's before or after.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         INSERT INTO tasks VALUES (11, 'a', 'brief');
         DELETE FROM tasks WHERE id = 11;
         COMMIT;",
    )
    .await;
    // Moved from a till to the other and back in one transaction, then
    // deleted in another before any pass: a's before them.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         UPDATE tasks SET unit_id = 'b' WHERE id = 4;
         UPDATE tasks SET unit_id = 'a' WHERE id = 4;
         COMMIT;
         DELETE FROM tasks WHERE id = 4;",
    )
    .await;
    // Now a holds task 2, b tasks 3 and 10. Under the deferrable key, b's
    // task 10 takes key 2 and is updated there, then a's task 2 leaves it:
    // key 2 notes (insert, update, delete), and its first note that is not
    // an insert is b's row, not the a's row that was there.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         UPDATE tasks SET id = 2 WHERE id = 10;
         UPDATE tasks SET title = 'recount' WHERE unit_id = 'b' AND id = 2;
         UPDATE tasks SET id = 12 WHERE unit_id = 'a' AND id = 2;
         COMMIT;",
    )
    .await;
    // b's task 3 takes key 12 (a's) and leaves it again: key 12 notes
    // (insert, delete) of b's row, while a's row there is untouched.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         UPDATE tasks SET id = 12 WHERE id = 3;
         UPDATE tasks SET id = 13 WHERE unit_id = 'b' AND id = 12;
         COMMIT;",
    )
    .await;
    // A note whose key no longer fits the table (as one written before the
    // key's type changed would not) is read as not known, not a failure of
    // the reading; the pass parks it.
    pending_then_synced(
        &mut fleet,
        "INSERT INTO sync.notes (table_name, source, key, op)
             VALUES ('tasks', 'tasks', '[\"T-1\"]', 'u');",
    )
    .await;
}

/// Projects, held by the tills whose jobs or chores point at them; jobs by
/// till, with steps following them; chores by till, under a key checked
/// only at commit (which no foreign key may point at), their till's id
/// blank-padded (a note's JSON keeps the blanks its text drops).
const PLANNED: &str = "
    CREATE TABLE projects (id bigint PRIMARY KEY, name text NOT NULL);
    CREATE TABLE jobs (
        id bigint PRIMARY KEY,
        unit_id text NOT NULL,
        project_id bigint REFERENCES projects,
        title text NOT NULL);
    CREATE TABLE chores (
        id bigint PRIMARY KEY DEFERRABLE INITIALLY DEFERRED,
        unit_id char(2) NOT NULL,
        project_id bigint REFERENCES projects,
        title text NOT NULL);
    CREATE TABLE steps (
        job_id bigint NOT NULL REFERENCES jobs,
        n int NOT NULL,
        what text NOT NULL,
        PRIMARY KEY (job_id, n));
    INSERT INTO projects VALUES (1, 'fit-out'), (2, 'audit');
    INSERT INTO jobs VALUES (1, 'a', 1, 'wire'), (2, 'b', 1, 'paint'), (3, 'a', 2, 'count');
    INSERT INTO chores VALUES (10, 'a', 2, 'sweep'), (11, 'b', NULL, 'stack'), (12, 'a', NULL, 'dust');
    INSERT INTO steps VALUES (1, 1, 'strip'), (1, 2, 'pull'), (3, 1, 'tally');
";

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "projects", down, referenced, key(id))]
struct Project {
    id: i64,
    name: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "jobs", down, replica = "unit_id", key(id))]
struct Job {
    id: i64,
    unit_id: String,
    project_id: Option<i64>,
    title: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "chores", down, replica = "unit_id", key(id))]
struct Chore {
    id: i64,
    unit_id: String,
    project_id: Option<i64>,
    title: String,
}

/// The chores of an earlier build, which every till held.
#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "chores", down, all, key(id))]
struct EveryChore {
    id: i64,
    unit_id: String,
    project_id: Option<i64>,
    title: String,
}

#[derive(Row, Debug, Clone, PartialEq)]
#[row(table = "steps", down, follows = "job_id", key(job_id, n))]
struct Step {
    job_id: i64,
    n: i32,
    what: String,
}

/// The planned schema's engine: its chores by till, or, with `every`, to
/// every till (an earlier build's rule).
fn planned(every: bool) -> Engine {
    let builder = Engine::builder().table::<Project>().table::<Job>();
    let builder = match every {
        true => builder.table::<EveryChore>(),
        false => builder.table::<Chore>(),
    };
    builder.table::<Step>().build().unwrap()
}

/// The planned schema's fleet of `tills`, provisioned with the record of
/// the rows a rule gives thinned (`Settings::record_ruled_rows` off).
async fn thinned(tills: &[&str]) -> Fleet {
    let engine = planned(false);
    let mut fleet = Fleet::of(PLANNED, engine).await;
    fleet.reconfigure(|s| s.record_ruled_rows = false).await;
    for till in tills {
        fleet.add(till, None);
    }
    fleet.sync().await;
    fleet.check().await;
    fleet
}

/// With the record of the rows a rule gives thinned
/// (`Settings::record_ruled_rows` off), the planner reads them by the rule
/// at each holder's position: a till is provisioned with no record row for
/// a job or chore nothing it holds points at, and every move, repointing,
/// delete and key swap after it leaves each till exact, with the parents
/// and followers that go with them.
#[tokio::test]
async fn rows_left_to_their_rule_are_planned_by_it_and_every_till_stays_exact() {
    let mut fleet = thinned(&["a", "b"]).await;
    let said_by_rule = "SELECT count(*) FROM sync.held
                        WHERE table_name IN ('jobs', 'chores') AND ruled AND refs = 0";
    assert_eq!(
        fleet.count(said_by_rule).await,
        0,
        "a job or chore nothing points at is left to its rule"
    );
    // Job 2, which no step follows, has no record row.
    assert_eq!(
        fleet
            .count("SELECT count(*) FROM sync.held WHERE table_name = 'jobs'")
            .await,
        2
    );
    // Each till's digest is compared with the record and the rule.
    for till in ["a", "b"] {
        assert_eq!(
            digest_of(&mut fleet, till).await,
            Compared::Matched,
            "{till}"
        );
    }
    // Moved to the other till: b lets go of it and of the project only
    // it pointed at there; a takes both.
    pending_then_synced(&mut fleet, "UPDATE jobs SET unit_id = 'a' WHERE id = 2").await;
    // Repointed, a step added, another job deleted with its step.
    pending_then_synced(
        &mut fleet,
        "UPDATE jobs SET project_id = 2 WHERE id = 2;
         INSERT INTO steps VALUES (2, 1, 'bag');
         DELETE FROM steps WHERE job_id = 3;
         DELETE FROM jobs WHERE id = 3;",
    )
    .await;
    // Two tills' chores swap keys under the deferrable key: the notes of
    // one of the keys cannot say which chore it was, so it is sent again
    // or taken back from every till they name.
    pending_then_synced(
        &mut fleet,
        "UPDATE chores SET id = 21 - id WHERE id IN (10, 11)",
    )
    .await;
    // Another chore takes a key and is changed there before the chore that
    // had it leaves it, in one transaction.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         UPDATE chores SET id = 10 WHERE id = 12;
         UPDATE chores SET project_id = 1 WHERE unit_id = 'a' AND id = 10;
         UPDATE chores SET id = 13 WHERE unit_id = 'b' AND id = 10;
         COMMIT;",
    )
    .await;
    // Inserted and moved in one transaction, then moved back with a
    // project, then deleted.
    pending_then_synced(
        &mut fleet,
        "BEGIN;
         INSERT INTO jobs VALUES (40, 'a', NULL, 'lift');
         UPDATE jobs SET unit_id = 'b' WHERE id = 40;
         COMMIT;",
    )
    .await;
    pending_then_synced(
        &mut fleet,
        "UPDATE jobs SET unit_id = 'a', project_id = 1 WHERE id = 40",
    )
    .await;
    pending_then_synced(&mut fleet, "DELETE FROM jobs WHERE id = 40").await;
    assert_eq!(fleet.count(said_by_rule).await, 0);
    // Recording every row again: a relay that does finds the record
    // thinned (`sync.record_form`) and has every till provisioned again,
    // its record written whole; its audit expects a record row for every
    // row a rule gives.
    fleet.reconfigure(|s| s.record_ruled_rows = true).await;
    fleet.sync().await;
    fleet.check().await;
    assert!(fleet.count(said_by_rule).await > 0, "recorded again");
    assert_eq!(
        fleet
            .count("SELECT count(*) FROM sync.record_form WHERE by_rule")
            .await,
        0
    );
}

/// A TRUNCATE while a table's trigger was missing took rows with no note.
/// With the record of the rows a rule gives thinned, nothing says who held
/// them: the repair provisions every replica again, not only those the
/// record names, and every till ends exact.
#[tokio::test]
async fn a_truncate_unnoted_in_a_thinned_record_provisions_every_till_again() {
    let mut fleet = thinned(&["a", "b", "c"]).await;
    let recorded = "SELECT count(*) FROM sync.held WHERE table_name = 'chores'";
    assert_eq!(fleet.count(recorded).await, 0, "left to their rule");
    fleet
        .write(
            "DROP TRIGGER magic_sync_no_truncate ON chores;
             TRUNCATE chores;",
        )
        .await;
    let ensured = ensure(
        &fleet.engine,
        &mut fleet.writer,
        &InstallSettings::default(),
    )
    .await
    .expect("repaired");
    assert_eq!(ensured.provisioned, ["a", "b", "c"]);
    fleet.sync().await;
    fleet.check().await;
}

/// A build that changes a rule from `all` to `replica`: every till held
/// every chore by the old rule, through the `all` cohort, and till `a`
/// holds project 2 both for its own job and through the cohort, for chore
/// 10. The cohort's rows of the table go back to its members before the
/// deployment plans them, so the cohort's letting go of project 2 reaches
/// only `b`: `a` keeps it for its job and chore. With the record thinned,
/// the chores had no record row: before the rule changes, the triggers'
/// installation records what the old rule gave each holder, and the table
/// is read by no rule until its deployment is done. Either way every till
/// ends exact, each holding only its own chores.
async fn rule_changed_from_all_to_replica(thinned: bool) {
    let mut fleet = Fleet::of(PLANNED, planned(true)).await;
    fleet.reconfigure(|s| s.record_ruled_rows = !thinned).await;
    fleet.add("a", None);
    fleet.add("b", None);
    fleet.sync().await;
    fleet.check().await;
    // A change pending as the build changes: read from its note's
    // pre-image by the old rule.
    fleet
        .write("UPDATE chores SET title = 'sweep up' WHERE id = 10")
        .await;
    let recorded = "SELECT count(*) FROM sync.held WHERE table_name = 'chores'";
    let before = fleet.count(recorded).await;
    fleet.redeploy(planned(false)).await;
    let whole = "SELECT count(*) FROM sync.recorded_whole WHERE table_name = 'chores'";
    if thinned {
        assert!(before < 3, "{before} of the cohort's 3 chores recorded");
        assert_eq!(fleet.count(whole).await, 1, "recorded whole while deployed");
    } else {
        assert_eq!(before, 3, "the cohort's");
        assert_eq!(fleet.count(whole).await, 0);
    }
    // Each till holds all three itself now, the cohort none.
    assert_eq!(fleet.count(recorded).await, 6);
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(
        fleet
            .count("SELECT count(*) FROM sync.recorded_whole")
            .await,
        0,
        "read by its rule again once deployed"
    );
}

#[tokio::test]
async fn a_rule_changed_from_all_takes_back_through_the_cohort_only_what_no_member_keeps() {
    rule_changed_from_all_to_replica(false).await;
}

#[tokio::test]
async fn a_rule_changed_over_a_thinned_record_takes_back_what_the_old_one_gave() {
    rule_changed_from_all_to_replica(true).await;
}

/// The `all` cohort made between passes, from a view that saw a chore
/// deleted whose note no pass has planned yet, with the chores left to
/// their rule: the cohort never held the chore, and the project it pointed
/// at counts only the chore still there. The pass after plans the delete
/// by the record alone for the cohort (the key kept for it as seen,
/// `sync.deferred`), not by the rule at a position before the note, which
/// would take the chore back again and count it out of its project once
/// more, letting the project go while a chore points at it.
#[tokio::test]
async fn a_cohort_made_from_a_view_that_saw_a_delete_lets_its_parent_go_only_once_unpointed() {
    let engine = planned(true);
    let mut fleet = Fleet::of(PLANNED, engine).await;
    fleet
        .reconfigure(|s| {
            s.record_ruled_rows = false;
            s.record_by_rule = true;
        })
        .await;
    fleet.add("a", None);
    fleet.add("b", None);
    fleet
        .settle("INSERT INTO chores VALUES (13, 'b', 2, 'mop')")
        .await;
    fleet.check().await;
    // Made again at the next pass's start, before that pass reads the
    // delete's note.
    fleet.reconfigure(|s| s.record_by_rule = false).await;
    fleet.sync().await;
    fleet.reconfigure(|s| s.record_by_rule = true).await;
    fleet.settle("DELETE FROM chores WHERE id = 10").await;
    fleet.check().await;
    let kept = "SELECT count(*) FROM sync.deferred";
    assert_eq!(fleet.count(kept).await, 0, "let go once planned");
    // Its last chore gone, the project goes too.
    fleet.settle("DELETE FROM chores WHERE id = 13").await;
    fleet.check().await;
}

/// A till's snapshot whose view saw a job deleted that no pass has planned
/// yet, with the jobs left to their rule: the till never got the job, and
/// the project it pointed at counts only the till's job still there. The
/// pass after plans the delete by the record alone for the till (the key
/// kept for it as its view saw it, `sync.deferred`), not by its rule at a
/// position before the note, which would count the job out of its project
/// once more and take the project from under the job left.
#[tokio::test]
async fn a_snapshot_whose_view_saw_a_delete_no_pass_planned_lets_its_parent_go_only_once_unpointed()
{
    let mut fleet = thinned(&["a", "b"]).await;
    fleet
        .settle("INSERT INTO jobs VALUES (4, 'c', 2, 'lift'), (5, 'c', 2, 'carry')")
        .await;
    fleet.add("c", None);
    assert_eq!(fleet.pass().await.waiting, ["c"]);
    let snapshot = fleet.begin_snapshot("c").await.expect("c waits");
    fleet.write("DELETE FROM jobs WHERE id = 4").await;
    let mut worker = fleet.db.connect().await;
    let streamed = snapshot
        .stream(&mut worker, &fleet.network)
        .await
        .expect("the snapshot streams");
    assert!(streamed.recorded, "{streamed:?}");
    let kept = "SELECT count(*) FROM sync.deferred WHERE replica = 'c'";
    assert_eq!(fleet.count(kept).await, 1, "the delete its view saw");
    fleet.sync().await;
    fleet.check().await;
    assert_eq!(fleet.count(kept).await, 0, "let go once planned");
    fleet.settle("DELETE FROM jobs WHERE id = 5").await;
    fleet.check().await;
}

/// Makes the note function of `jobs` an earlier build's: the same body
/// with a line more, as a build before this one would have written it.
const EARLIER_BUILD: &str = "
    DO $$
    DECLARE f regprocedure; body text;
    BEGIN
        SELECT t.tgfoid::regprocedure, p.prosrc INTO f, body
        FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
        WHERE t.tgname = 'magic_sync_note' AND t.tgrelid = 'jobs'::regclass;
        EXECUTE format('CREATE OR REPLACE FUNCTION %s RETURNS trigger LANGUAGE plpgsql AS %L',
                       f, body || E'\\n-- an earlier build');
    END $$";

/// A relay told to leave the rows a rule gives to it, over a record an
/// earlier build kept whole, records every row until the reading by rule
/// can read every note: while a note of the earlier build's (no kind) is
/// pending, and while a transaction in progress when this build's note
/// functions replaced the earlier one's has not ended, a till provisioned
/// is recorded whole; then the record's form is marked and the next till
/// is not.
#[tokio::test]
async fn a_relay_leaves_rows_to_their_rule_once_the_earlier_builds_notes_are_planned_and_its_writers_ended(
) {
    let engine = planned(false);
    let mut fleet = Fleet::of(PLANNED, engine).await;
    // The earlier build recorded every row.
    fleet.reconfigure(|s| s.record_ruled_rows = true).await;
    fleet.add("a", None);
    fleet.sync().await;
    // A writer of the earlier build's, in the middle of its transaction.
    fleet.write(EARLIER_BUILD).await;
    let writer = fleet.db.connect().await;
    writer
        .batch_execute("BEGIN; UPDATE jobs SET title = 'repaint' WHERE id = 2")
        .await
        .unwrap();
    let ensured = ensure(
        &fleet.engine,
        &mut fleet.writer,
        &InstallSettings::default(),
    )
    .await
    .expect("this build's note functions");
    assert_eq!(ensured.installed.len(), 1, "{ensured:?}");
    fleet.reconfigure(|s| s.record_ruled_rows = false).await;
    let by_rule = "SELECT count(*) FROM sync.record_form WHERE by_rule";
    let jobs_of = |till: &str| {
        format!("SELECT count(*) FROM sync.held WHERE replica = '{till}' AND table_name = 'jobs'")
    };
    fleet
        .write("INSERT INTO jobs VALUES (4, 'c', NULL, 'lift'), (5, 'd', NULL, 'carry')")
        .await;
    fleet.add("c", None);
    fleet.sync().await;
    assert_eq!(
        fleet.count(by_rule).await,
        0,
        "a writer of the earlier build's is open"
    );
    assert_eq!(fleet.count(&jobs_of("c")).await, 1, "c recorded whole");
    fleet.check().await;
    writer.batch_execute("COMMIT").await.unwrap();
    // A note the earlier build's function wrote, which says no kind.
    fleet
        .write(
            "UPDATE jobs SET title = 'rewire' WHERE id = 1;
             UPDATE sync.notes SET op = NULL",
        )
        .await;
    fleet.pass().await;
    assert_eq!(fleet.count(by_rule).await, 0, "a note says no kind");
    fleet.pass().await;
    assert_eq!(fleet.count(by_rule).await, 1, "every note readable");
    fleet.add("d", None);
    fleet.sync().await;
    assert_eq!(
        fleet.count(&jobs_of("d")).await,
        0,
        "d's job left to its rule"
    );
    fleet.check().await;
}

/// With the jobs left to their rule, a job moved from b to a by a note the
/// planner cannot plan (the project it names no longer fits, as a note
/// written before the column changed type would not), then changed again:
/// the note is parked, and the job is read by its record alone until it is
/// planned. Without that, the later change would be read from its own
/// pre-image, where the job was a's already, and b, which never had the
/// move, would keep the job. The tills the job's notes name are provisioned
/// again, once. A relay starting plans the note by the record, and the job
/// is read by its rule again.
#[tokio::test]
async fn a_row_with_a_note_parked_is_read_by_its_record_alone_until_the_note_is_planned() {
    let mut fleet = thinned(&["a", "b"]).await;
    fleet
        .write(
            "UPDATE jobs SET unit_id = 'a' WHERE id = 2;
             UPDATE sync.notes SET parents = jsonb_set(parents, '{project_id}', '\"one\"')
             WHERE table_name = 'jobs';
             UPDATE jobs SET title = 'paint again' WHERE id = 2;",
        )
        .await;
    fleet.sync().await;
    let parked = "SELECT count(*) FROM sync.parked";
    let ruled_out = "SELECT count(*) FROM sync.ruled_out WHERE table_name = 'jobs' AND key = '[2]'";
    assert_eq!(fleet.count(parked).await, 1);
    assert_eq!(fleet.count(ruled_out).await, 1);
    fleet.check().await;
    // A relay starting moves the note back; the job read by its record,
    // the note is planned by it (it needs no parent of the note's), and
    // the job is read by its rule again. Nobody is provisioned again.
    let provisioned = "SELECT count(*) FROM sync.replicas WHERE provision";
    fleet.reconfigure(|_| {}).await;
    fleet.pass().await;
    assert_eq!(fleet.count(parked).await, 0);
    assert_eq!(fleet.count(ruled_out).await, 0);
    assert_eq!(fleet.count(provisioned).await, 0, "provisioned once");
    fleet.sync().await;
    fleet.check().await;
    fleet
        .settle("UPDATE jobs SET unit_id = 'b' WHERE id = 2")
        .await;
    fleet.check().await;
}

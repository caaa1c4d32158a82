//! The rows a holder holds by its own rule, read at its position from the
//! host's rows and the pending notes alone (decision 176), agree with the
//! record while notes are pending: what each note says happened to its row
//! is what tells whether the key was there before them.

use crate::fleet::Fleet;
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

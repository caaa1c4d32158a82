//! Each read over the known fleet (see `known`), figure by figure.

use crate::known::{known, known_as, operator, settled};
use magic_sync::ops::{
    self, Action, Concern, ReplicaState, RowState, Scope, StateCounts, TableFigures, TableProgress,
    UpBacklog,
};
use std::time::Duration;

fn ids(replicas: &[ops::ReplicaSummary]) -> Vec<&str> {
    replicas.iter().map(|r| r.id.as_str()).collect()
}

fn figures(table: &str, replicas: i64, on_way: i64, outdated: i64, refused: i64) -> TableFigures {
    TableFigures {
        table: table.into(),
        replicas,
        rows_on_their_way: on_way,
        rows_outdated: outdated,
        rows_refused: refused,
    }
}

#[tokio::test]
async fn the_overview_tells_each_state_apart() {
    let fleet = known().await;
    let mut client = operator(&fleet).await;
    let seen = ops::overview(&mut client, &Scope::All, 10).await.unwrap();
    assert_eq!(seen.replicas, 5);
    assert_eq!(
        seen.states,
        StateCounts {
            caught_up: 1,
            on_its_way: 1,
            provisioning: 1,
            out_of_reach: 1,
            waiting_on_fix: 1,
        }
    );
    assert!(seen.waits_for_fix());
    // Those that need someone first, then the furthest behind.
    assert_eq!(ids(&seen.worst), ["d", "c", "e", "b"]);
    let [d, c, e, b] = &seen.worst[..] else {
        unreachable!()
    };
    assert_eq!(d.state, ReplicaState::WaitingOnFix);
    assert_eq!((d.rows_refused, d.rows_behind(), d.outbox), (1, 0, 0));
    assert_eq!(d.acknowledged, d.last_message);
    assert_eq!(c.state, ReplicaState::OutOfReach);
    assert_eq!((c.outbox, c.rows_on_their_way, c.rows_outdated), (1, 1, 0));
    assert!(c.acknowledged < c.last_message);
    assert!(
        c.last_error
            .as_deref()
            .unwrap()
            .starts_with("sending message"),
        "{c:?}"
    );
    assert_eq!(e.state, ReplicaState::Provisioning);
    assert!(e.provisioning);
    assert_eq!((e.last_message, e.acknowledged, e.outbox), (0, 0, 0));
    assert_eq!(b.state, ReplicaState::OnItsWay);
    assert_eq!((b.outbox, b.rows_on_their_way, b.rows_refused), (1, 1, 0));
    assert_eq!(
        seen.tables,
        [
            figures("items", 1, 1, 0, 0),
            figures("sales", 1, 0, 0, 1),
            figures("tasks", 1, 1, 0, 0),
        ]
    );
    assert_eq!(seen.pending_notes, 0);

    // The worst, up to a limit; a partition; some replicas.
    let two = ops::overview(&mut client, &Scope::All, 2).await.unwrap();
    assert_eq!(ids(&two.worst), ["d", "c"]);
    let south = ops::overview(&mut client, &Scope::Partition("south".into()), 10)
        .await
        .unwrap();
    assert_eq!(south.replicas, 2);
    assert_eq!(ids(&south.worst), ["d", "c"]);
    assert_eq!(
        south.tables,
        [figures("items", 1, 1, 0, 0), figures("sales", 1, 0, 0, 1)]
    );
    let some = ops::overview(
        &mut client,
        &Scope::Replicas(vec!["a".into(), "b".into()]),
        10,
    )
    .await
    .unwrap();
    assert_eq!(some.replicas, 2);
    assert_eq!((some.states.caught_up, some.states.on_its_way), (1, 1));
    assert!(!some.waits_for_fix());
}

#[tokio::test]
async fn a_change_not_planned_yet_makes_its_holders_outdated() {
    let fleet = known().await;
    fleet
        .write("UPDATE items SET name = 'oat milk' WHERE id = 2")
        .await;
    let mut client = operator(&fleet).await;
    let seen = ops::overview(&mut client, &Scope::All, 10).await.unwrap();
    assert_eq!(seen.pending_notes, 1);
    // Every kept-up replica holds item 2, acknowledged: `a` too is behind.
    assert_eq!(seen.states.caught_up, 0);
    assert_eq!(seen.states.on_its_way, 2);
    assert_eq!(ids(&seen.worst), ["d", "c", "e", "b", "a"]);
    assert_eq!(seen.worst[4].rows_outdated, 1);
    assert_eq!(seen.tables[0], figures("items", 4, 1, 4, 0));

    let row = ops::row_progress(&mut client, "items", &["2".into()])
        .await
        .unwrap();
    assert_eq!(row.key, "[2]");
    assert!(row.pending_note.is_some());
    let states: Vec<(&str, RowState)> = row
        .replicas
        .iter()
        .map(|r| (r.replica.as_str(), r.state))
        .collect();
    assert_eq!(
        states,
        [
            ("a", RowState::HoldsOlder),
            ("b", RowState::HoldsOlder),
            ("c", RowState::HoldsOlder),
            ("d", RowState::HoldsOlder),
            ("e", RowState::Provisioning),
        ]
    );
    let progress = ops::progress(&mut client, "a").await.unwrap();
    assert_eq!(progress.tables[0].outdated, 1);
    assert_eq!(progress.tables[0].bar(), (3, 4));
}

#[tokio::test]
async fn listing_pages_through_the_replicas_by_id() {
    let fleet = known().await;
    let mut client = operator(&fleet).await;
    let mut pages = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = ops::listing(&mut client, &Scope::All, after.as_deref(), 2)
            .await
            .unwrap();
        pages.push(
            page.replicas
                .iter()
                .map(|r| (r.id.clone(), r.state))
                .collect::<Vec<_>>(),
        );
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    use ReplicaState::*;
    let s = |id: &str, state| (id.to_string(), state);
    assert_eq!(
        pages,
        [
            vec![s("a", CaughtUp), s("b", OnItsWay)],
            vec![s("c", OutOfReach), s("d", WaitingOnFix)],
            vec![s("e", Provisioning)],
        ]
    );
    let north = ops::listing(
        &mut client,
        &Scope::Partition("north".into()),
        Some("a"),
        10,
    )
    .await
    .unwrap();
    assert_eq!(ids(&north.replicas), ["b", "e"]);
    assert_eq!(north.next, None);
}

#[tokio::test]
async fn progress_counts_per_table_what_is_held_on_its_way_and_set_aside() {
    let mut fleet = known().await;
    let mut client = operator(&fleet).await;
    let table = |table: &str, should, holds, outdated, on_its_way, set_aside| TableProgress {
        table: table.into(),
        should,
        holds,
        outdated,
        on_its_way,
        set_aside,
        up: None,
    };
    let b = ops::progress(&mut client, "b").await.unwrap();
    assert_eq!(b.replica.state, ReplicaState::OnItsWay);
    assert_eq!(
        b.tables,
        [table("items", 4, 4, 0, 0, 0), table("tasks", 3, 2, 0, 1, 0)]
    );
    assert_eq!(b.tables[1].bar(), (2, 3));
    assert_eq!(b.backlog_at, None);

    let c = ops::progress(&mut client, "c").await.unwrap();
    assert_eq!(
        c.tables,
        [table("items", 4, 3, 0, 1, 0), table("tasks", 1, 1, 0, 0, 0)]
    );

    // `d` said what it has not had filed: nothing, once its refused sale
    // was answered.
    let d = ops::progress(&mut client, "d").await.unwrap();
    assert_eq!(
        d.tables,
        [
            table("items", 4, 4, 0, 0, 0),
            table("sales", 0, 0, 0, 0, 1),
            table("tasks", 1, 1, 0, 0, 0)
        ]
    );
    assert!(d.backlog_at.is_some());
    // Then it sends a sale whose answer never comes back, and writes
    // another. The upload carried its backlog as it stood when the upload
    // was made, before it was recorded as sent: one row not sent.
    let till = &mut fleet.unit("d").replica;
    till.connection()
        .execute_batch("INSERT INTO sales VALUES ('s2', 'x', 5, 1)")
        .unwrap();
    let up = till
        .upload(1 << 20, Duration::from_secs(3600))
        .unwrap()
        .unwrap();
    till.connection()
        .execute_batch("INSERT INTO sales VALUES ('s3', 'x', 6, 1)")
        .unwrap();
    magic_sync::file::file(&mut client, &fleet.engine, &"d".into(), &up)
        .await
        .unwrap();
    let d = ops::progress(&mut client, "d").await.unwrap();
    assert_eq!(
        d.tables[1].up,
        Some(UpBacklog {
            unsent: 1,
            unfiled: 0
        })
    );

    let e = ops::progress(&mut client, "e").await.unwrap();
    assert_eq!(e.replica.state, ReplicaState::Provisioning);
    assert_eq!(e.tables, []);
}

#[tokio::test]
async fn row_progress_says_where_a_row_is_at_each_replica() {
    let fleet = known().await;
    let mut client = operator(&fleet).await;
    let states = |row: &ops::RowProgress| -> Vec<(String, RowState)> {
        row.replicas
            .iter()
            .map(|r| (r.replica.clone(), r.state))
            .collect()
    };
    let s = |id: &str, state| (id.to_string(), state);
    use RowState::*;

    let item = ops::row_progress(&mut client, "items", &["1".into()])
        .await
        .unwrap();
    assert_eq!(item.key, "[1]");
    assert_eq!(item.pending_note, None);
    assert_eq!(
        states(&item),
        [
            s("a", Holds),
            s("b", Holds),
            s("c", OnItsWay),
            s("d", Holds),
            s("e", Provisioning)
        ]
    );

    let task = ops::row_progress(&mut client, "tasks", &["10".into()])
        .await
        .unwrap();
    assert_eq!(
        states(&task),
        [
            s("a", DoesNotHold),
            s("b", OnItsWay),
            s("c", DoesNotHold),
            s("d", DoesNotHold),
            s("e", Provisioning)
        ]
    );

    // A key of text, known from the refused upload alone.
    let sale = ops::row_progress(&mut client, "sales", &["s1".into()])
        .await
        .unwrap();
    assert_eq!(sale.key, r#"["s1"]"#);
    assert!(sale.waits_for_fix());
    let d = &sale.replicas[3];
    assert_eq!((d.replica.as_str(), d.state), ("d", SetAside));
    assert!(
        d.refused.as_deref().unwrap().contains("another replica"),
        "{d:?}"
    );
}

#[tokio::test]
async fn a_row_taken_back_is_let_go_of_until_its_message_leaves_the_outbox() {
    let mut fleet = settled().await;
    fleet.write("DELETE FROM tasks WHERE id = 1").await;
    fleet.pass().await;
    let mut client = operator(&fleet).await;
    let task = ops::row_progress(&mut client, "tasks", &["1".into()])
        .await
        .unwrap();
    assert_eq!(task.replicas[0].state, RowState::LettingGo);
    assert_eq!(task.replicas[1].state, RowState::DoesNotHold);
    fleet.deliver().await;
    let task = ops::row_progress(&mut client, "tasks", &["1".into()])
        .await
        .unwrap();
    assert_eq!(task.replicas[0].state, RowState::DoesNotHold);
}

#[tokio::test]
async fn health_says_what_to_wait_for_and_what_needs_a_fix() {
    let fleet = known().await;
    let mut client = operator(&fleet).await;
    let health = ops::health(&mut client, &Scope::All).await.unwrap();
    assert!(!health.healthy);
    assert_eq!((health.pending.notes, health.pending.rows), (0, 0));
    assert_eq!(health.items.len(), 2, "{:?}", health.items);
    assert_eq!(health.items[0].action, Action::DeployFix);
    let Concern::Refused {
        table,
        reason,
        rows,
        replicas,
        ..
    } = &health.items[0].concern
    else {
        panic!("{:?}", health.items[0]);
    };
    assert_eq!((table.as_str(), *rows, *replicas), ("sales", 1, 1));
    assert!(reason.contains("another replica"), "{reason}");
    assert_eq!(health.items[1].action, Action::Wait);
    let Concern::SendFailing {
        replica, outbox, ..
    } = &health.items[1].concern
    else {
        panic!("{:?}", health.items[1]);
    };
    assert_eq!((replica.as_str(), *outbox), ("c", 1));

    // The north sees nothing to fix, and a note pending is waited for.
    fleet
        .write("UPDATE items SET name = 'oat milk' WHERE id = 2")
        .await;
    let north = ops::health(&mut client, &Scope::Partition("north".into()))
        .await
        .unwrap();
    assert!(north.healthy);
    assert_eq!((north.pending.notes, north.pending.rows), (1, 1));
    assert_eq!(north.items.len(), 1);
    assert_eq!(north.items[0].action, Action::Wait);
    assert!(matches!(
        north.items[0].concern,
        Concern::NotesPending {
            notes: 1,
            rows: 1,
            ..
        }
    ));
}

#[tokio::test]
async fn the_json_field_names_are_stable() {
    let fleet = known().await;
    let mut client = operator(&fleet).await;
    let seen = ops::overview(&mut client, &Scope::All, 1).await.unwrap();
    let json = serde_json::to_value(&seen).unwrap();
    let keys =
        |v: &serde_json::Value| -> Vec<String> { v.as_object().unwrap().keys().cloned().collect() };
    assert_eq!(
        keys(&json),
        [
            "deployment",
            "now",
            "pending_notes",
            "replicas",
            "states",
            "tables",
            "worst"
        ]
    );
    // A member of a cohort names it; a replica of none leaves it out.
    let cohorts: &[&str] = match fleet.relay.settings().record_by_rule {
        true => &["cohorts"],
        false => &[],
    };
    assert_eq!(
        keys(&json["worst"][0]),
        [
            &["acknowledged", "acknowledged_at", "alarm", "changes_kept",][..],
            cohorts,
            &[
                "id",
                "last_error",
                "last_message",
                "outbox",
                "partition",
                "provisioning",
                "rows_on_their_way",
                "rows_outdated",
                "rows_refused",
                "snapshot_began_at",
                "state"
            ],
        ]
        .concat()
    );
    assert_eq!(json["worst"][0]["state"], "waiting_on_fix");
    let health = ops::health(&mut client, &Scope::All).await.unwrap();
    let json = serde_json::to_value(&health).unwrap();
    assert_eq!(json["items"][0]["action"], "deploy_fix");
    assert_eq!(json["items"][0]["kind"], "refused");
    assert_eq!(json["items"][1]["kind"], "send_failing");
}

/// Rows in the record.
async fn recorded(fleet: &crate::fleet::Fleet) -> i64 {
    let client = operator(fleet).await;
    client
        .query_one("SELECT count(*) FROM sync.held", &[])
        .await
        .unwrap()
        .get(0)
}

/// Every replica's progress and the overview's figures, as the operator
/// reads them (the times left out).
async fn read_all(fleet: &crate::fleet::Fleet) -> Vec<String> {
    let mut client = operator(fleet).await;
    let seen = ops::overview(&mut client, &Scope::All, 10).await.unwrap();
    let mut read = vec![
        format!("{:?}", seen.states),
        format!("{:?}", seen.tables),
        format!("pending {}", seen.pending_notes),
    ];
    for r in &seen.worst {
        read.push(format!(
            "{} {:?} on their way {} outdated {} refused {}",
            r.id, r.state, r.rows_on_their_way, r.rows_outdated, r.rows_refused
        ));
    }
    for id in ["a", "b", "c", "d", "e"] {
        let progress = ops::progress(&mut client, id).await.unwrap();
        read.push(format!("{id} {:?}", progress.tables));
    }
    // Where rows are: the version and message a record row says are not
    // compared, as a row left to its rule has none.
    for (table, key) in [
        ("items", "2"),
        ("items", "4"),
        ("items", "5"),
        ("tasks", "2"),
        ("tasks", "3"),
        ("tasks", "10"),
        ("tasks", "11"),
    ] {
        let row = ops::row_progress(&mut client, table, &[key.into()])
            .await
            .unwrap();
        let places: Vec<String> = row
            .replicas
            .iter()
            .map(|p| format!("{} {}", p.replica, p.state.words()))
            .collect();
        read.push(format!(
            "{table} {key}: note {:?}, {places:?}",
            row.pending_note.is_some()
        ));
    }
    read
}

#[tokio::test]
async fn a_fleet_whose_rows_are_left_to_their_rule_reads_as_one_that_records_them() {
    // The same steps over a record of every row and over one that leaves
    // the rows a holder's rule gives it to the rule: what the operator
    // reads is the same, step by step, though the second has no record row
    // of most of what is held.
    let mut whole = known_as(Some(true)).await;
    let mut thinned = known_as(Some(false)).await;
    assert!(
        recorded(&thinned).await < recorded(&whole).await,
        "the thinned fleet records fewer rows"
    );
    assert_eq!(read_all(&thinned).await, read_all(&whole).await, "as known");
    let steps = [
        // A task moved from `b` to `a`, one of `a`'s deleted, an item
        // added and one changed: sent, taken back, and let go of again.
        "UPDATE tasks SET unit_id = 'a' WHERE id = 2",
        "DELETE FROM tasks WHERE id = 1",
        "INSERT INTO items VALUES (5, 'salt')",
        "UPDATE items SET name = 'black tea' WHERE id = 1",
        // Task 2 changed again, and b's task 10 taken back, each before the
        // message that carried it to its till arrived.
        "UPDATE tasks SET title = 'count again' WHERE id = 2",
        "DELETE FROM tasks WHERE id = 10",
        // A row every till holds by its rule, changed for the first time,
        // and a task for `e`, which its snapshot is to carry.
        "UPDATE items SET name = 'oat milk' WHERE id = 2",
        "INSERT INTO tasks VALUES (11, 'e', 'first')",
    ];
    for (i, step) in steps.iter().enumerate() {
        for fleet in [&mut whole, &mut thinned] {
            fleet.write(step).await;
        }
        // Its note pending: the holders of the row it changed hold an
        // outdated copy, whether recorded or left to their rule.
        assert_eq!(
            read_all(&thinned).await,
            read_all(&whole).await,
            "after step {i}'s write, before the pass"
        );
        for fleet in [&mut whole, &mut thinned] {
            fleet.pass().await;
        }
        assert_eq!(
            read_all(&thinned).await,
            read_all(&whole).await,
            "after step {i}, before any acknowledgement"
        );
    }
    // `e`'s snapshot written, not acknowledged yet, and its task changed:
    // on its way, not outdated.
    for fleet in [&mut whole, &mut thinned] {
        fleet.snapshot("e").await;
        fleet
            .write("UPDATE tasks SET title = 'first, again' WHERE id = 11")
            .await;
    }
    assert_eq!(
        read_all(&thinned).await,
        read_all(&whole).await,
        "a row of e's snapshot changed before e acknowledged it"
    );
    // Sent again, still before `e` acknowledged its snapshot: the row is
    // on its way once, not twice.
    for fleet in [&mut whole, &mut thinned] {
        fleet.pass().await;
    }
    assert_eq!(
        read_all(&thinned).await,
        read_all(&whole).await,
        "a row of e's snapshot sent again before e acknowledged it"
    );
    // A row sent to `e` and taken back, and a row of its cohort's sent
    // again, before `e` acknowledged its snapshot: each leaves the count
    // of the message that carried it.
    for fleet in [&mut whole, &mut thinned] {
        fleet
            .write("INSERT INTO tasks VALUES (12, 'e', 'second')")
            .await;
        fleet.pass().await;
        fleet.write("DELETE FROM tasks WHERE id = 12").await;
        fleet
            .write("UPDATE items SET name = 'rice' WHERE id = 4")
            .await;
        fleet.pass().await;
    }
    assert_eq!(
        read_all(&thinned).await,
        read_all(&whole).await,
        "rows taken back and sent again before e acknowledged its snapshot"
    );
    // `e`'s snapshot sent, every message published and acknowledged but
    // `c`'s, still cut off.
    for fleet in [&mut whole, &mut thinned] {
        fleet.sync().await;
    }
    assert_eq!(read_all(&thinned).await, read_all(&whole).await, "synced");
    for fleet in [&mut whole, &mut thinned] {
        fleet.cut("c", false);
        fleet.sync().await;
    }
    let read = read_all(&thinned).await;
    assert_eq!(read, read_all(&whole).await, "every replica caught up");
    assert!(
        read.iter()
            .any(|l| l.starts_with("e ") && l.contains("should: 5")),
        "e holds the items: {read:?}"
    );
}

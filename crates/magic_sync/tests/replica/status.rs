//! What a host asks its replica without decoding messages: whether it is
//! ready, what it applied, whether it waits in a gap, what it refused.

use crate::support::*;
use magic_sync::envelope::{RowData, TableRows};
use magic_sync::replica::Status;

#[test]
fn a_replica_is_ready_once_its_first_snapshot_ended_and_says_where_it_stands() {
    let site = Site::new();
    let mut replica = site.open();
    let mut server = Server::new();
    assert_eq!(replica.status().unwrap(), Status::default(), "nothing yet");

    // The snapshot begins, with a row of a table the replica does not hold.
    let ghosts = TableRows {
        table: "ghosts".into(),
        upserts: vec![RowData {
            key: b"[1]".to_vec(),
            data: b"{}".to_vec(),
        }],
        ..TableRows::default()
    };
    let begin = server.snapshot(vec![ghosts, upserts(&[product(1, "tea")])]);
    apply_all(&mut replica, std::slice::from_ref(&begin));
    assert_eq!(
        replica.status().unwrap(),
        Status {
            ready: false,
            applied: Some(begin.number),
            snapshot_began: Some(begin.number),
            gap: None,
            refused: 1,
            forged: 0,
            last_forgery: None,
            refused_dropped: 0,
            configuration: None,
            epoch: Some(begin.epoch.clone().into()),
            nonce: Some(begin.nonce.clone()),
            unfiled: 0,
            stopped: None,
        }
    );
    let end = server.end(&["products"]);
    apply_all(&mut replica, std::slice::from_ref(&end));
    let ready = replica.status().unwrap();
    assert!(ready.ready, "{ready:?}");
    assert_eq!(
        (ready.applied, ready.snapshot_began),
        (Some(end.number), None)
    );

    // A message lost on the way: the next cannot follow, and the replica
    // waits in a gap, still holding its consistent set.
    let _lost = server.down(vec![upserts(&[product(2, "coffee")])]);
    let after = server.down(vec![upserts(&[product(3, "milk")])]);
    replica.apply(&bytes(&after)).unwrap();
    let waiting = replica.status().unwrap();
    assert_eq!(
        (waiting.ready, waiting.applied, waiting.gap),
        (true, Some(end.number), Some(after.number))
    );

    // A host on a connection of its own reads the same.
    let host = rusqlite::Connection::open(replica.connection().path().unwrap()).unwrap();
    assert_eq!(magic_sync::replica::status(&host).unwrap(), waiting);
}

#[test]
fn refusals_on_record_are_bounded_and_the_dropped_counted() {
    let (_site, mut replica, mut server) = provisioned_with_tea();
    let past = magic_sync::replica::MAX_REFUSED as usize + 5;
    let ghosts = TableRows {
        table: "ghosts".into(),
        upserts: (0..past)
            .map(|i| RowData {
                key: format!("[{i}]").into_bytes(),
                data: b"{}".to_vec(),
            })
            .collect(),
        ..TableRows::default()
    };
    let message = server.down(vec![ghosts]);
    apply_all(&mut replica, std::slice::from_ref(&message));
    let status = replica.status().unwrap();
    assert_eq!(status.refused, magic_sync::replica::MAX_REFUSED as u64);
    assert_eq!(status.refused_dropped, 5);
    assert_eq!(
        replica.refused().unwrap().len(),
        magic_sync::replica::MAX_REFUSED as usize
    );
}

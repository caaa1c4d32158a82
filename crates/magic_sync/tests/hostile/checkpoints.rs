//! A replica that sends an upload in every frame and never acknowledges
//! what answers them keeps only its newest checkpoints waiting: every
//! pass reads them, so their number is bounded per replica.

use crate::{says, settle, shop};
use magic_sync::envelope::Up;
use magic_sync::run::Report;

#[tokio::test]
async fn a_replica_keeps_only_its_newest_checkpoints_waiting() {
    let mut fleet = shop().await;
    // 1,100 uploads of nothing, each under a send id of its own.
    let uploads: Vec<Report> = (0..1_100u32)
        .map(|n| {
            let mut send_id = vec![0u8; 16];
            send_id[..4].copy_from_slice(&n.to_be_bytes());
            Report::Upload(Up {
                send_id,
                ..Up::default()
            })
        })
        .collect();
    says(&mut fleet, "u1", uploads).await;
    assert_eq!(waiting(&fleet, "u1").await, 1_024);
    // The newest are the ones kept.
    let newest: Vec<u8> = {
        let mut id = vec![0u8; 16];
        id[..4].copy_from_slice(&1_099u32.to_be_bytes());
        id
    };
    let kept = fleet
        .writer
        .query_one(
            "SELECT count(*) FROM sync.checkpoints WHERE replica = 'u1' AND send_id = $1",
            &[&newest],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(kept, 1);
    // Another replica's upload is recorded as ever.
    says(
        &mut fleet,
        "u2",
        vec![Report::Upload(Up {
            send_id: vec![7; 16],
            ..Up::default()
        })],
    )
    .await;
    assert_eq!(waiting(&fleet, "u2").await, 1);
    settle(&mut fleet).await;
    fleet.check().await;
}

/// The checkpoints `replica` has waiting.
async fn waiting(fleet: &magic_sync_testkit::fleet::Fleet, replica: &str) -> i64 {
    fleet
        .writer
        .query_one(
            "SELECT count(*) FROM sync.checkpoints WHERE replica = $1",
            &[&replica],
        )
        .await
        .unwrap()
        .get(0)
}

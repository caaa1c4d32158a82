//! A flood of gaps from one replica costs the server a round trip or two,
//! however many come: only each replica's newest counts, and they are heard
//! together.

use crate::{ack_of, says, settle, shop, waiting};
use magic_sync::envelope::Gap;
use magic_sync::run::{self, Report};
use magic_sync::ReplicaId;

#[tokio::test]
async fn a_flood_of_gaps_costs_a_round_trip_or_two_whatever_its_size() {
    let mut fleet = shop().await;
    let ack = ack_of(&mut fleet, "u1");
    let mut reports: Vec<(ReplicaId, Report)> = (0..20_000u64)
        .map(|n| {
            let gap = Gap {
                epoch: ack.epoch.clone(),
                number: ack.number + 1 + n,
            };
            (ReplicaId::from("u1"), Report::Gap(gap))
        })
        .collect();
    let u2 = ack_of(&mut fleet, "u2");
    reports.push((
        "u2".into(),
        Report::Gap(Gap {
            epoch: u2.epoch.clone(),
            number: u2.number + 1,
        }),
    ));
    reports.push(("u2".into(), Report::Applied(u2)));
    let (mut client, counter) = magic_sync_testkit::wire::connect(&fleet.db).await;
    let before = counter.counts();
    run::server::heed(&mut client, &fleet.engine, &fleet.network, reports)
        .await
        .unwrap();
    let cost = counter.counts() - before;
    assert!(
        cost.round_trips <= 3 && cost.statements <= 8,
        "20,001 gaps and an acknowledgement heard in {cost}"
    );
    assert_eq!(
        waiting(&fleet).await,
        ["u1".to_string(), "u2".to_string()].into()
    );
    // Heard one at a time as before, the same.
    let ack = ack_of(&mut fleet, "u3");
    let gap = Gap {
        epoch: ack.epoch,
        number: ack.number + 1,
    };
    says(&mut fleet, "u3", vec![Report::Gap(gap)]).await;
    assert_eq!(waiting(&fleet).await.len(), 3);
    settle(&mut fleet).await;
    fleet.check().await;
}

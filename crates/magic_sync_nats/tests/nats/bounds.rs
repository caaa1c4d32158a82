//! What a replica says through the broker is bounded as it decodes, not as
//! it travels: a report whose entries would take many times its size once
//! decoded is refused unheard, before anything is allocated from it.

use magic_sync::run::Report;
use magic_sync_nats::broker::{Broker, Settings};
use magic_sync_testkit::nats::Nats;

/// `replica`'s own connection to the broker.
async fn speaking_as(nats: &Nats, replica: &str) -> async_nats::Client {
    async_nats::ConnectOptions::with_nkey(nats.seed(replica).to_string())
        .custom_inbox_prefix(magic_sync_nats::inbox_of(replica))
        .connect(nats.url())
        .await
        .expect("a replica connects with its own credentials")
}

/// An `Up` of `n` empty refusals: two bytes each on the wire, a struct of
/// 80 bytes each decoded.
fn empty_refusals(n: usize) -> Vec<u8> {
    [0x2a, 0x00].repeat(n)
}

/// An `Up` with one table of `n` empty rows.
fn empty_rows(n: usize) -> Vec<u8> {
    let rows = [0x12, 0x00].repeat(n);
    let mut up = vec![0x1a];
    prost::encoding::encode_varint(rows.len() as u64, &mut up);
    up.extend(rows);
    up
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_of_forged_empty_entries_is_refused_unheard() {
    let nats = Nats::start(&["till a"]);
    let broker = Broker::connect(Settings::new(nats.url()), nats.server.seed())
        .await
        .expect("the server connects");
    let till = speaking_as(&nats, "till a").await;
    let up = magic_sync_nats::up_subject("till a");
    // Half a million refusals in 1 MiB (40 MiB decoded), and more rows in
    // one upload than one may carry, in 12 KB.
    for forged in [
        empty_refusals(512 * 1024),
        empty_rows(magic_sync::run::MAX_UPLOAD_ROWS + 1),
    ] {
        till.publish(up.clone(), forged.into()).await.unwrap();
    }
    let said = Report::Applied(magic_sync::envelope::Ack {
        number: 7,
        ..Default::default()
    });
    till.publish(up.clone(), said.encode().into())
        .await
        .unwrap();
    till.flush().await.unwrap();
    // The upload stream hands them over in order: by the time the
    // acknowledgement is heard, both forgeries were dealt with, unheard.
    let heard = crate::heard(&broker).await;
    assert_eq!(heard.len(), 1, "{} reports heard", heard.len());
    assert_eq!(heard[0].0.as_str(), "till a");
    assert_eq!(heard[0].1, said);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reports_held_for_the_relay_take_at_most_the_decoded_bytes_set() {
    use magic_sync::run::server::Reports;
    let nats = Nats::start(&["till a"]);
    // Each report, well within what one may carry, takes `each` decoded;
    // the server holds two of them at most.
    let report = empty_refusals(2_000);
    let each = magic_sync::core::bounds::count_up(&report)
        .unwrap()
        .decoded_bytes();
    let settings = Settings {
        decoded_bytes: each * 5 / 2,
        ..Settings::new(nats.url())
    };
    let broker = Broker::connect(settings, nats.server.seed())
        .await
        .expect("the server connects");
    let till = speaking_as(&nats, "till a").await;
    let sent = 6;
    for _ in 0..sent {
        till.publish(magic_sync_nats::up_subject("till a"), report.clone().into())
            .await
            .unwrap();
    }
    till.flush().await.unwrap();
    // Whenever the relay drains, it is never handed more than two at once,
    // and every report comes in turn.
    let mut heard = 0;
    while heard < sent {
        let drained = crate::heard(&broker).await;
        assert!(drained.len() <= 2, "{} held at once", drained.len());
        heard += drained.len();
    }
    assert_eq!(heard, sent);
    assert!(broker.drain().is_empty());
}

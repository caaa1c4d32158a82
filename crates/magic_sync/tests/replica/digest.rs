//! The digest a replica reports, against a computation by hand.

use crate::support::*;
use magic_sync::envelope::{DigestForm, TableDigest};

/// FNV-1a 64, written out here rather than taken from the crate.
fn fnv(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The first form's fingerprint of `keys`: FNV-1a over them sorted
/// bytewise, each followed by a zero byte; written out here too.
fn sorted(keys: &[&str]) -> u64 {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    let bytes: Vec<u8> = keys.iter().flat_map(|k| k.bytes().chain([0])).collect();
    fnv(&bytes)
}

/// The summed form's fingerprint of `keys`: the wrapping sum of each key's
/// FNV-1a, mixed by SplitMix64's finaliser; written out here too.
fn summed(keys: &[&str]) -> u64 {
    keys.iter().fold(0u64, |sum, k| {
        let mut z = fnv(k.as_bytes());
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        sum.wrapping_add(z ^ (z >> 31))
    })
}

#[test]
fn the_digest_matches_a_hand_computation() {
    let site = Site::new();
    let mut server = Server::new();
    let mut replica = site.open();
    let line = |order_id, line_no| OrderLine {
        order_id,
        line_no,
        product_id: 1,
        qty: 1,
    };
    apply_all(
        &mut replica,
        &server.whole_snapshot(
            vec![
                upserts(&[product(1, "tea"), product(2, "jam"), product(10, "honey")]),
                upserts(&[customer(1, "Ada"), customer(2, "Bob")]),
                upserts(&[line(5, 2), line(5, 1)]),
            ],
            &["products", "customers", "order_lines"],
        ),
    );
    // Customer 2 is retired, product 2's newest version was refused: neither counts.
    record_sale(&replica, "s1", 2);
    let mut refused = upserts(&[product(2, "plum jam")]);
    refused.upserts[0].data = b"{\"id\": 2}".to_vec();
    apply_all(
        &mut replica,
        &[server.down(vec![deletes("customers", &[2]), refused])],
    );

    let digest = replica.digest().expect("digests");
    let expected = vec![
        TableDigest {
            table: "products".into(),
            rows: 2,
            fingerprint: sorted(&["[10]", "[1]"]),
            summed: Some(summed(&["[10]", "[1]"])),
        },
        TableDigest {
            table: "customers".into(),
            rows: 1,
            fingerprint: sorted(&["[1]"]),
            summed: Some(summed(&["[1]"])),
        },
        TableDigest {
            table: "orders".into(),
            rows: 0,
            fingerprint: sorted(&[]),
            summed: Some(summed(&[])),
        },
        TableDigest {
            table: "order_lines".into(),
            rows: 2,
            fingerprint: sorted(&["[5,2]", "[5,1]"]),
            summed: Some(summed(&["[5,2]", "[5,1]"])),
        },
        TableDigest {
            table: "stock".into(),
            rows: 0,
            fingerprint: sorted(&[]),
            summed: Some(summed(&[])),
        },
    ];
    assert_eq!(
        digest.tables, expected,
        "every table that goes down, in order; no sales"
    );
    assert_eq!(
        digest.form,
        DigestForm::Sorted as i32,
        "`fingerprint` in the first form"
    );
}

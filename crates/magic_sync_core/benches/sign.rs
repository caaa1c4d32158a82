//! What signing and verifying a message costs, against what a message
//! costs without them, in the same run.
//!
//! cargo bench -p magic_sync_core --bench sign
//!
//! For bodies of 1 KiB, 64 KiB and 1 MiB (a snapshot's messages are up to
//! the transport's message size), the server's side is sealing and putting
//! head, body and tail together (what it did before signing) against that
//! with the signature;
//! the replica's side is decoding the message (what it did before) against
//! verifying then decoding. The body's hash is the one `sync.bodies`
//! already keeps, so the server's signing does not hash the body; the
//! replica's verifying does, once.

use magic_sync_core::envelope::{to_replica::Body, Down, RowData, TableRows, ToReplica};
use magic_sync_core::seal;
use magic_sync_core::sign::{verify_message, Signer};
use prost::Message;
use sha2::{Digest, Sha256};
use std::hint::black_box;
use std::time::{Duration, Instant};

fn message(body_bytes: usize) -> ToReplica {
    let row = RowData {
        key: b"[123456]".to_vec(),
        data: vec![b'x'; 90],
    };
    let rows = (body_bytes / 104).max(1);
    ToReplica {
        replica: "till-0042".into(),
        epoch: vec![7; 16],
        number: 1_234_567,
        nonce: vec![9; 16],
        previous: 1_234_560,
        previous_nonce: vec![8; 16],
        body: Some(Body::Down(Down {
            tables: vec![TableRows {
                table: "products".into(),
                upserts: vec![row; rows],
                ..TableRows::default()
            }],
        })),
        ..ToReplica::default()
    }
}

/// Mean time of `f` over at least half a second.
fn time(mut f: impl FnMut()) -> Duration {
    let started = Instant::now();
    let mut n = 0u32;
    while started.elapsed() < Duration::from_millis(500) || n < 10 {
        f();
        n += 1;
    }
    started.elapsed() / n
}

fn main() {
    let signer = Signer::new(&[0x42; 32], Vec::new());
    let key = signer.public();
    let secret = [0x11u8; 32];
    println!(
        "| body | server: seal | seal + sign | ratio | replica: decode | verify + decode | ratio |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for size in [1 << 10, 64 << 10, 1 << 20] {
        let m = message(size);
        let head = ToReplica {
            body: None,
            ..m.clone()
        }
        .encode_to_vec();
        let body = ToReplica {
            body: m.body.clone(),
            ..ToReplica::default()
        }
        .encode_to_vec();
        let hash = Sha256::digest(&body);
        let sealed = || seal::seal(&secret, &m.replica, &m.epoch, m.number, &m.nonce).to_vec();
        let unsigned = [
            head.as_slice(),
            &body,
            &ToReplica {
                seal: sealed(),
                ..ToReplica::default()
            }
            .encode_to_vec(),
        ]
        .concat();
        let signed = signer.message(&head, &body, &hash, sealed());
        // What the server did before: seal, and put head, body and tail together.
        let seal_only = time(|| {
            let tail = ToReplica {
                seal: sealed(),
                ..ToReplica::default()
            }
            .encode_to_vec();
            black_box([head.as_slice(), &body, &tail].concat());
        });
        let seal_and_sign = time(|| {
            black_box(signer.message(&head, &body, &hash, sealed()));
        });
        let decode = time(|| {
            black_box(ToReplica::decode(unsigned.as_slice()).unwrap());
        });
        let verify = time(|| {
            verify_message(&key, &signed).unwrap();
            black_box(ToReplica::decode(signed.as_slice()).unwrap());
        });
        let us = |d: Duration| format!("{:.1} µs", d.as_secs_f64() * 1e6);
        println!(
            "| {} KiB | {} | {} | {:.2}x | {} | {} | {:.2}x |",
            size >> 10,
            us(seal_only),
            us(seal_and_sign),
            seal_and_sign.as_secs_f64() / seal_only.as_secs_f64(),
            us(decode),
            us(verify),
            verify.as_secs_f64() / decode.as_secs_f64(),
        );
    }
}

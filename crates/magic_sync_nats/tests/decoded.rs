//! What the broker decodes of a replica's report, measured by the
//! allocator: a forged report of empty entries is refused having allocated
//! nothing from it, and what a report within the bounds takes decoded is
//! never more than the bound counted on its wire
//! (`magic_sync::core::bounds`), which the broker adds up to bound the
//! reports it holds. Counts of bytes, never timings.
//!
//! The allocator counts only on the thread that asks it to, so the test
//! harness's other threads change nothing.

// A global allocator is `unsafe` to implement; this one only forwards to
// the system's and counts.
#![allow(unsafe_code)]

use magic_sync::core::bounds::{bounded_decode, count_up, Refusal, UpBounds};
use magic_sync::envelope::{
    Backlog, Digest, Refused, RowData, TableBacklog, TableDigest, Up, UpRows,
};
use prost::Message as _;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    /// Bytes asked for, in all.
    static ASKED: Cell<usize> = const { Cell::new(0) };
    /// Bytes held now, and the most held at once.
    static HELD: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    if ON.with(Cell::get) {
        ASKED.with(|a| a.set(a.get() + size));
        HELD.with(|h| {
            h.set(h.get() + size);
            PEAK.with(|p| p.set(p.get().max(h.get())));
        });
    }
}

fn note_free(size: usize) {
    if ON.with(Cell::get) {
        HELD.with(|h| h.set(h.get().saturating_sub(size)));
    }
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_free(layout.size());
        note_alloc(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// What `f` returned, the bytes it asked for in all, the most it held at
/// once, and what it still holds (what it returned takes).
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize, usize) {
    ASKED.with(|a| a.set(0));
    HELD.with(|h| h.set(0));
    PEAK.with(|p| p.set(0));
    ON.with(|on| on.set(true));
    let out = f();
    ON.with(|on| on.set(false));
    (
        out,
        ASKED.with(Cell::get),
        PEAK.with(Cell::get),
        HELD.with(Cell::get),
    )
}

const MESSAGE: usize = 1 << 20;

#[test]
fn a_forged_report_of_empty_entries_is_refused_before_anything_is_allocated_from_it() {
    // 1 MiB of empty refusals, two bytes each: half a million entries.
    let forged = [0x2a, 0x00].repeat(MESSAGE / 2);
    let bounds = UpBounds::of_messages(MESSAGE);
    let (refused, asked, _, _) = measured(|| bounded_decode(&forged, &bounds));
    assert_eq!(
        refused.unwrap_err(),
        Refusal::TooMany {
            what: "refusals",
            found: MESSAGE / 2,
            bound: magic_sync::core::bounds::MAX_REFUSED,
        }
    );
    assert_eq!(asked, 0, "refusing it allocated {asked} bytes");
    // What decoding it whole would have taken: forty times its size.
    let (decoded, asked, _, _) =
        measured(|| Up::decode(forged.as_slice()).map(|up| up.refused.len()));
    assert_eq!(decoded.unwrap(), MESSAGE / 2);
    assert!(asked >= 40 * forged.len(), "{asked} bytes");
}

/// Reports within the bounds, of the shapes that cost the most decoded
/// per byte on the wire, and one of real rows.
fn within_bounds() -> Vec<(&'static str, Up)> {
    let empty_tables = Up {
        tables: vec![UpRows::default(); 5_000],
        ..Up::default()
    };
    let one_row_each = Up {
        tables: (0..2_500)
            .map(|t| UpRows {
                table: format!("t{t}"),
                rows: vec![RowData {
                    key: vec![1],
                    data: vec![2],
                }],
                gone: vec![vec![3]],
            })
            .collect(),
        ..Up::default()
    };
    let refusals = Up {
        refused: vec![
            Refused {
                table: "t".into(),
                key: vec![1],
                number: 1,
                reason: "r".into(),
            };
            magic_sync::core::bounds::MAX_REFUSED
        ],
        digest: Some(Digest {
            tables: vec![TableDigest::default(); 10_000],
            ..Digest::default()
        }),
        backlog: Some(Backlog {
            tables: vec![TableBacklog::default(); 10_000],
        }),
        ..Up::default()
    };
    let rows = Up {
        lane: "main".into(),
        send_id: vec![9; 16],
        tables: vec![UpRows {
            table: "sales".into(),
            rows: (0..1_000)
                .map(|r| RowData {
                    key: format!("[{r}]").into_bytes(),
                    data: vec![7; 500],
                })
                .collect(),
            gone: Vec::new(),
        }],
        sequence: 42,
        ..Up::default()
    };
    vec![
        ("empty tables", empty_tables),
        ("a row and a key gone each", one_row_each),
        ("refusals, digest and backlog", refusals),
        ("rows", rows),
    ]
}

#[test]
fn what_a_report_takes_decoded_is_never_more_than_its_bound() {
    let bounds = UpBounds::of_messages(MESSAGE);
    for (shape, up) in within_bounds() {
        let encoded = up.encode_to_vec();
        assert!(encoded.len() <= MESSAGE, "{shape}: {} bytes", encoded.len());
        let counts = count_up(&encoded).unwrap();
        let (bounded, _, peak, held) = measured(|| bounded_decode(&encoded, &bounds));
        let bounded = bounded.unwrap_or_else(|e| panic!("{shape}: {e}"));
        assert_eq!(bounded.up, up, "{shape}");
        assert_eq!(bounded.decoded_bytes, counts.decoded_bytes(), "{shape}");
        assert!(
            held <= bounded.decoded_bytes,
            "{shape}: holds {held} bytes decoded, bounded at {}",
            bounded.decoded_bytes
        );
        // Decoding a byte field copies it once on the way.
        assert!(
            peak <= bounded.decoded_bytes + encoded.len(),
            "{shape}: took {peak} bytes at once decoding, bounded at {} and {} encoded",
            bounded.decoded_bytes,
            encoded.len()
        );
    }
}

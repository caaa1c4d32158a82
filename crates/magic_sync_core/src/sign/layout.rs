//! Where the head, body and tail of an encoded `ToReplica` lie, found by
//! walking its top-level fields without decoding them: they must come in
//! the server's order, so the bytes a signature covers are the bytes that
//! apply.

use super::verify::too_many;
use super::{Forgery, MAX_ENDORSEMENTS};

/// `ToReplica.endorsements`.
const ENDORSEMENTS_FIELD: u32 = 17;

/// Which part of a message a top-level field belongs to.
fn group(field: u32) -> Option<u8> {
    match field {
        1..=7 => Some(0),
        10..=14 => Some(1),
        15..=19 => Some(2),
        _ => None,
    }
}

/// An encoded `ToReplica`'s head, body and tail.
type Parts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// The head, body and tail of an encoded `ToReplica`, found by walking its
/// top-level fields, which must come head first, then body, then tail. The
/// endorsements are counted as they are walked: a tail of more than
/// [`MAX_ENDORSEMENTS`] is refused before any is decoded.
pub(super) fn split(bytes: &[u8]) -> Result<Parts<'_>, Forgery> {
    let layout = |why: String| Forgery::Layout { why };
    let mut at = 0;
    let mut current = 0u8;
    let mut endorsements = 0usize;
    // Where the body and the tail begin.
    let mut starts = [None::<usize>; 2];
    while at < bytes.len() {
        let start = at;
        let key = varint(bytes, &mut at).ok_or_else(|| layout("a field key is cut".into()))?;
        let field = u32::try_from(key >> 3).unwrap_or(u32::MAX);
        let Some(g) = group(field) else {
            return Err(layout(format!("field {field} is none of the server's")));
        };
        if g < current {
            return Err(layout(format!("field {field} comes after a later part")));
        }
        for part in current + 1..=g {
            starts[usize::from(part) - 1].get_or_insert(start);
        }
        current = g;
        if field == ENDORSEMENTS_FIELD {
            endorsements += 1;
            if endorsements > MAX_ENDORSEMENTS {
                return Err(too_many(endorsements));
            }
        }
        let skip = match key & 7 {
            0 => {
                varint(bytes, &mut at).ok_or_else(|| layout("a number is cut".into()))?;
                0
            }
            2 => usize::try_from(
                varint(bytes, &mut at).ok_or_else(|| layout("a length is cut".into()))?,
            )
            .unwrap_or(usize::MAX),
            1 => 8,
            5 => 4,
            other => return Err(layout(format!("field {field} has wire type {other}"))),
        };
        at = at
            .checked_add(skip)
            .filter(|end| *end <= bytes.len())
            .ok_or_else(|| layout(format!("field {field} runs past the end")))?;
    }
    let body = starts[0].unwrap_or(bytes.len());
    let tail = starts[1].unwrap_or(bytes.len()).max(body);
    Ok((&bytes[..body], &bytes[body..tail], &bytes[tail..]))
}

/// Reads a base-128 varint at `at`, moving past it.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        value |= u64::from(byte & 0x7F) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

//! Fingerprints: FNV-1a, 64 bits (the `fnv` crate's). Replicas report a
//! digest of the keys they hold with it; the server names over-long
//! identifiers with it.
//!
//! A table's keys (as they travel: the canonical key texts) are
//! fingerprinted in one of two forms ([`DigestForm`]):
//!
//! - [`sorted`]: FNV-1a over the keys sorted bytewise, each followed by a
//!   `0` byte. The first form; it needs every key at once, in order.
//! - [`summed`]: the wrapping sum of [`key_hash`] over the keys. A key in
//!   adds its hash and a key out takes it away, so whoever keeps the
//!   fingerprint can keep it as keys come and go, and a set held in two
//!   parts is the sum of its parts. An empty table's is 0.

use fnv::FnvHasher;
use std::hash::Hasher;

pub use crate::envelope::DigestForm;

/// FNV-1a over `bytes`.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h = FnvHasher::default();
    h.write(bytes);
    h.finish()
}

/// Continues an FNV-1a hash from `state` (a hash [`fnv1a`] or [`extend`]
/// returned) over `bytes`.
pub fn extend(state: u64, bytes: &[u8]) -> u64 {
    let mut h = FnvHasher::with_key(state);
    h.write(bytes);
    h.finish()
}

/// The [`DigestForm::Sorted`] fingerprint of `keys`. Sorts them in place.
pub fn sorted<K: AsRef<[u8]> + Ord>(keys: &mut [K]) -> u64 {
    keys.sort_unstable();
    keys.iter()
        .fold(fnv1a(b""), |h, k| extend(extend(h, k.as_ref()), &[0]))
}

/// One key's share of a [`DigestForm::Summed`] fingerprint: FNV-1a of the
/// key, its bits then mixed (SplitMix64's finaliser), so that keys alike
/// in all but their last bytes add up to sums unlike.
pub fn key_hash(key: &[u8]) -> u64 {
    let mut z = fnv1a(key);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The [`DigestForm::Summed`] fingerprint of `keys`, in any order.
pub fn summed<K: AsRef<[u8]>>(keys: impl IntoIterator<Item = K>) -> u64 {
    keys.into_iter()
        .fold(0, |sum, k| sum.wrapping_add(key_hash(k.as_ref())))
}

#[cfg(test)]
mod tests {
    #[test]
    fn matches_the_published_vectors() {
        assert_eq!(super::fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(super::fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(super::fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn extending_is_hashing_the_concatenation() {
        assert_eq!(
            super::extend(super::fnv1a(b"foo"), b"bar"),
            super::fnv1a(b"foobar")
        );
    }

    #[test]
    fn the_sorted_form_is_over_sorted_keys_each_ended_by_a_zero() {
        let mut keys = ["[2]", "[10]", "[1]"];
        // Bytewise: "[10]" < "[1]" < "[2]" ('0' < ']').
        assert_eq!(super::sorted(&mut keys), super::fnv1a(b"[10]\0[1]\0[2]\0"));
        assert_eq!(super::sorted::<&str>(&mut []), super::fnv1a(b""));
    }

    #[test]
    fn the_summed_form_adds_and_takes_away_keys_in_any_order() {
        let all = super::summed(["[1]", "[2]", "[10]"]);
        assert_eq!(all, super::summed(["[10]", "[1]", "[2]"]));
        assert_eq!(super::summed::<&str>([]), 0);
        // A set in two parts is the sum of its parts; a key out takes its
        // share away.
        let part = super::summed(["[1]"]).wrapping_add(super::summed(["[2]", "[10]"]));
        assert_eq!(part, all);
        assert_eq!(
            all.wrapping_sub(super::key_hash(b"[2]")),
            super::summed(["[1]", "[10]"])
        );
        // Keys alike in all but a byte differ in many bits.
        let (a, b) = (super::key_hash(b"[1]"), super::key_hash(b"[3]"));
        assert!((a ^ b).count_ones() > 16, "{a:x} {b:x}");
    }
}

//! Fingerprints: FNV-1a, 64 bits (the `fnv` crate's). Replicas report a
//! digest of the keys they hold with it; the server names over-long
//! identifiers with it.

use fnv::FnvHasher;
use std::hash::Hasher;

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
}

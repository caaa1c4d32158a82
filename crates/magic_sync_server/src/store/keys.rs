//! The keys the server signs with (`sync.keys`): the newest signs, and
//! each after the first is endorsed by the one before it. A replica pins
//! the public half of the newest when it is enrolled ([`public`]).
//!
//! Whoever holds a seed can sign as the server, so a seed need not be
//! readable by whoever reads the database or a backup of it. Given a key
//! outside the database ([`SeedKey`]: a file `MAGIC_SYNC_SEED_KEY` names,
//! 64 hex digits), the relay seals every seed under it as it starts
//! ([`seal`]), and a rotation stores the new seed sealed: ChaCha20-Poly1305,
//! a nonce of its own per seed, the seed's ordinal as associated data (a
//! sealed seed moved to another row does not open). Sealed seeds open only
//! with that key; without it the server says so and stops. Plain seeds (a
//! database no relay with a key started on yet) still read.

use crate::error::{Error, Result};
use magic_sync_core::envelope::Endorsement;
use magic_sync_core::sign::{ServerKey, Signer};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use std::path::{Path, PathBuf};
use tokio_postgres::{Client, GenericClient};

/// The variable naming the file of the key seeds are sealed under.
pub const SEED_KEY: &str = "MAGIC_SYNC_SEED_KEY";

/// What begins a sealed seed.
const SEALED: &[u8] = b"ms-seal-1";

/// The key signing seeds are sealed under: 32 bytes kept outside the
/// database.
#[derive(Clone)]
pub struct SeedKey([u8; 32]);

impl std::fmt::Debug for SeedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("SeedKey")
    }
}

impl SeedKey {
    /// The key from its 32 bytes.
    pub fn new(bytes: [u8; 32]) -> SeedKey {
        SeedKey(bytes)
    }

    /// A new key, drawn at random: `magic-sync key --new-seed-key`.
    pub fn draw() -> SeedKey {
        SeedKey(rand::random())
    }

    /// The key as its file holds it: 64 hex digits.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The key in the file at `path`: 64 hex digits, whitespace around them
    /// ignored.
    pub fn read(path: &Path) -> Result<SeedKey> {
        let failed = |why: String| Error::SeedKey {
            why: format!("{SEED_KEY} names {}: {why}", path.display()),
        };
        let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
        let bytes = hex::decode(text.trim())
            .ok()
            .and_then(|b| <[u8; 32]>::try_from(b).ok())
            .ok_or_else(|| failed("it does not hold 64 hex digits".into()))?;
        Ok(SeedKey(bytes))
    }

    /// The key `MAGIC_SYNC_SEED_KEY` names, if it names one; read once per
    /// path and kept.
    pub fn configured() -> Result<Option<SeedKey>> {
        static KEPT: std::sync::Mutex<Option<(PathBuf, SeedKey)>> = std::sync::Mutex::new(None);
        let Some(path) = std::env::var_os(SEED_KEY).map(PathBuf::from) else {
            return Ok(None);
        };
        let mut kept = KEPT.lock().expect("not poisoned");
        if let Some((_, key)) = kept.as_ref().filter(|(at, _)| *at == path) {
            return Ok(Some(key.clone()));
        }
        let key = SeedKey::read(&path)?;
        *kept = Some((path, key.clone()));
        Ok(Some(key))
    }

    fn aead(&self) -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&CHACHA20_POLY1305, &self.0).expect("a 32-byte key"))
    }

    /// `seed`, the key of ordinal `ordinal`, sealed.
    pub fn seal(&self, ordinal: i32, seed: &[u8; 32]) -> Vec<u8> {
        let nonce: [u8; NONCE_LEN] = rand::random();
        let mut sealed = seed.to_vec();
        self.aead()
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(ordinal.to_be_bytes()),
                &mut sealed,
            )
            .expect("a seed seals");
        [SEALED, &nonce, &sealed].concat()
    }

    /// The seed `stored` holds for ordinal `ordinal`; `None` when it is
    /// not one this key sealed (another key's, or changed).
    fn open(&self, ordinal: i32, stored: &[u8]) -> Option<[u8; 32]> {
        let rest = stored.strip_prefix(SEALED)?;
        let (nonce, sealed) = rest.split_at_checked(NONCE_LEN)?;
        let mut sealed = sealed.to_vec();
        let seed = self
            .aead()
            .open_in_place(
                Nonce::try_assume_unique_for_key(nonce).ok()?,
                Aad::from(ordinal.to_be_bytes()),
                &mut sealed,
            )
            .ok()?;
        seed.try_into().ok()
    }
}

/// The seed stored for the key of ordinal `ordinal`, opened with `key`
/// when it is sealed.
fn seed_of(stored: &[u8], ordinal: i32, key: Option<&SeedKey>) -> Result<[u8; 32]> {
    if let Ok(plain) = <[u8; 32]>::try_from(stored) {
        return Ok(plain);
    }
    if !stored.starts_with(SEALED) {
        return Err(Error::Damaged {
            what: format!(
                "sync.keys holds a seed (ordinal {ordinal}) that is neither 32 bytes nor sealed"
            ),
        });
    }
    let key = key.ok_or_else(|| Error::SeedKey {
        why: format!(
            "they are sealed, and {SEED_KEY} names no key to open them: set it to the file of \
             the key they were sealed under"
        ),
    })?;
    key.open(ordinal, stored).ok_or_else(|| Error::SeedKey {
        why: format!(
            "the key {SEED_KEY} names does not open the seed of ordinal {ordinal}: it is not the \
             key they were sealed under, or the seed was changed"
        ),
    })
}

/// Every key as stored, oldest first: its seed, and its endorsement by the
/// one before it.
pub(crate) const READ: &str =
    "SELECT array_agg(seed ORDER BY ordinal), array_agg(endorsement ORDER BY ordinal) FROM sync.keys";

/// The newest key as a signer, from the stored seeds and endorsements,
/// oldest first (ordinals 1, 2, ...), sealed seeds opened with the key
/// `MAGIC_SYNC_SEED_KEY` names.
pub(crate) fn signer(seeds: &[Vec<u8>], endorsements: &[Option<Vec<u8>>]) -> Result<Signer> {
    let key = match seeds.iter().any(|s| s.len() != 32) {
        true => SeedKey::configured()?,
        false => None,
    };
    signer_with(seeds, endorsements, key.as_ref())
}

/// [`signer`], sealed seeds opened with `key`.
fn signer_with(
    seeds: &[Vec<u8>],
    endorsements: &[Option<Vec<u8>>],
    key: Option<&SeedKey>,
) -> Result<Signer> {
    let damaged = |what: &str| Error::Damaged {
        what: format!("sync.keys {what}"),
    };
    let mut chain = Vec::new();
    let mut last = None;
    for (i, seed) in seeds.iter().enumerate() {
        let ordinal = i32::try_from(i + 1).map_err(|_| damaged("holds too many keys"))?;
        let seed = &seed_of(seed, ordinal, key)?;
        let key = Signer::new(seed, Vec::new());
        if i > 0 {
            let signature = endorsements
                .get(i)
                .cloned()
                .flatten()
                .ok_or_else(|| damaged("holds a key after the first with no endorsement"))?;
            chain.push(Endorsement {
                key: key.public().to_bytes().to_vec(),
                signature,
            });
        }
        last = Some(*seed);
    }
    let seed = last.ok_or_else(|| damaged("is empty: the migrations did not run whole"))?;
    Ok(Signer::new(&seed, chain))
}

/// The key the server signs with now, with its endorsements.
pub async fn current(client: &impl GenericClient) -> Result<Signer> {
    let row = client.query_one(READ, &[]).await?;
    let seeds: Option<Vec<Vec<u8>>> = row.get(0);
    let endorsements: Option<Vec<Option<Vec<u8>>>> = row.get(1);
    signer(
        &seeds.unwrap_or_default(),
        &endorsements.unwrap_or_default(),
    )
}

/// The public half of the key the server signs with now: what a replica
/// is given with its secret when it is enrolled, and pins.
pub async fn public(client: &impl GenericClient) -> Result<ServerKey> {
    Ok(current(client).await?.public())
}

/// Replaces the key the server signs with by a new one, endorsed by it:
/// replicas that pinned an older key follow the endorsements to it. Returns
/// the new public key (for replicas enrolled from now on). Messages the
/// server sends from the next pass on are signed with it.
pub async fn rotate(client: &mut Client) -> Result<ServerKey> {
    let tx = client.transaction().await?;
    tx.execute("LOCK TABLE sync.keys IN EXCLUSIVE MODE", &[])
        .await?;
    let now = current(&tx).await?;
    let seed: [u8; 32] = rand::random();
    let next = Signer::new(&seed, Vec::new()).public();
    let endorsement = now.endorse(&next).signature;
    let ordinal: i32 = tx
        .query_one("SELECT max(ordinal) + 1 FROM sync.keys", &[])
        .await?
        .get(0);
    let stored = match SeedKey::configured()? {
        Some(key) => key.seal(ordinal, &seed),
        None => seed.to_vec(),
    };
    tx.execute(
        "INSERT INTO sync.keys (ordinal, seed, endorsement) VALUES ($1, $2, $3)",
        &[&ordinal, &stored, &endorsement],
    )
    .await?;
    tx.commit().await?;
    Ok(next)
}

/// Seals, under the key `MAGIC_SYNC_SEED_KEY` names, every seed stored
/// plain; nothing without one. Returns how many it sealed.
pub async fn seal(client: &Client) -> Result<u64> {
    match SeedKey::configured()? {
        Some(key) => seal_with(client, &key).await,
        None => Ok(0),
    }
}

/// Seals under `key` every seed stored plain, after checking that `key`
/// opens those already sealed. Returns how many it sealed.
/// On `client`'s session, which must not be in a transaction: one of its
/// own, as the relay's start runs it.
pub async fn seal_with(client: &Client, key: &SeedKey) -> Result<u64> {
    client
        .batch_execute("BEGIN; LOCK TABLE sync.keys IN EXCLUSIVE MODE")
        .await?;
    match seal_rows(client, key).await {
        Ok(sealed) => {
            client.batch_execute("COMMIT").await?;
            Ok(sealed)
        }
        Err(e) => {
            // The connection may be gone with the error; nothing was kept.
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

async fn seal_rows(client: &Client, key: &SeedKey) -> Result<u64> {
    let rows = client
        .query("SELECT ordinal, seed FROM sync.keys ORDER BY ordinal", &[])
        .await?;
    let mut sealed = 0;
    for row in rows {
        let (ordinal, stored): (i32, Vec<u8>) = (row.get(0), row.get(1));
        let seed = seed_of(&stored, ordinal, Some(key))?;
        if stored.len() == 32 {
            client
                .execute(
                    "UPDATE sync.keys SET seed = $2 WHERE ordinal = $1",
                    &[&ordinal, &key.seal(ordinal, &seed)],
                )
                .await?;
            sealed += 1;
        }
    }
    Ok(sealed)
}

#[cfg(test)]
mod tests {
    use super::{seed_of, signer_with, SeedKey};
    use crate::error::Error;

    #[test]
    fn a_sealed_seed_opens_only_with_its_key_in_its_row() {
        let key = SeedKey::draw();
        let seed: [u8; 32] = rand::random();
        let sealed = key.seal(2, &seed);
        assert_eq!(sealed.len(), 69, "as the sync.keys check says");
        assert_eq!(seed_of(&sealed, 2, Some(&key)).unwrap(), seed);
        assert!(
            !sealed.windows(32).any(|w| w == seed),
            "the seed is not in it"
        );
        // Another key, another row, a flipped bit, no key: none opens it.
        let other = SeedKey::draw();
        for (ordinal, key) in [(2, Some(&other)), (3, Some(&key)), (2, None)] {
            assert!(matches!(
                seed_of(&sealed, ordinal, key),
                Err(Error::SeedKey { .. })
            ));
        }
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(seed_of(&flipped, 2, Some(&key)).is_err());
        // A plain seed reads with or without a key.
        assert_eq!(seed_of(&seed, 1, None).unwrap(), seed);
    }

    #[test]
    fn a_chain_of_sealed_seeds_signs_as_the_plain_one_did() {
        let key = SeedKey::draw();
        let first: [u8; 32] = rand::random();
        let plain = signer_with(&[first.to_vec()], &[None], None).unwrap();
        let sealed = signer_with(&[key.seal(1, &first)], &[None], Some(&key)).unwrap();
        assert_eq!(plain.public(), sealed.public());
    }

    #[test]
    fn a_key_file_holds_64_hex_digits() {
        let dir = std::env::temp_dir().join(format!("ms-seed-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good");
        let key = SeedKey::draw();
        std::fs::write(&good, format!("{}\n", key.to_hex())).unwrap();
        assert_eq!(SeedKey::read(&good).unwrap().0, key.0);
        let bad = dir.join("bad");
        std::fs::write(&bad, "not a key").unwrap();
        let why = SeedKey::read(&bad).unwrap_err().to_string();
        assert!(why.contains("64 hex digits"), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

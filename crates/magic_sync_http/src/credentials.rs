//! Each replica's secret, kept on the server as a password hash
//! (`sync.credentials`, Argon2id in PHC form): a connecting replica proves
//! who it is with it, and the secret itself is never stored nor logged.

use crate::{Error, Result};
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use base64::Engine as _;
use magic_sync::store::credentials as store;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio_postgres::Client;

/// A new random secret: 32 bytes, as URL-safe base64.
pub fn generate() -> String {
    let bytes: [u8; 32] = rand::random();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The hash of `secret` as stored: Argon2id with a random salt.
pub fn hash(secret: &str) -> Result<String> {
    let salt = SaltString::generate(&mut rand::rngs::OsRng);
    Argon2::default()
        .hash_password(secret.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| Error::Hash(e.to_string()))
}

/// Whether `secret` is the one `hash` was made from. A stored hash that
/// does not parse proves nothing.
pub fn verify(hash: &str, secret: &str) -> bool {
    PasswordHash::new(hash).is_ok_and(|parsed| {
        Argon2::default()
            .verify_password(secret.as_bytes(), &parsed)
            .is_ok()
    })
}

/// Gives `replica` a new secret, replacing any it had, and returns it: the
/// only time it can be read. Its connections made with the old secret
/// stay until they end; new ones need the new secret.
pub async fn issue(client: &Client, replica: &str) -> Result<String> {
    let secret = generate();
    set(client, replica, &secret).await?;
    Ok(secret)
}

/// The longest replica id, in bytes, that can connect.
pub const MAX_ID_BYTES: usize = 256;

/// Why a text cannot be a replica's id on the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NotAnId {
    /// Empty.
    #[error("it is empty")]
    Empty,
    /// Longer than [`MAX_ID_BYTES`].
    #[error("it is {0} bytes long, more than the {MAX_ID_BYTES} an id may have")]
    TooLong(usize),
    /// It holds a control character (a NUL, an escape, a line break...).
    #[error("it holds a control character")]
    Control,
}

/// Whether `id` can be a replica's id: 1 to [`MAX_ID_BYTES`] bytes of
/// text without a control character. The hub refuses any other before it
/// looks anything up, and no secret is given to one.
pub fn check_id(id: &str) -> std::result::Result<(), NotAnId> {
    if id.is_empty() {
        return Err(NotAnId::Empty);
    }
    if id.len() > MAX_ID_BYTES {
        return Err(NotAnId::TooLong(id.len()));
    }
    if id.chars().any(char::is_control) {
        return Err(NotAnId::Control);
    }
    Ok(())
}

/// Sets `replica`'s secret to `secret` (for a host that makes its own).
pub async fn set(client: &Client, replica: &str, secret: &str) -> Result<()> {
    if let Err(why) = check_id(replica) {
        return Err(Error::Settings(format!(
            "{} cannot be a replica's id on the socket: {why}",
            crate::guard::logged(replica)
        )));
    }
    if secret.len() < 16 {
        return Err(Error::Settings(format!(
            "the secret of replica `{replica}` is {} characters long; at least 16 are needed",
            secret.len()
        )));
    }
    let secret = secret.to_string();
    let hashed = tokio::task::spawn_blocking(move || hash(&secret))
        .await
        .map_err(|e| Error::Hash(e.to_string()))??;
    store::set(client, replica, &hashed).await?;
    Ok(())
}

/// Takes `replica`'s secret away: it can no longer connect. Whether it had one.
pub async fn revoke(client: &Client, replica: &str) -> Result<bool> {
    Ok(store::revoke(client, replica).await?)
}

/// Per replica: the stored hash a secret was proved against, and the
/// SHA-256 of that secret.
type Proved = HashMap<String, (String, [u8; 32])>;

/// Checks connecting replicas' secrets against `sync.credentials`, on a
/// connection of its own (opened again when lost).
///
/// Each check reads the stored hash, so a secret replaced or taken away
/// counts from the next connection. The slow hash runs once per secret and
/// stored hash: a replica reconnecting with the secret already proved is
/// let in on a comparison of digests kept in memory.
///
/// The slow hashes share the machine's cores. One of them is kept for
/// replicas that proved their secret in the last day (as recorded in
/// `sync.credentials`, so it holds across a restart), asking from a party
/// with no failure on record: a flood of wrong secrets fills the others'
/// queue, not theirs, even when it names real replicas. An id with no
/// secret is checked against a hash of nothing in particular, so how long
/// a refusal takes does not tell which ids exist.
///
/// A lookup PostgreSQL refuses for the id it was given (SQLSTATE class 22,
/// a data exception: text holding a NUL, say) is that check's failure: the
/// id cannot be anyone's, and the connection stays. Only a connection that
/// failed is opened again.
pub struct Credentials {
    config: tokio_postgres::Config,
    /// The connection, shared: lookups run at once on it (the lock is
    /// held only to take or replace it).
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// Per replica: the stored hash a secret was proved against, and the
    /// SHA-256 of that secret.
    proved: Arc<Mutex<Proved>>,
    /// Slow hashes run at once at most, for anyone (each takes Argon2's
    /// 19 MiB and a thread), so a fleet connecting at once cannot exhaust
    /// the server; and the share kept for replicas proved recently, asking
    /// from a party that did not fail lately.
    hashing: Share,
    reserved: Share,
    /// Compared with when an id has no secret.
    dummy: Arc<std::sync::OnceLock<String>>,
}

/// Slow hashes that may run at once, checks that may wait for one, and
/// the hashes run so far.
struct Share {
    permits: Arc<tokio::sync::Semaphore>,
    waiting: std::sync::atomic::AtomicUsize,
    ran: std::sync::atomic::AtomicU64,
}

impl Share {
    fn new(permits: usize) -> Share {
        Share {
            permits: Arc::new(tokio::sync::Semaphore::new(permits.max(1))),
            waiting: std::sync::atomic::AtomicUsize::new(0),
            ran: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// A turn at hashing; past [`Credentials::QUEUE`] waiting, refused at
    /// once, to be tried again after the replica's backoff.
    async fn turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        use std::sync::atomic::Ordering;
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= Credentials::QUEUE {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Hash(format!(
                "{} secrets wait to be checked already",
                Credentials::QUEUE
            )));
        }
        let permit = self.permits.clone().acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        let permit = permit.map_err(|e| Error::Hash(e.to_string()))?;
        self.ran.fetch_add(1, Ordering::Relaxed);
        Ok(permit)
    }
}

/// Slow hashes run so far, per share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hashes {
    /// On the share for anyone.
    pub general: u64,
    /// On the share kept for replicas that proved their secret lately,
    /// asking from a party with no failure on record.
    pub reserved: u64,
}

/// What the caller knows of who asks: whether that party must wait before
/// trying this id again, and whether it failed lately with any.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// How long it must wait before trying this id's secret again, if it
    /// must.
    pub barred: Option<std::time::Duration>,
    /// Whether it failed lately, with any id.
    pub suspect: bool,
}

/// What looking a replica's secret up came to.
enum Lookup {
    /// Its stored hash, and whether it proved its secret in the last day.
    Found { hash: String, recent: bool },
    /// It has no secret.
    None,
    /// PostgreSQL refused the id itself: it cannot be anyone's.
    NotAnId,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").finish_non_exhaustive()
    }
}

impl Credentials {
    /// Checks against the database at `config`.
    pub fn new(config: tokio_postgres::Config) -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Credentials {
            config,
            client: tokio::sync::Mutex::new(None),
            proved: Arc::default(),
            hashing: Share::new(cores.saturating_sub(1)),
            reserved: Share::new(1),
            dummy: Arc::default(),
        }
    }

    /// Checks that may wait for a slow hash at once, per share.
    const QUEUE: usize = 256;

    async fn connection(&self) -> Result<Arc<Client>> {
        let mut client = self.client.lock().await;
        Ok(match &*client {
            Some(c) if !c.is_closed() => c.clone(),
            _ => {
                let c = magic_sync::tls::connect(&self.config).await?;
                client.insert(Arc::new(c)).clone()
            }
        })
    }

    async fn stored(&self, replica: &str) -> Result<Lookup> {
        let client = self.connection().await?;
        match store::hash(&client, replica).await {
            Ok(Some((hash, recent))) => Ok(Lookup::Found { hash, recent }),
            Ok(None) => Ok(Lookup::None),
            Err(e) => self.lookup_failed(&client, e).await,
        }
    }

    /// A lookup on `client` that failed with `e`: refused for its data, it
    /// is this check's alone; refused for anything else the database said,
    /// it is an error and the connection stays; failed without an answer,
    /// the connection is opened again next time.
    async fn lookup_failed(&self, client: &Arc<Client>, e: magic_sync::Error) -> Result<Lookup> {
        let answered = match &e {
            magic_sync::Error::Postgres(pg) => pg.as_db_error().map(|db| db.code().code()),
            _ => None,
        };
        match answered {
            Some(code) if code.starts_with("22") => Ok(Lookup::NotAnId),
            Some(_) => Err(e.into()),
            None => {
                let mut held = self.client.lock().await;
                if held.as_ref().is_some_and(|c| Arc::ptr_eq(c, client)) {
                    *held = None;
                }
                Err(e.into())
            }
        }
    }

    /// Whether `digest` is of the secret last proved for `replica`, against
    /// whatever hash.
    fn proved_before(&self, replica: &str, digest: &[u8; 32]) -> bool {
        self.proved
            .lock()
            .expect("not poisoned")
            .get(replica)
            .is_some_and(|(_, proved)| proved == digest)
    }

    fn cached(&self, replica: &str, stored: &str, digest: &[u8; 32]) -> bool {
        self.proved
            .lock()
            .expect("not poisoned")
            .get(replica)
            .is_some_and(|(hash, proved)| hash == stored && proved == digest)
    }

    /// Slow hashes run so far, per share.
    pub fn hashes(&self) -> Hashes {
        use std::sync::atomic::Ordering;
        Hashes {
            general: self.hashing.ran.load(Ordering::Relaxed),
            reserved: self.reserved.ran.load(Ordering::Relaxed),
        }
    }

    /// Whether `secret` is `replica`'s. An error means the check could not
    /// be made (the database is out of reach, or too many wait): the
    /// replica tries again.
    pub async fn check(&self, replica: &str, secret: &str) -> Result<bool> {
        Ok(self
            .check_from(replica, secret, Standing::default())
            .await?
            == Checked::Yes)
    }

    /// [`check`](Self::check), for a party whose `standing` the caller
    /// knows. A party barred is answered without a lookup, unless it
    /// presents the secret last proved for `replica` (then the stored hash
    /// is read, to see that the secret still stands, and it is let in): a
    /// replica is not locked out by whoever shares its address, and a
    /// guesser costs nothing. Otherwise the stored hash is read once: a
    /// secret already proved against it is let in at once, and any other
    /// is hashed, on the share kept for replicas proved lately only when
    /// the party is not `suspect`.
    pub async fn check_from(
        &self,
        replica: &str,
        secret: &str,
        standing: Standing,
    ) -> Result<Checked> {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        if let Some(wait) = standing.barred {
            if !self.proved_before(replica, &digest) {
                return Ok(Checked::Barred(wait));
            }
            return Ok(match self.stored(replica).await? {
                Lookup::Found { hash, .. } if self.cached(replica, &hash, &digest) => Checked::Yes,
                _ => Checked::Barred(wait),
            });
        }
        let (stored, recent) = match self.stored(replica).await? {
            Lookup::Found { hash, recent } => (hash, recent),
            Lookup::NotAnId => return Ok(Checked::NotAnId),
            Lookup::None => {
                self.as_long_as_a_wrong_secret(secret).await?;
                return Ok(Checked::No);
            }
        };
        if self.cached(replica, &stored, &digest) {
            return Ok(Checked::Yes);
        }
        let permit = if recent && !standing.suspect {
            self.reserved.turn().await?
        } else {
            self.hashing.turn().await?
        };
        let (proved, who, secret, kept) = (
            self.proved.clone(),
            replica.to_string(),
            secret.to_string(),
            stored.clone(),
        );
        // A secret proved counts even if the replica gave up waiting.
        let ok = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let ok = verify(&kept, &secret);
            if ok {
                proved
                    .lock()
                    .expect("not poisoned")
                    .insert(who, (kept, digest));
            }
            ok
        })
        .await
        .map_err(|e| Error::Hash(e.to_string()))?;
        if !ok {
            return Ok(Checked::No);
        }
        let client = self.connection().await?;
        store::proved(&client, replica, &stored).await?;
        Ok(Checked::Yes)
    }

    /// Checks `secret` against a hash of nothing in particular, on the
    /// general share: an id with no secret is refused as slowly as a
    /// wrong secret is.
    async fn as_long_as_a_wrong_secret(&self, secret: &str) -> Result<()> {
        let permit = self.hashing.turn().await?;
        let (dummy, secret) = (self.dummy.clone(), secret.to_string());
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let dummy = dummy.get_or_init(|| hash(&generate()).unwrap_or_default());
            verify(dummy, &secret)
        })
        .await
        .map_err(|e| Error::Hash(e.to_string()))?;
        Ok(())
    }
}

/// What checking a secret came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The replica's secret.
    Yes,
    /// Not its secret, or an id with none.
    No,
    /// An id PostgreSQL refused to look up: it cannot be anyone's.
    NotAnId,
    /// Not checked: the caller must wait this long first.
    Barred(std::time::Duration),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hash_proves_its_secret_and_no_other() {
        let secret = generate();
        let hashed = hash(&secret).unwrap();
        assert!(!hashed.contains(&secret));
        assert!(verify(&hashed, &secret));
        assert!(!verify(&hashed, &generate()));
        assert!(!verify("not a hash", &secret));
    }

    #[test]
    fn an_id_is_short_text_without_a_control_character() {
        for id in [
            "t1",
            "till 12 (north)",
            "caisse-é",
            &"x".repeat(MAX_ID_BYTES),
        ] {
            assert_eq!(check_id(id), Ok(()), "{id}");
        }
        assert_eq!(check_id(""), Err(NotAnId::Empty));
        assert_eq!(
            check_id(&"x".repeat(MAX_ID_BYTES + 1)),
            Err(NotAnId::TooLong(MAX_ID_BYTES + 1))
        );
        for id in ["t\0", "t\u{1b}[2J", "t\n", "\u{7f}", "\u{85}", "\u{9b}"] {
            assert_eq!(check_id(id), Err(NotAnId::Control), "{id:?}");
        }
    }
}

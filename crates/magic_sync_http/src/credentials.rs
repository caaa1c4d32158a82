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
/// Checks that are likely guesses (an id with no secret, a party that
/// failed lately, an id guessed wrong lately from anywhere) begin at most
/// [`Credentials::GENERAL_PER_SECOND`] slow hashes a second: past that one
/// is refused at once (a replica tries again after its backoff), so
/// guesses from ever new addresses cost a bounded part of a core. A real
/// id from a party with nothing against it is checked at any rate, once
/// per [`Credentials::DOUBTED_FOR`] if its secret was wrong.
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
    /// How many slow hashes the general share may start, per second and at
    /// once: past it a check is refused at once, as when too many wait.
    general_rate: Mutex<Bucket>,
    /// Ids a wrong secret was checked for from a party with nothing against
    /// it, and when: for [`Credentials::DOUBTED_FOR`] their checks go on
    /// the general share at its rate, so that guessing a real replica's
    /// secret from ever new addresses costs one hash at any rate per id,
    /// not one per guess.
    doubted: Mutex<HashMap<String, std::time::Instant>>,
    /// Compared with when an id has no secret.
    dummy: Arc<std::sync::OnceLock<String>>,
}

/// A token bucket: `rate` tokens a second, at most `burst` kept.
#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: std::time::Instant,
}

impl Bucket {
    fn new(rate: f64, burst: u32) -> Bucket {
        Bucket {
            rate,
            burst: f64::from(burst.max(1)),
            tokens: f64::from(burst.max(1)),
            at: std::time::Instant::now(),
        }
    }

    /// Takes a token if there is one.
    fn take(&mut self) -> bool {
        let now = std::time::Instant::now();
        let earned = now.duration_since(self.at).as_secs_f64() * self.rate;
        self.tokens = (self.tokens + earned).min(self.burst);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
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
            general_rate: Mutex::new(Bucket::new(Self::GENERAL_PER_SECOND, Self::GENERAL_BURST)),
            doubted: Mutex::default(),
            dummy: Arc::default(),
        }
    }

    /// [`Credentials::new`], with the general share's rate set to
    /// `per_second` slow hashes begun, `burst` at once (by default
    /// [`Credentials::GENERAL_PER_SECOND`] and
    /// [`Credentials::GENERAL_BURST`]).
    pub fn with_general_rate(self, per_second: f64, burst: u32) -> Self {
        *self.general_rate.lock().expect("not poisoned") = Bucket::new(per_second, burst);
        self
    }

    /// Checks that may wait for a slow hash at once, per share.
    const QUEUE: usize = 256;

    /// Slow hashes begun a second, by default, for checks that are likely
    /// guesses: ids with no secret, parties that failed lately, ids guessed
    /// wrong lately. Each takes about 20 ms of a core, so they cost at most
    /// a sixth of one. A real id named by a party with nothing against it
    /// is not bound by it (a fleet connecting for the first time), nor is
    /// the reserved share, and a secret already proved costs no hash.
    pub const GENERAL_PER_SECOND: f64 = 8.0;
    /// Slow hashes the general share may begin at once after a quiet time.
    pub const GENERAL_BURST: u32 = 16;
    /// How long an id a wrong secret was checked for on the reserved share
    /// is checked on the general share.
    pub const DOUBTED_FOR: std::time::Duration = std::time::Duration::from_secs(600);

    /// A turn on the general share, if its rate allows one now.
    async fn general_turn(&self) -> Result<tokio::sync::OwnedSemaphorePermit> {
        if !self.general_rate.lock().expect("not poisoned").take() {
            return Err(Error::Hash(format!(
                "more than {} secrets a second to check that may be guesses",
                Self::GENERAL_PER_SECOND
            )));
        }
        self.hashing.turn().await
    }

    /// Whether a wrong secret was checked for `replica` from a party with
    /// nothing against it within [`Credentials::DOUBTED_FOR`].
    fn is_doubted(&self, replica: &str) -> bool {
        self.doubted
            .lock()
            .expect("not poisoned")
            .get(replica)
            .is_some_and(|at| at.elapsed() < Self::DOUBTED_FOR)
    }

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
        let answered = matches!(&e, magic_sync::Error::Postgres(pg) if pg.as_db_error().is_some());
        match answered {
            true if e.is_data_exception() => Ok(Lookup::NotAnId),
            true => Err(e.into()),
            false => {
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
        // A party with nothing against it, naming an id nobody guessed
        // lately: its own share if it proved itself lately, else the
        // general share at any rate (a fleet's first connections). Any
        // other check is on the general share at its rate.
        let trusted = !standing.suspect && !self.is_doubted(replica);
        let permit = match (trusted, recent) {
            (true, true) => self.reserved.turn().await?,
            (true, false) => self.hashing.turn().await?,
            (false, _) => self.general_turn().await?,
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
            if trusted {
                // Bounded by the fleet: only ids with a secret get here.
                // Those past their time go as one is added, not at every
                // look: a fleet's logins each ask.
                let mut doubted = self.doubted.lock().expect("not poisoned");
                doubted.retain(|_, at| at.elapsed() < Self::DOUBTED_FOR);
                doubted.insert(replica.to_string(), std::time::Instant::now());
            }
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
        let permit = self.general_turn().await?;
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

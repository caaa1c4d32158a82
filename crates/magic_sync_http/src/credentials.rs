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

/// Sets `replica`'s secret to `secret` (for a host that makes its own).
pub async fn set(client: &Client, replica: &str, secret: &str) -> Result<()> {
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
/// `sync.credentials`, so it holds across a restart): a flood of wrong
/// secrets fills the others' queue, not theirs. An id with no secret is
/// checked against a hash of nothing in particular, so how long a refusal
/// takes does not tell which ids exist.
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
    /// the server; and the share kept for replicas proved recently.
    hashing: Share,
    reserved: Share,
    /// Compared with when an id has no secret.
    dummy: Arc<std::sync::OnceLock<String>>,
}

/// Slow hashes that may run at once, and checks that may wait for one.
struct Share {
    permits: Arc<tokio::sync::Semaphore>,
    waiting: std::sync::atomic::AtomicUsize,
}

impl Share {
    fn new(permits: usize) -> Share {
        Share {
            permits: Arc::new(tokio::sync::Semaphore::new(permits.max(1))),
            waiting: std::sync::atomic::AtomicUsize::new(0),
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
        permit.map_err(|e| Error::Hash(e.to_string()))
    }
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

    async fn stored(&self, replica: &str) -> Result<Option<(String, bool)>> {
        let client = self.connection().await?;
        match store::hash(&client, replica).await {
            Ok(hash) => Ok(hash),
            Err(e) => {
                // Connect again next time.
                *self.client.lock().await = None;
                Err(e.into())
            }
        }
    }

    fn cached(&self, replica: &str, stored: &str, secret: &str) -> bool {
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        self.proved
            .lock()
            .expect("not poisoned")
            .get(replica)
            .is_some_and(|(hash, proved)| hash == stored && *proved == digest)
    }

    /// Whether `secret` is `replica`'s. An error means the check could not
    /// be made (the database is out of reach, or too many wait): the
    /// replica tries again.
    pub async fn check(&self, replica: &str, secret: &str) -> Result<bool> {
        Ok(self.check_unless(replica, secret, || None).await? == Checked::Yes)
    }

    /// [`check`](Self::check), reading the stored hash once: a secret
    /// already proved against it is let in at once; otherwise, when
    /// `barred` says the caller must wait (its address failed too often),
    /// no slow hash runs and that wait is returned.
    pub async fn check_unless(
        &self,
        replica: &str,
        secret: &str,
        barred: impl FnOnce() -> Option<std::time::Duration>,
    ) -> Result<Checked> {
        let stored = self.stored(replica).await?;
        if let Some((hash, _)) = &stored {
            if self.cached(replica, hash, secret) {
                return Ok(Checked::Yes);
            }
        }
        if let Some(wait) = barred() {
            return Ok(Checked::Barred(wait));
        }
        let Some((stored, recent)) = stored else {
            // As long as a wrong secret for an id that has one.
            let permit = self.hashing.turn().await?;
            let (dummy, secret) = (self.dummy.clone(), secret.to_string());
            tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let dummy = dummy.get_or_init(|| hash(&generate()).unwrap_or_default());
                verify(dummy, &secret)
            })
            .await
            .map_err(|e| Error::Hash(e.to_string()))?;
            return Ok(Checked::No);
        };
        let permit = if recent {
            self.reserved.turn().await?
        } else {
            self.hashing.turn().await?
        };
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
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
}

/// What checking a secret came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checked {
    /// The replica's secret.
    Yes,
    /// Not its secret, or an id with none.
    No,
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
}

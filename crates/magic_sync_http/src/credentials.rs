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
use tokio_postgres::{Client, NoTls};

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
pub struct Credentials {
    config: tokio_postgres::Config,
    /// The connection, shared: lookups run at once on it (the lock is
    /// held only to take or replace it).
    client: tokio::sync::Mutex<Option<Arc<Client>>>,
    /// Per replica: the stored hash a secret was proved against, and the
    /// SHA-256 of that secret.
    proved: Arc<Mutex<Proved>>,
    /// Slow hashes run at once at most (each takes Argon2's 19 MiB and a
    /// thread), so a fleet connecting at once cannot exhaust the server.
    hashing: Arc<tokio::sync::Semaphore>,
    /// Checks waiting for a turn now; past [`Credentials::QUEUE`] a check
    /// is refused at once, to be tried again after the replica's backoff.
    waiting: std::sync::atomic::AtomicUsize,
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
            hashing: Arc::new(tokio::sync::Semaphore::new(cores)),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Checks that may wait for a slow hash at once.
    const QUEUE: usize = 256;

    async fn stored(&self, replica: &str) -> Result<Option<String>> {
        let client = {
            let mut client = self.client.lock().await;
            match &*client {
                Some(c) if !c.is_closed() => c.clone(),
                _ => {
                    let (c, connection) = self.config.connect(NoTls).await?;
                    tokio::spawn(connection);
                    client.insert(Arc::new(c)).clone()
                }
            }
        };
        match store::hash(&client, replica).await {
            Ok(hash) => Ok(hash),
            Err(e) => {
                // Connect again next time.
                *self.client.lock().await = None;
                Err(e.into())
            }
        }
    }

    /// Whether `secret` is `replica`'s. An error means the check could not
    /// be made (the database is out of reach): the replica tries again.
    pub async fn check(&self, replica: &str, secret: &str) -> Result<bool> {
        let Some(stored) = self.stored(replica).await? else {
            return Ok(false);
        };
        let digest: [u8; 32] = Sha256::digest(secret.as_bytes()).into();
        let known = self
            .proved
            .lock()
            .expect("not poisoned")
            .get(replica)
            .is_some_and(|(hash, proved)| *hash == stored && *proved == digest);
        if known {
            return Ok(true);
        }
        use std::sync::atomic::Ordering;
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= Self::QUEUE {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::Hash(format!(
                "{} secrets wait to be checked already",
                Self::QUEUE
            )));
        }
        let permit = self.hashing.clone().acquire_owned().await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        let permit = permit.map_err(|e| Error::Hash(e.to_string()))?;
        let (proved, replica, secret) =
            (self.proved.clone(), replica.to_string(), secret.to_string());
        // A secret proved counts even if the replica gave up waiting.
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let ok = verify(&stored, &secret);
            if ok {
                proved
                    .lock()
                    .expect("not poisoned")
                    .insert(replica, (stored, digest));
            }
            ok
        })
        .await
        .map_err(|e| Error::Hash(e.to_string()))
    }
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

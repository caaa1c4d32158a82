//! The installation's epoch (`sync.epoch`): the id every message names and
//! the secret its seal is keyed with, drawn once by the migrations and again
//! whenever the server finds its database restored from an older copy
//! ([`begin_new`]); with the master secret epochs begun since migration 034
//! draw theirs from, and the server's newest signing key (`super::keys`).
//!
//! An epoch the server begins is ordered (`EpochId::ordered`): its
//! generation is above the current one's, above any newer one a replica
//! showed it had begun before (a restore took it back), and never below the
//! clock; its secret is `seal::epoch_secret(master, id)`.

use crate::error::{Error, Result};
use magic_sync_core::seal::{self, Seal};
use magic_sync_core::sign::Signer;
use magic_sync_core::EpochId;
use rand::RngCore;

/// The installation's epoch, and the key its messages are signed with.
pub(crate) struct Epoch {
    pub id: EpochId,
    pub(crate) secret: Vec<u8>,
    /// What the secrets of the epochs it begins are drawn from.
    master: Vec<u8>,
    pub(crate) signer: Signer,
}

impl Epoch {
    /// An epoch of no database, signing with `signer`: for unit tests of
    /// what is done with one.
    #[cfg(test)]
    pub(crate) fn for_tests(signer: Signer) -> Epoch {
        Epoch {
            id: EpochId::from([7u8; 24].as_slice()),
            secret: vec![1; 32],
            master: vec![2; 32],
            signer,
        }
    }

    /// The epoch and the server's newest key, in one round trip.
    pub async fn read(client: &impl tokio_postgres::GenericClient) -> Result<Epoch> {
        let sql = format!(
            "SELECT e.id, e.secret, k.*, e.master FROM sync.epoch e CROSS JOIN LATERAL ({}) k",
            super::keys::READ
        );
        let row = client
            .query_typed_opt(&sql, &[])
            .await?
            .ok_or_else(|| Error::Damaged {
                what: "sync.epoch is empty: the migrations did not run whole".into(),
            })?;
        let seeds: Option<Vec<Vec<u8>>> = row.get(2);
        let endorsements: Option<Vec<Option<Vec<u8>>>> = row.get(3);
        Ok(Epoch {
            id: row.get::<_, Vec<u8>>(0).into(),
            secret: row.get(1),
            master: row.get(4),
            signer: super::keys::signer(
                &seeds.unwrap_or_default(),
                &endorsements.unwrap_or_default(),
            )?,
        })
    }
}

impl Epoch {
    /// The secret of the epoch `other` as the server drew it when it
    /// began it: this epoch's own, or, for another epoch begun since
    /// migration 034 (an ordered one), the one drawn from the master. A
    /// seal that verifies under it was made by this installation, whichever
    /// copy of its database is running now.
    pub(crate) fn secret_of(&self, other: &EpochId) -> Option<Vec<u8>> {
        if *other == self.id {
            return Some(self.secret.clone());
        }
        other
            .generation()
            .map(|_| seal::epoch_secret(&self.master, other).to_vec())
    }

    /// The receipt for `replica`'s upload of `sequence`, filed in this
    /// epoch.
    pub(crate) fn receipt(&self, replica: &str, sequence: u64) -> Seal {
        seal::receipt(&self.secret, replica, &self.id, sequence)
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Epoch")
            .field("id", &hex::encode(&self.id))
            .field("key", &self.signer.public())
            .finish()
    }
}

/// Begins a new epoch after `current` (a new id and secret, so no message
/// sealed before it is believed again), of a generation above `seen` when
/// an epoch of it is known to have been begun, and has every live replica
/// provisioned again, at once: what the server's database was restored to
/// is older than what the replicas hold. One statement, so both or
/// neither; and only while `current` is still the epoch, so a relay that
/// found the same restore twice begins one epoch. Returns the epoch begun.
pub(crate) async fn begin_new(
    client: &tokio_postgres::Client,
    current: &Epoch,
    seen: Option<u64>,
) -> Result<EpochId> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    let mut random = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut random);
    let id = EpochId::ordered(current.id.next_generation(seen, now), random);
    let secret = seal::epoch_secret(&current.master, &id);
    client
        .execute(
            "WITH began AS (
                 UPDATE sync.epoch SET id = $1, secret = $2, began_at = now() WHERE id = $3
                 RETURNING 1)
             UPDATE sync.replicas SET provision = true WHERE live AND EXISTS (SELECT 1 FROM began)",
            &[&id.as_bytes(), &secret.as_slice(), &current.id.as_bytes()],
        )
        .await?;
    Ok(id)
}

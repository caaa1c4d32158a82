//! The installation's epoch (`sync.epoch`): the id every message names and
//! the secret its seal is keyed with, drawn once by the migrations; with the
//! server's newest signing key (`super::keys`).

use crate::error::{Error, Result};
use magic_sync_core::sign::Signer;
use magic_sync_core::EpochId;

/// The installation's epoch, and the key its messages are signed with.
pub(crate) struct Epoch {
    pub id: EpochId,
    pub(crate) secret: Vec<u8>,
    pub(crate) signer: Signer,
}

impl Epoch {
    /// The epoch and the server's newest key, in one round trip.
    pub async fn read(client: &impl tokio_postgres::GenericClient) -> Result<Epoch> {
        let sql = format!(
            "SELECT e.id, e.secret, k.* FROM sync.epoch e CROSS JOIN LATERAL ({}) k",
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
            signer: super::keys::signer(
                &seeds.unwrap_or_default(),
                &endorsements.unwrap_or_default(),
            )?,
        })
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

/// Begins a new epoch (a new id and secret, so no message sealed before it
/// is believed again) and has every live replica provisioned again, at
/// once: what the server's database was restored to is older than what
/// the replicas hold.
pub(crate) async fn begin_new(client: &tokio_postgres::Client) -> Result<()> {
    client
        .batch_execute(
            "BEGIN;
             UPDATE sync.epoch SET
                 id = decode(replace(gen_random_uuid()::text, '-', ''), 'hex'),
                 secret = decode(replace(gen_random_uuid()::text || gen_random_uuid()::text
                     || gen_random_uuid()::text, '-', ''), 'hex'),
                 began_at = now();
             UPDATE sync.replicas SET provision = true WHERE live;
             COMMIT;",
        )
        .await?;
    Ok(())
}

//! The keys the server signs with (`sync.keys`): the newest signs, and
//! each after the first is endorsed by the one before it. A replica pins
//! the public half of the newest when it is enrolled ([`public`]).

use crate::error::{Error, Result};
use magic_sync_core::envelope::Endorsement;
use magic_sync_core::sign::{ServerKey, Signer};
use tokio_postgres::{Client, GenericClient};

/// Every key as stored, oldest first: its seed, and its endorsement by the
/// one before it.
pub(crate) const READ: &str =
    "SELECT array_agg(seed ORDER BY ordinal), array_agg(endorsement ORDER BY ordinal) FROM sync.keys";

/// The newest key as a signer, from the stored seeds and endorsements,
/// oldest first.
pub(crate) fn signer(seeds: &[Vec<u8>], endorsements: &[Option<Vec<u8>>]) -> Result<Signer> {
    let damaged = |what: &str| Error::Damaged {
        what: format!("sync.keys {what}"),
    };
    let mut chain = Vec::new();
    let mut last = None;
    for (i, seed) in seeds.iter().enumerate() {
        let seed: &[u8; 32] = seed
            .as_slice()
            .try_into()
            .map_err(|_| damaged("holds a seed that is not 32 bytes"))?;
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
    tx.execute(
        "INSERT INTO sync.keys (ordinal, seed, endorsement)
         SELECT max(ordinal) + 1, $1, $2 FROM sync.keys",
        &[&seed.as_slice(), &endorsement],
    )
    .await?;
    tx.commit().await?;
    Ok(next)
}

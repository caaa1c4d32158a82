//! Telling replicas what the running build's declarations make of their
//! tables, and when they hold them whole.
//!
//! A replica kept up when a relay of other declarations starts is sent
//! their description first (`ReplicaSchema`: the columns, keys and the
//! foreign keys among its tables), before any row they send it, so it
//! knows which of its rows a row it lets go of must stay for.
//! `sync.replicas.described` records what each was sent; a snapshot's end
//! carries the description itself.
//!
//! A replica provisioned from a snapshot learns it from the snapshot's end,
//! which carries the declarations' fingerprint. A replica kept up through a
//! deployment learns it once the deployment is done: the first pass after
//! the last chunk writes it a `Configured` naming the fingerprint, after
//! everything the deployment wrote for it, so a replica that applied it
//! holds the new configuration whole. `sync.replicas.configured` records
//! what each was told; a relay starting tells again the replicas an older
//! build told something else.

use super::observe::Observation;
use super::outbox::Writer;
use super::pack::Packed;
use crate::envelope::{to_replica::Body, Configured, ReplicaSchema};
use crate::error::Result;
use crate::store;
use tokio_postgres::Transaction;

pub(crate) use crate::store::replicas::Told;

/// The replicas kept up that were not told `what` of the declarations
/// whose fingerprint is `schema`.
pub(crate) async fn due(
    tx: &Transaction<'_>,
    observed: &Observation,
    what: Told,
    schema: &[u8],
) -> Result<Vec<String>> {
    let kept: Vec<&str> = observed.kept.iter().map(|k| k.id.as_str()).collect();
    if kept.is_empty() {
        return Ok(Vec::new());
    }
    store::replicas::not_told(tx, &kept, what, schema).await
}

/// Writes each of `replicas` the description of its tables, before
/// anything else the pass writes it; returns the statement recording it.
pub(crate) async fn describe(
    tx: &Transaction<'_>,
    writer: &mut Writer<'_>,
    replicas: &[String],
    described: &ReplicaSchema,
) -> Result<String> {
    if replicas.is_empty() {
        return Ok(String::new());
    }
    let mut body = Vec::new();
    Body::Described(described.clone()).encode(&mut body);
    send(tx, writer, replicas, body).await?;
    Ok(store::replicas::told(
        replicas,
        Told::Described,
        &described.fingerprint,
    ))
}

async fn send(
    tx: &Transaction<'_>,
    writer: &mut Writer<'_>,
    replicas: &[String],
    body: Vec<u8>,
) -> Result<()> {
    let packed = replicas
        .iter()
        .map(|replica| Packed {
            replica: replica.clone(),
            body: body.clone(),
            last: false,
        })
        .collect();
    writer.write(tx, packed).await
}

/// Writes each of `replicas` its `Configured`, after everything the pass
/// wrote for it; returns the statement recording what each was told.
pub(crate) async fn write(
    tx: &Transaction<'_>,
    writer: &mut Writer<'_>,
    replicas: &[String],
    schema: &[u8],
) -> Result<String> {
    if replicas.is_empty() {
        return Ok(String::new());
    }
    let mut body = Vec::new();
    Body::Configured(Configured {
        schema: schema.to_vec(),
    })
    .encode(&mut body);
    send(tx, writer, replicas, body).await?;
    Ok(store::replicas::told(replicas, Told::Configured, schema))
}

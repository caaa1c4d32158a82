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
use crate::sql::{bytea, text_array};
use tokio_postgres::Transaction;

/// What a replica is told of the declarations.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Told {
    /// What they make of its tables.
    Described,
    /// That it holds them whole.
    Configured,
}

impl Told {
    fn column(self) -> &'static str {
        match self {
            Told::Described => "described",
            Told::Configured => "configured",
        }
    }
}

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
    let rows = tx
        .query(
            &format!(
                "SELECT id FROM sync.replicas
                 WHERE id = ANY($1) AND {} IS DISTINCT FROM $2 ORDER BY id",
                what.column()
            ),
            &[&kept, &schema],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
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
    Ok(format!(
        "UPDATE sync.replicas SET described = {} WHERE id = ANY({});",
        bytea(&described.fingerprint),
        text_array(replicas.iter().map(String::as_str))
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
    Ok(format!(
        "UPDATE sync.replicas SET configured = {} WHERE id = ANY({});",
        bytea(schema),
        text_array(replicas.iter().map(String::as_str))
    ))
}

//! Telling replicas they hold the running build's declarations whole.
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
use crate::envelope::{to_replica::Body, Configured};
use crate::error::Result;
use crate::sql::{bytea, text_array};
use tokio_postgres::Transaction;

/// The replicas kept up that were not told `schema`.
pub(crate) async fn due(
    tx: &Transaction<'_>,
    observed: &Observation,
    schema: &[u8],
) -> Result<Vec<String>> {
    let kept: Vec<&str> = observed.kept.iter().map(|k| k.id.as_str()).collect();
    if kept.is_empty() {
        return Ok(Vec::new());
    }
    let rows = tx
        .query(
            "SELECT id FROM sync.replicas
             WHERE id = ANY($1) AND configured IS DISTINCT FROM $2 ORDER BY id",
            &[&kept, &schema],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
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
    let packed = replicas
        .iter()
        .map(|replica| Packed {
            replica: replica.clone(),
            body: body.clone(),
        })
        .collect();
    writer.write(tx, packed).await?;
    Ok(format!(
        "UPDATE sync.replicas SET configured = {} WHERE id = ANY({});",
        bytea(schema),
        text_array(replicas.iter().map(String::as_str))
    ))
}

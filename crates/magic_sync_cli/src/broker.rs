//! The `broker` commands: the replicas' keys on a NATS broker, kept by the
//! server (enrol, revoke, the broker's `authorization` block), the
//! server's own key pair, drawn and kept nowhere, and where each replica
//! stands on the broker.

use crate::{emit, show, Broker, Error, Outcome, StatusArgs};
use std::io::Write;
use tokio_postgres::Client;

/// `broker status`: where each replica stands on the broker, and the
/// reports waiting for the server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BrokerStatus {
    /// Each replica read, in the order named (or by id).
    pub replicas: Vec<ReplicaStanding>,
    /// The upload stream and the server's consumer of it.
    pub uploads: magic_sync_nats::broker::Standing,
}

impl BrokerStatus {
    /// Where `replicas` stand on the broker, and the reports waiting, as
    /// `inspector` asks it.
    pub async fn read(
        inspector: &magic_sync_nats::broker::Inspector,
        replicas: Vec<String>,
    ) -> Result<BrokerStatus, magic_sync_nats::Error> {
        let mut read = BrokerStatus {
            replicas: Vec::with_capacity(replicas.len()),
            uploads: inspector.uploads_standing().await?,
        };
        for replica in replicas {
            let standing = inspector.standing(&replica).await?;
            read.replicas.push(ReplicaStanding { replica, standing });
        }
        Ok(read)
    }
}

/// One replica's line of [`BrokerStatus`].
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicaStanding {
    /// The replica.
    pub replica: String,
    /// Its stream and consumer.
    pub standing: magic_sync_nats::broker::Standing,
}
/// `broker server`: the server's key pair on the broker, kept nowhere.
pub(crate) fn draw_server(json: bool, out: &mut dyn Write) -> Result<Outcome, Error> {
    let credentials = magic_sync_nats::access::Credentials::issue();
    let read = serde_json::json!({
        "public_key": credentials.public_key(),
        "seed": credentials.seed(),
    });
    emit(out, json, &read, |read| {
        format!(
            "public key: {}\nseed: {}\n",
            read["public_key"].as_str().unwrap_or(""),
            read["seed"].as_str().unwrap_or("")
        )
    })?;
    Ok(Outcome::Fine)
}

pub(crate) async fn broker(
    command: &Broker,
    json: bool,
    client: &Client,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    use magic_sync_nats::access::{self, Access};
    let read = match command {
        Broker::Server => return draw_server(json, out),
        Broker::Enrol { replica } => {
            let credentials = access::enrol(client, replica).await?;
            serde_json::json!({
                "replica": replica,
                "public_key": credentials.public_key(),
                "seed": credentials.seed(),
            })
        }
        Broker::Revoke { replica } => {
            serde_json::json!({ "replica": replica, "revoked": access::revoke(client, replica).await? })
        }
        Broker::Status(status) => return broker_status(status, Some(client), json, out).await,
        Broker::Authorization { server } => {
            if !access::is_public_key(server) {
                return Err(Error::NotAUserKey);
            }
            let block = Access::read(client, server).await?.authorization();
            serde_json::json!({ "authorization": block })
        }
    };
    emit(out, json, &read, |read| {
        if let Some(seed) = read["seed"].as_str() {
            format!("{seed}\n")
        } else if let Some(block) = read["authorization"].as_str() {
            block.to_string()
        } else {
            format!(
                "{}\n",
                if read["revoked"].as_bool() == Some(true) {
                    "revoked"
                } else {
                    "had no key"
                }
            )
        }
    })?;
    Ok(Outcome::Fine)
}

/// `broker status`: the replicas named, or (with `client`) every one
/// enrolled.
pub(crate) async fn broker_status(
    status: &StatusArgs,
    client: Option<&Client>,
    json: bool,
    out: &mut dyn Write,
) -> Result<Outcome, Error> {
    let StatusArgs {
        broker,
        seed_file,
        trust,
        allow_plain,
        replicas,
    } = status;
    let seed = magic_sync::run::read_secret(seed_file).map_err(Error::SeedFile)?;
    let settings = magic_sync_nats::broker::Settings {
        trust: trust.clone(),
        allow_plain: *allow_plain,
        ..magic_sync_nats::broker::Settings::new(broker.clone())
    };
    let inspector = magic_sync_nats::broker::Inspector::connect(&settings, &seed)
        .await
        .map_err(Error::BrokerStatus)?;
    let names = match client {
        Some(client) if replicas.is_empty() => magic_sync::store::broker_keys::all(client)
            .await
            .map_err(|e| Error::BrokerStatus(e.into()))?
            .into_iter()
            .map(|(replica, _)| replica)
            .collect(),
        _ => replicas.clone(),
    };
    let read = BrokerStatus::read(&inspector, names)
        .await
        .map_err(Error::BrokerStatus)?;
    emit(out, json, &read, show::broker_status)?;
    Ok(Outcome::Fine)
}

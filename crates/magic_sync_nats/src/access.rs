//! Who may do what on the broker.
//!
//! Every replica connects as an nkey user of its own: it holds the seed,
//! the broker only the public key, so the broker's configuration holds no
//! secret. [`Access::authorization`] writes the broker's `authorization`
//! block: the server may do anything; a replica may publish only to its own
//! upload subject, fetch from, look up and acknowledge the consumer the
//! server made of its own stream, and subscribe only under its own inbox
//! prefix. It cannot read another replica's subject or stream, nor speak
//! as another.
//!
//! Nor can it make, change or remove a consumer or a stream, of its own
//! stream or any: the broker does not check a push consumer's deliver
//! subject against its maker's permissions, so a consumer a replica made
//! could deliver its stream onto another replica's upload subject, where
//! the server would hear it as that replica's. The server makes each
//! replica's one consumer (`broker::Broker::prepare`, or its first send).
//!
//! The server keeps each replica's public key (`sync.broker_keys`):
//! [`enrol`] draws a replica's credentials, keeps the public key and
//! returns the seed once, to hand to the replica; [`revoke`] takes it
//! away; [`Access::read`] is every replica's key, for the block. The block
//! is plain configuration: write it where the broker's configuration
//! includes it and reload the broker (`nats-server --signal reload`) when a
//! replica is enrolled or revoked.

use crate::{inbox_of, stream_of, up_subject, CONSUMER};
use magic_sync::ReplicaId;

/// One user's credentials: an nkey pair. The seed is the secret and is
/// never printed.
#[derive(Clone)]
pub struct Credentials {
    seed: String,
    public: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("public", &self.public)
            .field("seed", &"<hidden>")
            .finish()
    }
}

impl Credentials {
    /// New credentials, drawn from the system's randomness.
    pub fn issue() -> Credentials {
        let pair = nkeys::KeyPair::new_user();
        Credentials {
            seed: pair.seed().expect("a new pair has its seed"),
            public: pair.public_key(),
        }
    }

    /// Credentials from a seed kept earlier (`SU...`).
    pub fn from_seed(seed: &str) -> crate::Result<Credentials> {
        let pair = nkeys::KeyPair::from_seed(seed)
            .map_err(|e| crate::Error::Settings(format!("not an nkey seed: {e}")))?;
        Ok(Credentials {
            seed: seed.to_string(),
            public: pair.public_key(),
        })
    }

    /// The public key, which the broker's configuration names.
    pub fn public_key(&self) -> &str {
        &self.public
    }

    /// The seed: the secret to give the one who connects with it.
    pub fn seed(&self) -> &str {
        &self.seed
    }
}

/// Enrols `replica` on the broker: new credentials, whose public key the
/// server keeps, replacing any it had. The seed is in what this returns
/// and nowhere else: hand it to the replica.
pub async fn enrol(client: &tokio_postgres::Client, replica: &str) -> crate::Result<Credentials> {
    let credentials = Credentials::issue();
    magic_sync::store::broker_keys::set(client, replica, credentials.public_key()).await?;
    Ok(credentials)
}

/// Takes `replica`'s key away: the next block written leaves it out.
/// Whether it had one.
pub async fn revoke(client: &tokio_postgres::Client, replica: &str) -> crate::Result<bool> {
    Ok(magic_sync::store::broker_keys::revoke(client, replica).await?)
}

/// Whether `key` is a user's public nkey.
pub fn is_public_key(key: &str) -> bool {
    nkeys::KeyPair::from_public_key(key)
        .is_ok_and(|k| k.key_pair_type() == nkeys::KeyPairType::User)
}

/// The broker's users: the server's key and each replica's.
#[derive(Debug, Clone, Default)]
pub struct Access {
    server: Vec<String>,
    replicas: Vec<(ReplicaId, String)>,
}

impl Access {
    /// Access for the server whose public key is `server`.
    pub fn new(server: &str) -> Access {
        Access {
            server: vec![server.to_string()],
            replicas: Vec::new(),
        }
    }

    /// Access for the server whose public key is `server` and every
    /// replica enrolled ([`enrol`]).
    pub async fn read(client: &tokio_postgres::Client, server: &str) -> crate::Result<Access> {
        let mut access = Access::new(server);
        for (replica, public) in magic_sync::store::broker_keys::all(client).await? {
            access = access.replica(&replica, &public);
        }
        Ok(access)
    }

    /// Lets `replica` in with the public key `public`.
    pub fn replica(mut self, replica: &str, public: &str) -> Access {
        self.replicas
            .push((ReplicaId::from(replica.to_string()), public.to_string()));
        self
    }

    /// What `replica` may publish to: its uploads, and its own consumer's
    /// requests for messages, look-ups and acknowledgements, with a look-up
    /// of its stream (where it begins). No subject that makes, changes or
    /// removes a consumer or a stream: `$JS.API.CONSUMER.CREATE` and
    /// `DURABLE.CREATE` take the consumer's deliver subject in their body,
    /// where no permission reaches.
    pub fn publishes(replica: &str) -> Vec<String> {
        let stream = stream_of(replica);
        vec![
            up_subject(replica),
            format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.{CONSUMER}"),
            format!("$JS.API.CONSUMER.INFO.{stream}.{CONSUMER}"),
            format!("$JS.API.STREAM.INFO.{stream}"),
            format!("$JS.ACK.{stream}.{CONSUMER}.>"),
        ]
    }

    /// What `replica` may subscribe to: its inbox, where the broker answers
    /// its requests.
    pub fn subscribes(replica: &str) -> Vec<String> {
        vec![format!("{}.>", inbox_of(replica))]
    }

    /// The broker's `authorization { ... }` block.
    pub fn authorization(&self) -> String {
        let quoted = |items: Vec<String>| {
            items
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut users = Vec::new();
        for key in &self.server {
            users.push(format!("    {{ nkey: {key:?} }}"));
        }
        for (replica, key) in &self.replicas {
            users.push(format!(
                "    {{ nkey: {key:?}, permissions: {{ publish: {{ allow: [{}] }}, subscribe: {{ allow: [{}] }} }} }}",
                quoted(Self::publishes(replica)),
                quoted(Self::subscribes(replica)),
            ));
        }
        format!(
            "authorization {{\n  users: [\n{}\n  ]\n}}\n",
            users.join("\n")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_is_confined_to_its_own_subjects_and_the_seed_is_never_shown() {
        let server = Credentials::issue();
        let till = Credentials::issue();
        assert!(server.public_key().starts_with('U'));
        assert!(!format!("{till:?}").contains(till.seed()));
        let again = Credentials::from_seed(till.seed()).unwrap();
        assert_eq!(again.public_key(), till.public_key());
        assert!(Credentials::from_seed("not a seed").is_err());
        let block = Access::new(server.public_key())
            .replica("x.*", till.public_key())
            .authorization();
        assert!(!block.contains(till.seed()));
        // The id cannot widen what it may reach: it is hex in every subject.
        assert!(!block.contains("x.*"), "{block}");
        for subject in Access::publishes("x.*")
            .iter()
            .chain(&Access::subscribes("x.*"))
        {
            assert!(subject.contains(&crate::token("x.*")), "{subject}");
        }
    }

    #[test]
    fn a_replica_may_use_its_consumer_and_never_make_or_remove_one() {
        for subject in Access::publishes("till 1") {
            for verb in ["CREATE", "DELETE", "UPDATE", "PURGE", "MSG.DELETE"] {
                assert!(
                    !subject.contains(verb),
                    "a replica may publish to {subject}"
                );
            }
            if let Some(api) = subject.strip_prefix("$JS.API.") {
                assert!(
                    ["CONSUMER.MSG.NEXT.", "CONSUMER.INFO.", "STREAM.INFO."]
                        .iter()
                        .any(|allowed| api.starts_with(allowed)),
                    "{subject}"
                );
                assert!(
                    !subject.contains('*') && !subject.contains('>'),
                    "{subject}"
                );
            }
        }
    }
}

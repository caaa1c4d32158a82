//! What travels between a replica's loop and the server's, as both runners
//! see it: what a replica reports, what reaches it, and why a transport did
//! not carry something ([`LinkError`]).

use crate::envelope::{from_server, Ack, Filed, FromServer, Gap, Up};
use prost::Message as _;

/// Rows (and keys gone) one upload carries at most. A replica's uplink
/// keeps within it; the server refuses a larger upload unfiled, as it
/// refuses one larger than a message, so that no upload of many small rows
/// keeps filing (and the publishing beside it) from the rest of the fleet
/// for long.
pub const MAX_UPLOAD_ROWS: usize = 5_000;

/// The rows (and keys gone) `up` carries.
pub fn upload_rows(up: &Up) -> usize {
    up.tables.iter().map(|t| t.rows.len() + t.gone.len()).sum()
}

/// What a replica tells the server.
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    /// The last message it applied, with its seal as it came.
    Applied(Ack),
    /// It could not follow a message and waits for a snapshot.
    Gap(Gap),
    /// What it wrote, to be filed.
    Upload(Up),
}

impl Report {
    /// An `Up` as it came over a transport that carries every report as
    /// one: one that only acknowledges, or only says a gap, is that;
    /// anything else is an upload, as the replica's loop sent it.
    pub fn from_up(mut up: Up) -> Report {
        let nothing_else = up.send_id.is_empty()
            && up.tables.is_empty()
            && up.refused.is_empty()
            && up.digest.is_none()
            && up.backlog.is_none();
        if nothing_else {
            match (up.applied.take(), up.gap.take()) {
                (Some(ack), None) => return Report::Applied(ack),
                (None, Some(gap)) => return Report::Gap(gap),
                (applied, gap) => {
                    up.applied = applied;
                    up.gap = gap;
                }
            }
        }
        Report::Upload(up)
    }

    /// What was said as the one `Up` a transport that carries bytes sends:
    /// [`Report::from_up`] reads it back.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Report::Applied(ack) => Up {
                applied: Some(ack.clone()),
                ..Up::default()
            }
            .encode_to_vec(),
            Report::Gap(gap) => Up {
                gap: Some(gap.clone()),
                ..Up::default()
            }
            .encode_to_vec(),
            Report::Upload(up) => up.encode_to_vec(),
        }
    }
}

/// A sealed `ToReplica` as the one `FromServer` a transport that carries
/// bytes sends down.
pub fn message_frame(message: Vec<u8>) -> Vec<u8> {
    FromServer {
        body: Some(from_server::Body::Message(message)),
    }
    .encode_to_vec()
}

/// The answer to an upload as the one `FromServer` a transport that
/// carries bytes sends down.
pub fn filed_frame(filed: Filed) -> Vec<u8> {
    FromServer {
        body: Some(from_server::Body::Filed(filed)),
    }
    .encode_to_vec()
}

/// Why a transport did not carry something: its kind, which the side that
/// asked acts on, and what the operator reads beside it. The relay's
/// `SendError` and the replica's `UplinkError` are this.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct LinkError {
    /// What kind of failure it is: whether trying again may help.
    pub kind: LinkErrorKind,
    /// What happened, for the operator: the peer, the limit, the fix.
    pub why: String,
}

/// What kind of failure a transport's is. Each side decides what it does
/// about each kind: the relay retries only [`Unreachable`]
/// (`magic_sync::Error::Send`), the replica's loop also sets aside what
/// was [`Refused`] and stops on [`Misconfigured`].
///
/// [`Unreachable`]: LinkErrorKind::Unreachable
/// [`Refused`]: LinkErrorKind::Refused
/// [`Misconfigured`]: LinkErrorKind::Misconfigured
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkErrorKind {
    /// The other side is out of reach now: a connection lost or not made
    /// yet, a peer that took nothing within its time, a broker slow to
    /// answer. The same may go later.
    Unreachable,
    /// This one will never go as it is (more bytes than the transport
    /// carries, say), while other things do.
    Refused,
    /// The transport carries nothing until the operator acts: its
    /// credentials refused, a setting that cannot work.
    Misconfigured,
}

impl LinkError {
    /// Out of reach now ([`LinkErrorKind::Unreachable`]).
    pub fn unreachable(why: impl Into<String>) -> LinkError {
        LinkError {
            kind: LinkErrorKind::Unreachable,
            why: why.into(),
        }
    }

    /// This one never goes as it is ([`LinkErrorKind::Refused`]).
    pub fn refused(why: impl Into<String>) -> LinkError {
        LinkError {
            kind: LinkErrorKind::Refused,
            why: why.into(),
        }
    }

    /// Nothing goes until the operator acts
    /// ([`LinkErrorKind::Misconfigured`]).
    pub fn misconfigured(why: impl Into<String>) -> LinkError {
        LinkError {
            kind: LinkErrorKind::Misconfigured,
            why: why.into(),
        }
    }
}

/// What reached a replica through its link.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// A message from the server.
    Message(Vec<u8>),
    /// The answer to an upload.
    Filed(Filed),
    /// Nothing came for as long as it waited, or its host wrote
    /// something (a nudge).
    Quiet,
    /// The link is closed: the loop ends.
    Closed,
}

impl Delivery {
    /// What a `FromServer` frame carries: a message or an answer, or
    /// nothing (an empty frame, from a newer server). An answer carrying
    /// more endorsements than any server makes is refused before it is
    /// decoded: its signature is checked only after, and what it would
    /// take decoded is many times what it takes on the wire.
    pub fn decode(frame: &[u8]) -> Result<Option<Delivery>, prost::DecodeError> {
        let endorsements = crate::bounds::count_filed_endorsements(frame)
            .map_err(|e| prost::DecodeError::new(e.to_string()))?;
        if endorsements > crate::sign::MAX_ENDORSEMENTS {
            return Err(prost::DecodeError::new(format!(
                "an answer carrying {endorsements} endorsements, more than any server makes ({}): \
                 refused before decoding",
                crate::sign::MAX_ENDORSEMENTS
            )));
        }
        Ok(match FromServer::decode(frame)?.body {
            Some(from_server::Body::Message(m)) => Some(Delivery::Message(m)),
            Some(from_server::Body::Filed(f)) => Some(Delivery::Filed(f)),
            None => None,
        })
    }
}

/// The host of an address without its scheme: `host`, `host:port`,
/// `[v6]:port`, with any path after.
pub fn host_of(rest: &str) -> &str {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        return v6.split(']').next().unwrap_or(v6);
    }
    authority.split(':').next().unwrap_or(authority)
}

/// Whether `host` names this machine.
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Backlog;

    #[test]
    fn what_is_said_and_sent_travels_as_it_was() {
        let ack = Ack {
            reads_batches: false,
            epoch: vec![1; 16],
            number: 7,
            nonce: vec![2; 16],
            seal: vec![3; 32],
            answered: 9,
            receipt: None,
        };
        let gap = Gap {
            epoch: vec![1; 16],
            number: 9,
        };
        let upload = Up {
            send_id: vec![4; 16],
            applied: Some(ack.clone()),
            backlog: Some(Backlog::default()),
            ..Up::default()
        };
        for said in [
            Report::Applied(ack),
            Report::Gap(gap),
            Report::Upload(upload),
        ] {
            let heard = Report::from_up(Up::decode(said.encode().as_slice()).unwrap());
            assert_eq!(heard, said);
        }
        let filed = Filed {
            send_id: vec![5; 16],
            ..Filed::default()
        };
        assert_eq!(
            Delivery::decode(&message_frame(vec![6; 10])).unwrap(),
            Some(Delivery::Message(vec![6; 10]))
        );
        assert_eq!(
            Delivery::decode(&filed_frame(filed.clone())).unwrap(),
            Some(Delivery::Filed(filed))
        );
        assert_eq!(Delivery::decode(&[]).unwrap(), None);
        assert!(Delivery::decode(&[0xff, 0xff]).is_err());
    }

    #[test]
    fn an_answer_of_more_endorsements_than_any_server_makes_is_refused_undecoded() {
        use crate::envelope::Endorsement;
        let answer = |n: usize| {
            filed_frame(Filed {
                send_id: vec![5; 16],
                endorsements: vec![Endorsement::default(); n],
                ..Filed::default()
            })
        };
        let most = crate::sign::MAX_ENDORSEMENTS;
        assert!(matches!(
            Delivery::decode(&answer(most)),
            Ok(Some(Delivery::Filed(f))) if f.endorsements.len() == most
        ));
        // A million empty ones: two bytes each on the wire.
        let flood = answer(1_000_000);
        assert!(flood.len() < 3 << 20);
        let why = Delivery::decode(&flood).unwrap_err().to_string();
        assert!(why.contains("1000000 endorsements"), "{why}");
    }
}

//! Frames on the socket: `FromServer` down, `Up` up.

use magic_sync::envelope::{from_server, Filed, FromServer, Up};
use magic_sync::run::Report;
use prost::Message as _;

/// A sealed `ToReplica` as a frame.
pub(crate) fn message(bytes: Vec<u8>) -> Vec<u8> {
    FromServer {
        body: Some(from_server::Body::Message(bytes)),
    }
    .encode_to_vec()
}

/// The answer to an upload as a frame.
pub(crate) fn filed(filed: Filed) -> Vec<u8> {
    FromServer {
        body: Some(from_server::Body::Filed(filed)),
    }
    .encode_to_vec()
}

/// What a replica says, as the one `Up` the wire carries.
pub(crate) fn up(report: &Report) -> Vec<u8> {
    match report {
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

#[cfg(test)]
mod tests {
    use super::*;
    use magic_sync::envelope::{Ack, Backlog, Gap};

    #[test]
    fn reports_travel_as_they_were_said() {
        let ack = Ack {
            epoch: vec![1; 16],
            number: 7,
            nonce: vec![2; 16],
            seal: vec![3; 32],
            answered: 9,
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
            let heard = Report::from_up(Up::decode(up(&said).as_slice()).unwrap());
            assert_eq!(heard, said);
        }
    }
}

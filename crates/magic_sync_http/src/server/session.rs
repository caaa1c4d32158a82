//! A replica's session, once its connection upgraded: one task writes what
//! the hub sends it, with pings, each frame within the write timeout; the
//! connection reads what it says at its pace, hands each `Up` to the hub,
//! and closes it, saying why, on what is refused or after its silence.

use super::hub::{Inner, Out};
use super::listener::Stopped;
use super::Settings;
use crate::logbook::Kind;
use axum::extract::ws::{CloseFrame, Message, WebSocket};
use futures_util::stream::{SplitSink, SplitStream};
use futures_util::{SinkExt, StreamExt};
use magic_sync::core::bounds::{bounded_decode, Bounded, Refusal, UpBounds};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// Close codes: going away, policy violation, data that is not an `Up`,
/// a frame too large.
pub(super) const CLOSE_AWAY: u16 = 1001;
pub(super) const CLOSE_POLICY: u16 = 1008;
pub(super) const CLOSE_INVALID: u16 = 1007;
pub(super) const CLOSE_TOO_BIG: u16 = 1009;

/// What a frame counts as, at least, against its replica's pace: hearing a
/// frame costs the relay by the frame as well as by the byte, and a flood
/// of acknowledgements of 50 bytes would otherwise be read at 170,000 a
/// second. At the default pace this is 2,048 frames a second, far above
/// what a replica says (an acknowledgement per message applied, an upload
/// per batch of writes).
const FRAME_FLOOR: usize = 4 << 10;
/// What a row of an upload counts as, at least, against its replica's
/// pace: filing costs by the row, and an upload of 5,000 empty rows is a
/// few KiB. At the default pace this is 8,192 rows a second, a day's
/// backlog of 100,000 sales in about 12 s.
const ROW_FLOOR: usize = 1 << 10;

/// A failed read: the replica went away (code 0: nothing to say to it), or
/// it sent what is refused (too large, not WebSocket), and is told why.
fn lost_or_refused(e: axum::Error) -> Result<(), (u16, String)> {
    use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
    let why = e.to_string();
    match e.into_inner().downcast::<WsError>() {
        Ok(ws) => match *ws {
            WsError::ConnectionClosed
            | WsError::AlreadyClosed
            | WsError::Io(_)
            | WsError::Protocol(ProtocolError::ResetWithoutClosingHandshake) => Err((0, why)),
            WsError::Capacity(_) => Err((CLOSE_TOO_BIG, why)),
            _ => Err((CLOSE_POLICY, why)),
        },
        Err(_) => Err((CLOSE_POLICY, why)),
    }
}

/// A close reason fits in a control frame: at most 123 bytes.
fn reason(why: &str) -> String {
    let mut end = why.len().min(123);
    while !why.is_char_boundary(end) {
        end -= 1;
    }
    why[..end].to_string()
}

/// Runs `replica`'s connection until it ends: what comes in is heard under
/// its name; what the hub sends it goes out, with pings.
pub(super) async fn replica_connection(
    inner: Arc<Inner>,
    replica: String,
    addr: SocketAddr,
    stopped: Stopped,
    socket: WebSocket,
) {
    let (sink, mut stream) = socket.split();
    let (tx, rx) = mpsc::unbounded_channel();
    let generation = inner.attach(&replica, tx.clone());
    let mut writer = tokio::spawn(write_frames(sink, rx, inner.settings.clone(), stopped));
    let ended = tokio::select! {
        read = read_frames(&inner, &replica, &mut stream) => Some(read),
        _ = &mut writer => None,
    };
    match ended {
        Some(Err((0, why))) => {
            inner.log(
                Kind::Lost,
                |more| tracing::info!(replica = %replica, %addr, "connection lost: {why}{more}"),
            );
            writer.abort();
        }
        Some(Err((code, why))) => {
            inner.log(Kind::Refused, |more| {
                tracing::warn!(replica = %replica, %addr, "{why}; its connection is closed{more}")
            });
            let _ = tx.send(Out::Close(code, why));
            let _ = tokio::time::timeout(CLOSING, &mut writer).await;
            writer.abort();
            closing(&mut stream).await;
        }
        Some(Ok(())) => writer.abort(),
        // The writer said why it closed (or could not write at all).
        None => closing(&mut stream).await,
    }
    inner.detach(&replica, generation);
}

/// Writes what the hub sends the replica, and a ping every
/// `settings.ping_every`, each frame within `settings.write_timeout`; ends
/// after a close frame (the hub's, or the server's as it stops), or with
/// why it could not write.
async fn write_frames(
    mut sink: SplitSink<WebSocket, Message>,
    mut rx: mpsc::UnboundedReceiver<Out>,
    settings: Settings,
    mut stopped: Stopped,
) -> Result<(), String> {
    let mut ping = tokio::time::interval(settings.ping_every);
    ping.tick().await;
    loop {
        let (message, last) = tokio::select! {
            out = rx.recv() => match out {
                Some(Out::Frame(bytes)) => (Message::Binary(bytes), false),
                Some(Out::Close(code, why)) => (
                    Message::Close(Some(CloseFrame { code, reason: reason(&why).into() })),
                    true,
                ),
                None => return Ok(()),
            },
            _ = ping.tick() => (Message::Ping(axum::body::Bytes::new()), false),
            // Became a replica's as the server stopped.
            () = stopped.wait() => (
                Message::Close(Some(CloseFrame {
                    code: CLOSE_AWAY,
                    reason: "the server stops".into(),
                })),
                true,
            ),
        };
        match tokio::time::timeout(settings.write_timeout, sink.send(message)).await {
            Ok(Ok(())) if !last => {}
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => {
                return Err(format!(
                    "took no frame for {:?}: it does not read",
                    settings.write_timeout
                ))
            }
        }
    }
}

/// Reads what `replica` says, at its pace, and hands each `Up` to the hub,
/// until it closes (`Ok`), goes away (code 0) or says what is refused (the
/// close code to tell it, and why).
async fn read_frames(
    inner: &Inner,
    replica: &str,
    stream: &mut SplitStream<WebSocket>,
) -> Result<(), (u16, String)> {
    let idle = inner.settings.idle_timeout;
    let mut pace = Pace::new(
        inner.settings.max_bytes_per_second,
        inner.settings.max_message_bytes,
    );
    if let Some(paid_at) = inner.paid_at(replica) {
        pace.paid_at = pace.paid_at.max(paid_at);
    }
    let bounds = UpBounds::of_messages(inner.settings.max_message_bytes);
    loop {
        let frame = match tokio::time::timeout(idle, stream.next()).await {
            Err(_) => return Err((CLOSE_POLICY, format!("said nothing for {idle:?}"))),
            Ok(None) => return Ok(()),
            Ok(Some(Err(e))) => return lost_or_refused(e),
            Ok(Some(Ok(frame))) => frame,
        };
        match frame {
            // Counted on the wire before anything is decoded, and queued by
            // what it takes decoded (an empty entry is two bytes sent and
            // tens held).
            Message::Binary(bytes) => match bounded_decode(&bytes, &bounds) {
                Ok(Bounded { up, decoded_bytes }) => {
                    let rows = magic_sync::core::link::upload_rows(&up);
                    inner.hear(replica, up, decoded_bytes).await;
                    let charged = bytes.len().max(FRAME_FLOOR).max(rows * ROW_FLOOR);
                    inner.paid(replica, pace.owe(charged));
                    pace.after(charged).await;
                }
                Err(Refusal::Malformed(e)) => {
                    return Err((CLOSE_INVALID, format!("a frame that is not an Up: {e}")))
                }
                Err(e) => return Err((CLOSE_POLICY, e.to_string())),
            },
            Message::Text(_) => {
                return Err((
                    CLOSE_POLICY,
                    "a text frame: only binary frames are spoken".into(),
                ))
            }
            Message::Close(_) => return Ok(()),
            Message::Ping(_) | Message::Pong(_) => {}
        }
    }
}

/// Reading at most so many bytes a second, after a first burst: a token
/// bucket kept as the moment its debt is paid.
pub(super) struct Pace {
    /// When what was read so far is paid for.
    paid_at: tokio::time::Instant,
    /// Seconds a byte costs.
    per_byte: f64,
    /// How far ahead of its pace a replica may be.
    burst: Duration,
}

impl Pace {
    fn new(bytes_per_second: usize, burst_bytes: usize) -> Pace {
        let per_byte = 1.0 / bytes_per_second.max(1) as f64;
        Pace {
            paid_at: tokio::time::Instant::now(),
            per_byte,
            burst: Duration::from_secs_f64(burst_bytes as f64 * per_byte),
        }
    }

    /// Until when `bytes` more read are paid for.
    fn owe(&self, bytes: usize) -> tokio::time::Instant {
        let now = tokio::time::Instant::now();
        let floor = now.checked_sub(self.burst).unwrap_or(now);
        self.paid_at.max(floor) + Duration::from_secs_f64(bytes as f64 * self.per_byte)
    }

    /// Counts `bytes` read, and waits while the replica is ahead of its
    /// pace by more than the burst.
    async fn after(&mut self, bytes: usize) {
        self.paid_at = self.owe(bytes);
        if self.paid_at > tokio::time::Instant::now() {
            tokio::time::sleep_until(self.paid_at).await;
        }
    }
}

/// How long a closed connection is given to read its close frame.
const CLOSING: Duration = Duration::from_secs(1);

/// Keeps reading, briefly, after the server's close frame went: the
/// socket stays open until the replica answers it (or goes), so a replica
/// behind on reading still gets to read why.
async fn closing(stream: &mut SplitStream<WebSocket>) {
    let _ = tokio::time::timeout(CLOSING, async {
        while let Some(Ok(frame)) = stream.next().await {
            if matches!(frame, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
}

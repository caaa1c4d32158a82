//! A connection to PostgreSQL that counts what crosses it: the statements
//! the client runs and the round trips it waits for. What a pass costs the
//! database, in the units latency is paid in.
//!
//! The stream under the client is wrapped, and the protocol's messages are
//! read as they pass (each is a type byte and a length, after the startup
//! message, which has no type). A round trip begins when the client asks
//! for something while nothing it waits for is outstanding: a request sent
//! while another is still being answered (a pipelined one) rides along,
//! and one that only closes a statement or a portal (sent as it is dropped,
//! and not waited for) begins none.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, NoTls};

/// What a counted connection carried since it opened or was last taken.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Times the client waited for the server: requests sent while nothing
    /// else was outstanding.
    pub round_trips: u64,
    /// Statements run: each Execute of the extended protocol and each
    /// simple Query (which may hold several, as `batch_execute`'s do).
    pub statements: u64,
    /// Statements parsed (prepared), each a round trip of its own unless
    /// pipelined.
    pub parsed: u64,
}

impl std::ops::Sub for Counts {
    type Output = Counts;

    fn sub(self, o: Counts) -> Counts {
        Counts {
            round_trips: self.round_trips - o.round_trips,
            statements: self.statements - o.statements,
            parsed: self.parsed - o.parsed,
        }
    }
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} round trips, {} statements ({} parsed)",
            self.round_trips, self.statements, self.parsed
        )
    }
}

/// Reads a stream of protocol messages split anywhere by the socket.
#[derive(Default)]
struct Frames {
    /// The startup message (no type byte) is still to come.
    untyped_first: bool,
    /// Bytes of a message not yet complete.
    partial: Vec<u8>,
}

impl Frames {
    /// Calls `seen` with the type and body of every message that ends in
    /// `bytes`.
    fn feed(&mut self, bytes: &[u8], mut seen: impl FnMut(u8, &[u8])) {
        self.partial.extend_from_slice(bytes);
        let mut at = 0;
        loop {
            let header = if self.untyped_first { 4 } else { 5 };
            let rest = &self.partial[at..];
            if rest.len() < header {
                break;
            }
            let len = u32::from_be_bytes(rest[header - 4..header].try_into().expect("four bytes"));
            let end = header - 4 + (len as usize).max(4);
            if rest.len() < end {
                break;
            }
            if !self.untyped_first {
                seen(rest[0], &rest[header..end]);
            }
            self.untyped_first = false;
            at += end;
        }
        self.partial.drain(..at);
    }
}

/// The text of a statement a Parse or Query message carries, shortened.
fn statement_text(body: &[u8]) -> String {
    let text = body.split(|b| *b == 0).next().unwrap_or_default();
    let text = String::from_utf8_lossy(text);
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match text.char_indices().nth(120) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

#[derive(Default)]
struct Tally {
    counts: Counts,
    /// Requests (Sync or Query) sent whose ReadyForQuery has not come
    /// back, in order: whether each asked for anything the client waits
    /// for. One that only closes statements or portals is not waited for
    /// (the client sends it and goes on), so it begins no round trip.
    outstanding: std::collections::VecDeque<bool>,
    /// The request being sent holds more than closes.
    asking: bool,
    /// Its lines, while tracing.
    batch: Vec<String>,
    /// The text of the statement last bound: a portal is bound in one
    /// request and read in the next.
    bound: String,
    /// When the trace was last taken.
    traced_at: Option<std::time::Instant>,
    /// The server said it was ready for the first time: what comes before
    /// (authentication, parameters) is not counted.
    ready: bool,
    sent: Frames,
    received: Frames,
    /// What was sent, a line a message, while tracing.
    trace: Option<Vec<String>>,
    /// The text of each statement prepared under a name.
    named: std::collections::HashMap<String, String>,
}

/// The counts of a connection opened by [`connect`], readable while it runs.
#[derive(Clone, Default)]
pub struct Counter(Arc<Mutex<Tally>>);

impl Counter {
    /// What the connection carried so far.
    pub fn counts(&self) -> Counts {
        self.0.lock().expect("not poisoned").counts
    }

    /// From now on, a line for each request sent is kept, for
    /// [`take_trace`](Self::take_trace).
    pub fn start_trace(&self) {
        self.0.lock().expect("not poisoned").trace = Some(Vec::new());
    }

    /// The lines kept since [`start_trace`](Self::start_trace) or the last
    /// take: `round trip`, `parse`, `execute` or `query` and the text.
    pub fn take_trace(&self) -> Vec<String> {
        let mut tally = self.0.lock().expect("not poisoned");
        tally.traced_at = None;
        tally.trace.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn sent(&self, bytes: &[u8]) {
        let mut guard = self.0.lock().expect("not poisoned");
        let tally = &mut *guard;
        let ready = tally.ready;
        let (counts, outstanding) = (&mut tally.counts, &mut tally.outstanding);
        let (trace, named, asking) = (&mut tally.trace, &mut tally.named, &mut tally.asking);
        let bound = &mut tally.bound;
        let batch = &mut tally.batch;
        let traced_at = &mut tally.traced_at;
        tally.sent.feed(bytes, |kind, body| {
            if !ready {
                return;
            }
            let mut line = |l: String| batch.push(l);
            if !matches!(kind, b'C' | b'S' | b'Q') {
                *asking = true;
            }
            match kind {
                b'E' => {
                    counts.statements += 1;
                    line(format!("  execute {bound}"));
                }
                b'B' => {
                    let mut parts = body.split(|b| *b == 0);
                    let _portal = parts.next();
                    let name = String::from_utf8_lossy(parts.next().unwrap_or_default());
                    *bound = named.get(name.as_ref()).cloned().unwrap_or_default();
                }
                b'P' => {
                    counts.parsed += 1;
                    let end = body.iter().position(|b| *b == 0).unwrap_or(body.len());
                    let name = String::from_utf8_lossy(&body[..end]).into_owned();
                    let text = statement_text(body.get(end + 1..).unwrap_or_default());
                    line(format!("  parse {text}"));
                    named.insert(name, text);
                }
                b'Q' | b'S' => {
                    let asks = kind == b'Q' || *asking;
                    if kind == b'Q' {
                        counts.statements += 1;
                        line(format!("  query {}", statement_text(body)));
                    }
                    let begins = asks && !outstanding.iter().any(|waited| *waited);
                    if begins {
                        counts.round_trips += 1;
                    }
                    if let Some(t) = trace.as_mut() {
                        if begins {
                            let at = traced_at.get_or_insert_with(std::time::Instant::now);
                            t.push(format!(
                                "round trip at {:.2} ms",
                                at.elapsed().as_secs_f64() * 1e3
                            ));
                        }
                        t.append(batch);
                    }
                    batch.clear();
                    outstanding.push_back(asks);
                    *asking = false;
                }
                _ => {}
            }
        });
    }

    fn received(&self, bytes: &[u8]) {
        let mut guard = self.0.lock().expect("not poisoned");
        let tally = &mut *guard;
        let (ready, outstanding) = (&mut tally.ready, &mut tally.outstanding);
        tally.received.feed(bytes, |kind, _| {
            if kind == b'Z' {
                *ready = true;
                outstanding.pop_front();
            }
        });
    }
}

/// A stream whose bytes are counted by a [`Counter`].
pub struct Counted<S> {
    inner: S,
    counter: Counter,
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let counter = self.counter.clone();
            counter.received(&buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = polled {
            self.counter.sent(&buf[..n]);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A client of `db` whose traffic `Counter` counts, on the same host as
/// [`TestDb::connect`](magic_sync_testdb::TestDb::connect) uses.
pub async fn connect(db: &magic_sync_testdb::TestDb) -> (Client, Counter) {
    let config = db.config();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let counter = Counter::default();
    let client = match config.get_hosts().first() {
        Some(Host::Tcp(host)) => {
            let stream = tokio::net::TcpStream::connect((host.as_str(), port))
                .await
                .expect("connect to the test database");
            stream.set_nodelay(true).expect("no delay");
            run(&config, stream, &counter).await
        }
        Some(Host::Unix(dir)) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            let stream = tokio::net::UnixStream::connect(path)
                .await
                .expect("connect to the test database");
            run(&config, stream, &counter).await
        }
        None => panic!("the test database has no host"),
    };
    (client, counter)
}

async fn run<S>(config: &Config, stream: S, counter: &Counter) -> Client
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let counted = Counted {
        inner: stream,
        counter: counter.clone(),
    };
    {
        // The startup message comes first, and has no type byte.
        counter.0.lock().expect("not poisoned").sent.untyped_first = true;
    }
    let (client, connection) = config
        .connect_raw(counted, NoTls)
        .await
        .expect("a counted connection");
    tokio::spawn(async move {
        // It ends with its client.
        let _ = connection.await;
    });
    client
}

#[cfg(test)]
mod tests {
    use super::Frames;

    #[test]
    fn messages_split_anywhere_are_each_seen_once() {
        // Startup (untyped, 8 bytes), then 'P' with a 2-byte body, 'S'.
        let bytes = [
            0, 0, 0, 8, 0, 3, 0, 0, b'P', 0, 0, 0, 6, 1, 2, b'S', 0, 0, 0, 4,
        ];
        for cut in 0..bytes.len() {
            let mut frames = Frames {
                untyped_first: true,
                ..Frames::default()
            };
            let mut seen = Vec::new();
            frames.feed(&bytes[..cut], |k, _| seen.push(k));
            frames.feed(&bytes[cut..], |k, _| seen.push(k));
            assert_eq!(seen, b"PS", "cut at {cut}");
        }
    }
}

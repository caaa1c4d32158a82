//! The relay's sessions with PostgreSQL: how the runner opens them, so that
//! a host that vanishes never leaves one working on the server, and how it
//! ends them, so that a host that stops never does either.
//!
//! A session the host lost would otherwise go on: its statement runs to its
//! end (or waits for a lock for ever), keeping the relay's advisory lock and
//! its table locks, and a new relay, a migration or the installation of
//! triggers queues behind it, and the application's writes behind those.
//! So each session is opened with the server watching its client, and is
//! closed by cancelling what it runs before saying goodbye.

use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Config};

/// How the runner's sessions are set up. Each is set on the session itself,
/// whatever the role or database defaults say: the relay's statements are
/// the engine's to bound, not a setting meant for the application's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// What the sessions show as `application_name` in `pg_stat_activity`,
    /// followed by what each does: `magic_sync relay: record` holds the
    /// relay's lock and records passes, `magic_sync relay: publish`
    /// publishes and heeds what replicas said, `magic_sync relay: file`
    /// files their uploads, `magic_sync relay: digest`
    /// compares their digests with the record, and each
    /// `magic_sync relay: snapshot` streams one snapshot.
    pub application_name: String,
    /// How often the server checks, while a statement runs, that the client
    /// is still there (`client_connection_check_interval`, PostgreSQL 14+).
    /// Protects against a host that died mid-statement: without it the
    /// statement runs to its end, or waits for a lock for ever, keeping the
    /// relay's lock. The check is a `poll` of the socket, nearly free, so
    /// the default is short: 2 s. `None` turns it off.
    pub client_connection_check_interval: Option<Duration>,
    /// How long a session may sit in an open transaction between statements
    /// (`idle_in_transaction_session_timeout`) before the server ends it.
    /// Protects against a host that froze mid-pass (stopped, swapped out,
    /// a debugger): its transaction would keep its snapshot and locks. A
    /// pass never waits on anything but PostgreSQL and its own encoding
    /// inside a transaction, so the default, 60 s, is far beyond a healthy
    /// pause. `None` turns it off.
    pub idle_in_transaction_session_timeout: Option<Duration>,
    /// The longest any one statement may run (`statement_timeout`). Off by
    /// default (`None`): provisioning a large replica runs statements of
    /// minutes, legitimately, and a pass cancelled for that would only be
    /// tried again and cancelled again. Stopping cancels what runs, and a
    /// lost host's statement ends through the connection check; set this
    /// only to bound a database you know.
    pub statement_timeout: Option<Duration>,
    /// TCP keepalives, on both ends of each connection (the client's socket
    /// and the server's `tcp_keepalives_*`): after this long without
    /// traffic a probe is sent. Protects against a host or a server that
    /// vanished without closing its connection (power lost, network cut):
    /// no FIN ever arrives, and without probes neither side learns the other
    /// is gone. Ignored over Unix sockets. Default 30 s.
    pub keepalives_idle: Duration,
    /// Time between probes. Default 10 s.
    pub keepalives_interval: Duration,
    /// Probes unanswered before the connection counts as dead. Default 3:
    /// a vanished peer is noticed within about a minute.
    pub keepalives_retries: u32,
    /// How long stopping waits for each session to cancel its statement,
    /// give back the relay's lock and close, before it drops the connection
    /// (and leaves the rest to the server's own checks above). Default 5 s.
    pub stop_timeout: Duration,
}

impl Default for SessionSettings {
    fn default() -> Self {
        SessionSettings {
            application_name: "magic_sync relay".into(),
            client_connection_check_interval: Some(Duration::from_secs(2)),
            idle_in_transaction_session_timeout: Some(Duration::from_secs(60)),
            statement_timeout: None,
            keepalives_idle: Duration::from_secs(30),
            keepalives_interval: Duration::from_secs(10),
            keepalives_retries: 3,
            stop_timeout: Duration::from_secs(5),
        }
    }
}

impl SessionSettings {
    /// `config` with this session's name and keepalives.
    fn config(&self, config: &Config, role: &str) -> Config {
        let mut config = config.clone();
        config
            .application_name(format!("{}: {role}", self.application_name))
            .keepalives(true)
            .keepalives_idle(self.keepalives_idle)
            .keepalives_interval(self.keepalives_interval)
            .keepalives_retries(self.keepalives_retries);
        config
    }

    /// The statements that set the session up, sent as one batch. JIT is
    /// off: the engine's statements run once over temporary tables whose
    /// estimates are often large, and compiling them cost more than it
    /// saved (0.5-0.7 s per statement recording a 1,000-row snapshot).
    /// The server sends warnings and worse only: each session makes its
    /// temporary tables afresh (`DROP TABLE IF EXISTS`), and every one of
    /// those drops was a notice ("table _ms_r does not exist, skipping").
    fn setup(&self) -> String {
        let millis = |d: Option<Duration>| d.map_or(0, |d| d.as_millis());
        let seconds = |d: Duration| d.as_secs().max(1);
        format!(
            "SET TIME ZONE 'UTC';
             SET jit = off;
             SET client_min_messages = warning;
             SET client_connection_check_interval = '{}ms';
             SET idle_in_transaction_session_timeout = '{}ms';
             SET statement_timeout = '{}ms';
             SET tcp_keepalives_idle = '{}s';
             SET tcp_keepalives_interval = '{}s';
             SET tcp_keepalives_count = {};",
            millis(self.client_connection_check_interval),
            millis(self.idle_in_transaction_session_timeout),
            millis(self.statement_timeout),
            seconds(self.keepalives_idle),
            seconds(self.keepalives_interval),
            self.keepalives_retries,
        )
    }
}

/// One of the runner's sessions: its client, and what ends it.
#[derive(Debug)]
pub struct Session {
    client: Client,
    connection: JoinHandle<()>,
    /// Stored a permit whenever the server sent a notification (`LISTEN`).
    notified: std::sync::Arc<tokio::sync::Notify>,
}

impl Session {
    /// Connects to `config` as the session that does `role` (`record`,
    /// `publish`), set up by `settings`.
    pub async fn open(
        config: &Config,
        settings: &SessionSettings,
        role: &str,
    ) -> crate::Result<Session> {
        crate::tls::warn_once(config);
        let (client, connection) = settings
            .config(config, role)
            .connect(crate::tls::tls()?)
            .await?;
        let notified = std::sync::Arc::new(tokio::sync::Notify::new());
        let heard = notified.clone();
        let connection = tokio::spawn(async move {
            let mut connection = connection;
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            // Errors surface on the client; the connection only ends.
            while let Some(Ok(message)) = futures_util::StreamExt::next(&mut messages).await {
                match message {
                    tokio_postgres::AsyncMessage::Notification(_) => heard.notify_one(),
                    // Warnings and worse: the session asks for no less.
                    tokio_postgres::AsyncMessage::Notice(notice) => {
                        tracing::warn!(
                            severity = notice.severity(),
                            notice = %notice.message(),
                            "the server says"
                        );
                    }
                    _ => {}
                }
            }
        });
        let session = Session {
            client,
            connection,
            notified,
        };
        session.client.batch_execute(&settings.setup()).await?;
        Ok(session)
    }

    /// The session's client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Resolves when a notification came on a channel the session listens
    /// on, at once if one came since the last call.
    pub async fn notified(&self) {
        self.notified.notified().await
    }

    /// What [`notified`](Self::notified) waits on, to wait on it beside
    /// the client borrowed mutably.
    pub fn notifications(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.notified.clone()
    }

    /// The session's client, to open transactions on.
    pub fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Ends the session, whatever it was doing, within `timeout`: cancels
    /// the statement in flight (the backend stops at once, rolling back
    /// what it had begun), gives back the relay's lock, and closes the
    /// connection. Past `timeout` (the server out of reach) the connection
    /// is dropped, and the server's own checks end the session.
    pub async fn close(self, timeout: Duration) {
        let Session {
            client, connection, ..
        } = self;
        let cancel = client.cancel_token();
        let abort = connection.abort_handle();
        let ended = async {
            // A cancel that comes while nothing runs is ignored by the server.
            if let Ok(tls) = crate::tls::tls() {
                let _ = cancel.cancel_query(tls).await;
            }
            release(&client).await;
            // With its client gone, the connection finishes what it was
            // sent, says goodbye (Terminate) and closes.
            drop(client);
            let _ = connection.await;
        };
        if tokio::time::timeout(timeout, ended).await.is_err() {
            abort.abort();
        }
    }
}

/// Gives back the relay's lock (every session-level advisory lock the
/// session holds), so that whoever waits for it may take it as soon as
/// [`Session::close`] returns, not a moment after (when the backend has
/// gone). The cancel reaches the backend in its own time and may land on
/// this statement instead of the one it was meant for; it lands once, so the
/// second try stands.
async fn release(client: &Client) {
    for _ in 0..2 {
        match client
            .batch_execute("SELECT pg_advisory_unlock_all()")
            .await
        {
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {}
            _ => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SessionSettings;
    use std::time::Duration;

    #[test]
    fn off_is_zero_and_every_setting_is_set_on_the_session() {
        let settings = SessionSettings {
            client_connection_check_interval: None,
            statement_timeout: Some(Duration::from_millis(1500)),
            ..SessionSettings::default()
        };
        let sql = settings.setup();
        assert!(
            sql.contains("client_connection_check_interval = '0ms'"),
            "{sql}"
        );
        assert!(
            sql.contains("idle_in_transaction_session_timeout = '60000ms'"),
            "{sql}"
        );
        assert!(sql.contains("statement_timeout = '1500ms'"), "{sql}");
        assert!(sql.contains("tcp_keepalives_count = 3"), "{sql}");
        assert!(sql.contains("SET jit = off"), "{sql}");
        assert!(sql.contains("SET client_min_messages = warning"), "{sql}");
    }
}

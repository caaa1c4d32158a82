//! The relay's loop: take the lock, then pass after pass — observe, plan,
//! record — waiting briefly when there was nothing to do, and backing off
//! after a failure; beside the passes, on a second connection, publish what
//! they wrote and heed what replicas said.

use super::Report;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::relay::{Relay, Replicas, Settings, Transport};
use crate::session::Session;
use std::future::Future;
use std::time::Duration;
use tokio_postgres::Client;

/// Where what replicas say reaches the server.
pub trait Reports: Send + Sync {
    /// Everything said since the last call, by the replica the transport
    /// authenticated, oldest first.
    fn drain(&self) -> Vec<(String, Report)>;
    /// Resolves when something was said.
    fn wait(&self) -> impl Future<Output = ()> + Send;
}

/// Applies what replicas said: acknowledgements all at once, gaps one by
/// one. A forged acknowledgement is refused and changes nothing; the others
/// still count. Needs no lock; the runner heeds on its publishing
/// connection, beside the passes.
pub async fn heed(client: &Client, reports: Vec<(String, Report)>) -> Result<()> {
    let mut acks = Vec::new();
    for (replica, report) in reports {
        match report {
            Report::Applied(ack) => acks.push((replica, ack)),
            Report::Gap(gap) => {
                crate::relay::gap(client, &replica, &gap).await?;
            }
        }
    }
    for outcome in crate::relay::acknowledge_all(client, &acks).await? {
        match outcome {
            Ok(_) | Err(Error::Forged { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Runs the relay for `engine` over the database at `config` until `stop`
/// resolves. Waits for the lock while another relay holds it. A failed pass
/// is retried after a backoff; nothing is lost meanwhile: notes stay pending
/// and the outbox stays written.
///
/// When `stop` resolves, the statement in flight on either connection is
/// cancelled, the relay's lock given back and both connections closed
/// before this returns (within `settings.session.stop_timeout`), so a
/// stopped host leaves nothing running on the server. A host that dies
/// instead is covered by the sessions' own settings ([`crate::session`]).
pub async fn server<H, T, R>(
    config: tokio_postgres::Config,
    engine: Engine,
    settings: Settings,
    host: &H,
    transport: &T,
    reports: &R,
    stop: impl Future<Output = ()>,
) -> Result<()>
where
    H: Replicas,
    T: Transport,
    R: Reports,
{
    tokio::pin!(stop);
    let mut backoff = settings.backoff_min;
    loop {
        let mut sessions = Sessions::default();
        let outcome = {
            let attempt = relay_loop(
                &mut sessions,
                &config,
                &engine,
                &settings,
                host,
                transport,
                reports,
                &mut backoff,
            );
            tokio::select! {
                () = &mut stop => None,
                result = attempt => Some(result),
            }
        };
        // Whatever ended the attempt, nothing of it goes on on the server.
        sessions.close(settings.session.stop_timeout).await;
        let e = match outcome {
            None => return Ok(()),
            Some(Ok(())) => continue,
            Some(Err(e)) => e,
        };
        if !e.is_transient() {
            eprintln!("magic_sync relay: {e}");
        }
        tokio::select! {
            () = &mut stop => return Ok(()),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(settings.backoff_max);
    }
}

/// The runner's two sessions, once open. They live outside the attempt that
/// uses them, so that however the attempt ends (stopped, or failed on one
/// connection while the other was mid-statement) they can be closed.
#[derive(Default)]
struct Sessions {
    recorder: Option<Session>,
    publisher: Option<Session>,
}

impl Sessions {
    async fn close(self, timeout: Duration) {
        let close = |s: Option<Session>| async move {
            if let Some(s) = s {
                s.close(timeout).await;
            }
        };
        tokio::join!(close(self.recorder), close(self.publisher));
    }
}

/// Records on the connection holding the lock and publishes and heeds on a
/// second one, at the same time: a pass's messages go out, and replicas'
/// acknowledgements are recorded, while the next pass plans. (Neither needs
/// the lock: the outbox holds only what a recording relay committed, a
/// replica applies a message once however often it comes, and
/// acknowledgements go to `sync.acks`, which passes write only to forget a
/// replica the host no longer lists.)
#[allow(clippy::too_many_arguments)]
async fn relay_loop<H: Replicas, T: Transport, R: Reports>(
    sessions: &mut Sessions,
    config: &tokio_postgres::Config,
    engine: &Engine,
    settings: &Settings,
    host: &H,
    transport: &T,
    reports: &R,
    backoff: &mut Duration,
) -> Result<()> {
    let recorder = sessions
        .recorder
        .insert(Session::open(config, &settings.session, "record").await?);
    let mut relay = Relay::new(recorder.client(), engine.clone(), settings.clone()).await?;
    while !Relay::lock(recorder.client()).await? {
        tokio::time::sleep(settings.idle.max(Duration::from_millis(100))).await;
    }
    let publisher = sessions
        .publisher
        .insert(Session::open(config, &settings.session, "publish").await?);
    let written = tokio::sync::Notify::new();
    tokio::try_join!(
        record_forever(
            recorder.client_mut(),
            &mut relay,
            host,
            transport,
            backoff,
            &written
        ),
        publish_forever(publisher.client(), transport, reports, settings, &written)
    )?;
    Ok(())
}

/// Pass after pass on the lock's connection: what replicas said, then
/// record; a pass that wrote messages wakes the publisher.
async fn record_forever<H: Replicas, T: Transport>(
    client: &mut Client,
    relay: &mut Relay,
    host: &H,
    transport: &T,
    backoff: &mut Duration,
    written: &tokio::sync::Notify,
) -> Result<()> {
    let settings = relay.settings().clone();
    loop {
        let replicas = host.replicas().await?;
        let started = std::time::Instant::now();
        let recorded = relay
            .record(client, &replicas, transport.max_message_bytes())
            .await?;
        crate::relay::trace("record", started);
        *backoff = settings.backoff_min;
        if recorded.messages > 0 {
            written.notify_one();
        }
        if recorded.messages == 0 && recorded.planned.notes == 0 {
            tokio::time::sleep(settings.idle).await;
        }
    }
}

/// Publishes whenever a pass wrote messages, and now and then regardless,
/// to try again a replica a send failed to; heeds what replicas said
/// whenever they said something.
async fn publish_forever<T: Transport, R: Reports>(
    publisher: &Client,
    transport: &T,
    reports: &R,
    settings: &Settings,
    written: &tokio::sync::Notify,
) -> Result<()> {
    loop {
        let started = std::time::Instant::now();
        heed(publisher, reports.drain()).await?;
        crate::relay::trace("heed", started);
        let started = std::time::Instant::now();
        crate::relay::publish_outbox(publisher, transport, settings.concurrency).await?;
        crate::relay::trace("publish", started);
        tokio::select! {
            () = written.notified() => {}
            () = reports.wait() => {}
            () = tokio::time::sleep(settings.backoff_min) => {}
        }
    }
}

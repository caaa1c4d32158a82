//! What one broker holds for a fleet (issue 23): a stream per replica, on
//! Debian's `nats-server` (2.9, JetStream on its file store), started by
//! this program.
//!
//! cargo bench -p magic_sync_nats --bench streams
//!
//! - MAGIC_SYNC_BENCH_STREAMS replicas (default 9,000): each one's stream
//!   made (`Broker::prepare`), then one message of MAGIC_SYNC_BENCH_BYTES
//!   (default 1,024) sent to each through the relay's `Transport::send`,
//!   which waits for the broker to say it stored it. Timed, with the
//!   broker's resident memory and its store on disk before and after: the
//!   cost of a replica to the broker, with the files it holds open: each
//!   stream keeps two, so the broker's limit of open files bounds the
//!   streams it holds (20,000 here: the default stays under it).
//! - The broker killed and started again on the same store: the time until
//!   it answers for the last replica's stream, and its memory after.
//! - MAGIC_SYNC_BENCH_READERS of them (default 100) read their mailboxes
//!   on threads of this process while the server sends each
//!   MAGIC_SYNC_BENCH_MESSAGES more (default 200): messages taken and
//!   acknowledged a second, from the first send to the last taken. No
//!   database and no relay: this is the broker's part of a delivery alone.
//!
//! Both processes share the machine's 2 cores; the broker's CPU time is
//! read from /proc.

#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a benchmark prints its figures"
)]

use magic_sync::relay::Transport;
use magic_sync::run::replica::Link;
use magic_sync::run::{Delivery, Report};
use magic_sync::ReplicaId;
use magic_sync_nats::broker::{Broker, Settings};
use magic_sync_nats::mailbox::{self, Mailbox};
use magic_sync_testkit::bench::{cpu_of, env_u64, show};
use magic_sync_testkit::nats::Nats;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Files process `pid` holds open.
fn open_files(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Bytes under `dir`.
fn disk(dir: &std::path::Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => disk(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn main() {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(run());
}

async fn run() {
    let streams = env_u64("MAGIC_SYNC_BENCH_STREAMS", 9_000) as usize;
    let bytes = env_u64("MAGIC_SYNC_BENCH_BYTES", 1_024) as usize;
    let readers = (env_u64("MAGIC_SYNC_BENCH_READERS", 100) as usize).min(streams);
    let messages = env_u64("MAGIC_SYNC_BENCH_MESSAGES", 200);
    let ids: Vec<String> = (0..streams).map(|i| format!("r{i:06}")).collect();
    let named: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut nats = Nats::start(&named);
    println!(
        "streams: {streams} replicas on one nats-server (2.9, file store); messages of {bytes} bytes"
    );
    let store = nats.dir.path().join("store");
    let (rss0, disk0, cpu0) = (rss(nats_pid(&nats)), disk(&store), cpu_of(nats_pid(&nats)));
    let broker = Broker::connect(Settings::new(nats.url()), nats.server.seed())
        .await
        .expect("the server connects");
    let began = Instant::now();
    for id in &ids {
        broker.prepare(id).await.expect("a replica's stream");
    }
    let made = began.elapsed();
    let (rss1, disk1) = (rss(nats_pid(&nats)), disk(&store));
    println!(
        "  {streams} streams made in {} ({:.0}/s); broker RSS {} -> {} ({:.1} KiB a stream), store {} -> {}, {} files open",
        show(made),
        streams as f64 / made.as_secs_f64(),
        mib(rss0),
        mib(rss1),
        (rss1.saturating_sub(rss0)) as f64 / 1024.0 / streams as f64,
        mib(disk0),
        mib(disk1),
        open_files(nats_pid(&nats)),
    );
    let began = Instant::now();
    for (n, id) in ids.iter().enumerate() {
        broker
            .send(
                &ReplicaId::from(id.clone()),
                &format!("e-{n}-first"),
                vec![7; bytes],
            )
            .await
            .expect("stored");
    }
    let sent = began.elapsed();
    let (rss2, disk2, cpu2) = (rss(nats_pid(&nats)), disk(&store), cpu_of(nats_pid(&nats)));
    println!(
        "  one message to each, stored, in {} ({:.0} sends/s, one at a time); broker RSS {} ({:.1} KiB a replica), store {} ({:.1} KiB a replica); broker CPU so far {}",
        show(sent),
        streams as f64 / sent.as_secs_f64(),
        mib(rss2),
        (rss2.saturating_sub(rss0)) as f64 / 1024.0 / streams as f64,
        mib(disk2),
        (disk2.saturating_sub(disk0)) as f64 / 1024.0 / streams as f64,
        show(cpu2.saturating_sub(cpu0)),
    );
    drop(broker);

    // A restart on the same store: every stream is read back.
    let began = Instant::now();
    nats.restart();
    let listening = began.elapsed();
    let broker = Broker::connect(Settings::new(nats.url()), nats.server.seed())
        .await
        .expect("the server connects again");
    let last = ids.last().expect("one replica at least");
    let js = async_nats::jetstream::new(broker.client().clone());
    let kept = loop {
        match js.get_stream(magic_sync_nats::stream_of(last)).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => break info.state.messages,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            },
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    println!(
        "  killed and started again: listening in {}, the last replica's stream answering in {} ({kept} message kept); broker RSS {}",
        show(listening),
        show(began.elapsed()),
        mib(rss(nats_pid(&nats))),
    );

    // Deliveries through the broker alone.
    let mailboxes: Vec<Arc<Mailbox>> = nats
        .replicas
        .iter()
        .take(readers)
        .map(|(id, credentials)| {
            Arc::new(
                Mailbox::open(mailbox::Settings::new(nats.url(), id, credentials.seed()))
                    .expect("a mailbox"),
            )
        })
        .collect();
    let want = messages + 1;
    let cpu3 = cpu_of(nats_pid(&nats));
    let began = Instant::now();
    let threads: Vec<_> = mailboxes
        .iter()
        .map(|mailbox| {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || {
                let mut taken = 0;
                let deadline = Instant::now() + Duration::from_secs(300);
                while taken < want {
                    assert!(
                        Instant::now() < deadline,
                        "{taken} of {want} taken in 300 s"
                    );
                    match mailbox.next(Duration::from_millis(100)) {
                        Delivery::Message(_) => {
                            taken += 1;
                            // As the loop does once it applied one.
                            mailbox.report(Report::Applied(Default::default()));
                        }
                        Delivery::Closed => panic!("the mailbox closed"),
                        _ => {}
                    }
                }
                mailbox.close();
            })
        })
        .collect();
    let senders: Vec<_> = ids
        .iter()
        .take(readers)
        .map(|id| {
            let (broker, id) = (broker.clone(), ReplicaId::from(id.clone()));
            tokio::spawn(async move {
                for n in 0..messages {
                    broker
                        .send(&id, &format!("e-{n}-more"), vec![7; bytes])
                        .await
                        .expect("stored");
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.expect("a sender");
    }
    tokio::task::block_in_place(|| {
        for thread in threads {
            thread.join().expect("a reader");
        }
    });
    let took = began.elapsed();
    let delivered = readers as u64 * want;
    println!(
        "  {readers} mailboxes, {want} messages each: {delivered} taken and acknowledged in {} = {:.0} deliveries/s; broker CPU {} ({:.0} µs a delivery)",
        show(took),
        delivered as f64 / took.as_secs_f64(),
        show(cpu_of(nats_pid(&nats)).saturating_sub(cpu3)),
        cpu_of(nats_pid(&nats)).saturating_sub(cpu3).as_secs_f64() * 1e6 / delivered as f64,
    );
}

fn nats_pid(nats: &Nats) -> u32 {
    nats.pid().expect("the broker runs")
}

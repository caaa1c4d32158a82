//! A throwaway `nats-server` with JetStream, started by the test that needs
//! it on a free port of loopback, with a store of its own that outlives a
//! restart. Stopped when dropped. For the broker transport's tests and
//! benchmarks.

use magic_sync_nats::access::{Access, Credentials};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `nats-server` is: `MAGIC_SYNC_NATS_SERVER`, else on `PATH`, else
/// where Debian's package puts it.
pub fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("MAGIC_SYNC_NATS_SERVER") {
        return path.into();
    }
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir: PathBuf| dir.join("nats-server"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| {
        panic!(
            "no nats-server found (set MAGIC_SYNC_NATS_SERVER, or `apt-get install nats-server`; \
             `cargo xtask test` installs it)"
        )
    })
}

/// A broker and the credentials it lets in.
pub struct Nats {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub addr: SocketAddr,
    pub server: Credentials,
    pub replicas: Vec<(String, Credentials)>,
    /// With TLS: the PEM file of the broker's own (self-signed)
    /// certificate, for `localhost` and `127.0.0.1`, which a client trusts.
    pub certificate: Option<PathBuf>,
}

impl Nats {
    /// A broker letting in the server and `replicas`, each with new
    /// credentials.
    pub fn start(replicas: &[&str]) -> Nats {
        Nats::start_as(replicas, false)
    }

    /// As [`Nats::start`], with TLS required of every client, under a new
    /// self-signed certificate ([`Nats::certificate`]).
    pub fn start_tls(replicas: &[&str]) -> Nats {
        Nats::start_as(replicas, true)
    }

    fn start_as(replicas: &[&str], tls: bool) -> Nats {
        let server = Credentials::issue();
        let replicas: Vec<(String, Credentials)> = replicas
            .iter()
            .map(|r| (r.to_string(), Credentials::issue()))
            .collect();
        let mut access = Access::new(server.public_key());
        for (replica, credentials) in &replicas {
            access = access.replica(replica, credentials.public_key());
        }
        Nats::launch(server, replicas, &access.authorization(), tls)
    }

    /// A broker whose users are those of `authorization` (an
    /// `authorization { ... }` block), as a host would configure it.
    pub fn start_with(authorization: &str) -> Nats {
        Nats::launch(Credentials::issue(), Vec::new(), authorization, false)
    }

    fn launch(
        server: Credentials,
        replicas: Vec<(String, Credentials)>,
        authorization: &str,
        tls: bool,
    ) -> Nats {
        let addr = {
            let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
            listener.local_addr().expect("its address")
        };
        let dir = tempfile::tempdir().expect("a directory");
        let certificate = tls.then(|| dir.path().join("broker.pem"));
        let tls_block = match &certificate {
            None => String::new(),
            Some(pem) => {
                let key = dir.path().join("broker.key");
                let rcgen::CertifiedKey { cert, key_pair } =
                    rcgen::generate_simple_self_signed(vec![
                        "localhost".to_string(),
                        "127.0.0.1".to_string(),
                    ])
                    .expect("a certificate");
                std::fs::write(pem, cert.pem()).expect("the certificate");
                std::fs::write(&key, key_pair.serialize_pem()).expect("its key");
                format!(
                    "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n}}\n",
                    pem.display().to_string(),
                    key.display().to_string()
                )
            }
        };
        let config = format!(
            "listen: {addr:?}\nmax_payload: 2MB\njetstream {{\n  store_dir: {:?}\n  max_memory_store: 64MB\n  max_file_store: 2GB\n}}\n{tls_block}{authorization}",
            dir.path().join("store").display().to_string(),
        );
        std::fs::write(dir.path().join("nats.conf"), config).expect("the configuration");
        let mut nats = Nats {
            child: None,
            dir,
            addr,
            server,
            replicas,
            certificate,
        };
        nats.run();
        nats
    }

    fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nats.log"))
            .expect("the log");
        let child = Command::new(binary())
            .arg("-c")
            .arg(self.dir.path().join("nats.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log"))
            .stderr(log)
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {} in 20 s:\n{}",
                self.addr,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The broker's process, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The broker's address: `tls://` when it requires TLS.
    pub fn url(&self) -> String {
        let scheme = if self.certificate.is_some() {
            "tls"
        } else {
            "nats"
        };
        format!("{scheme}://{}", self.addr)
    }

    /// The seed of `replica`.
    pub fn seed(&self, replica: &str) -> &str {
        self.replicas
            .iter()
            .find(|(r, _)| r == replica)
            .map(|(_, c)| c.seed())
            .expect("a replica the broker lets in")
    }

    /// Kills the broker at once (as a crash would), then starts it again on
    /// the same port and store.
    pub fn restart(&mut self) {
        self.kill();
        self.run();
    }

    /// Kills the broker at once.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// What the broker logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

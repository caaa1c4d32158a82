//! The server's connections to PostgreSQL honour `sslmode`: against a
//! cluster of its own with TLS on and a self-signed certificate, `require`
//! connects over TLS (the engine's sessions too), and given root
//! certificates the connection verifies the server against them; through
//! the cluster's Unix socket it connects without TLS.

use magic_sync::session::{Session, SessionSettings};
use magic_sync_testdb::Cluster;
use std::path::Path;
use std::time::Duration;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, NoTls};

/// A self-signed certificate for 127.0.0.1 and its key, as PEM.
fn certificate() -> (String, String) {
    let rcgen::CertifiedKey { cert, key_pair } =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".to_string()])
            .unwrap();
    (cert.pem(), key_pair.serialize_pem())
}

/// Writes `text` to `path`, readable by the server's user only.
fn private(path: &Path, text: &str, owner: Option<&str>) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    if let Some(user) = owner {
        let status = std::process::Command::new("chown")
            .arg(user)
            .arg(path)
            .status()
            .unwrap();
        assert!(status.success(), "chown {user} {}", path.display());
    }
}

async fn ssl(client: &Client) -> bool {
    client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn sslmode_require_connects_over_tls_and_roots_given_are_checked() {
    let bin = magic_sync_testdb::require_bin_dir().unwrap();
    let cluster = tokio::task::spawn_blocking(move || Cluster::start(&bin))
        .await
        .unwrap()
        .unwrap();
    let (cert, key) = certificate();
    let data = cluster.data_dir();
    private(&data.join("server.crt"), &cert, cluster.run_as());
    private(&data.join("server.key"), &key, cluster.run_as());
    let (admin, connection) = cluster.admin_config().connect(NoTls).await.unwrap();
    tokio::spawn(connection);
    // One statement at a time: ALTER SYSTEM runs in no transaction block.
    for statement in [
        "ALTER SYSTEM SET ssl_cert_file = 'server.crt'",
        "ALTER SYSTEM SET ssl_key_file = 'server.key'",
        "ALTER SYSTEM SET ssl = on",
        "SELECT pg_reload_conf()",
    ] {
        admin.batch_execute(statement).await.unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let on: String = admin.query_one("SHOW ssl", &[]).await.unwrap().get(0);
        if on == "on" {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "ssl never came on");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut config = cluster.admin_config();
    config.ssl_mode(SslMode::Require);
    let Err(err) = config.connect(NoTls).await else {
        panic!("require connected without TLS");
    };
    assert!(err.to_string().to_lowercase().contains("tls"), "{err}");
    // The engine's connector: encrypted, the certificate unchecked, as
    // libpq's `require` without root certificates.
    let client = magic_sync::tls::connect(&config).await.unwrap();
    assert!(ssl(&client).await, "the connection is not encrypted");
    // The engine's sessions (the relay's, the snapshots') go the same way.
    let session = Session::open(&config, &SessionSettings::default(), "record")
        .await
        .unwrap();
    assert!(ssl(session.client()).await);
    session.close(Duration::from_secs(5)).await;

    // Given root certificates: this server's verifies, another's does not.
    let dir = tempfile::tempdir().unwrap();
    let (right, wrong) = (dir.path().join("right.pem"), dir.path().join("wrong.pem"));
    std::fs::write(&right, &cert).unwrap();
    std::fs::write(&wrong, certificate().0).unwrap();
    let verified = magic_sync::tls::tls_with_roots(Some(&right)).unwrap();
    let (client, connection) = config.connect(verified).await.unwrap();
    tokio::spawn(connection);
    assert!(ssl(&client).await);
    let refused = magic_sync::tls::tls_with_roots(Some(&wrong)).unwrap();
    assert!(
        config.connect(refused).await.is_err(),
        "another's certificate verified"
    );
    // A root file that is not PEM is a setup error, named.
    let err = magic_sync::tls::tls_with_roots(Some(dir.path()))
        .expect_err("a directory is no certificate file");
    assert_eq!(err.handling(), magic_sync::Handling::Stop, "{err}");

    // Through the cluster's Unix socket, which has no host name for TLS:
    // the engine's connector and sessions connect, unencrypted (PostgreSQL
    // offers no TLS on a socket), whatever the sslmode short of `require`.
    // Every such connection used to fail on the missing name.
    for mode in [SslMode::Disable, SslMode::Prefer] {
        let mut socket = tokio_postgres::Config::new();
        socket
            .host_path(cluster.socket_dir())
            .port(cluster.port())
            .user(cluster.admin_config().get_user().unwrap())
            .dbname("postgres")
            .ssl_mode(mode);
        let client = magic_sync::tls::connect(&socket)
            .await
            .unwrap_or_else(|e| panic!("through the socket, {mode:?}: {e}"));
        assert!(!ssl(&client).await);
        let session = Session::open(&socket, &SessionSettings::default(), "record")
            .await
            .unwrap();
        assert!(!ssl(session.client()).await);
        session.close(Duration::from_secs(5)).await;
    }
    drop(admin);
    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .unwrap()
        .unwrap();
}

//! TLS for the connections the server makes to PostgreSQL, as the
//! connection string's `sslmode` asks: `disable`, `prefer` (the default:
//! TLS when the server offers it) or `require` (TLS or no connection).
//!
//! Which certificate is accepted follows libpq. Without root certificates,
//! the connection is encrypted but the certificate is not checked, as
//! libpq's `require` does. With them (a PEM file named by `PGSSLROOTCERT`,
//! libpq's variable), the certificate must chain to one of them and name
//! the host connected to.
//!
//! So only `sslmode=require` with root certificates keeps a network path
//! from reading or changing what the server says to PostgreSQL: `prefer`
//! falls back to plain text when anything on the way strips the offer, and
//! `require` without roots takes any certificate. A connection over TCP to
//! another host than this one set up so is warned about once, as the
//! process first connects ([`caveat`]).

use crate::error::{Error, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use std::path::Path;
use std::sync::Arc;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{Client, Config};
use tokio_postgres_rustls::MakeRustlsConnect;

/// What connects to PostgreSQL: plain or TLS, as `sslmode` says, over TCP
/// or a Unix socket.
#[derive(Clone)]
pub struct Tls(MakeRustlsConnect);

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

impl<S> MakeTlsConnect<S> for Tls
where
    MakeRustlsConnect: MakeTlsConnect<S>,
{
    type Stream = <MakeRustlsConnect as MakeTlsConnect<S>>::Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<S>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<S>>::Error;

    fn make_tls_connect(&mut self, hostname: &str) -> Result<Self::TlsConnect, Self::Error> {
        // A Unix socket has no host name, which rustls refuses as a server
        // name: every connection through a socket failed, even with
        // `sslmode=disable`. tokio-postgres never starts TLS without a host
        // name (PostgreSQL offers none on a socket), so the name stands in
        // and is never checked.
        let name = if hostname.is_empty() {
            "localhost"
        } else {
            hostname
        };
        self.0.make_tls_connect(name)
    }
}

/// The variable naming the root certificates to verify the server against.
pub const ROOT_CERTIFICATES: &str = "PGSSLROOTCERT";

/// The connector every connection of the server's uses: root certificates
/// from the file `PGSSLROOTCERT` names, if it names one.
pub fn tls() -> Result<Tls> {
    tls_with_roots(
        std::env::var_os(ROOT_CERTIFICATES)
            .as_deref()
            .map(Path::new),
    )
}

/// The connector verifying against the root certificates in the PEM file
/// `roots`, or, without one, encrypting without verifying.
pub fn tls_with_roots(roots: Option<&Path>) -> Result<Tls> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls { why: e.to_string() })?;
    let config = match roots {
        Some(path) => {
            let mut store = rustls::RootCertStore::empty();
            let certificates = CertificateDer::pem_file_iter(path)
                .and_then(|c| c.collect::<std::result::Result<Vec<_>, _>>())
                .map_err(|e| Error::Tls {
                    why: format!("root certificates in {}: {e}", path.display()),
                })?;
            for certificate in certificates {
                store.add(certificate).map_err(|e| Error::Tls {
                    why: format!("root certificates in {}: {e}", path.display()),
                })?;
            }
            builder.with_root_certificates(store)
        }
        None => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unchecked(provider))),
    }
    .with_no_client_auth();
    Ok(Tls(MakeRustlsConnect::new(config)))
}

/// What a connection as `config` says leaves open to a network path
/// between the server and PostgreSQL, when it leaves anything: `None` for a
/// Unix socket, a loopback host, or `sslmode=require` with root
/// certificates (`roots`, as `PGSSLROOTCERT` names them).
pub fn caveat(config: &Config, roots: bool) -> Option<String> {
    use tokio_postgres::config::{Host, SslMode};
    let remote: Vec<&str> = config
        .get_hosts()
        .iter()
        .filter_map(|h| match h {
            Host::Tcp(name) => Some(name.as_str()),
            #[cfg(unix)]
            Host::Unix(_) => None,
        })
        .filter(|name| !magic_sync_core::link::is_loopback(name))
        .collect();
    if remote.is_empty() {
        return None;
    }
    let hosts = remote.join(", ");
    match config.get_ssl_mode() {
        SslMode::Require if roots => None,
        SslMode::Require => Some(format!(
            "connections to PostgreSQL at {hosts} are encrypted but the server's certificate \
             is not checked (sslmode=require without {ROOT_CERTIFICATES}): anyone on the path \
             can stand in for it; set {ROOT_CERTIFICATES} to the certificates it must chain to"
        )),
        SslMode::Disable => Some(format!(
            "connections to PostgreSQL at {hosts} are plain text (sslmode=disable): anyone on \
             the path can read and change them; use sslmode=require with {ROOT_CERTIFICATES}"
        )),
        _ => Some(format!(
            "connections to PostgreSQL at {hosts} fall back to plain text when TLS is not \
             offered (sslmode=prefer), which anyone on the path can arrange; use \
             sslmode=require with {ROOT_CERTIFICATES}"
        )),
    }
}

/// Warns once per process of what [`caveat`] finds in `config`.
pub(crate) fn warn_once(config: &Config) {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let roots = std::env::var_os(ROOT_CERTIFICATES).is_some();
    if let Some(caveat) = caveat(config, roots) {
        WARNED.call_once(|| tracing::warn!("{caveat}"));
    }
}

/// Connects as `config` says, TLS as its `sslmode` says, and drives the
/// connection on a task of its own.
pub async fn connect(config: &Config) -> Result<Client> {
    warn_once(config);
    let (client, connection) = config.connect(tls()?).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "a connection to PostgreSQL ended");
        }
    });
    Ok(client)
}

/// Accepts any certificate, checking only that the handshake is signed by
/// it: encryption without verification, libpq's `require` without roots.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::caveat;
    use tokio_postgres::Config;

    fn config(text: &str) -> Config {
        text.parse().unwrap()
    }

    #[test]
    fn only_a_remote_host_without_verified_tls_is_warned_about() {
        for safe in [
            "host=/run/postgresql sslmode=disable",
            "host=localhost sslmode=prefer",
            "host=127.0.0.1 sslmode=disable",
            "host=::1",
        ] {
            assert_eq!(caveat(&config(safe), false), None, "{safe}");
        }
        assert_eq!(
            caveat(&config("host=db.example sslmode=require"), true),
            None
        );
        let prefer = caveat(&config("host=db.example"), true).unwrap();
        assert!(prefer.contains("sslmode=prefer"), "{prefer}");
        assert!(prefer.contains("db.example"), "{prefer}");
        let unverified = caveat(&config("host=db.example sslmode=require"), false).unwrap();
        assert!(unverified.contains("not checked"), "{unverified}");
        let plain = caveat(&config("host=10.1.2.3 sslmode=disable"), true).unwrap();
        assert!(plain.contains("plain text"), "{plain}");
    }
}

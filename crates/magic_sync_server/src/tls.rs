//! TLS for the connections the server makes to PostgreSQL, as the
//! connection string's `sslmode` asks: `disable`, `prefer` (the default:
//! TLS when the server offers it) or `require` (TLS or no connection).
//!
//! Which certificate is accepted follows libpq. Without root certificates,
//! the connection is encrypted but the certificate is not checked, as
//! libpq's `require` does. With them (a PEM file named by `PGSSLROOTCERT`,
//! libpq's variable), the certificate must chain to one of them and name
//! the host connected to.

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

/// Connects as `config` says, TLS as its `sslmode` says, and drives the
/// connection on a task of its own.
pub async fn connect(config: &Config) -> Result<Client> {
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

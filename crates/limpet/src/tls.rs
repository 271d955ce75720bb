//! TLS through rustls (ring provider): server configs for TLS listeners, client configs for
//! TLS to nodes.
//!
//! ```text
//!  PEM files ──► load_certified_key (parse, key matches cert?) ──► CertifiedKey
//!  [CertifiedKey + SNI names] ──► SniResolver (names, else the default) ──► ServerConfig
//!                                                   ALPN: h2, http/1.1 for http listeners
//!  CA file ──► RootCertStore ──► ClientConfig (verified)      ─┐
//!  verify = "none" ──► NoVerify (accepts any certificate)     ─┴─► TlsConnector per listener
//! ```
//!
//! Everything that reads a file runs while the config is validated, so a bad path or a key
//! that does not match its certificate is a config error (with file, line and key), never a
//! runtime failure.
//!
//! An HTTP listener's client streams are read under rustls through [`RecordWatch`], which
//! follows the record framing so that a record begun and never finished is timed like the
//! request head inside it ([`records`]).

use std::path::Path;
use std::sync::Arc;

pub mod records;
pub use records::{RecordClock, RecordWatch};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert, ResolvesServerCertUsingSni};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

/// The crypto provider limpet uses everywhere (ring: builds with a C compiler, no cmake).
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Which file (or which part) a TLS error is about, so config errors can point at the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPart {
    Cert,
    Key,
    Ca,
    Name,
}

/// Why a TLS setting cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError {
    pub part: TlsPart,
    pub message: String,
}

impl std::fmt::Display for TlsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for TlsError {}

fn err(part: TlsPart, message: String) -> TlsError {
    TlsError { part, message }
}

fn read_file(path: &Path, part: TlsPart) -> Result<Vec<u8>, TlsError> {
    crate::config::read_bounded(path)
        .map_err(|e| err(part, format!("cannot read {}: {e}", path.display())))
}

/// A certificate chain and its private key, from PEM files, checked to belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let cert_pem = read_file(cert, TlsPart::Cert)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| err(TlsPart::Cert, format!("{}: bad PEM: {e:?}", cert.display())))?;
    if chain.is_empty() {
        return Err(err(
            TlsPart::Cert,
            format!("{}: no CERTIFICATE block", cert.display()),
        ));
    }
    let key_pem = read_file(key, TlsPart::Key)?;
    let key_der = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        err(
            TlsPart::Key,
            format!("{}: no usable private key: {e:?}", key.display()),
        )
    })?;
    CertifiedKey::from_der(chain, key_der, &provider()).map_err(|e| {
        let message = match e {
            // The certificate's own bytes, read to compare the keys: its fault, not the key's.
            rustls::Error::InvalidCertificate(_) => {
                return err(
                    TlsPart::Cert,
                    format!(
                        "{}: not a certificate this build can read: {e}",
                        cert.display()
                    ),
                );
            }
            rustls::Error::InconsistentKeys(_) => format!(
                "{} does not match the certificate {}: {e}",
                key.display(),
                cert.display()
            ),
            // The key did not load at all (a kind or curve the crypto provider does not
            // sign with, a P-521 key under ring): not a mismatch, which would send the
            // operator looking for another certificate.
            _ => format!(
                "{}: a private key this build cannot sign with: {e}",
                key.display()
            ),
        };
        err(TlsPart::Key, message)
    })
}

/// One certificate of a TLS listener and the SNI names it answers (none: the default).
#[derive(Debug, Clone)]
pub struct CertSpec<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub names: &'a [String],
}

/// Picks the certificate by SNI; a client without SNI, or naming no configured name, gets the
/// default certificate (rustls' own SNI resolver refuses those).
#[derive(Debug)]
struct SniResolver {
    by_name: ResolvesServerCertUsingSni,
    has_names: bool,
    default: Option<Arc<CertifiedKey>>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.has_names && hello.server_name().is_some() {
            if let Some(ck) = self.by_name.resolve(hello) {
                return Some(ck);
            }
        }
        self.default.clone()
    }
}

/// A server config for these certificates. `alpn` lists the protocols offered, most
/// preferred first (`[b"h2", b"http/1.1"]` for HTTP listeners, empty for TCP).
/// On error, the index of the certificate at fault comes with it.
pub fn server_config(
    certs: &[CertSpec<'_>],
    alpn: &[&[u8]],
) -> Result<ServerConfig, (usize, TlsError)> {
    let mut by_name = ResolvesServerCertUsingSni::new();
    let mut default = None;
    let mut has_names = false;
    // With no entry without `names`, the first entry is the default, as HAProxy's first
    // `crt` and nginx's default server's certificate are: a client that sends no SNI (one
    // that connects by IP address, as printers and terminals do) or an unlisted name gets a
    // certificate, which it checks as it would any. Before, its handshake was refused with
    // nothing said above debug.
    let mut first = None;
    for (i, spec) in certs.iter().enumerate() {
        let ck = load_certified_key(spec.cert, spec.key).map_err(|e| (i, e))?;
        if i == 0 && !spec.names.is_empty() {
            first = Some(Arc::new(ck.clone()));
        }
        if spec.names.is_empty() {
            if default.is_some() {
                return Err((
                    i,
                    err(
                        TlsPart::Name,
                        "two certificates without `names`: only one can be the default".into(),
                    ),
                ));
            }
            default = Some(Arc::new(ck));
            continue;
        }
        for name in spec.names {
            has_names = true;
            // Checks the name is a DNS name the certificate is valid for.
            by_name.add(name, ck.clone()).map_err(|e| {
                (
                    i,
                    err(
                        TlsPart::Name,
                        format!("{}: not usable for {name:?}: {e}", spec.cert.display()),
                    ),
                )
            })?;
        }
    }
    let resolver = SniResolver {
        by_name,
        has_names,
        default: default.or(first),
    };
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| (0, err(TlsPart::Cert, e.to_string())))?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(cfg)
}

/// How a listener checks its nodes' certificates.
#[derive(Debug, Clone)]
pub enum UpstreamVerify<'a> {
    /// Against the CA certificates in this PEM file.
    Ca(&'a Path),
    /// Not at all (`verify = "none"`): the connection is encrypted but a node's identity is
    /// not checked, like HAProxy's `ssl verify none`. Only for networks you trust.
    None,
}

/// A client config for TLS to nodes, offering `alpn`.
pub fn client_config(verify: UpstreamVerify<'_>, alpn: &[&[u8]]) -> Result<ClientConfig, TlsError> {
    client_config_trusting(verify, alpn).map(|(config, _)| config)
}

/// [`client_config`], and what it trusts, in words that change whenever that does: `none`,
/// or the CA file's path and a digest of what it held when read. A TLS health check keeps
/// running across a reload only while this stays the same: a CA file rewritten in place,
/// under the same path, must reach the checks as it reaches new node connections.
pub fn client_config_trusting(
    verify: UpstreamVerify<'_>,
    alpn: &[&[u8]],
) -> Result<(ClientConfig, String), TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| err(TlsPart::Ca, e.to_string()))?;
    let trust;
    let mut cfg = match verify {
        UpstreamVerify::Ca(path) => {
            let pem = read_file(path, TlsPart::Ca)?;
            trust = {
                use std::hash::{Hash, Hasher};
                // The same digest for the same bytes within this process, which is all a
                // reload compares.
                let mut h = std::hash::DefaultHasher::new();
                pem.hash(&mut h);
                format!("ca {} #{:016x}", path.display(), h.finish())
            };
            let mut roots = RootCertStore::empty();
            let mut n = 0;
            for cert in CertificateDer::pem_slice_iter(&pem) {
                let cert = cert
                    .map_err(|e| err(TlsPart::Ca, format!("{}: bad PEM: {e:?}", path.display())))?;
                roots.add(cert).map_err(|e| {
                    err(
                        TlsPart::Ca,
                        format!("{}: bad CA certificate: {e}", path.display()),
                    )
                })?;
                n += 1;
            }
            if n == 0 {
                return Err(err(
                    TlsPart::Ca,
                    format!("{}: no CERTIFICATE block", path.display()),
                ));
            }
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        UpstreamVerify::None => {
            trust = "none".to_owned();
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerify(provider())))
                .with_no_client_auth()
        }
    };
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok((cfg, trust))
}

/// Accepts any server certificate (`verify = "none"`), still checking that handshake
/// signatures are made by the presented key, so the session is at least encrypted to it.
#[derive(Debug)]
struct NoVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
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
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
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

/// The name to send as SNI and verify against for a node: the configured `server_name`, or
/// the node's IP address.
pub fn upstream_name(server_name: Option<&str>, ip: std::net::IpAddr) -> ServerName<'static> {
    server_name
        .and_then(|n| ServerName::try_from(n.to_owned()).ok())
        .unwrap_or(ServerName::IpAddress(ip.into()))
}

/// A self-signed certificate and its private key, both PEM (`limpet cert`).
#[derive(Clone)]
pub struct SelfSigned {
    /// One `CERTIFICATE` block.
    pub cert_pem: String,
    /// One `PRIVATE KEY` block (PKCS#8, ECDSA P-256).
    pub key_pem: String,
}

impl std::fmt::Debug for SelfSigned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of logs and panic messages.
        f.debug_struct("SelfSigned")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

/// Makes a self-signed certificate valid for `names` (DNS names or IP addresses, each a
/// subject alternative name) with `common_name` as its subject. For trying a TLS listener
/// before a real certificate exists: clients must be told to trust it (`curl --cacert`) or
/// not to verify (`curl -k`).
pub fn self_signed(common_name: &str, names: &[String]) -> Result<SelfSigned, TlsError> {
    if names.is_empty() {
        return Err(err(
            TlsPart::Name,
            "a certificate needs at least one name".into(),
        ));
    }
    let mut params = rcgen::CertificateParams::new(names.to_vec())
        .map_err(|e| err(TlsPart::Name, format!("bad certificate name: {e}")))?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    let key = rcgen::KeyPair::generate()
        .map_err(|e| err(TlsPart::Key, format!("cannot generate a key: {e}")))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| err(TlsPart::Cert, format!("cannot sign the certificate: {e}")))?;
    Ok(SelfSigned {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Writes a [`self_signed`] certificate as `DIR/NAME.pem` and its key as `DIR/NAME.key`
/// (readable by the owner only), creating `DIR` if needed; the paths a listener's
/// `tls = { cert = "DIR/NAME.pem", key = "DIR/NAME.key" }` names. Existing files are kept
/// unless `overwrite`, so a real certificate is never replaced by accident.
pub fn write_self_signed(
    dir: &Path,
    name: &str,
    names: &[String],
    overwrite: bool,
) -> Result<(std::path::PathBuf, std::path::PathBuf), String> {
    let plain = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\'])
        && !name.chars().any(char::is_control);
    if !plain {
        return Err(format!("{name:?} is not a plain file name"));
    }
    let cert_path = dir.join(format!("{name}.pem"));
    let key_path = dir.join(format!("{name}.key"));
    if !overwrite {
        for p in [&cert_path, &key_path] {
            if p.exists() {
                return Err(format!(
                    "{} exists; it is kept (--force replaces it)",
                    p.display()
                ));
            }
        }
    }
    let made = self_signed(name, names).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    write_private(&key_path, made.key_pem.as_bytes())?;
    std::fs::write(&cert_path, made.cert_pem.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", cert_path.display()))?;
    Ok((cert_path, key_path))
}

/// Writes a file only its owner can read (a private key): into a temporary file of its own,
/// created with that mode, then renamed over `path`. Written in place, a `--force` over a key
/// readable by others held the new key under the old mode until narrowed after, or for good
/// if that failed, and followed a symbolic link at `path`.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = crate::runtime::snapshot::temporary(path, std::process::id());
    crate::runtime::snapshot::write_durably(&tmp, path, bytes, Some(0o600))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_written_self_signed_certificate_loads_and_serves_its_names() {
        let dir = std::env::temp_dir().join(format!("limpet-tls-cert-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let names = vec!["print.example".to_owned(), "127.0.0.1".to_owned()];
        let (cert, key) =
            write_self_signed(&dir, "ha-safeq", &names, false).expect("write certificate");
        assert_eq!(cert, dir.join("ha-safeq.pem"));
        assert_eq!(key, dir.join("ha-safeq.key"));
        load_certified_key(&cert, &key).expect("the key matches the certificate");
        let sni = ["print.example".to_owned()];
        let spec = CertSpec {
            cert: &cert,
            key: &key,
            names: &sni,
        };
        assert!(server_config(&[spec], &[b"http/1.1"]).is_ok());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&key).expect("key").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "the key is readable by its owner only");
        }
        // A second run keeps what is there, unless asked to replace it.
        assert!(write_self_signed(&dir, "ha-safeq", &names, false).is_err());
        assert!(write_self_signed(&dir, "ha-safeq", &names, true).is_ok());
        #[cfg(unix)]
        {
            // Replacing a key others could read, or a symbolic link at its name: the new key
            // is never under the old mode nor written through the link, whose target is
            // left as it was.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            write_self_signed(&dir, "ha-safeq", &names, true).expect("replace");
            let mode = std::fs::metadata(&key).expect("key").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "a replaced key is its owner's only");
            let elsewhere = dir.join("elsewhere");
            std::fs::write(&elsewhere, b"not a key").expect("write");
            std::fs::remove_file(&key).expect("rm");
            std::os::unix::fs::symlink(&elsewhere, &key).expect("symlink");
            write_self_signed(&dir, "ha-safeq", &names, true).expect("replace the link");
            assert_eq!(std::fs::read(&elsewhere).expect("read"), b"not a key");
            assert!(!std::fs::symlink_metadata(&key)
                .expect("key")
                .file_type()
                .is_symlink());
            load_certified_key(&cert, &key).expect("the new key matches the new certificate");
        }
        assert!(write_self_signed(&dir, "../x", &names, true).is_err());
        assert!(self_signed("x", &[]).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

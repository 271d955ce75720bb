//! TLS for `limpet probe https://...`: one rustls client config (ring provider, like the rest
//! of limpet), shared by every session's HTTP client and its `wss://` upgrades, so both trust
//! exactly the same certificates.
//!
//! Trusted roots: the system's (`rustls-native-certs`: `/etc/ssl/certs` and the like, or
//! `SSL_CERT_FILE`/`SSL_CERT_DIR`), plus the `--ca` file's. `--insecure` trusts any
//! certificate instead (testing only). ALPN offers `http/1.1` alone: the probe speaks
//! HTTP/1.1, and a WebSocket upgrade needs it.

use std::path::Path;

use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::tls::{client_config as insecure_config, provider, UpstreamVerify};

const ALPN: &[&[u8]] = &[b"http/1.1"];

/// The client config for `--ca` / `--insecure`; the error is one line for the user.
pub(crate) fn client_config(ca: Option<&Path>, insecure: bool) -> Result<ClientConfig, String> {
    if insecure {
        return insecure_config(UpstreamVerify::None, ALPN).map_err(|e| e.to_string());
    }
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    for error in &native.errors {
        tracing::debug!(%error, "system root certificates");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "system root certificates loaded");
    if let Some(path) = ca {
        let shown = path.display();
        let pem = std::fs::read(path).map_err(|e| format!("--ca {shown}: {e}"))?;
        let mut n = 0usize;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            let cert = cert.map_err(|e| format!("--ca {shown}: bad PEM: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("--ca {shown}: bad CA certificate: {e}"))?;
            n += 1;
        }
        if n == 0 {
            return Err(format!("--ca {shown}: no CERTIFICATE block"));
        }
    }
    if roots.is_empty() {
        // Not fatal: every handshake will then say why it failed (UnknownIssuer).
        eprintln!(
            "limpet probe: no trusted root certificates (none in the system store, no --ca); \
             every server certificate will be refused"
        );
    }
    let mut cfg = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ca_file_errors_are_one_line() {
        let dir = std::env::temp_dir().join(format!("limpet-probe-tls-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let missing = dir.join("missing.pem");
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").expect("write");
        let e = client_config(Some(&missing), false).expect_err("missing file");
        assert!(e.starts_with("--ca ") && !e.contains('\n'), "{e}");
        let e = client_config(Some(&empty), false).expect_err("no PEM");
        assert!(e.contains("no CERTIFICATE block"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn configs_offer_http11_only() {
        for insecure in [false, true] {
            let cfg = client_config(None, insecure).expect("config");
            assert_eq!(cfg.alpn_protocols, [b"http/1.1".to_vec()]);
        }
    }

    #[test]
    fn reqwest_takes_the_config() {
        // `use_preconfigured_tls` downcasts: a rustls version reqwest does not share would
        // only show as a build error of every session's client.
        let cfg = client_config(None, true).expect("config");
        reqwest::Client::builder()
            .use_preconfigured_tls(cfg)
            .build()
            .expect("reqwest accepts the rustls config");
    }
}

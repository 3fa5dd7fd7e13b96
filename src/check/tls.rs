//! The certificate checks and the per-remote probes of `xcc check`: this registry's own
//! material (loads, chains, identity, expiry), and for each RemoteRegistry a TCP connect, a TLS
//! handshake with the identity the remote presents, and (for a peer) a Hamlet subscription, with
//! the remote's clock read from the response's `Date` header.

use std::time::{Duration, SystemTime};

use rustls::pki_types::ServerName;
use tokio_stream::wrappers::ReceiverStream;
use xcc_certs::CertError;
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL;
use xcc_proto::federation::resourcediscovery::v1alpha1 as rd1;
use xcc_registry::hamlet::client::RemoteSpec;

use super::report::Check;

/// A certificate that expires within this is a warning.
pub const EXPIRY_WARNING: Duration = Duration::from_secs(30 * 24 * 3600);
/// A clock further than this from a remote's is a warning (certificate validity, TLS).
pub const SKEW_WARNING: Duration = Duration::from_secs(10);

/// The fix for a certificate that does not load.
pub fn load_hint(e: &CertError) -> &'static str {
    match e {
        CertError::Io { .. } => {
            "check the paths: --tls-dir (ca.crt, tls.crt, tls.key) or --tls-ca/--tls-cert/--tls-key"
        }
        CertError::KeyMismatch { .. } => {
            "use the tls.key that was written with this tls.crt (xcc certs issue writes both)"
        }
        CertError::NotSignedByCa { .. } => {
            "put the CA that issued tls.crt into ca.crt (during a CA rotation the bundle holds both CAs), or reissue the certificate from the CA in ca.crt"
        }
        CertError::NotValidNow { .. } => {
            "reissue the certificate (xcc certs issue), or check this machine's clock"
        }
        CertError::FileIdentity { .. } | CertError::Identity(_) => {
            "issue a cluster certificate: xcc certs issue --cluster <name> (it carries spiffe://<trust-domain>/cluster/<name>)"
        }
        _ => "reissue the files with xcc certs (see `xcc certs --help`)",
    }
}

/// Load this registry's material and report it: `certificate` (loads, chains, names a cluster,
/// the expected one when `cluster` is given) and `certificate expiry`.
pub fn certificate(
    files: &TlsFiles,
    cluster: Option<&str>,
    now: time::OffsetDateTime,
    out: &mut Vec<Check>,
) -> Option<ReloadingTls> {
    let tls = match ReloadingTls::load(files.clone()) {
        Ok(t) => t,
        Err(e) => {
            out.push(Check::fail("certificate", e.to_string(), load_hint(&e)));
            out.push(Check::skip("certificate expiry", "no certificate loaded"));
            out.push(Check::skip("ca expiry", "no certificate loaded"));
            return None;
        }
    };
    let id = tls.identity();
    let spiffe = id.spiffe_id().unwrap_or_else(|| id.to_string());
    if !id.is_cluster() {
        out.push(Check::fail(
            "certificate",
            format!("{spiffe} is not a cluster identity"),
            "a registry needs spiffe://<trust-domain>/cluster/<name>: xcc certs issue --cluster <name>",
        ));
    } else if let Some(want) = cluster.filter(|c| *c != id.name()) {
        out.push(Check::fail(
            "certificate",
            format!("{spiffe} names cluster {:?}, expected {want:?}", id.name()),
            "issue this cluster's certificate with --cluster set to its name (peers and policies know it by that name)",
        ));
    } else {
        out.push(Check::ok(
            "certificate",
            format!("{spiffe}, issued by a CA in {}", files.ca.display()),
        ));
    }
    let m = tls.current();
    out.push(expiry_check(m.not_after, now));
    out.push(ca_expiry_check(files, now));
    Some(tls)
}

/// `ca expiry`: the earliest-expiring CA of the bundle, a warning under [`EXPIRY_WARNING`]
/// (every certificate it issued stops verifying when it expires).
pub fn ca_expiry_check(files: &TlsFiles, now: time::OffsetDateTime) -> Check {
    let entries = std::fs::read(&files.ca)
        .map_err(|e| e.to_string())
        .and_then(|pem| {
            xcc_certs::bundle::entries(&pem, &files.ca.display().to_string())
                .map_err(|e| e.to_string())
        });
    let first = match entries {
        Ok(e) => e.into_iter().min_by_key(|c| c.not_after),
        Err(e) => return Check::fail("ca expiry", e, load_hint_io()),
    };
    let Some(ca) = first else {
        return Check::fail("ca expiry", "the bundle holds no CA", load_hint_io());
    };
    let left = ca.not_after - now;
    let days = left.whole_days();
    let who = format!("{} (serial {})", ca.subject, ca.serial);
    if left <= time::Duration::ZERO {
        Check::fail(
            "ca expiry",
            format!("{who} expired at {}", ca.not_after),
            "rotate the CA (docs/operations.md, Rotating the CA): certificates it issued no longer verify",
        )
    } else if left < time::Duration::try_from(EXPIRY_WARNING).unwrap_or(time::Duration::MAX) {
        Check::warn(
            "ca expiry",
            format!("{who} expires in {days} days ({})", ca.not_after),
            "rotate the CA before then (docs/operations.md, Rotating the CA)",
        )
    } else {
        Check::ok(
            "ca expiry",
            format!("the first CA of the bundle to expire, {who}, is valid for {days} more days"),
        )
    }
}

fn load_hint_io() -> &'static str {
    "check --tls-ca (or ca.crt in --tls-dir): a PEM bundle of CA certificates"
}

/// `certificate expiry`: a warning under [`EXPIRY_WARNING`].
pub fn expiry_check(not_after: time::OffsetDateTime, now: time::OffsetDateTime) -> Check {
    let left = not_after - now;
    let days = left.whole_days();
    if left <= time::Duration::ZERO {
        Check::fail(
            "certificate expiry",
            format!("expired at {not_after}"),
            "reissue the certificate; xcc picks up replaced files without a restart",
        )
    } else if left < time::Duration::try_from(EXPIRY_WARNING).unwrap_or(time::Duration::MAX) {
        Check::warn(
            "certificate expiry",
            format!("expires in {days} days ({not_after})"),
            "renew it before then; xcc picks up replaced files without a restart",
        )
    } else {
        Check::ok(
            "certificate expiry",
            format!("valid for {days} more days ({not_after})"),
        )
    }
}

/// Why a handshake or a stream failed, and the fix, from the TLS error in `e`'s sources (found
/// and classified as every xcc log line does it: [`xcc_certs::explain`]).
pub fn tls_failure(
    e: &(dyn std::error::Error + 'static),
    spec: &RemoteSpec,
) -> Option<(String, String)> {
    xcc_certs::explain::find_tls_error(e).map(|r| explain_rustls(&r, spec))
}

fn explain_rustls(e: &rustls::Error, spec: &RemoteSpec) -> (String, String) {
    use xcc_certs::explain::{Cause, cause};
    let ca_source = if spec.roots.is_some() {
        "spec.tlsConfig.serverCA"
    } else {
        "this registry's ca.crt (spec.tlsConfig.serverCA is empty)"
    };
    match cause(e) {
        Cause::PeerUnknownCa => (
            "this registry refused the remote's certificate: it is not issued by a CA it trusts"
                .into(),
            format!("put the remote's current CA into {ca_source}"),
        ),
        Cause::PeerWrongName => (
            format!(
                "this registry refused the remote's certificate: it does not name {:?}",
                spec.server_name
            ),
            "set spec.tlsConfig.serverName to a DNS name or IP the remote's certificate carries, or reissue it with that name (xcc certs issue --dns/--ip)".into(),
        ),
        Cause::PeerExpired => (
            "this registry refused the remote's certificate: it has expired or is not valid yet"
                .into(),
            "the remote must renew its certificate, or one of the two clocks is wrong".into(),
        ),
        Cause::UsUnknownCa
        | Cause::UsExpired
        | Cause::UsBadCertificate
        | Cause::UsNoCertificate => {
            let alert = match e {
                rustls::Error::AlertReceived(a) => format!("{a:?}"),
                other => other.to_string(),
            };
            (
                format!("the remote refused this registry's certificate (TLS alert {alert})"),
                "the remote must trust the CA that issued this registry's certificate (add it to the remote's CA bundle), and this registry must be a cluster of the remote's trust domain".into(),
            )
        }
        Cause::NotTls => (
            format!("{} does not answer TLS", spec.address),
            "is spec.address the remote's Hamlet listener (8443 in deploy/)? The metrics port 9090 is plain HTTP".into(),
        ),
        _ => (
            format!("TLS failed: {e}"),
            format!(
                "check {ca_source} and spec.tlsConfig.serverName against the remote's certificate"
            ),
        ),
    }
}

/// Probe one RemoteRegistry: reach it, shake hands, and (a peer) subscribe. `parent` probes
/// stop after the handshake: a parent serves the federation API, which has no read-only call.
pub async fn remote(
    tls: &ReloadingTls,
    spec: &RemoteSpec,
    parent: bool,
    timeout: Duration,
) -> Check {
    let id = format!("{} {}", if parent { "parent" } else { "remote" }, spec.name);
    let peer = match handshake(tls, spec, timeout).await {
        Ok(peer) => peer,
        Err((detail, hint)) => return Check::fail(id, detail, hint),
    };
    let who = peer.spiffe_id().unwrap_or_else(|| peer.to_string());
    if parent {
        return Check::ok(id, format!("{} is {who} (TLS handshake)", spec.address));
    }
    match subscribe(tls, spec, timeout).await {
        Ok(skew) => match skew {
            Some(s) if s.abs() > SKEW_WARNING.as_secs_f64() => Check::warn(
                id,
                format!(
                    "{} is {who}; Hamlet stream open; its clock is {s:+.0} s from ours",
                    spec.address
                ),
                "synchronise the clocks (NTP): certificates and timestamps assume agreement",
            ),
            Some(s) => Check::ok(
                id,
                format!(
                    "{} is {who}; Hamlet stream open; clock skew {s:+.0} s",
                    spec.address
                ),
            ),
            None => Check::ok(
                id,
                format!(
                    "{} is {who}; Hamlet stream open (its clock is not known: no Date header)",
                    spec.address
                ),
            ),
        },
        Err((detail, hint)) => {
            Check::fail(id, format!("{} is {who}, but {detail}", spec.address), hint)
        }
    }
}

/// Why a step failed and how to fix it.
type Failure = (String, String);

fn failure(detail: impl Into<String>, hint: impl Into<String>) -> Failure {
    (detail.into(), hint.into())
}

/// Connect to the remote and complete a TLS handshake as the registry would, reading the
/// server's first bytes (a refusal of our certificate arrives there): the remote's identity.
async fn handshake(
    tls: &ReloadingTls,
    spec: &RemoteSpec,
    timeout: Duration,
) -> Result<xcc_certs::identity::Identity, Failure> {
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&spec.address))
        .await
    {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(failure(
                format!("cannot reach {}: {e}", spec.address),
                "check spec.address (host:port of the remote's Hamlet listener, 8443 in deploy/), that the remote runs, and that this cluster can route to it (a NodePort or LoadBalancer address)",
            ));
        }
        Err(_) => {
            return Err(failure(
                format!("no answer from {} within {timeout:?}", spec.address),
                "a firewall or an unrouted address drops the connection: check spec.address and the path to it",
            ));
        }
    };
    let Ok(name) = ServerName::try_from(spec.server_name.clone()) else {
        return Err(failure(
            format!(
                "spec.tlsConfig.serverName {:?} is not a DNS name or an IP",
                spec.server_name
            ),
            "set spec.tlsConfig.serverName to a name the remote's certificate carries",
        ));
    };
    let connector = tokio_rustls::TlsConnector::from(tls.client_config(spec.roots.clone()));
    let mut stream = match tokio::time::timeout(timeout, connector.connect(name, tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return Err(tls_failure(&e, spec).unwrap_or_else(|| {
                failure(
                    format!("TLS handshake with {} failed: {e}", spec.address),
                    "is spec.address a Hamlet (TLS) listener? The metrics port 9090 and plain HTTP are not",
                )
            }));
        }
        Err(_) => {
            return Err(failure(
                format!(
                    "{} accepted the connection but no TLS handshake within {timeout:?}",
                    spec.address
                ),
                "is spec.address the remote's Hamlet listener (8443 in deploy/)?",
            ));
        }
    };
    let peer = match stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(xcc_certs::identity::identity_from_der)
    {
        Some(Ok(p)) => p,
        Some(Err(e)) => {
            return Err(failure(
                format!("the remote's certificate carries no usable identity: {e}"),
                "the remote needs a cluster certificate (xcc certs issue --cluster <name>)",
            ));
        }
        None => {
            return Err(failure(
                "the remote sent no certificate",
                "is spec.address an xcc or Hamlet registry?",
            ));
        }
    };
    // With TLS 1.3 the client's handshake ends before the server has verified the client's
    // certificate: a refusal arrives as an alert on the first read, where an HTTP/2 server's
    // first bytes (its SETTINGS) would otherwise be.
    let mut first = [0u8; 1];
    let read = tokio::io::AsyncReadExt::read(&mut stream, &mut first);
    if let Ok(Err(e)) = tokio::time::timeout(timeout.min(Duration::from_secs(2)), read).await
        && let Some(refused) = tls_failure(&e, spec)
    {
        return Err(refused);
    }
    Ok(peer)
}

/// Open a Hamlet stream as the registry would; the remote's clock minus ours, from `Date`.
async fn subscribe(
    tls: &ReloadingTls,
    spec: &RemoteSpec,
    timeout: Duration,
) -> Result<Option<f64>, (String, String)> {
    let connector = xcc_certs::client::TlsConnector::new(
        tls.clone(),
        spec.server_name.clone(),
        spec.roots.clone(),
    )
    .map_err(|e| (e.to_string(), "fix spec.tlsConfig".to_string()))?;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", spec.address))
        .map_err(|e| {
            (
                format!("invalid address: {e}"),
                "fix spec.address".to_string(),
            )
        })?
        .connect_timeout(timeout);
    let open = async {
        let channel = endpoint.connect_with_connector(connector).await?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let _ = tx.try_send(rd1::StreamRequest {
            resource_url: FEDERATED_SERVICE_V1ALPHA1_URL.into(),
            response_nonce: String::new(),
            status: None,
        });
        let mut client = rd1::discovery_service_client::DiscoveryServiceClient::new(channel);
        let response = client
            .establish_stream(ReceiverStream::new(rx))
            .await
            .map_err(anyhow::Error::new)?;
        drop(tx);
        Ok::<_, anyhow::Error>(response.metadata().get("date").cloned())
    };
    let date = match tokio::time::timeout(timeout, open).await {
        Ok(Ok(date)) => date,
        Ok(Err(e)) => return Err(stream_failure(&e, spec)),
        Err(_) => {
            return Err((
                format!("no Hamlet answer within {timeout:?}"),
                "is spec.address the remote's Hamlet listener (8443 in deploy/)?".into(),
            ));
        }
    };
    let remote = date
        .and_then(|d| d.to_str().ok().map(str::to_string))
        .and_then(|d| httpdate::parse_http_date(&d).ok());
    Ok(remote.map(|r| skew_seconds(r, SystemTime::now())))
}

/// The remote's clock minus ours, in seconds (the `Date` header has whole seconds).
pub fn skew_seconds(remote: SystemTime, local: SystemTime) -> f64 {
    match remote.duration_since(local) {
        Ok(ahead) => ahead.as_secs_f64().floor(),
        // `0.0 - 0.0` prints as "0", where `-0.0` would print as "-0".
        Err(behind) => 0.0 - behind.duration().as_secs_f64().floor(),
    }
}

fn stream_failure(e: &anyhow::Error, spec: &RemoteSpec) -> (String, String) {
    // A TLS alert from the remote (it refused our certificate) arrives as a transport error
    // under the gRPC status: look for it first.
    let chain: &(dyn std::error::Error + 'static) = e.as_ref();
    if let Some(found) = tls_failure(chain, spec) {
        return found;
    }
    if let Some(s) = e.downcast_ref::<tonic::Status>() {
        return match s.code() {
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => (
                format!("it refused this registry's subscription: {}", s.message()),
                "the remote must admit this cluster: its trust domain and its policies (xcc admin explain on the remote says why)".into(),
            ),
            tonic::Code::Unimplemented => (
                "it does not serve the Hamlet API".into(),
                "is spec.address a Hamlet listener? (xcc's admin port 9443 is not)".into(),
            ),
            code => (
                format!("the subscription failed: {code:?}: {}", s.message()),
                "see the remote registry's log".into(),
            ),
        };
    }
    (
        format!("the subscription failed: {e:#}"),
        "see the remote registry's log".into(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(roots: bool) -> RemoteSpec {
        RemoteSpec {
            name: "east".into(),
            address: "10.0.0.1:8443".into(),
            server_name: "east.example".into(),
            roots: roots.then(|| std::sync::Arc::new(rustls::RootCertStore::empty())),
            allowed_domains: vec![],
        }
    }

    #[test]
    fn each_tls_failure_names_the_side_and_the_fix() {
        let unknown = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let (d, h) = explain_rustls(&unknown, &spec(true));
        assert!(d.contains("not issued by a CA it trusts"), "{d}");
        assert_eq!(
            h,
            "put the remote's current CA into spec.tlsConfig.serverCA"
        );
        let (_, h) = explain_rustls(&unknown, &spec(false));
        assert!(h.contains("this registry's ca.crt"), "{h}");
        let name = rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName);
        assert!(
            explain_rustls(&name, &spec(true))
                .0
                .contains("does not name \"east.example\"")
        );
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA);
        let (d, h) = explain_rustls(&alert, &spec(true));
        assert_eq!(
            d,
            "the remote refused this registry's certificate (TLS alert UnknownCA)"
        );
        assert!(h.contains("add it to the remote's CA bundle"), "{h}");
        // Found through the io::Error tokio-rustls wraps it in.
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, unknown);
        assert!(tls_failure(&io, &spec(true)).is_some());
    }

    #[test]
    fn expiry_warns_under_30_days_and_fails_when_past() {
        let now = time::OffsetDateTime::UNIX_EPOCH + time::Duration::days(1000);
        let s = |days| expiry_check(now + time::Duration::days(days), now).status;
        use super::super::report::Status;
        assert_eq!(s(31), Status::Ok);
        assert_eq!(s(29), Status::Warn);
        assert_eq!(s(-1), Status::Fail);
    }

    #[test]
    fn skew_is_whole_seconds_either_way() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        assert_eq!(skew_seconds(t + Duration::from_millis(12_400), t), 12.0);
        assert_eq!(skew_seconds(t - Duration::from_millis(3_900), t), -3.0);
    }
}

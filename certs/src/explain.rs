//! TLS failures in words: a rustls error (or any error whose source chain holds one) goes in, one
//! sentence comes out saying which side refused whom, why, and what to change.
//!
//! The same rustls error means opposite things on the two ends: `UnknownIssuer` is *our* verdict
//! on the peer's certificate, `AlertReceived(UnknownCA)` is the *peer's* verdict on ours. So every
//! explanation is for one [`Side`]. [`Repeats`] keeps a storm of identical failures (a peer
//! retrying every second) to one log line per minute with a count.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::io;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rustls::{AlertDescription, CertificateError};

/// Which end of the connection we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// We accepted the connection (a listener); the peer is a client.
    Server,
    /// We dialled (an import, a parent link, the admin CLI); the peer is a server.
    Client,
}

/// What went wrong, in kinds an operator can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cause {
    /// We refused the peer's certificate: not issued by a CA in our bundle.
    PeerUnknownCa,
    /// We refused the peer's certificate: expired or not valid yet.
    PeerExpired,
    /// We refused the server's certificate: it does not carry the name we dialled.
    PeerWrongName,
    /// We refused the peer's certificate for another reason.
    PeerBadCertificate,
    /// The peer presented no certificate (a server of ours requires one).
    PeerNoCertificate,
    /// The peer refused our certificate: it does not trust our CA.
    UsUnknownCa,
    /// The peer refused our certificate as expired (or not valid yet).
    UsExpired,
    /// The peer refused our certificate (name, usage or signature).
    UsBadCertificate,
    /// The peer wants a client certificate and we sent none.
    UsNoCertificate,
    /// The peer does not speak TLS at all (a plaintext port, or plaintext sent to a TLS port).
    NotTls,
    /// Anything else TLS reported.
    Other,
}

/// The rustls error in `e` or its source chain (through `io::Error`s, whose own `source` skips
/// the error they wrap). An alert that reached us only as text (some layers keep the message
/// and drop the error: "received fatal alert: UnknownCA") is recognised by that text.
pub fn find_tls_error(e: &(dyn StdError + 'static)) -> Option<rustls::Error> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(t) = tls_error_of(e) {
            return Some(t);
        }
        if let Some(inner) = e.downcast_ref::<io::Error>().and_then(|io| io.get_ref())
            && let Some(t) = tls_error_of(inner)
        {
            return Some(t);
        }
        next = e.source();
    }
    None
}

fn tls_error_of(e: &(dyn StdError + 'static)) -> Option<rustls::Error> {
    if let Some(t) = e.downcast_ref::<rustls::Error>() {
        return Some(t.clone());
    }
    if let Some(t) = e.downcast_ref::<Explained>() {
        return Some(t.source.clone());
    }
    alert_from_text(&e.to_string()).map(rustls::Error::AlertReceived)
}

/// The alert named in rustls' text for a received alert (`received fatal alert: <name>`).
fn alert_from_text(text: &str) -> Option<AlertDescription> {
    let (_, name) = text.split_once("received fatal alert: ")?;
    let name = name.split(|c: char| !c.is_ascii_alphanumeric()).next()?;
    Some(match name {
        "UnknownCA" => AlertDescription::UnknownCA,
        "DecryptError" => AlertDescription::DecryptError,
        "CertificateExpired" => AlertDescription::CertificateExpired,
        "CertificateRequired" => AlertDescription::CertificateRequired,
        "BadCertificate" => AlertDescription::BadCertificate,
        "CertificateUnknown" => AlertDescription::CertificateUnknown,
        "UnsupportedCertificate" => AlertDescription::UnsupportedCertificate,
        "CertificateRevoked" => AlertDescription::CertificateRevoked,
        "AccessDenied" => AlertDescription::AccessDenied,
        _ => return None,
    })
}

/// The cause of a rustls error (whose side it concerns follows from the error: an alert
/// received is the peer's verdict on us, an invalid certificate ours on the peer).
pub fn cause(e: &rustls::Error) -> Cause {
    #[allow(deprecated)] // BadSignature: older webpki versions report a wrong signer this way.
    match e {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                Cause::PeerUnknownCa
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => Cause::PeerExpired,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Cause::PeerWrongName
            }
            _ => Cause::PeerBadCertificate,
        },
        rustls::Error::NoCertificatesPresented => Cause::PeerNoCertificate,
        rustls::Error::AlertReceived(a) => match a {
            AlertDescription::UnknownCA | AlertDescription::DecryptError => Cause::UsUnknownCa,
            AlertDescription::CertificateExpired => Cause::UsExpired,
            AlertDescription::CertificateRequired => Cause::UsNoCertificate,
            AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::AccessDenied => Cause::UsBadCertificate,
            // A rustls server answers plaintext with a TLS alert the plaintext client cannot
            // read; a TLS client sees this only from a server that got something odd.
            _ => Cause::Other,
        },
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            Cause::NotTls
        }
        _ => Cause::Other,
    }
}

/// One sentence: who refused whom, why, and what to change. `peer` names the other end (an
/// address, a remote's name); the rustls error's own text closes the sentence in brackets.
pub fn explain(e: &rustls::Error, side: Side, peer: &str) -> String {
    let why = match (side, cause(e)) {
        (Side::Server, Cause::PeerUnknownCa) => format!(
            "refused client {peer}: its certificate is not issued by a CA in our ca.crt (unknown CA; another trust domain or PKI?); issue its certificate from our CA, or add its CA to our ca.crt"
        ),
        (Side::Client, Cause::PeerUnknownCa) => format!(
            "refused server {peer}: its certificate is not issued by a CA we trust (unknown CA; another trust domain or PKI?); give the CA that issued it (RemoteRegistry tlsConfig.serverCA, or our ca.crt)"
        ),
        (Side::Server, Cause::PeerExpired) => format!(
            "refused client {peer}: its certificate is expired or not valid yet; renew it (`xcc certs issue`, or cert-manager) or check its clock"
        ),
        (Side::Client, Cause::PeerExpired) => format!(
            "refused server {peer}: its certificate is expired or not valid yet; renew the server's certificate or check the clocks"
        ),
        (_, Cause::PeerWrongName) => format!(
            "refused server {peer}: its certificate does not carry the name we asked for (name mismatch); set the server name we verify (RemoteRegistry tlsConfig.serverName, `xcc admin --server-name`) to a DNS name on its certificate, or reissue it with `--dns <name>`"
        ),
        (Side::Server, Cause::PeerBadCertificate) => {
            format!("refused client {peer}: its certificate is unusable")
        }
        (Side::Client, Cause::PeerBadCertificate) => {
            format!("refused server {peer}: its certificate is unusable")
        }
        (_, Cause::PeerNoCertificate) => format!(
            "refused client {peer}: it presented no certificate; every xcc port requires mutual TLS with a certificate from our CA"
        ),
        (Side::Server, Cause::UsUnknownCa) => format!(
            "client {peer} refused our certificate: it does not trust the CA that issued it (unknown CA); give it our CA (its ca.crt, or its RemoteRegistry tlsConfig.serverCA)"
        ),
        (Side::Client, Cause::UsUnknownCa) => format!(
            "server {peer} refused our certificate: it does not trust the CA that issued it (unknown CA; another trust domain or PKI?); add our CA to the server's ca.crt, or use a certificate from its CA"
        ),
        (Side::Server, Cause::UsExpired) => format!(
            "client {peer} refused our certificate as expired or not valid yet; renew our certificate (--tls-dir) or check the clocks"
        ),
        (Side::Client, Cause::UsExpired) => format!(
            "server {peer} refused our certificate as expired or not valid yet; renew our certificate (--tls-dir) or check the clocks"
        ),
        (Side::Server, Cause::UsBadCertificate) => format!(
            "client {peer} refused our certificate (typically: it dialled a name our certificate does not carry; reissue ours with that `--dns` name, or have it verify one we carry)"
        ),
        (Side::Client, Cause::UsBadCertificate) => {
            format!("server {peer} refused our certificate")
        }
        (Side::Server, Cause::UsNoCertificate) => {
            format!("client {peer} wants a certificate from us and got none")
        }
        (Side::Client, Cause::UsNoCertificate) => format!(
            "server {peer} requires a client certificate and we sent none; give one issued by its CA (--tls-dir)"
        ),
        (Side::Server, Cause::NotTls) => format!(
            "client {peer} does not speak TLS: plaintext (HTTP, or gRPC without TLS) sent to a TLS port; every xcc port is mutual TLS"
        ),
        (Side::Client, Cause::NotTls) => format!(
            "server {peer} does not answer TLS: is it a plaintext port (metrics and probes, DNS) rather than an xcc Hamlet or admin port?"
        ),
        (Side::Server, Cause::Other) => format!("TLS with client {peer} failed"),
        (Side::Client, Cause::Other) => format!("TLS with server {peer} failed"),
    };
    format!("{why} [{e}]")
}

/// An error that carries its explanation: its `Display` is the sentence of [`explain`], and its
/// source the rustls error.
#[derive(Debug)]
pub struct Explained {
    text: String,
    source: rustls::Error,
}

impl Explained {
    /// Explain `source`, seen on `side` talking to `peer`.
    pub fn new(source: rustls::Error, side: Side, peer: &str) -> Self {
        Self {
            text: explain(&source, side, peer),
            source,
        }
    }

    /// The rustls error explained.
    pub fn tls_error(&self) -> &rustls::Error {
        &self.source
    }
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl StdError for Explained {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.source)
    }
}

/// If `e` (or its source chain) holds a TLS failure, its explanation; an [`Explained`] in the
/// chain is used as it is.
pub fn explain_chain(e: &(dyn StdError + 'static), side: Side, peer: &str) -> Option<String> {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(x) = e.downcast_ref::<Explained>() {
            return Some(x.to_string());
        }
        if let Some(x) = e
            .downcast_ref::<io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<Explained>())
        {
            return Some(x.to_string());
        }
        next = e.source();
    }
    find_tls_error(e).map(|t| explain(&t, side, peer))
}

/// How long identical failures are counted before they are logged again.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(60);

/// At most this many distinct failures are tracked; beyond that the oldest are forgotten (and
/// logged again when they recur).
const MAX_TRACKED: usize = 256;

/// Keeps a storm of identical failures to one line per [`REPEAT_WINDOW`]: the first occurrence is
/// logged, repeats within the window are counted, and the next occurrence after it is logged
/// with that count.
#[derive(Default)]
pub struct Repeats {
    seen: Mutex<HashMap<String, (Instant, u64)>>,
}

impl Repeats {
    /// Whether to log `key` now, and how many identical ones were held back since it was last
    /// logged.
    pub fn check(&self, key: &str) -> Option<u64> {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: &str, now: Instant) -> Option<u64> {
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((since, held)) = seen.get_mut(key) {
            if now.saturating_duration_since(*since) < REPEAT_WINDOW {
                *held += 1;
                return None;
            }
            let repeats = *held;
            *since = now;
            *held = 0;
            return Some(repeats);
        }
        if seen.len() >= MAX_TRACKED {
            seen.retain(|_, (since, _)| now.saturating_duration_since(*since) < REPEAT_WINDOW);
            if seen.len() >= MAX_TRACKED {
                seen.clear();
            }
        }
        seen.insert(key.to_owned(), (now, 0));
        Some(0)
    }
}

/// " (N more like it since the last report)" for a count from [`Repeats::check`] (empty for 0).
pub fn repeats_suffix(held: u64) -> String {
    if held == 0 {
        String::new()
    } else {
        format!(" ({held} more like it since the last report)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_side_says_who_refused_whom() {
        let unknown = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
        assert!(
            explain(&unknown, Side::Server, "10.0.0.1:5000")
                .starts_with("refused client 10.0.0.1:5000: its certificate is not issued by a CA in our ca.crt (unknown CA")
        );
        assert!(
            explain(&unknown, Side::Client, "remote east (127.0.0.1:8443)")
                .starts_with("refused server remote east (127.0.0.1:8443): its certificate is not issued by a CA we trust")
        );
        let alert = rustls::Error::AlertReceived(AlertDescription::UnknownCA);
        assert!(
            explain(&alert, Side::Client, "x")
                .starts_with("server x refused our certificate: it does not trust the CA")
        );
        assert!(
            explain(&alert, Side::Server, "x")
                .starts_with("client x refused our certificate: it does not trust the CA")
        );
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::Expired),
                Cause::PeerExpired,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
                Cause::PeerWrongName,
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateExpired),
                Cause::UsExpired,
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::BadCertificate),
                Cause::UsBadCertificate,
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
                Cause::UsNoCertificate,
            ),
            (
                rustls::Error::NoCertificatesPresented,
                Cause::PeerNoCertificate,
            ),
            (
                rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType),
                Cause::NotTls,
            ),
        ];
        for (e, want) in cases {
            assert_eq!(cause(&e), want, "{e}");
        }
        // The rustls text closes the sentence.
        assert!(explain(&unknown, Side::Client, "x").ends_with(&format!("[{unknown}]")));
    }

    #[test]
    fn the_chain_is_searched_through_io_errors() {
        let tls = rustls::Error::AlertReceived(AlertDescription::UnknownCA);
        let io = io::Error::new(io::ErrorKind::InvalidData, tls.clone());
        #[derive(Debug)]
        struct Outer(io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("transport error")
            }
        }
        impl StdError for Outer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                Some(&self.0)
            }
        }
        let outer = Outer(io);
        assert_eq!(find_tls_error(&outer), Some(tls.clone()));
        // Kept only as text by a layer on the way.
        let text = Outer(io::Error::other(format!("{tls}")));
        assert_eq!(find_tls_error(&text), Some(tls.clone()));
        assert_eq!(
            explain_chain(&outer, Side::Client, "east"),
            Some(explain(&tls, Side::Client, "east"))
        );
        let plain = Outer(io::Error::other("connection refused"));
        assert_eq!(explain_chain(&plain, Side::Client, "east"), None);
        // An explanation made where the address was known wins.
        let made = Explained::new(tls.clone(), Side::Client, "127.0.0.1:1");
        let outer = Outer(io::Error::new(io::ErrorKind::InvalidData, made));
        assert_eq!(
            explain_chain(&outer, Side::Client, "east"),
            Some(explain(&tls, Side::Client, "127.0.0.1:1"))
        );
    }

    #[test]
    fn repeats_are_counted_and_reported_once_a_window() {
        let r = Repeats::default();
        let t0 = Instant::now();
        assert_eq!(r.check_at("a", t0), Some(0));
        assert_eq!(r.check_at("a", t0 + Duration::from_secs(1)), None);
        assert_eq!(r.check_at("a", t0 + Duration::from_secs(2)), None);
        assert_eq!(r.check_at("b", t0 + Duration::from_secs(2)), Some(0));
        assert_eq!(r.check_at("a", t0 + REPEAT_WINDOW), Some(2));
        assert_eq!(r.check_at("a", t0 + REPEAT_WINDOW), None);
        assert_eq!(repeats_suffix(0), "");
        assert_eq!(repeats_suffix(2), " (2 more like it since the last report)");
    }
}

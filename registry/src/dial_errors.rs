//! What a client of ours (an import, the parent link, the admin CLI) says when a call fails: a
//! TLS failure explained ([`xcc_certs::explain`]), a server that does not offer the service asked
//! for named as the likely wrong port, anything else as the gRPC status.

use xcc_certs::explain::{Side, cause, explain_chain, find_tls_error};

/// A failed call to `peer` (how to name the server: a remote's name and address) that wanted
/// `service` (e.g. "the Hamlet API"): the text to report and, for a TLS or wrong-port failure
/// (reported at WARN, once per [`xcc_certs::explain::REPEAT_WINDOW`]), the key under which
/// repeats of it are counted: the cause, not the text, which may hold a time (an expired
/// certificate's "… seconds ago").
pub fn status_words(status: &tonic::Status, peer: &str, service: &str) -> (String, Option<String>) {
    if let Some(tls) = find_tls_error(status) {
        let text = explain_chain(status, Side::Client, peer).unwrap_or_default();
        return (text, Some(format!("{:?}", cause(&tls))));
    }
    if status.code() == tonic::Code::Unimplemented {
        let said = match status.message() {
            "" => String::new(),
            m => format!(" ({m})"),
        };
        return (
            format!(
                "{peer} answers gRPC over TLS but does not offer {service}{said}: is it another xcc port (Hamlet/federation --listen, admin --admin-listen)?"
            ),
            Some("unimplemented".to_owned()),
        );
    }
    (format!("{:?}: {}", status.code(), status.message()), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_and_wrong_port_are_named() {
        let tls = rustls::Error::AlertReceived(rustls::AlertDescription::UnknownCA);
        let mut status = tonic::Status::unknown("transport error");
        status.set_source(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            tls,
        )));
        let (text, key) = status_words(&status, "remote east (127.0.0.1:8443)", "the Hamlet API");
        assert_eq!(key.as_deref(), Some("UsUnknownCa"));
        assert!(
            text.starts_with("server remote east (127.0.0.1:8443) refused our certificate: it does not trust the CA"),
            "{text}"
        );
        let (text, key) = status_words(
            &tonic::Status::unimplemented("Operation is not implemented or not supported"),
            "127.0.0.1:8443",
            "the admin API",
        );
        assert_eq!(key.as_deref(), Some("unimplemented"));
        assert!(
            text.starts_with(
                "127.0.0.1:8443 answers gRPC over TLS but does not offer the admin API"
            ),
            "{text}"
        );
        let (text, key) = status_words(&tonic::Status::unavailable("down"), "x", "y");
        assert_eq!((text.as_str(), key), ("Unavailable: down", None));
    }
}

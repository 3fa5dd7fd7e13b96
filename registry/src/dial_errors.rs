//! What a client of ours (an import, the parent link, the admin CLI) says when a call fails: a
//! TLS failure explained ([`xcc_certs::explain`]), a server that does not offer the service asked
//! for named as the likely wrong port, anything else as the gRPC status.

use xcc_certs::explain::{Side, explain_chain};

/// A failed call to `peer` (how to name the server: a remote's name and address) that wanted
/// `service` (e.g. "the Hamlet API"): the text to report, and whether it is a TLS or wrong-port
/// failure (reported at WARN, once per [`xcc_certs::explain::REPEAT_WINDOW`]).
pub fn status_words(status: &tonic::Status, peer: &str, service: &str) -> (String, bool) {
    if let Some(text) = explain_chain(status, Side::Client, peer) {
        return (text, true);
    }
    if status.code() == tonic::Code::Unimplemented {
        return (
            format!(
                "{peer} answers gRPC over TLS but does not offer {service} ({}): is it another xcc port (Hamlet/federation --listen, admin --admin-listen)?",
                status.message()
            ),
            true,
        );
    }
    (format!("{:?}: {}", status.code(), status.message()), false)
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
        let (text, loud) = status_words(&status, "remote east (127.0.0.1:8443)", "the Hamlet API");
        assert!(loud);
        assert!(
            text.starts_with("server remote east (127.0.0.1:8443) refused our certificate: it does not trust the CA"),
            "{text}"
        );
        let (text, loud) = status_words(
            &tonic::Status::unimplemented("Operation is not implemented or not supported"),
            "127.0.0.1:8443",
            "the admin API",
        );
        assert!(loud);
        assert!(
            text.starts_with(
                "127.0.0.1:8443 answers gRPC over TLS but does not offer the admin API"
            ),
            "{text}"
        );
        let (text, loud) = status_words(&tonic::Status::unavailable("down"), "x", "y");
        assert_eq!((text.as_str(), loud), ("Unavailable: down", false));
    }
}

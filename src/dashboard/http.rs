//! The dashboard's HTTP side: the page's files (compiled in: no CDN, no external font), the
//! current document (`/api/state`) and its updates as Server-Sent Events (`/api/events`).
//!
//! Only GET (and HEAD). Every response forbids framing and any script, style or connection
//! not from this server (Content-Security-Policy), and a request whose `Host` is a DNS name
//! other than `localhost` is refused: a web page elsewhere could otherwise point a name of its
//! own at 127.0.0.1 (DNS rebinding) and read the dashboard from the operator's browser.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const INDEX_HTML: &str = include_str!("assets/index.html");
const APP_JS: &str = include_str!("assets/app.js");
const APP_CSS: &str = include_str!("assets/app.css");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

#[derive(Clone)]
struct Shared {
    page: watch::Receiver<Arc<str>>,
    cancel: CancellationToken,
}

pub fn router(page: watch::Receiver<Arc<str>>, cancel: CancellationToken) -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
        .route(
            "/favicon.svg",
            get(|| async { asset("image/svg+xml", FAVICON_SVG) }),
        )
        .route("/api/state", get(state))
        .route("/api/events", get(events))
        .with_state(Shared { page, cancel })
        .layer(axum::middleware::from_fn(guard))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn state(axum::extract::State(s): axum::extract::State<Shared>) -> Response {
    let json = s.page.borrow().clone();
    (
        [(header::CONTENT_TYPE, "application/json")],
        json.to_string(),
    )
        .into_response()
}

/// The current document, then each new one, until the dashboard stops.
async fn events(axum::extract::State(s): axum::extract::State<Shared>) -> Response {
    let stream = tokio_stream::wrappers::WatchStream::new(s.page)
        .map(|json| Ok::<_, Infallible>(Event::default().event("state").data(&*json)))
        .take_until(s.cancel.cancelled_owned());
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Whether a `Host` header names this machine by address or as `localhost` (never by a DNS
/// name someone else controls).
pub fn host_allowed(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        // [v6]:port or [v6]
        Some(rest) => match rest.split_once(']') {
            Some((v6, port)) => {
                return v6.parse::<std::net::Ipv6Addr>().is_ok()
                    && (port.is_empty() || port.strip_prefix(':').is_some_and(is_port));
            }
            None => return false,
        },
        None => match host.rsplit_once(':') {
            Some((name, port)) if is_port(port) => name,
            Some(_) => return false,
            None => host,
        },
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

fn is_port(p: &str) -> bool {
    !p.is_empty() && p.parse::<u16>().is_ok()
}

async fn guard(request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let mut response = if host_allowed(host) {
        next.run(request).await
    } else {
        (
            StatusCode::FORBIDDEN,
            "xcc dashboard: open it by address (http://127.0.0.1:<port>/) or as localhost; \
             other host names are refused (DNS rebinding)\n",
        )
            .into_response()
    };
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_SECURITY_POLICY, CSP),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn only_addresses_and_localhost_are_accepted_as_host() {
        for ok in [
            "127.0.0.1:9445",
            "127.0.0.1",
            "localhost:9445",
            "LOCALHOST",
            "[::1]:9445",
            "[::1]",
            "10.0.0.5:80",
        ] {
            assert!(host_allowed(ok), "{ok}");
        }
        for refused in [
            "",
            "evil.example:9445",
            "localhost.evil.example",
            "127.0.0.1.nip.io:9445",
            "[::1",
            "[::1]x",
            "127.0.0.1:",
            "127.0.0.1:99999",
            "[evil]:80",
        ] {
            assert!(!host_allowed(refused), "{refused}");
        }
    }
}

//! `xcc dashboard`: a read-only web page over the admin API, served on loopback.
//!
//! What flows: each registry named with `--addr` is read with the operator's admin certificate
//! (the TLS flags of `xcc admin`) by one task ([`source`]): its catalog live from the admin
//! `Watch` stream, its tree, peers and grants re-read on every catalog change and every
//! `--refresh-seconds`. The tasks write into one [`model::Model`]; a renderer turns it into one
//! JSON document ([`model::Model::render`]) and publishes it on a `watch` channel, which the
//! page's Server-Sent Events stream forwards ([`http`]). The page itself (HTML, CSS, JS) is
//! compiled into the binary; it builds its DOM from that JSON with `textContent` only.
//!
//! Read-only: the page can only GET, and the dashboard calls only the admin API's List, Get and
//! Watch methods (never Resolve, which records grants).

mod http;
pub mod model;
mod source;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::args::TlsArgs;

#[derive(Args, Debug)]
pub struct DashboardArgs {
    /// Admin API of a registry to show (host:port). Repeat it (or separate with commas) for
    /// each registry of the federation the page should show.
    #[arg(
        long = "addr",
        env = "XCC_ADMIN_ADDR",
        default_value = "127.0.0.1:9443",
        value_delimiter = ','
    )]
    pub addrs: Vec<String>,
    /// Name to verify on each registry's certificate (default: the host of its --addr).
    #[arg(long, env = "XCC_ADMIN_SERVER_NAME")]
    pub server_name: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Where the page is served: a loopback address (port 0: any free port). Another address
    /// needs --allow-non-loopback.
    #[arg(long, env = "XCC_DASHBOARD_LISTEN", default_value = "127.0.0.1:9445")]
    pub listen: SocketAddr,
    /// Serve on an address that is not loopback. Dangerous: the page has no login, so anyone
    /// who can reach the address reads what the admin certificate reads.
    #[arg(long)]
    pub allow_non_loopback: bool,
    /// How often each registry's tree, peers and grants are re-read (the catalog is live).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub refresh_seconds: u64,
}

/// Why the dashboard will not serve on an address.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ListenError {
    #[error(
        "--listen {0} is not a loopback address: the dashboard has no login of its own, so anyone \
         who can reach {0} would read the federation with your admin certificate. Serve on \
         127.0.0.1 (and reach it through an SSH tunnel or `kubectl port-forward`), or pass \
         --allow-non-loopback if every client of that address may see it"
    )]
    NotLoopback(SocketAddr),
}

/// Whether `listen` may be served: loopback always; another address only when allowed, and
/// then with the warning to print.
pub fn check_listen(
    listen: SocketAddr,
    allow_non_loopback: bool,
) -> Result<Option<String>, ListenError> {
    if listen.ip().is_loopback() {
        Ok(None)
    } else if allow_non_loopback {
        Ok(Some(format!(
            "serving the dashboard on {listen}, which is not loopback (--allow-non-loopback): it \
             has no login, and anyone who can reach this address reads every registry shown here \
             with your admin certificate"
        )))
    } else {
        Err(ListenError::NotLoopback(listen))
    }
}

/// The shortest pause between two renders: a burst of catalog events is drawn once, and a
/// single event reaches the page within this (the page must show an export within 1 s).
const RENDER_EVERY: Duration = Duration::from_millis(50);

pub async fn run(args: DashboardArgs) -> anyhow::Result<()> {
    if let Some(warning) = check_listen(args.listen, args.allow_non_loopback)? {
        tracing::warn!("{warning}");
        eprintln!("warning: {warning}");
    }
    if args.addrs.is_empty() {
        anyhow::bail!("no registry to show: give --addr");
    }
    let tls = xcc_certs::reload::ReloadingTls::load(args.tls.files()?)?;
    let cancel = CancellationToken::new();
    let model = Arc::new(Mutex::new(model::Model::new(&args.addrs)));
    let changed = Arc::new(tokio::sync::Notify::new());
    let (pages, page) = tokio::sync::watch::channel(Arc::<str>::from(
        model::lock(&model).render(std::time::SystemTime::now()),
    ));

    let mut tasks = tokio::task::JoinSet::new();
    for (index, addr) in args.addrs.iter().enumerate() {
        tasks.spawn(source::run(
            source::Source {
                index,
                addr: addr.clone(),
                server_name: args.server_name.clone(),
                tls: tls.clone(),
                refresh: Duration::from_secs(args.refresh_seconds),
                model: model.clone(),
                changed: changed.clone(),
            },
            cancel.clone(),
        ));
    }
    {
        let (model, changed, cancel) = (model.clone(), changed.clone(), cancel.clone());
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = changed.notified() => {}
                }
                let json = model::lock(&model).render(std::time::SystemTime::now());
                pages.send_replace(Arc::from(json));
                // Coalesce a burst: what changes meanwhile is drawn by the next render.
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(RENDER_EVERY) => {}
                }
            }
        });
    }

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding the dashboard to {}", args.listen))?;
    let local = listener.local_addr()?;
    // The one line a script (and the tests) read: where the page is.
    println!("xcc dashboard: http://{local}/");
    let server = {
        let cancel = cancel.clone();
        axum::serve(listener, http::router(page, cancel.clone()))
            .with_graceful_shutdown(async move { cancel.cancelled().await })
    };
    let result = tokio::select! {
        r = server => r.context("serving the dashboard"),
        _ = tokio::signal::ctrl_c() => Ok(()),
        Some(done) = tasks.join_next() => match done {
            Ok(()) => Err(anyhow::anyhow!("a dashboard task stopped")),
            Err(e) => Err(anyhow::anyhow!("a dashboard task failed: {e}")),
        },
    };
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_is_served_unless_explicitly_allowed() {
        let at = |s: &str| s.parse::<SocketAddr>().expect("literal");
        assert_eq!(check_listen(at("127.0.0.1:9445"), false), Ok(None));
        assert_eq!(check_listen(at("[::1]:0"), false), Ok(None));
        let err = check_listen(at("0.0.0.0:9445"), false).expect_err("refused");
        assert_eq!(err, ListenError::NotLoopback(at("0.0.0.0:9445")));
        assert!(err.to_string().starts_with(
            "--listen 0.0.0.0:9445 is not a loopback address: the dashboard has no login"
        ));
        let warning = check_listen(at("10.1.2.3:9445"), true)
            .expect("allowed")
            .expect("with a warning");
        assert!(
            warning.contains("anyone who can reach this address"),
            "{warning}"
        );
    }
}

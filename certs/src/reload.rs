//! Reloadable TLS material: three PEM files (`ca.crt`, `tls.crt`, `tls.key`) go in, validated
//! [`TlsMaterial`] with ready-built rustls configurations comes out on a `watch` channel.
//!
//! New material is published only after it passed every check (PEM parses, key matches the leaf, the leaf
//! chains to the CA bundle and is currently valid, the leaf carries the same identity as before). A failed
//! reload is
//! logged and counted, and the last good material stays in service. Consumers call
//! [`ReloadingTls::server_config`] / [`ReloadingTls::client_config`] per connection, so every new
//! connection uses the latest certificate; established connections are not touched.
//!
//! Change detection ([`ReloadingTls::spawn_watcher`]) combines filesystem notifications on the parent
//! directories (a Kubernetes Secret volume swaps a `..data` symlink, so individual file watches would go
//! stale) with a periodic content comparison as a fallback for filesystems without notifications.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rustls::client::WantsClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{
    CertificateError, ClientConfig, ConfigBuilder, InconsistentKeys, RootCertStore, ServerConfig,
    WantsVerifier,
};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::error::CertError;
use crate::identity::{Identity, parse_identity};
use crate::pki::{CA_CERT_FILE, TLS_CERT_FILE, TLS_KEY_FILE, display, pem_key_error, read_file};
use crate::{ALPN_H2, provider};

/// After a filesystem event, wait this long for further events before reloading, so that a writer
/// replacing `tls.crt` and `tls.key` one after the other is read as one change (a kubelet Secret update is
/// a single symlink swap and needs no such grace).
const DEBOUNCE: Duration = Duration::from_millis(200);

/// Longest advance warning of an expiring certificate: a month gives an operator time to act on
/// a certificate that is not renewed automatically.
const MAX_EXPIRY_WARNING: time::Duration = time::Duration::days(30);

/// Shortest advance warning: a certificate with less than a week left is always reported, however
/// short its lifetime (one that lives under a week is reported once per certificate, at load).
pub const MIN_EXPIRY_WARNING: time::Duration = time::Duration::days(7);

/// How close a certificate is to its expiry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    /// More than the warning period left.
    Valid,
    /// Within the warning period: less than a third of its lifetime left (the point where
    /// cert-manager, by default, renews a certificate, so one this close should already have
    /// been replaced) or less than 30 days, whichever is shorter; and always once less than
    /// 7 days are left.
    Soon,
    /// Past `notAfter`: peers refuse it.
    Expired,
}

/// Where a certificate valid from `not_before` to `not_after` stands at `now`.
pub fn expiry_at(
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
    now: time::OffsetDateTime,
) -> Expiry {
    if now >= not_after {
        return Expiry::Expired;
    }
    if now >= warning_from(not_before, not_after) {
        Expiry::Soon
    } else {
        Expiry::Valid
    }
}

/// When a certificate valid from `not_before` to `not_after` enters its warning period
/// ([`Expiry::Soon`]).
pub fn warning_from(
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
) -> time::OffsetDateTime {
    let lifetime: time::Duration = not_after - not_before;
    let warning = (lifetime / 3_u32)
        .min(MAX_EXPIRY_WARNING)
        .max(MIN_EXPIRY_WARNING);
    not_after - warning
}

/// The next moment after `now` at which a certificate valid from `not_before` to `not_after`
/// changes [`Expiry`] state (none once expired).
pub fn next_expiry_change(
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
    now: time::OffsetDateTime,
) -> Option<time::OffsetDateTime> {
    let soon = warning_from(not_before, not_after);
    if now < soon {
        Some(soon)
    } else if now < not_after {
        Some(not_after)
    } else {
        None
    }
}

/// Where the PEM files live. Same layout as a cert-manager Secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle used to verify peers (one or more certificates; several during CA rotation).
    pub ca: PathBuf,
    /// Our certificate: the leaf first, optionally followed by intermediates.
    pub cert: PathBuf,
    /// The leaf's private key.
    pub key: PathBuf,
}

impl TlsFiles {
    /// `dir/ca.crt`, `dir/tls.crt`, `dir/tls.key`.
    pub fn in_dir(dir: &Path) -> TlsFiles {
        TlsFiles {
            ca: dir.join(CA_CERT_FILE),
            cert: dir.join(TLS_CERT_FILE),
            key: dir.join(TLS_KEY_FILE),
        }
    }
}

/// One validated generation of TLS material.
pub struct TlsMaterial {
    /// Our own identity, from the leaf certificate.
    pub identity: Identity,
    /// Trust anchors built from the CA bundle.
    pub roots: Arc<RootCertStore>,
    /// The CA bundle as loaded.
    pub ca_certs: Vec<CertificateDer<'static>>,
    /// Our certificate chain and signing key.
    pub certified_key: Arc<CertifiedKey>,
    /// Start of the leaf certificate's validity.
    pub not_before: time::OffsetDateTime,
    /// Expiry of the leaf certificate.
    pub not_after: time::OffsetDateTime,
    /// Starts at 1 for the initial load and increases by one with every successful reload.
    pub generation: u64,
    server_config: Arc<ServerConfig>,
    client_config: Arc<ClientConfig>,
    contents: FileContents,
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("identity", &self.identity)
            .field("not_after", &self.not_after)
            .field("generation", &self.generation)
            .field("ca_certs", &self.ca_certs.len())
            .finish_non_exhaustive()
    }
}

/// Raw file contents, compared to detect changes. No `Debug`: it holds the private key.
#[derive(Clone, PartialEq, Eq)]
struct FileContents {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl FileContents {
    fn read(files: &TlsFiles) -> Result<Self, CertError> {
        Ok(Self {
            ca: read_file(&files.ca)?,
            cert: read_file(&files.cert)?,
            key: read_file(&files.key)?,
        })
    }
}

/// TLS material that follows its files on disk. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct ReloadingTls {
    inner: Arc<Inner>,
}

struct Inner {
    files: TlsFiles,
    tx: watch::Sender<Arc<TlsMaterial>>,
    /// Serialises reloads and remembers the last rejected input, so the watcher reports a broken file once
    /// rather than on every poll.
    last_failure: Mutex<Option<Failure>>,
    builders: Builders,
    metrics: Metrics,
    /// The last expiry state logged, with the generation it was about: each state of each
    /// generation is reported once, not on every poll.
    expiry_reported: Mutex<Option<(u64, Expiry)>>,
    /// The same for the earliest-expiring CA of the bundle.
    ca_expiry_reported: Mutex<Option<(u64, Expiry)>>,
}

/// What the last failed reload saw: the contents (if they could be read) and the error text.
struct Failure {
    contents: Option<FileContents>,
    error: String,
}

/// Provider and protocol versions, validated once; each material generation completes a clone.
struct Builders {
    server: ConfigBuilder<ServerConfig, WantsVerifier>,
    client: ConfigBuilder<ClientConfig, WantsVerifier>,
}

impl Builders {
    fn new() -> Result<Self, CertError> {
        let config = |e: rustls::Error| CertError::Config(e.to_string());
        // rustls' safe defaults: TLS 1.3 and TLS 1.2.
        Ok(Self {
            server: ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(config)?,
            client: ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(config)?,
        })
    }

    fn client_config(
        &self,
        roots: Arc<RootCertStore>,
        key: &Arc<CertifiedKey>,
    ) -> Arc<ClientConfig> {
        let builder: ConfigBuilder<ClientConfig, WantsClientCert> =
            self.client.clone().with_root_certificates(roots);
        let mut config =
            builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(key.clone())));
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Arc::new(config)
    }
}

#[derive(Clone)]
pub(crate) struct Metrics {
    reloads: Family<[(&'static str, &'static str); 1], Counter>,
    expiry: Gauge,
    /// `notAfter` of each CA of the bundle in service, by subject and serial.
    ca_expiry: Family<Vec<(String, String)>, Gauge>,
    handshake_failures: Family<[(&'static str, &'static str); 1], Counter>,
}

impl Metrics {
    fn new() -> Self {
        let metrics = Self {
            reloads: Family::default(),
            expiry: Gauge::default(),
            ca_expiry: Family::default(),
            handshake_failures: Family::default(),
        };
        // Create every series up front so dashboards see explicit zeros.
        for result in ["ok", "error"] {
            let _series = metrics.reloads.get_or_create(&[("result", result)]);
        }
        for reason in HANDSHAKE_FAILURE_REASONS {
            let _series = metrics
                .handshake_failures
                .get_or_create(&[("reason", reason)]);
        }
        metrics
    }

    /// One `xcc_ca_certificate_expiry_timestamp_seconds` series per CA of `material`'s bundle
    /// (the previous bundle's series go).
    fn set_ca_expiry(&self, material: &TlsMaterial) {
        self.ca_expiry.clear();
        for ca in ca_validity(&material.ca_certs) {
            self.ca_expiry
                .get_or_create(&vec![
                    ("subject".to_string(), ca.subject),
                    ("serial".to_string(), ca.serial),
                ])
                .set(ca.not_after.unix_timestamp());
        }
    }

    /// Counts a failed server-side handshake; `reason` is one of [`HANDSHAKE_FAILURE_REASONS`].
    pub(crate) fn handshake_failed(&self, reason: &'static str) {
        self.handshake_failures
            .get_or_create(&[("reason", reason)])
            .inc();
    }
}

/// One CA of a bundle: who it is and how long it is valid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaValidity {
    pub subject: String,
    pub serial: String,
    pub not_before: time::OffsetDateTime,
    pub not_after: time::OffsetDateTime,
}

/// The validity of each CA of a bundle (certificates that do not parse are left out: the
/// bundle was verified when it was loaded).
pub fn ca_validity(certs: &[CertificateDer<'static>]) -> Vec<CaValidity> {
    certs
        .iter()
        .filter_map(|der| {
            let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
            Some(CaValidity {
                subject: cert.subject().to_string(),
                serial: cert.raw_serial_as_string().replace(':', ""),
                not_before: cert.validity().not_before.to_datetime(),
                not_after: cert.validity().not_after.to_datetime(),
            })
        })
        .collect()
}

/// The validity of each CA of a PEM bundle (a RemoteRegistry's `serverCA`); nothing when it
/// does not parse (such a bundle is refused where it is used).
pub fn pem_ca_validity(pem: &[u8]) -> Vec<CaValidity> {
    parse_certs(pem, "CA bundle")
        .map(|certs| ca_validity(&certs))
        .unwrap_or_default()
}

/// Label values of `xcc_tls_handshake_failures_total`: TLS error, timeout, or a verified certificate that
/// yields no identity.
pub(crate) const HANDSHAKE_FAILURE_REASONS: [&str; 3] = ["tls", "timeout", "no_identity"];

impl ReloadingTls {
    /// Loads and validates the files: PEM parses, the key matches the leaf certificate, the leaf chains to a
    /// CA of `ca.crt` (webpki verification, client-auth usage, validity period) and carries a parsable
    /// [`Identity`]. This is blocking file I/O.
    pub fn load(files: TlsFiles) -> Result<Self, CertError> {
        let builders = Builders::new()?;
        let contents = FileContents::read(&files)?;
        let material = build_material(&files, &builders, contents, 1)?;
        let metrics = Metrics::new();
        metrics.expiry.set(material.not_after.unix_timestamp());
        metrics.set_ca_expiry(&material);
        tracing::info!(
            identity = %material.identity,
            not_after = %material.not_after,
            cert = %files.cert.display(),
            "loaded TLS material"
        );
        let (tx, _rx) = watch::channel(Arc::new(material));
        let tls = Self {
            inner: Arc::new(Inner {
                files,
                tx,
                last_failure: Mutex::new(None),
                builders,
                metrics,
                expiry_reported: Mutex::new(None),
                ca_expiry_reported: Mutex::new(None),
            }),
        };
        tls.check_expiry(time::OffsetDateTime::now_utc());
        Ok(tls)
    }

    /// Logs the expiry of the certificate in service when it is close (a warning) or past (an
    /// error), once per state and generation: called at load, after every reload and on every
    /// poll of the watcher, so a certificate that expires while in service is reported too.
    /// Returns the state when it was logged now.
    pub fn check_expiry(&self, now: time::OffsetDateTime) -> Option<Expiry> {
        self.check_ca_expiry(now);
        let material = self.current();
        let state = expiry_at(material.not_before, material.not_after, now);
        let mut reported = self
            .inner
            .expiry_reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let this = (material.generation, state);
        if state == Expiry::Valid || *reported == Some(this) {
            return None;
        }
        *reported = Some(this);
        let cert = display(&self.inner.files.cert);
        let remaining = material.not_after - now;
        if state == Expiry::Soon {
            tracing::warn!(
                identity = %material.identity,
                not_after = %material.not_after,
                hours_left = remaining.whole_hours(),
                %cert,
                "the serving certificate expires soon; renew it (it is reloaded from disk)"
            );
        } else {
            tracing::error!(
                identity = %material.identity,
                not_after = %material.not_after,
                %cert,
                "the serving certificate has expired; peers refuse it until it is renewed"
            );
        }
        Some(state)
    }

    /// Logs the earliest-expiring CA of the bundle when it is close to its expiry (a warning)
    /// or past it (an error), once per state and generation: every certificate it issued stops
    /// verifying then, whatever the leaves' own dates say. Returns the state when it was logged.
    pub fn check_ca_expiry(&self, now: time::OffsetDateTime) -> Option<Expiry> {
        let material = self.current();
        let first = ca_validity(&material.ca_certs)
            .into_iter()
            .min_by_key(|c| c.not_after)?;
        let state = expiry_at(first.not_before, first.not_after, now);
        let mut reported = self
            .inner
            .ca_expiry_reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let this = (material.generation, state);
        if state == Expiry::Valid || *reported == Some(this) {
            return None;
        }
        *reported = Some(this);
        let ca = display(&self.inner.files.ca);
        if state == Expiry::Soon {
            tracing::warn!(
                subject = %first.subject,
                serial = %first.serial,
                not_after = %first.not_after,
                hours_left = (first.not_after - now).whole_hours(),
                %ca,
                "a CA of the bundle expires soon: rotate it (docs/operations.md, Rotating the CA) before every certificate it issued stops verifying"
            );
        } else {
            tracing::error!(
                subject = %first.subject,
                serial = %first.serial,
                not_after = %first.not_after,
                %ca,
                "a CA of the bundle has expired: certificates it issued no longer verify"
            );
        }
        Some(state)
    }

    /// How long from `now` until the leaf or a CA of the bundle in service changes [`Expiry`]
    /// state (a little after it, so the check sees the new state; at most a day, after which it
    /// is computed again).
    fn until_next_expiry_change(&self, now: time::OffsetDateTime) -> Option<Duration> {
        let material = self.current();
        let next = ca_validity(&material.ca_certs)
            .into_iter()
            .map(|c| (c.not_before, c.not_after))
            .chain([(material.not_before, material.not_after)])
            .filter_map(|(from, to)| next_expiry_change(from, to, now))
            .min()?;
        let wait = (next - now).clamp(time::Duration::ZERO, time::Duration::DAY);
        Some(Duration::try_from(wait).unwrap_or_default() + Duration::from_millis(10))
    }

    /// The files this instance follows.
    pub fn files(&self) -> &TlsFiles {
        &self.inner.files
    }

    /// The material in service now.
    pub fn current(&self) -> Arc<TlsMaterial> {
        self.inner.tx.borrow().clone()
    }

    /// A receiver that is notified whenever new material is published.
    pub fn subscribe(&self) -> watch::Receiver<Arc<TlsMaterial>> {
        self.inner.tx.subscribe()
    }

    /// Our identity according to the current certificate.
    pub fn identity(&self) -> Identity {
        self.current().identity.clone()
    }

    /// Re-reads and re-validates the files now. `Ok(true)` if new material was published, `Ok(false)` if
    /// the files are unchanged. On error the last good material stays in service; the failure is logged
    /// and counted. Blocking file I/O: from async code, call it via `spawn_blocking`.
    pub fn reload_now(&self) -> Result<bool, CertError> {
        self.reload(false)
    }

    /// Like [`reload_now`](Self::reload_now), but silently skips input that already failed last time, so a
    /// broken file left on disk is reported once, not on every poll.
    fn reload_if_changed(&self) -> Result<bool, CertError> {
        self.reload(true)
    }

    fn reload(&self, skip_known_failure: bool) -> Result<bool, CertError> {
        let inner = &self.inner;
        let mut last_failure = inner
            .last_failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let current = self.current();
        let attempt = match FileContents::read(&inner.files) {
            Ok(contents) if contents == current.contents => {
                *last_failure = None;
                return Ok(false);
            }
            Ok(contents) => {
                let known = last_failure
                    .as_ref()
                    .is_some_and(|f| f.contents.as_ref() == Some(&contents));
                if skip_known_failure && known {
                    return Ok(false);
                }
                let generation = current.generation + 1;
                build_material(&inner.files, &inner.builders, contents.clone(), generation)
                    .and_then(|material| same_identity(&inner.files, &current, material))
                    .map_err(|e| (Some(contents), e))
            }
            Err(e) => {
                let known = last_failure
                    .as_ref()
                    .is_some_and(|f| f.contents.is_none() && f.error == e.to_string());
                if skip_known_failure && known {
                    return Ok(false);
                }
                Err((None, e))
            }
        };
        match attempt {
            Ok(material) => {
                *last_failure = None;
                inner
                    .metrics
                    .reloads
                    .get_or_create(&[("result", "ok")])
                    .inc();
                inner
                    .metrics
                    .expiry
                    .set(material.not_after.unix_timestamp());
                inner.metrics.set_ca_expiry(&material);
                tracing::info!(
                    identity = %material.identity,
                    not_after = %material.not_after,
                    generation = material.generation,
                    "reloaded TLS material"
                );
                inner.tx.send_replace(Arc::new(material));
                self.check_expiry(time::OffsetDateTime::now_utc());
                Ok(true)
            }
            Err((contents, e)) => {
                inner
                    .metrics
                    .reloads
                    .get_or_create(&[("result", "error")])
                    .inc();
                tracing::warn!(
                    error = %e,
                    generation = current.generation,
                    "TLS material reload failed; keeping the last good certificate"
                );
                *last_failure = Some(Failure {
                    contents,
                    error: e.to_string(),
                });
                Err(e)
            }
        }
    }

    /// Watches the files and reloads on change until `cancel` fires: filesystem notifications on the
    /// parent directories (debounced), plus a content comparison every `poll` as a fallback.
    ///
    /// Before returning, the directory watches are in place and the files have been compared once (blocking
    /// file I/O), so a change made at any point after [`load`](Self::load) is noticed. Must be called
    /// within a Tokio runtime.
    pub fn spawn_watcher(
        &self,
        poll: Duration,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        // Capacity 1: events only mean "look again"; a pending one already covers any newer ones.
        let (event_tx, events) = mpsc::channel::<()>(1);
        let watcher = match self.fs_watcher(event_tx) {
            Ok(watcher) => Some(watcher),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch certificate directories; relying on polling");
                None
            }
        };
        // Errors are logged and counted by reload itself.
        let _ = self.reload_if_changed();
        let tls = self.clone();
        tokio::spawn(async move { tls.watch(watcher, events, poll, cancel).await })
    }

    async fn watch(
        self,
        // Kept alive for the lifetime of the task: dropping it stops the notifications.
        _watcher: Option<notify::RecommendedWatcher>,
        mut events: mpsc::Receiver<()>,
        poll: Duration,
        cancel: CancellationToken,
    ) {
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + poll, poll);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The moment the leaf or a CA enters its warning period or expires is checked then,
            // not up to a poll later (a short-lived certificate could expire between polls).
            let change = self.until_next_expiry_change(time::OffsetDateTime::now_utc());
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
                _ = tokio::time::sleep(change.unwrap_or(Duration::MAX)), if change.is_some() => {}
                Some(()) = events.recv() => {
                    // Debounce: reload once the directories have been quiet for DEBOUNCE.
                    loop {
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            more = events.recv() => if more.is_none() { break },
                            _ = tokio::time::sleep(DEBOUNCE) => break,
                        }
                    }
                }
            }
            let tls = self.clone();
            // File reads and validation block; keep them off the async workers. Errors were logged and
            // counted by reload itself.
            if let Err(e) = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await {
                tracing::warn!(error = %e, "certificate reload task failed");
            }
            self.check_expiry(time::OffsetDateTime::now_utc());
        }
    }

    fn fs_watcher(&self, events: mpsc::Sender<()>) -> notify::Result<notify::RecommendedWatcher> {
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                match event {
                    // A full channel already holds a wake-up; a closed one means the watch task ended.
                    Ok(_) => {
                        let _ = events.try_send(());
                    }
                    Err(e) => tracing::debug!(error = %e, "certificate directory watch error"),
                }
            })?;
        let files = &self.inner.files;
        let dirs: BTreeSet<&Path> = [&files.ca, &files.cert, &files.key]
            .into_iter()
            .map(|file| match file.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            })
            .collect();
        for dir in dirs {
            watcher.watch(dir, RecursiveMode::NonRecursive)?;
        }
        Ok(watcher)
    }

    /// The server configuration of the current material: requires a client certificate verified against
    /// the CA bundle, ALPN `h2`, TLS 1.2 and 1.3. Built once per material generation.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.current().server_config.clone()
    }

    /// A client configuration presenting the current certificate and verifying the server against `roots`
    /// (default: our CA bundle), ALPN `h2`. With `roots == None` the configuration is cached per
    /// generation; with explicit roots it is built on each call (see [`TlsConnector`](crate::TlsConnector),
    /// which caches it).
    pub fn client_config(&self, roots: Option<Arc<RootCertStore>>) -> Arc<ClientConfig> {
        let current = self.current();
        match roots {
            None => current.client_config.clone(),
            Some(roots) => self
                .inner
                .builders
                .client_config(roots, &current.certified_key),
        }
    }

    /// Registers `xcc_certificate_reloads_total{result="ok|error"}`,
    /// `xcc_certificate_expiry_timestamp_seconds` (leaf `notAfter`, Unix seconds) and
    /// `xcc_tls_handshake_failures_total{reason="tls|timeout|no_identity"}` (server side, from
    /// [`tls_incoming`](crate::tls_incoming)). The initial load is not counted as a reload.
    pub fn register_metrics(&self, registry: &mut Registry) {
        let metrics = &self.inner.metrics;
        registry.register(
            "xcc_certificate_reloads",
            "Certificate reload attempts with changed files, by result",
            metrics.reloads.clone(),
        );
        registry.register(
            "xcc_certificate_expiry_timestamp_seconds",
            "Expiry (notAfter) of the certificate in service, Unix seconds",
            metrics.expiry.clone(),
        );
        registry.register(
            "xcc_ca_certificate_expiry_timestamp_seconds",
            "Expiry (notAfter) of each CA of the bundle in service, by subject and serial, Unix seconds",
            metrics.ca_expiry.clone(),
        );
        registry.register(
            "xcc_tls_handshake_failures",
            "Inbound TLS handshakes that did not yield a connection, by reason",
            metrics.handshake_failures.clone(),
        );
    }

    pub(crate) fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }
}

/// Parses and validates one generation. `contents` are the raw file bytes.
fn build_material(
    files: &TlsFiles,
    builders: &Builders,
    contents: FileContents,
    generation: u64,
) -> Result<TlsMaterial, CertError> {
    let (ca_file, cert_file, key_file) = (
        display(&files.ca),
        display(&files.cert),
        display(&files.key),
    );
    let ca_certs = parse_certs(&contents.ca, &ca_file)?;
    let roots = Arc::new(root_store(&ca_certs, &ca_file)?);
    let chain = parse_certs(&contents.cert, &cert_file)?;
    let key =
        PrivateKeyDer::from_pem_slice(&contents.key).map_err(|e| pem_key_error(e, &key_file))?;

    let provider = provider();
    let signing_key =
        provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| CertError::BadKey {
                file: key_file.clone(),
                detail: e.to_string(),
            })?;
    let certified_key = Arc::new(CertifiedKey::new(chain, signing_key));
    match certified_key.keys_match() {
        Ok(()) => {}
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::KeyMismatch)) => {
            return Err(CertError::KeyMismatch {
                key: key_file,
                cert: cert_file,
            });
        }
        Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {
            return Err(CertError::BadKey {
                file: key_file,
                detail: "cannot derive its public key to compare with the certificate".into(),
            });
        }
        Err(e) => {
            return Err(CertError::BadCertificate {
                file: cert_file,
                detail: e.to_string(),
            });
        }
    }
    let (leaf, intermediates) = match certified_key.cert.split_first() {
        Some(split) => split,
        None => return Err(CertError::NoCertificate { file: cert_file }),
    };

    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| CertError::Config(e.to_string()))?;
    verifier
        .verify_client_cert(leaf, intermediates, UnixTime::now())
        .map_err(|e| verify_error(e, &cert_file, &ca_file))?;
    let identity = parse_identity(leaf).map_err(|source| CertError::FileIdentity {
        file: cert_file.clone(),
        source,
    })?;
    let (_, x509) =
        x509_parser::parse_x509_certificate(leaf).map_err(|e| CertError::BadCertificate {
            file: cert_file.clone(),
            detail: e.to_string(),
        })?;
    let not_before = x509.validity().not_before.to_datetime();
    let not_after = x509.validity().not_after.to_datetime();

    let mut server_config = builders
        .server
        .clone()
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified_key.clone())));
    server_config.alpn_protocols = vec![ALPN_H2.to_vec()];
    let client_config = builders.client_config(roots.clone(), &certified_key);

    Ok(TlsMaterial {
        identity,
        roots,
        ca_certs,
        certified_key,
        not_before,
        not_after,
        generation,
        server_config: Arc::new(server_config),
        client_config,
        contents,
    })
}

/// Refuses new material whose identity differs from the material in service.
fn same_identity(
    files: &TlsFiles,
    current: &TlsMaterial,
    new: TlsMaterial,
) -> Result<TlsMaterial, CertError> {
    if new.identity == current.identity {
        return Ok(new);
    }
    let label = |id: &Identity| id.spiffe_id().unwrap_or_else(|| id.to_string());
    Err(CertError::IdentityChanged {
        file: display(&files.cert),
        from: label(&current.identity),
        to: label(&new.identity),
    })
}

/// All `CERTIFICATE` sections of a PEM file; at least one.
pub(crate) fn parse_certs(
    pem: &[u8],
    file: &str,
) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| CertError::Pem {
            file: file.to_owned(),
            source,
        })?;
    if certs.is_empty() {
        return Err(CertError::NoCertificate {
            file: file.to_owned(),
        });
    }
    Ok(certs)
}

/// A root store holding every certificate of the bundle; any unusable certificate is an error.
pub(crate) fn root_store(
    certs: &[CertificateDer<'static>],
    file: &str,
) -> Result<RootCertStore, CertError> {
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert.clone())
            .map_err(|source| CertError::BadCaCertificate {
                file: file.to_owned(),
                source,
            })?;
    }
    Ok(roots)
}

fn verify_error(e: rustls::Error, cert: &str, ca: &str) -> CertError {
    #[allow(deprecated)] // BadSignature: older webpki versions report a wrong signer this way.
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => CertError::NotSignedByCa {
            cert: cert.to_owned(),
            ca: ca.to_owned(),
        },
        rustls::Error::InvalidCertificate(
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. },
        ) => CertError::NotValidNow {
            cert: cert.to_owned(),
        },
        source => CertError::Untrusted {
            cert: cert.to_owned(),
            ca: ca.to_owned(),
            source,
        },
    }
}

#[cfg(test)]
mod tests;

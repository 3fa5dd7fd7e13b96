//! The measured registry, as a child process or in this process, and the exports it serves.

use super::*;

pub(crate) struct BenchPki {
    pub(crate) server: TlsFiles,
    pub(crate) consumer: TlsFiles,
}

impl BenchPki {
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Self> {
        xcc_certs::install_crypto_provider();
        let [server, consumer] =
            crate::common::localhost_pki(dir, [SERVER_CLUSTER, CONSUMER_CLUSTER])?;
        Ok(Self { server, consumer })
    }
}

pub(super) fn record(name: &str, fqdn: &str, addresses: &[String]) -> ServiceRecord {
    let mut annotations = BTreeMap::new();
    annotations.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceRecord {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NAMESPACE.into()),
            annotations: Some(annotations),
            ..Default::default()
        },
        spec: ServiceRecordSpec {
            fqdn: fqdn.into(),
            endpoints: addresses
                .iter()
                .map(|a| Endpoint {
                    address: a.clone(),
                    port: 443,
                })
                .collect(),
            ..Default::default()
        },
        status: None,
    }
}

/// `services - 1` ordinary services (two endpoints each), in one file's worth of records.
pub(crate) fn bulk_records(services: usize) -> Vec<ServiceRecord> {
    (1..services)
        .map(|i| {
            let name = format!("svc-{i:05}");
            let (hi, lo) = (i / 250, i % 250 + 1);
            // 250 per /24, 256 /24s per pair of /16s (10.1 and 10.2, then 10.3 and 10.4, ...):
            // valid addresses past 64,000 services.
            let (a, b) = (1 + 2 * (hi / 256), hi % 256);
            record(
                &name,
                &format!("{name}.{NAMESPACE}.xcc.test"),
                &[format!("10.{a}.{b}.{lo}"), format!("10.{}.{b}.{lo}", a + 1)],
            )
        })
        .collect()
}

pub(crate) fn hot_record(seq: u32) -> ServiceRecord {
    record(HOT_NAME, HOT_FQDN, &[hot_address(seq)])
}

pub(super) fn write_exports(state_dir: &Path, services: usize) -> anyhow::Result<()> {
    let exports = state_dir.join("exports");
    std::fs::create_dir_all(&exports).with_context(|| format!("creating {}", exports.display()))?;
    std::fs::create_dir_all(state_dir.join("tmp")).context("creating tmp/")?;
    let bulk = resources::to_yaml_documents(&bulk_records(services))?;
    let path = exports.join("bulk.yaml");
    std::fs::write(&path, bulk).with_context(|| format!("writing {}", path.display()))?;
    write_hot(state_dir, 0)?;
    Ok(())
}

/// Atomically replace `exports/hot.yaml` (temporary file outside the watched directory, its
/// mtime set a second back as `tar` or `cp -p` would, then rename): the registry sees a file
/// renamed into place after it was finished and applies the change at once, without the file
/// store's settle time. Returns the instant just before the rename.
pub(super) fn write_hot(state_dir: &Path, seq: u32) -> anyhow::Result<Instant> {
    let text = resources::to_yaml_documents(&[hot_record(seq)])?;
    let tmp = state_dir.join("tmp").join("hot.yaml");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::File::options()
        .write(true)
        .open(&tmp)
        .and_then(|f| f.set_modified(std::time::SystemTime::now() - Duration::from_secs(1)))
        .with_context(|| format!("setting the mtime of {}", tmp.display()))?;
    let dest = state_dir.join("exports").join("hot.yaml");
    let t0 = Instant::now();
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming onto {}", dest.display()))?;
    Ok(t0)
}

/// Kills the child registry when dropped (also on error paths).
pub(super) struct ChildGuard(pub(super) Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub(super) enum Backend {
    Child {
        child: ChildGuard,
        updates: ChildUpdates,
        log: PathBuf,
    },
    InProcess {
        registry: Box<Registry>,
        cancel: CancellationToken,
    },
    /// The transport floor in this process (`--server floor`).
    FloorInProcess(FloorServer),
}

/// How the bench makes an update in a child.
pub(super) enum ChildUpdates {
    /// An xcc registry watching its exports: rewrite `exports/hot.yaml` in this state directory.
    Exports(PathBuf),
    /// The floor server: one line with the sequence number on its stdin.
    Stdin(std::sync::Mutex<std::process::ChildStdin>),
}

/// What a child server is started with.
struct ChildSetup {
    /// A free port on loopback (bound, read and released: the child binds it a moment later).
    addr: SocketAddr,
    /// The directory of the server's certificate and key.
    tls_dir: PathBuf,
    /// The child's log (its stderr), in the work directory.
    log: PathBuf,
    log_file: std::fs::File,
    /// This executable.
    exe: PathBuf,
}

impl ChildSetup {
    fn new(tls: &TlsFiles, work_dir: &Path, what: &str, services: usize) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port")?
            .port();
        let tls_dir = tls
            .cert
            .parent()
            .context("the server certificate has no directory")?
            .to_path_buf();
        let log = work_dir.join(format!("{what}-{services}-{port}.log"));
        let log_file =
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        Ok(Self {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            tls_dir,
            log,
            log_file,
            exe: std::env::current_exe().context("locating the xcc executable")?,
        })
    }

    /// Starts this executable with the arguments `args` gives it (for this address and
    /// certificate directory), stdout discarded and stderr to the log: the child, its address
    /// and its log.
    fn spawn(
        self,
        stdin: Stdio,
        args: impl FnOnce(&mut Command, SocketAddr, &Path),
    ) -> anyhow::Result<(ChildGuard, SocketAddr, PathBuf)> {
        let mut cmd = Command::new(&self.exe);
        args(&mut cmd, self.addr, &self.tls_dir);
        let child = cmd
            .stdin(stdin)
            .stdout(Stdio::null())
            .stderr(Stdio::from(self.log_file))
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        Ok((ChildGuard(child), self.addr, self.log))
    }
}

pub(super) struct Server {
    pub(super) addr: SocketAddr,
    pub(super) backend: Backend,
}

pub(super) struct Rss {
    pub(super) rss_mib: f64,
    pub(super) hwm_mib: f64,
}

impl Server {
    pub(super) fn spawn_child(
        tls: &TlsFiles,
        state_dir: &Path,
        work_dir: &Path,
        services: usize,
        log_filter: &str,
    ) -> anyhow::Result<Self> {
        write_hot(state_dir, 0)?;
        let (child, addr, log) = ChildSetup::new(tls, work_dir, "registry", services)?.spawn(
            Stdio::null(),
            |cmd, addr, tls_dir| {
                cmd.arg("--log")
                    .arg(log_filter)
                    .arg("registry")
                    .arg("--store")
                    .arg("file")
                    .arg("--state-dir")
                    .arg(state_dir)
                    .arg("--tls-dir")
                    .arg(tls_dir)
                    .arg("--listen")
                    .arg(addr.to_string())
                    .arg("--admin-listen")
                    .arg("127.0.0.1:0")
                    .arg("--metrics-listen")
                    .arg("");
            },
        )?;
        Ok(Self {
            addr,
            backend: Backend::Child {
                child,
                updates: ChildUpdates::Exports(state_dir.to_path_buf()),
                log,
            },
        })
    }

    /// The transport floor as a child process (`xcc bench hamlet-floor-serve`).
    pub(super) fn spawn_floor_child(
        tls: &TlsFiles,
        work_dir: &Path,
        services: usize,
        log_filter: &str,
    ) -> anyhow::Result<Self> {
        let (mut child, addr, log) = ChildSetup::new(tls, work_dir, "floor", services)?.spawn(
            Stdio::piped(),
            |cmd, addr, tls_dir| {
                cmd.arg("--log")
                    .arg(log_filter)
                    .args(["bench", "hamlet-floor-serve", "--listen"])
                    .arg(addr.to_string())
                    .arg("--tls-dir")
                    .arg(tls_dir)
                    .arg("--services")
                    .arg(services.to_string());
            },
        )?;
        let stdin = child.0.stdin.take().context("the floor child's stdin")?;
        Ok(Self {
            addr,
            backend: Backend::Child {
                child,
                updates: ChildUpdates::Stdin(std::sync::Mutex::new(stdin)),
                log,
            },
        })
    }

    /// The transport floor in this process.
    pub(super) async fn start_floor_in_process(
        tls: &TlsFiles,
        services: usize,
    ) -> anyhow::Result<Self> {
        let floor =
            FloorServer::start(tls, SocketAddr::from(([127, 0, 0, 1], 0)), services).await?;
        Ok(Self {
            addr: floor.addr,
            backend: Backend::FloorInProcess(floor),
        })
    }

    pub(super) async fn start_in_process(tls: &TlsFiles, services: usize) -> anyhow::Result<Self> {
        let cancel = CancellationToken::new();
        let registry = Registry::start(RegistryConfig::loopback(tls.clone()), cancel.clone())
            .await
            .context("starting the in-process registry")?;
        let mut entries = Vec::with_capacity(services);
        for sr in bulk_records(services).iter().chain([&hot_record(0)]) {
            entries.push(entry(sr)?);
        }
        registry.catalog.replace_source(&Source::Local, entries);
        Ok(Self {
            addr: registry.hamlet_addr,
            backend: Backend::InProcess {
                registry: Box::new(registry),
                cancel,
            },
        })
    }

    /// Connect a probe consumer until it receives the full snapshot (bounded attempts).
    pub(super) async fn wait_ready(
        &mut self,
        tls: &ReloadingTls,
        services: usize,
    ) -> anyhow::Result<()> {
        const ATTEMPTS: usize = 150;
        let mut last = String::from("no attempt made");
        for _ in 0..ATTEMPTS {
            if let Backend::Child { child, log, .. } = &mut self.backend
                && let Some(status) = child.0.try_wait().context("checking the child")?
            {
                bail!(
                    "the registry exited ({status}); its log:\n{}",
                    tail(log, 20)
                );
            }
            let attempt = async {
                let channel = connect(tls, self.addr).await?;
                tokio::time::timeout(Duration::from_secs(60), snapshot_once(channel))
                    .await
                    .context("probe snapshot timed out")?
            };
            match attempt.await {
                Ok((_, n)) if n == services => return Ok(()),
                Ok((_, n)) => last = format!("probe snapshot had {n} of {services} services"),
                Err(e) => last = format!("{e:#}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("not ready after {ATTEMPTS} attempts: {last}")
    }

    /// Change the hot service to carry `seq`; returns when the change started.
    pub(super) async fn update(&self, seq: u32) -> anyhow::Result<Instant> {
        match &self.backend {
            Backend::Child {
                updates: ChildUpdates::Exports(state_dir),
                ..
            } => write_hot(state_dir, seq),
            Backend::Child {
                updates: ChildUpdates::Stdin(stdin),
                ..
            } => {
                use std::io::Write as _;
                let mut stdin = xcc_controller::plumbing::lock(stdin);
                let t0 = Instant::now();
                writeln!(stdin, "{seq}")
                    .and_then(|()| stdin.flush())
                    .context("writing to the floor child's stdin")?;
                Ok(t0)
            }
            Backend::FloorInProcess(floor) => floor.update(seq),
            Backend::InProcess { registry, .. } => {
                let e = entry(&hot_record(seq))?;
                let t0 = Instant::now();
                registry
                    .catalog
                    .upsert(e)
                    .context("the upsert changed nothing")?;
                Ok(t0)
            }
        }
    }

    pub(super) fn rss(&self) -> Option<Rss> {
        let Backend::Child { child, .. } = &self.backend else {
            return None;
        };
        let status = std::fs::read_to_string(format!("/proc/{}/status", child.0.id())).ok()?;
        let field = |name: &str| -> Option<f64> {
            let kb: f64 = status
                .lines()
                .find(|l| l.starts_with(name))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            Some(kb / 1024.0)
        };
        Some(Rss {
            rss_mib: field("VmRSS:")?,
            hwm_mib: field("VmHWM:")?,
        })
    }

    /// User + system CPU seconds of the child so far, from /proc/<pid>/stat (USER_HZ = 100, as on
    /// every Linux architecture xcc targets).
    pub(super) fn cpu_seconds(&self) -> Option<f64> {
        let Backend::Child { child, .. } = &self.backend else {
            return None;
        };
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.0.id())).ok()?;
        // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
        let rest = stat.get(stat.rfind(')')? + 2..)?;
        let mut fields = rest.split_whitespace().skip(11);
        let utime: f64 = fields.next()?.parse().ok()?;
        let stime: f64 = fields.next()?.parse().ok()?;
        Some((utime + stime) / 100.0)
    }

    pub(super) async fn stop(self) -> anyhow::Result<()> {
        match self.backend {
            Backend::Child { child, .. } => {
                drop(child);
                Ok(())
            }
            Backend::InProcess { registry, cancel } => {
                cancel.cancel();
                registry.shutdown().await
            }
            Backend::FloorInProcess(floor) => floor.stop().await,
        }
    }
}

pub(crate) fn entry(sr: &ServiceRecord) -> anyhow::Result<ServiceEntry> {
    xcc_registry::store::model::export_entry(SERVER_CLUSTER, sr)
        .map_err(|e| anyhow::anyhow!("{}: {e}", sr.metadata.name.as_deref().unwrap_or_default()))
}

pub(super) fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

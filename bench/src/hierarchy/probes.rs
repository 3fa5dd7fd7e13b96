//! Memory probes: a root registry and a bare Level in child processes.

use super::*;

/// Parent side of the root-registry probe: a child process runs the root; `shape.mids`
/// registries in this process attach to it and announce the services.
pub(super) async fn root_probe(
    shape: &Shape,
    pki: &TreePki,
    timeout: Duration,
) -> anyhow::Result<Probe> {
    let files = pki.issue(PROBE_ROOT)?;
    let dir = files
        .cert
        .parent()
        .context("the probe certificate has no directory")?;
    let exe = std::env::current_exe().context("locating the xcc executable")?;
    let mut child = tokio::process::Command::new(&exe)
        .args(["--log", "warn", "bench", "hierarchy", "--timeout-seconds"])
        .arg(timeout.as_secs().to_string())
        .arg("--root-probe")
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", exe.display()))?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let mut ask = async |cmd: Option<&str>| -> anyhow::Result<String> {
        if let Some(cmd) = cmd {
            stdin.write_all(format!("{cmd}\n").as_bytes()).await?;
            stdin.flush().await?;
        }
        let line = tokio::time::timeout(timeout + Duration::from_secs(5), lines.next_line())
            .await
            .map_err(|_| anyhow!("the probe did not answer {cmd:?} in time"))??
            .ok_or_else(|| anyhow!("the probe exited (asked {cmd:?})"))?;
        if let Some(err) = line.strip_prefix("ERR ") {
            bail!("probe: {err}");
        }
        Ok(line)
    };
    let addr: SocketAddr = ask(None)
        .await?
        .strip_prefix("ADDR ")
        .context("the probe did not print its address")?
        .parse()
        .context("the probe's address")?;

    let cancel = CancellationToken::new();
    let mut children = Vec::with_capacity(shape.mids);
    let clusters = shape.mids + 1;
    let result = async {
        for m in 0..shape.mids {
            children.push(
                start_node(
                    pki,
                    &format!("probe-{:02}", m + 1),
                    Some(addr),
                    vec![],
                    &cancel,
                )
                .await?,
            );
        }
        ask(Some(&format!("wait 0 {clusters}"))).await?;
        tokio::time::sleep(SETTLE).await;
        let before: u64 = parse_rss(&ask(Some("rss")).await?)?;
        let mut per_child: Vec<Vec<ServiceEntry>> = vec![Vec::new(); shape.mids];
        for i in 0..shape.services {
            let c = i % shape.mids;
            let mut e = initial_entry(shape, i);
            e.key.cluster = children[c].cluster.as_str().into();
            per_child[c].push(e);
        }
        for (c, entries) in children.iter().zip(per_child) {
            c.catalog.replace_source(&Source::Local, entries);
        }
        ask(Some(&format!("wait {} {clusters}", shape.services))).await?;
        tokio::time::sleep(SETTLE).await;
        let after = parse_rss(&ask(Some("rss")).await?)?;
        anyhow::Ok(Probe::new(shape.services, before, after))
    }
    .await;
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
    shutdown_all(&cancel, children).await;
    result
}

pub(super) fn parse_rss(line: &str) -> anyhow::Result<u64> {
    line.strip_prefix("RSS ")
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("unexpected probe answer {line:?}"))
}

/// Child side of the root-registry probe. Prints `ADDR <hamlet address>`, then answers one
/// line per command read from stdin: `wait <services> <clusters>` (OK once the catalog holds
/// that many services and the subtree that many clusters), `rss` (`RSS <VmRSS KiB> <VmHWM
/// KiB>`). Stops at end of input.
pub(super) async fn root_probe_main(dir: &Path, timeout: Duration) -> anyhow::Result<()> {
    let cancel = CancellationToken::new();
    let root = Registry::start(
        RegistryConfig::loopback(TlsFiles::in_dir(dir)),
        cancel.clone(),
    )
    .await
    .context("starting the probe root")?;
    println!("ADDR {}", root.hamlet_addr);
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["wait", services, clusters] => {
                let (Ok(services), Ok(clusters)) =
                    (services.parse::<usize>(), clusters.parse::<usize>())
                else {
                    println!("ERR bad numbers in {line:?}");
                    continue;
                };
                let waited = wait_for(
                    &root,
                    &format!("{services} services and {clusters} clusters"),
                    timeout,
                    |r| r.catalog.len() == services && r.level.subtree().len() == clusters,
                    tree_status,
                )
                .await;
                match waited {
                    Ok(()) => println!("OK"),
                    Err(e) => println!("ERR {e:#}"),
                }
            }
            ["rss"] => println!(
                "RSS {} {}",
                proc_status("VmRSS:").unwrap_or(0),
                proc_status("VmHWM:").unwrap_or(0)
            ),
            _ => println!("ERR unknown command {line:?}"),
        }
    }
    cancel.cancel();
    root.shutdown().await
}

/// Parent side of the bare Level/Catalog probe.
pub(super) async fn level_probe(args: &HierarchyArgs, timeout: Duration) -> anyhow::Result<Probe> {
    let exe = std::env::current_exe().context("locating the xcc executable")?;
    let out = tokio::process::Command::new(&exe)
        .args(["--log", "warn", "bench", "hierarchy", "--level-probe"])
        .args(["--mids", &args.mids.to_string()])
        .args(["--leaves-per-mid", &args.leaves_per_mid.to_string()])
        .args(["--services", &args.services.to_string()])
        .args(["--namespaces", &args.namespaces.to_string()])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(timeout, out)
        .await
        .map_err(|_| anyhow!("the probe did not finish within {timeout:?}"))?
        .with_context(|| format!("running {}", exe.display()))?;
    if !out.status.success() {
        bail!("the probe failed ({})", out.status);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .with_context(|| format!("parsing the probe's output {text:?}"))
}

/// Child side: a root `Level` with the tree's mids attached, fed every service as the mid of
/// its owner would announce it (policy check included). VmRSS before and after the
/// announcements.
pub(super) fn level_probe_main(shape: &Shape) -> anyhow::Result<Probe> {
    let catalog = Catalog::new();
    let policies = Policies::from_sources(&shape.carry_policies()?)?;
    let level = Level::new(
        PROBE_ROOT,
        None,
        catalog.clone(),
        xcc_registry::authz::Gate::fixed("xcc.test", policies),
    );
    let mut sessions = Vec::with_capacity(shape.mids);
    for m in 0..shape.mids {
        let mut clusters: BTreeSet<String> =
            (0..shape.leaves_per_mid).map(|l| leaf_name(m, l)).collect();
        clusters.insert(mid_name(m));
        let (tx, rx) = xcc_registry::federation::queues::DownLink::new(
            xcc_registry::budget::QueueLimits::new(
                64,
                xcc_registry::budget::QueueLimits::FEDERATION.bytes,
            ),
        );
        level
            .attach_child(
                &mid_name(m),
                "127.0.0.1:1".into(),
                &fed::SubtreeMembership {
                    clusters: clusters.into_iter().collect(),
                    ..Default::default()
                },
                tx,
            )
            .map_err(|e| anyhow!("attaching {}: {e}", mid_name(m)))?;
        sessions.push(rx);
    }
    let before = rss_kib()?;
    for i in 0..shape.services {
        let entry = initial_entry(shape, i);
        let mid = mid_name(shape.mid_of(shape.leaf_of(i)));
        let ann = xcc_registry::federation::convert::announcement(&entry, false);
        level
            .child_announcement(&mid, &ann)
            .map_err(|e| anyhow!("announcing {}: {e}", entry.key))?;
    }
    let after = rss_kib()?;
    if catalog.len() != shape.services {
        bail!(
            "the Level accepted {} of {} announcements",
            catalog.len(),
            shape.services
        );
    }
    drop(sessions);
    Ok(Probe::new(shape.services, before, after))
}

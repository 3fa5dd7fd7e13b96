//! `xcc dashboard`, as an operator runs it: the real binary, reading the demo's hierarchy
//! (root; b with b1 and b2; c with c1) through the admin API with an admin certificate, and
//! the page it serves driven in a headless Chromium over the DevTools protocol.
//!
//! c1's registry shows two refusals: its export `data/secret`, which the root's Cedar policy
//! `no-secret` forbids (failed check `announce`), and its import of `shop/api` as workload
//! `batch`, which b2's allowed requesters (`b1/web` only) deny.
//!
//! Needs Debian's `chromium`; without it the browser test prints a notice and checks nothing,
//! unless `XCC_REQUIRE_CHROMIUM=1` (CI), which makes that a failure. Screenshots go to
//! `target/screenshots/` (CI keeps them).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chromiumoxide::cdp::browser_protocol::emulation::SetDeviceMetricsOverrideParams;
use chromiumoxide::cdp::browser_protocol::log::EventEntryAdded;
use chromiumoxide::cdp::browser_protocol::page::CaptureScreenshotFormat;
use chromiumoxide::cdp::js_protocol::runtime::{
    ConsoleApiCalledType, EventConsoleApiCalled, EventExceptionThrown,
};
use chromiumoxide::handler::viewport::Viewport;
use chromiumoxide::page::ScreenshotParams;
use chromiumoxide::{Browser, BrowserConfig, Page};
use futures::StreamExt as _;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::level::{Question, Target};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::{Registry, RegistryConfig};

fn export(cluster: &str, ns: &str, name: &str, ip: &str, allowed: &[&str]) -> ServiceEntry {
    ServiceEntry {
        key: ServiceKey::new(cluster, ns, name),
        source: Source::Local,
        fqdn: xcc_proto::names::clusterset_fqdn(name, ns).into(),
        endpoints: vec![Endpoint {
            address: ip.into(),
            port: 443,
        }],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: allowed.iter().map(|s| s.to_string()).collect(),
        origin: None,
        revision: 0,
    }
}

/// The demo's hierarchy on loopback, with the admin certificate in `dir/operator`.
struct Hierarchy {
    dir: tempfile::TempDir,
    nodes: Vec<Registry>,
    cancel: CancellationToken,
}

impl Hierarchy {
    async fn start() -> Self {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = xcc_certs::pki::init_ca_dir("xcc.demo", &dir.path().join("ca")).unwrap();
        let issue = |name: &str, admin: bool| {
            let mut req = if admin {
                xcc_certs::pki::IssueRequest::admin(name)
            } else {
                xcc_certs::pki::IssueRequest::cluster(name)
            };
            req.dns = vec!["localhost".into()];
            req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
            let cert = ca.issue(&req).unwrap();
            xcc_certs::pki::write_issued(&dir.path().join(name), &ca, &cert).unwrap()
        };
        issue("operator", true);
        let cancel = CancellationToken::new();
        let mut nodes: Vec<Registry> = Vec::new();
        for (name, parent) in [
            ("root", None),
            ("b", Some("root")),
            ("c", Some("root")),
            ("b1", Some("b")),
            ("b2", Some("b")),
            ("c1", Some("c")),
        ] {
            let mut cfg = RegistryConfig::loopback(issue(name, false));
            if name == "root" {
                cfg.federation.policies = vec![
                    (
                        "carry-b.cedar".into(),
                        xcc_registry::authz::carry_policy("b", &["b1", "b2"]).unwrap(),
                    ),
                    (
                        "carry-c.cedar".into(),
                        xcc_registry::authz::carry_policy("c", &["c1"]).unwrap(),
                    ),
                    (
                        "no-secret.cedar".into(),
                        r#"@id("no-secret")
forbid (principal, action == Xcc::Action::"announce", resource) when { resource.name == "secret" };"#
                            .into(),
                    ),
                ];
            }
            if name == "c1" {
                cfg.federation.imports = vec![Question::new(
                    Target::Name {
                        namespace: "shop".into(),
                        name: "api".into(),
                    },
                    "batch",
                )];
            }
            cfg.federation.parent = parent.map(|p| ParentSpec {
                name: p.to_string(),
                address: nodes
                    .iter()
                    .find(|n| n.cluster == p)
                    .unwrap()
                    .hamlet_addr
                    .to_string(),
                server_name: "localhost".into(),
                roots: None,
            });
            nodes.push(Registry::start(cfg, cancel.clone()).await.unwrap());
        }
        let h = Self { dir, nodes, cancel };
        h.node("b2")
            .catalog
            .upsert(export("b2", "shop", "api", "10.2.0.10", &["b1/web"]));
        h.node("b1")
            .catalog
            .upsert(export("b1", "shop", "web", "10.1.0.10", &[]));
        h.node("c1")
            .catalog
            .upsert(export("c1", "data", "db", "10.3.0.10", &["c"]));
        h.node("c1")
            .catalog
            .upsert(export("c1", "data", "secret", "10.3.0.11", &[]));
        h
    }

    fn node(&self, name: &str) -> &Registry {
        self.nodes.iter().find(|n| n.cluster == name).unwrap()
    }

    fn admin_dir(&self) -> PathBuf {
        self.dir.path().join("operator")
    }

    /// Until the tree is whole and c1 holds both refusals (bounded: the federation's own
    /// timing is not what these tests measure).
    async fn settled(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let c1 = self.node("c1");
        loop {
            let root = self.node("root").level.subtree();
            let refused = c1.level.refusal_of("data", "secret").is_some();
            let answered = c1
                .level
                .subscriptions()
                .iter()
                .all(|(_, _, answer)| answer.is_some());
            if root.len() == 6 && refused && answered {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the hierarchy did not settle in 30 s: root subtree {root:?}, c1 refused {refused}, answered {answered}"
            );
            // The registries announce no "settled" event; re-read every 20 ms (bounded above).
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn stop(self) {
        self.cancel.cancel();
        for n in self.nodes {
            n.shutdown().await.unwrap();
        }
    }
}

/// A refusal's gRPC code as the admin API names it.
const DENIED: &str = "PERMISSION_DENIED";

/// `xcc dashboard` reading `registries`, and the URL it prints.
async fn dashboard(h: &Hierarchy, registries: &[&str]) -> (tokio::process::Child, String) {
    let addrs: Vec<String> = registries
        .iter()
        .map(|r| h.node(r).admin_addr.to_string())
        .collect();
    dashboard_of(h, &addrs).await
}

/// `xcc dashboard` reading the admin APIs at `addrs`, and the URL it prints.
async fn dashboard_of(h: &Hierarchy, addrs: &[String]) -> (tokio::process::Child, String) {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_xcc"));
    cmd.arg("dashboard")
        .arg("--tls-dir")
        .arg(h.admin_dir())
        .args(["--listen", "127.0.0.1:0", "--refresh-seconds", "1"]);
    for a in addrs {
        cmd.arg("--addr").arg(a);
    }
    let mut child = cmd
        .env("XCC_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the dashboard prints its URL within 30 s")
        .unwrap()
        .expect("a line");
    let url = line
        .strip_prefix("xcc dashboard: ")
        .unwrap_or_else(|| panic!("not the URL line: {line:?}"))
        .to_string();
    (child, url)
}

/// One HTTP/1.1 request by hand: the status line, the headers (lower-cased) and the body.
async fn http(url: &str, method: &str, path: &str, host: &str) -> (String, String, String) {
    let addr = url
        .strip_prefix("http://")
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    let (status, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (status.to_string(), headers.to_lowercase(), body.to_string())
}

#[test]
fn a_non_loopback_address_is_refused_with_the_reason() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args([
            "dashboard",
            "--listen",
            "0.0.0.0:9445",
            "--tls-dir",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with(
            "error: --listen 0.0.0.0:9445 is not a loopback address: the dashboard has no login of its own"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("--allow-non-loopback"), "{stderr}");
}

#[tokio::test]
async fn the_dashboard_serves_only_reads_to_local_hosts_with_a_strict_policy() {
    let h = Hierarchy::start().await;
    h.settled().await;
    // Two registries, and an address where nothing listens.
    let addrs = [
        h.node("root").admin_addr.to_string(),
        h.node("c1").admin_addr.to_string(),
        "127.0.0.1:1".to_string(),
    ];
    let (mut child, url) = dashboard_of(&h, &addrs).await;
    let host = url.trim_start_matches("http://").trim_end_matches('/');

    let (status, headers, body) = http(&url, "GET", "/", host).await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    assert!(
        headers.contains("content-security-policy: default-src 'none'; script-src 'self';"),
        "{headers}"
    );
    assert!(headers.contains("x-frame-options: deny"), "{headers}");
    // Every asset is served from the binary: no other origin is named anywhere in the page.
    assert!(
        !body.contains("http://") && !body.contains("https://") && !body.contains("//cdn"),
        "{body}"
    );
    for asset in ["/app.js", "/app.css", "/favicon.svg"] {
        let (status, _, text) = http(&url, "GET", asset, host).await;
        assert_eq!(status, "HTTP/1.1 200 OK", "{asset}");
        assert!(
            !text.contains("https://") && !text.contains("@import"),
            "{asset}"
        );
    }
    // The page script never turns data into HTML.
    let (_, _, js) = http(&url, "GET", "/app.js", host).await;
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
    ] {
        assert!(!js.contains(sink), "app.js uses {sink}");
    }

    // Read-only: nothing but GET is routed.
    let (status, _, _) = http(&url, "POST", "/api/state", host).await;
    assert_eq!(status, "HTTP/1.1 405 Method Not Allowed");
    // DNS rebinding: a page elsewhere that points its own name at 127.0.0.1 is refused.
    let (status, _, body) = http(&url, "GET", "/api/state", "attacker.example:80").await;
    assert_eq!(status, "HTTP/1.1 403 Forbidden");
    assert!(body.contains("other host names are refused"), "{body}");
    let (status, _, _) = http(&url, "GET", "/api/state", "localhost").await;
    assert_eq!(status, "HTTP/1.1 200 OK");

    // The document: c1's refusal with its failed check, policy id and reason.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let c1 = loop {
        let (_, _, body) = http(&url, "GET", "/api/state", host).await;
        let doc: Value = serde_json::from_str(&body).unwrap();
        let c1 = doc["registries"][1].clone();
        if c1["refused"]["total"] == 1
            && c1["status"] == "live"
            && doc["registries"][2]["status"] == "error"
        {
            // The unreachable one is shown with why.
            assert_eq!(
                doc["registries"][2]["error"],
                "connecting to the admin API at 127.0.0.1:1: transport error: Connection refused (os error 111): Connection refused (os error 111)",
                "{doc:#}"
            );
            break c1;
        }
        assert!(tokio::time::Instant::now() < deadline, "{doc:#}");
        // The dashboard reads the registries in the background; re-ask every 50 ms (bounded).
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let fqdn = xcc_proto::names::clusterset_fqdn("secret", "data");
    assert_eq!(
        c1["refused"]["rows"][0],
        serde_json::json!({"kind": "announcement", "entry": "c1/data/secret", "fqdn": fqdn,
            "code": DENIED, "check": "announce", "policies": ["no-secret"],
            "refusedBy": "root", "reason": format!("c1 may not announce {fqdn}: forbidden by no-secret"),
            "at": c1["refused"]["rows"][0]["at"].clone()})
    );
    child.kill().await.unwrap();
    h.stop().await;
}

/// The browser, or `None` (with a notice) when it is not installed and not required.
fn chromium() -> Option<PathBuf> {
    let found = std::env::var_os("XCC_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join("chromium"))
                    .find(|p| p.is_file())
            })
        });
    if found.is_none() {
        assert!(
            std::env::var("XCC_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "chromium is required (XCC_REQUIRE_CHROMIUM=1) but not installed: apt-get install chromium"
        );
        eprintln!(
            "chromium is not installed: the dashboard's browser test checks nothing (apt-get install chromium)"
        );
    }
    found
}

fn screenshots_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    let dir = target.join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Wait in the page, on DOM mutations, until `condition` (a JS expression) is truthy; fails
/// after `ms` milliseconds. Returns the condition's value and how long it took in the page.
fn dom_wait(condition: &str, ms: u64) -> String {
    format!(
        r#"() => new Promise((resolve, reject) => {{
            const check = () => {{ try {{ return ({condition}); }} catch (e) {{ return null; }} }};
            const start = performance.now();
            let observer = null, timer = null;
            const done = (value) => {{
                observer.disconnect(); clearTimeout(timer);
                resolve({{ value, ms: performance.now() - start }});
            }};
            observer = new MutationObserver(() => {{ const v = check(); if (v) done(v); }});
            timer = setTimeout(() => {{
                observer.disconnect();
                reject(new Error("not within {ms} ms: " + {condition_text}));
            }}, {ms});
            observer.observe(document, {{ subtree: true, childList: true, characterData: true, attributes: true }});
            const v = check(); if (v) done(v);
        }})"#,
        condition_text = serde_json::to_string(condition).unwrap(),
    )
}

/// The text of the registry section of `cluster`.
fn section(cluster: &str) -> String {
    format!(
        "[...document.querySelectorAll('section.registry')].find(s => s.getAttribute('data-cluster') === {})",
        serde_json::to_string(cluster).unwrap()
    )
}

async fn eval(page: &Page, f: &str) -> Value {
    page.evaluate_function(f)
        .await
        .unwrap_or_else(|e| panic!("{e}\nin:\n{f}"))
        .into_value()
        .unwrap()
}

/// Console errors, uncaught exceptions and browser log errors (a blocked resource, a CSP
/// violation), as they arrive.
async fn console_errors(page: &Page) -> Arc<Mutex<Vec<String>>> {
    let errors = Arc::new(Mutex::new(Vec::new()));
    let mut console = page
        .event_listener::<EventConsoleApiCalled>()
        .await
        .unwrap();
    let mut exceptions = page.event_listener::<EventExceptionThrown>().await.unwrap();
    let mut log = page.event_listener::<EventEntryAdded>().await.unwrap();
    let e = errors.clone();
    tokio::spawn(async move {
        loop {
            let line = tokio::select! {
                Some(c) = console.next() => {
                    if c.r#type != ConsoleApiCalledType::Error && c.r#type != ConsoleApiCalledType::Assert {
                        continue;
                    }
                    format!("console.{:?}: {:?}", c.r#type, c.args.iter().map(|a| a.value.clone()).collect::<Vec<_>>())
                }
                Some(x) = exceptions.next() => format!("exception: {:?}", x.exception_details),
                Some(l) = log.next() => {
                    if format!("{:?}", l.entry.level) != "Error" {
                        continue;
                    }
                    format!("log: {} {:?}", l.entry.text, l.entry.url)
                }
                else => return,
            };
            e.lock().unwrap().push(line);
        }
    });
    errors
}

#[tokio::test]
async fn the_dashboard_in_headless_chromium() {
    let Some(executable) = chromium() else {
        return;
    };
    let h = Hierarchy::start().await;
    h.settled().await;
    let (mut child, url) = dashboard(&h, &["root", "b", "b1", "c1"]).await;

    let profile = tempfile::tempdir().unwrap();
    let config = BrowserConfig::builder()
        .chrome_executable(executable)
        .user_data_dir(profile.path())
        .new_headless_mode()
        // Root in CI: Chromium's sandbox needs a user namespace it does not get there.
        .no_sandbox()
        .window_size(1280, 800)
        .viewport(Viewport {
            width: 1280,
            height: 800,
            ..Default::default()
        })
        .launch_timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let (mut browser, mut handler) = Browser::launch(config).await.unwrap();
    let driver = tokio::spawn(async move { while handler.next().await.is_some() {} });

    let page = browser.new_page("about:blank").await.unwrap();
    page.enable_log().await.unwrap();
    page.enable_runtime().await.unwrap();
    let errors = console_errors(&page).await;
    page.goto(url.as_str()).await.unwrap();

    // The demo's tree, and c1's two refusals with their reasons.
    let tree = eval(
        &page,
        &dom_wait(
            "document.querySelector('#tree li[data-cluster=\"c1\"]')?.innerText.includes('2 refusals') && \
             document.querySelector('#tree').innerText",
            15_000,
        ),
    )
    .await;
    let tree_text = tree["value"].as_str().unwrap().to_string();
    let lines: Vec<&str> = tree_text.lines().map(str::trim).collect();
    // c1 is marked in the tree with its two refusals.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("c1") && l.ends_with("2 refusals")),
        "{tree_text}"
    );
    for want in ["root", "b", "b1", "b2", "c", "c1"] {
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().next() == Some(want)),
            "{want} not in the tree:\n{tree_text}"
        );
    }
    let fqdn = xcc_proto::names::clusterset_fqdn("secret", "data");
    let refusal = eval(
        &page,
        &dom_wait(
            &format!(
                "(() => {{ const s = {}; const rows = s && [...s.querySelectorAll('tr')].map(r => [...r.cells].map(c => c.innerText)); \
                 return rows && rows.find(r => r[2] === 'announce') && rows.find(r => r[2] === 'Denied') ? rows : null; }})()",
                section("c1")
            ),
            15_000,
        ),
    )
    .await;
    let rows: Vec<Vec<String>> = serde_json::from_value(refusal["value"].clone()).unwrap();
    let announce = rows.iter().find(|r| r[2] == "announce").unwrap();
    assert_eq!(
        announce[..7],
        [
            "announcement",
            "c1/data/secret",
            "announce",
            "no-secret",
            DENIED,
            "root",
            &format!("c1 may not announce {fqdn}: forbidden by no-secret"),
        ]
    );
    let denied = rows.iter().find(|r| r[2] == "Denied").unwrap();
    assert_eq!(denied[..2], ["shop/api", "batch"]);
    assert_eq!(
        denied[2..5],
        [
            "Denied",
            "b2",
            "b2/shop/api allows [b1/web]; c1/batch is not among them"
        ]
    );

    // An export appears in b1: the page shows it within 1 s. The wait starts in the page
    // before the export is made, and fails at 1 s.
    let cart = xcc_proto::names::clusterset_fqdn("cart", "shop");
    let in_b1 = format!(
        "{}?.querySelector('tr[data-row={}]')",
        section("b1"),
        serde_json::to_string(&cart).unwrap()
    );
    eval(
        &page,
        &format!(
            "() => {{ window.__cart = ({})(); return true; }}",
            dom_wait(&in_b1, 1_000)
        ),
    )
    .await;
    h.node("b1")
        .catalog
        .upsert(export("b1", "shop", "cart", "10.1.0.20", &[]));
    let seen = eval(&page, "() => window.__cart.then(r => r.ms)").await;
    eprintln!("the export was on the page {seen} ms after the wait began");
    // ... and at the root, announced up through b, with its propagation latency from b.
    let at_root = format!(
        "{}?.querySelector('tr[data-row={}]')",
        section("root"),
        serde_json::to_string(&cart).unwrap()
    );
    eval(&page, &dom_wait(&at_root, 15_000)).await;
    let latency = eval(
        &page,
        &dom_wait(
            &format!(
                "(() => {{ const r = {}?.querySelector('tr[data-row=\"child/b\"]'); return r && [...r.cells].map(c => c.innerText); }})()",
                section("root")
            ),
            15_000,
        ),
    )
    .await;
    let latency: Vec<String> = serde_json::from_value(latency["value"].clone()).unwrap();
    assert_eq!(latency[0], "child/b");
    assert!(
        latency[1].ends_with(" ms") || latency[1].ends_with(" s"),
        "{latency:?}"
    );

    // Names are hostile input: markup in one is shown as text, never parsed (no element is
    // created from it, and the CSP would report an inline handler as a console error).
    let hostile = "<img src=x onerror=console.error('xss')>";
    h.node("b1")
        .catalog
        .upsert(export("b1", "shop", "odd", "10.1.0.30", &[hostile]));
    let odd = xcc_proto::names::clusterset_fqdn("odd", "shop");
    let cells = eval(
        &page,
        &dom_wait(
            &format!(
                "(() => {{ const r = {}?.querySelector('tr[data-row={}]'); return r && [...r.cells].map(c => c.textContent); }})()",
                section("b1"),
                serde_json::to_string(&odd).unwrap()
            ),
            15_000,
        ),
    )
    .await;
    assert_eq!(cells["value"][3], hostile, "{cells}");
    let images = eval(&page, "() => document.images.length").await;
    assert_eq!(images, 0);

    // Keyboard: Tab reaches the skip link, the pause button, then the first registry link,
    // and Enter follows it; the focused element is outlined.
    let body = page.find_element("body").await.unwrap();
    body.press_key("Tab").await.unwrap();
    let focused = eval(&page, "() => document.activeElement.textContent").await;
    assert_eq!(focused, "Skip to content");
    let outline = eval(
        &page,
        "() => getComputedStyle(document.activeElement).outlineStyle",
    )
    .await;
    assert_eq!(outline, "solid");
    body.press_key("Tab").await.unwrap();
    let focused = eval(&page, "() => document.activeElement.id").await;
    assert_eq!(focused, "pause");
    body.press_key("Tab").await.unwrap();
    body.press_key("Enter").await.unwrap();
    let hash = eval(&page, "() => location.hash").await;
    assert_eq!(hash, "#r0");

    let shots = screenshots_dir();
    let shot = |name: &str| shots.join(name);
    eval(&page, "() => { window.scrollTo(0, 0); return true; }").await;
    page.save_screenshot(
        ScreenshotParams::builder()
            .format(CaptureScreenshotFormat::Png)
            .build(),
        shot("dashboard-1280x800.png"),
    )
    .await
    .unwrap();
    // c1's section, with its two refusals, at the same size.
    eval(
        &page,
        &format!(
            "() => {{ {}.scrollIntoView(); return true; }}",
            section("c1")
        ),
    )
    .await;
    page.save_screenshot(
        ScreenshotParams::builder()
            .format(CaptureScreenshotFormat::Png)
            .build(),
        shot("dashboard-c1-refusals-1280x800.png"),
    )
    .await
    .unwrap();
    eval(&page, "() => { window.scrollTo(0, 0); return true; }").await;
    // A phone: 390 px wide. Nothing is wider than the screen (wide tables scroll in their box).
    page.execute(SetDeviceMetricsOverrideParams::new(390, 844, 2.0, true))
        .await
        .unwrap();
    let fits = eval(
        &page,
        "() => new Promise(r => requestAnimationFrame(() => r([document.documentElement.scrollWidth, window.innerWidth])))",
    )
    .await;
    assert_eq!(fits[1], 390, "{fits}");
    assert!(
        fits[0].as_u64() <= fits[1].as_u64(),
        "the page is wider than the phone: {fits}"
    );
    page.save_screenshot(
        ScreenshotParams::builder()
            .format(CaptureScreenshotFormat::Png)
            .build(),
        shot("dashboard-390x844.png"),
    )
    .await
    .unwrap();

    let errors = errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "console errors: {errors:#?}");

    browser.close().await.unwrap();
    let _ = browser.wait().await;
    driver.abort();
    child.kill().await.unwrap();
    h.stop().await;
}

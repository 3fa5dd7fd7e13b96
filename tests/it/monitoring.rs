//! `deploy/monitoring/`: the alerting rules pass `promtool check rules` and their own unit tests
//! (`promtool test rules`), the PrometheusRule carries exactly the rule file's groups, every
//! query of the Grafana dashboard parses as PromQL, and every metric the rules and the dashboard
//! name is one that xcc exports (read from a registry's `/metrics` and the binder's registry,
//! so a renamed metric breaks this test, not an alert in production).
//!
//! A real Prometheus scrapes two registries while one imports from the other, loads the rule
//! file, and its query API answers the per-peer series with the values a known sequence of
//! exports must give.
//!
//! Needs `promtool` and `prometheus` (Debian `prometheus`); without them these tests print a
//! notice and check nothing, unless `XCC_REQUIRE_PROMETHEUS=1` (CI), which makes that a failure.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn monitoring_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("deploy/monitoring")
}

fn yaml(file: &str) -> Value {
    let text = std::fs::read_to_string(monitoring_dir().join(file)).unwrap();
    let v: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    serde_json::to_value(v).unwrap()
}

fn dashboard() -> Value {
    let text = std::fs::read_to_string(monitoring_dir().join("dashboard.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Every `expr` of the dashboard's panels.
fn dashboard_queries() -> Vec<String> {
    let d = dashboard();
    d["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().clone())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect()
}

/// Every `expr` of the rule file.
fn rule_queries() -> Vec<String> {
    yaml("rules.yaml")["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect()
}

/// `promtool <args>` in deploy/monitoring, or `None` (with a notice) when it is not installed
/// and not required.
fn promtool(args: &[&str]) -> Option<std::process::Output> {
    match Command::new("promtool")
        .args(args)
        .current_dir(monitoring_dir())
        .output()
    {
        Ok(out) => Some(out),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            not_installed("promtool");
            None
        }
        Err(e) => panic!("running promtool: {e}"),
    }
}

/// A missing Prometheus tool: a failure where it is required, else a notice.
fn not_installed(tool: &str) {
    assert!(
        std::env::var("XCC_REQUIRE_PROMETHEUS").as_deref() != Ok("1"),
        "{tool} is required (XCC_REQUIRE_PROMETHEUS=1) but not installed: apt-get install prometheus"
    );
    eprintln!("{tool} not installed: skipping (Debian: apt-get install prometheus)");
}

fn assert_success(what: &str, out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{what} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_pass_promtool_and_their_unit_tests() {
    let Some(check) = promtool(&["check", "rules", "rules.yaml"]) else {
        return;
    };
    assert_success("promtool check rules", &check);
    assert!(
        String::from_utf8_lossy(&check.stdout).contains("SUCCESS: 13 rules found"),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let test = promtool(&["test", "rules", "rules.test.yaml"]).unwrap();
    assert_success("promtool test rules", &test);
}

/// Every alert of the rule file is exercised by a unit test of rules.test.yaml.
#[test]
fn every_alert_has_a_unit_test() {
    let alerts: BTreeSet<String> = yaml("rules.yaml")["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| r["alert"].as_str().unwrap().to_string())
        .collect();
    let tested: BTreeSet<String> = yaml("rules.test.yaml")["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().clone())
        .filter(|t| !t["exp_alerts"].as_array().unwrap().is_empty())
        .map(|t| t["alertname"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(alerts.len(), 13);
    assert_eq!(
        tested, alerts,
        "alerts never seen firing in rules.test.yaml"
    );
}

#[test]
fn the_prometheus_rule_carries_the_rule_files_groups() {
    let rule = yaml("prometheusrule.yaml");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rule["kind"], "PrometheusRule");
    assert_eq!(rule["spec"]["groups"], yaml("rules.yaml")["groups"]);
}

/// Each dashboard query, as a recording rule, passes `promtool check rules` (PromQL parses).
#[test]
fn every_dashboard_query_parses() {
    let d = dashboard();
    assert_eq!(d["uid"], "xcc-federation");
    for p in d["panels"].as_array().unwrap() {
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {} must use the dashboard's data source variable",
            p["title"]
        );
    }
    let queries = dashboard_queries();
    assert_eq!(queries.len(), 14);
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, q) in queries.iter().enumerate() {
        rules.push_str(&format!(
            "      - record: xcc_dashboard_query_{i}\n        expr: {}\n",
            serde_json::to_string(q).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yaml");
    std::fs::write(&file, rules).unwrap();
    let Some(out) = promtool(&["check", "rules", file.to_str().unwrap()]) else {
        return;
    };
    assert_success("promtool check rules (dashboard queries)", &out);
}

/// The `xcc_…` metric names a query uses, outside its quoted label values.
fn metric_names(query: &str) -> BTreeSet<String> {
    let query: String = query.split('"').step_by(2).collect::<Vec<_>>().join("\"\"");
    let query = query.as_str();
    let mut names = BTreeSet::new();
    let bytes = query.as_bytes();
    let mut i = 0;
    while let Some(at) = query[i..].find("xcc_") {
        let start = i + at;
        let word_start = start == 0 || !is_ident(bytes[start - 1]);
        let mut end = start;
        while end < bytes.len() && is_ident(bytes[end]) {
            end += 1;
        }
        if word_start {
            names.insert(query[start..end].to_string());
        }
        i = end;
    }
    names
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The sample names xcc exports: a registry's `/metrics` (started in-process, with an import
/// and a consumer so that the per-peer families have series) and the binder's registry.
async fn exported_metric_names() -> BTreeSet<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    xcc_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = xcc_certs::pki::init_ca_dir("xcc.test", &dir.path().join("ca")).unwrap();
    let files = |name: &str| {
        let mut req = xcc_certs::pki::IssueRequest::cluster(name);
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = ca.issue(&req).unwrap();
        xcc_certs::pki::write_issued(&dir.path().join(name), &ca, &cert).unwrap()
    };
    let mut cfg = xcc_registry::RegistryConfig::loopback(files("east"));
    cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    let cancel = tokio_util::sync::CancellationToken::new();
    let east = xcc_registry::Registry::start(cfg, cancel.clone())
        .await
        .unwrap();
    let addr = east.metrics_addr.unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    cancel.cancel();
    east.shutdown().await.unwrap();

    let mut binder = prometheus_client::registry::Registry::default();
    let b = xcc_binder::controller::metrics::Metrics::register(&mut binder);
    // A histogram family with no series is not printed: one observation each.
    let now = std::time::SystemTime::now();
    b.propagated("west", now, now);
    prometheus_client::encoding::text::encode(&mut text, &binder).unwrap();
    // A family with no series is not printed: the registry's metrics with a rejected file.
    let mut files = prometheus_client::registry::Registry::default();
    let m = xcc_registry::metrics::Metrics::default();
    m.register(&mut files);
    m.set_rejected_files(&[], &["exports/web.yaml: bad".to_string()]);
    m.propagation.observe("west", now, now);
    prometheus_client::encoding::text::encode(&mut text, &files).unwrap();
    // ... and the serverCA expiry, which has series only for a RemoteRegistry with a serverCA.
    let mut remotes = prometheus_client::registry::Registry::default();
    let cas = xcc_registry::remote_ca::RemoteCaExpiry::default();
    cas.register(&mut remotes);
    let rr: xcc_proto::crd::RemoteRegistry = serde_json::from_value(serde_json::json!({
        "apiVersion": "connectivity.tanzu.vmware.com/v1alpha1",
        "kind": "RemoteRegistry",
        "metadata": {"name": "west", "namespace": "xcc"},
        "spec": {
            "address": "west.example:443",
            "tlsConfig": {
                "serverCA": base64::engine::Engine::encode(
                    &base64::engine::general_purpose::STANDARD,
                    ca.cert_pem(),
                ),
                "serverName": "west.example",
            },
        },
    }))
    .unwrap();
    let _ = cas.observe([&rr], time::OffsetDateTime::now_utc());
    prometheus_client::encoding::text::encode(&mut text, &remotes).unwrap();

    // `# TYPE <family> <type>`: a counter's samples are `<family>_total`.
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(family), Some(kind)) =
            (f.next(), f.next(), f.next(), f.next())
        {
            match kind {
                "counter" => {
                    names.insert(format!("{family}_total"));
                }
                // A histogram's samples: `_bucket`, `_sum`, `_count`.
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{family}{suffix}"));
                    }
                }
                _ => {
                    names.insert(family.to_string());
                }
            }
        }
    }
    names
}

#[tokio::test]
async fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let exported = exported_metric_names().await;
    // The per-peer families are there even with no peer.
    assert!(exported.contains("xcc_peer_up"), "{exported:?}");
    let mut used = BTreeSet::new();
    for q in rule_queries().iter().chain(dashboard_queries().iter()) {
        used.extend(metric_names(q));
    }
    assert!(used.len() >= 12, "{used:?}");
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(missing.is_empty(), "not exported by xcc: {missing:?}");
}

#[test]
fn metric_names_are_read_as_whole_words() {
    assert_eq!(
        metric_names(r#"time() - xcc_a_b{x="xcc_no"} > on() max(xcc_c_total)"#),
        ["xcc_a_b", "xcc_c_total"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

// ----- a real Prometheus -----

use std::net::SocketAddr;
use std::time::Duration;

use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::hamlet::client::{Backoff, RemoteSpec};

/// A Prometheus server, killed when dropped.
struct Prometheus {
    child: std::process::Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Start one that scrapes `targets` (job name, address) every second and loads rules.yaml;
    /// `None` when prometheus is not installed (and not required).
    fn start(targets: &[(&str, SocketAddr)]) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            monitoring_dir().join("rules.yaml").display()
        );
        for (job, addr) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{addr}']\n"
            ));
        }
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        // A free port for the web listener (Prometheus binds it itself).
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], xcc_testkube::free_port()));
        let child = match Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
        {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                not_installed("prometheus");
                return None;
            }
            Err(e) => panic!("starting prometheus: {e}"),
        };
        Some(Self {
            child,
            addr,
            _dir: dir,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self._dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// `GET path` on the web API, parsed; `None` while it does not answer yet.
    async fn get(&self, path: &str) -> Option<Value> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.addr).await.ok()?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .ok()?;
        let mut raw = String::new();
        s.read_to_string(&mut raw).await.ok()?;
        let (head, body) = raw.split_once("\r\n\r\n")?;
        if !head.starts_with("HTTP/1.1 200") {
            return None;
        }
        // Small answers come with a Content-Length; a chunked one starts with its size line.
        let json = &body[body.find('{')?..];
        serde_json::Deserializer::from_str(json)
            .into_iter::<Value>()
            .next()?
            .ok()
    }

    /// The value of the instant query `q` with exactly one series, once it equals `want`.
    /// Prometheus scrapes on its own clock, so this re-asks every 200 ms (bounded at 60 s):
    /// there is no event to wait on in another process's query API.
    async fn until_value(&self, q: &str, want: &str) {
        let path = format!("/api/v1/query?query={}", encode(q));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        let mut last = Value::Null;
        while tokio::time::Instant::now() < deadline {
            if let Some(v) = self.get(&path).await {
                let result = &v["data"]["result"];
                if result.as_array().map(Vec::len) == Some(1) && result[0]["value"][1] == want {
                    return;
                }
                last = v;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!(
            "{q} never became {want}; last answer {last}\n{}",
            self.log()
        );
    }
}

/// Percent-encoding of a query parameter.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn export(name: &str) -> ServiceEntry {
    ServiceEntry {
        key: ServiceKey::new("east", "default", name),
        source: Source::Local,
        fqdn: format!("{name}.xcc.test").into(),
        endpoints: vec![Endpoint {
            address: "10.0.0.1".into(),
            port: 443,
        }],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

/// West imports from east; Prometheus scrapes both. Three exports, then one removed: the
/// series say 3, then 2, with the link up on both ends; the rule file loads with every rule
/// healthy.
#[tokio::test]
async fn a_real_prometheus_sees_the_per_peer_series() {
    xcc_certs::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = xcc_certs::pki::init_ca_dir("xcc.test", &dir.path().join("ca")).unwrap();
    let start = |name: &'static str| {
        let mut req = xcc_certs::pki::IssueRequest::cluster(name);
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = ca.issue(&req).unwrap();
        let files = xcc_certs::pki::write_issued(&dir.path().join(name), &ca, &cert).unwrap();
        let mut cfg = xcc_registry::RegistryConfig::loopback(files);
        cfg.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.client.backoff = Backoff {
            min: Duration::from_millis(50),
            max: Duration::from_millis(200),
        };
        let cancel = tokio_util::sync::CancellationToken::new();
        async move {
            let r = xcc_registry::Registry::start(cfg, cancel.clone())
                .await
                .unwrap();
            (r, cancel)
        }
    };
    let (east, _ec) = start("east").await;
    let (west, _wc) = start("west").await;
    for name in ["a", "b", "c"] {
        east.catalog.upsert(export(name));
    }
    let Some(prom) = Prometheus::start(&[
        ("xcc-east", east.metrics_addr.unwrap()),
        ("xcc-west", west.metrics_addr.unwrap()),
    ]) else {
        return;
    };
    west.set_remotes(vec![RemoteSpec {
        name: "east-rr".into(),
        address: east.hamlet_addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
        allowed_domains: vec![],
    }])
    .await;

    let imp = r#"{job="xcc-west",direction="import",remote="east-rr",source_cluster="east",target_cluster="west"}"#;
    prom.until_value(&format!("xcc_peer_records{imp}"), "3")
        .await;
    prom.until_value(&format!("xcc_peer_up{imp}"), "1").await;
    prom.until_value(r#"xcc_catalog_services{job="xcc-west"}"#, "3")
        .await;
    let exp = r#"{job="xcc-east",direction="export",source_cluster="east",target_cluster="west"}"#;
    prom.until_value(&format!("xcc_peer_streams{exp}"), "1")
        .await;
    prom.until_value(
        &format!("xcc_peer_last_sync_timestamp_seconds{imp} > bool 0"),
        "1",
    )
    .await;

    east.catalog
        .remove(&ServiceKey::new("east", "default", "b"));
    prom.until_value(&format!("xcc_peer_records{imp}"), "2")
        .await;
    prom.until_value(r#"xcc_catalog_services{job="xcc-west"}"#, "2")
        .await;
    // Three records sent in the snapshot and a removal: at least 4 responses ACKed.
    prom.until_value(&format!("xcc_peer_acks_total{exp} >= bool 4"), "1")
        .await;

    // Propagation: the snapshot's three records were stamped before the stream started and are
    // not observed; two exports added live are, each once (2, not 5).
    for name in ["d", "e"] {
        east.catalog.upsert(export(name));
    }
    prom.until_value(r#"xcc_catalog_services{job="xcc-west"}"#, "4")
        .await;
    prom.until_value(
        r#"xcc_propagation_seconds_count{job="xcc-west",source_cluster="east-rr"}"#,
        "2",
    )
    .await;
    prom.until_value(
        r#"xcc_propagation_seconds_bucket{job="xcc-west",source_cluster="east-rr",le="60.0"}"#,
        "2",
    )
    .await;

    // The rule file loaded into a real Prometheus: 13 alerting rules, none unhealthy.
    let rules = prom.get("/api/v1/rules?type=alert").await.unwrap();
    let rules: Vec<&Value> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    assert_eq!(rules.len(), 13);
    for r in rules {
        assert_eq!(r["health"], "ok", "{r}");
    }
}

//! A record is served only under names its sender may hold. Registries run
//! in-process on loopback with real mTLS; what an importer holds is turned into the records a
//! file-mode registry writes (`store::file::imported_record`) and into the zones
//! `xcc dns --feed imports` builds from them (`imports_feed::services_from_records`,
//! `ZoneSet::build`), so each test asks the DNS answer the issue's repro got wrong.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::rr::Name;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, Ca, IssueRequest};
use xcc_certs::reload::TlsFiles;
use xcc_dns::zone::ZoneSet;
use xcc_proto::crd::ServiceRecord;
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::federation::{Question, Target};
use xcc_registry::hamlet::client::{Backoff, RemoteSpec};
use xcc_registry::hamlet::convert::Imported;
use xcc_registry::{Registry, RegistryConfig};

/// Generous bound for what should happen soon; the tests wait on catalog changes, never sleep.
const WAIT: Duration = Duration::from_secs(30);

struct Pki {
    dir: tempfile::TempDir,
    ca: Ca,
}

impl Pki {
    fn new() -> Self {
        xcc_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = pki::init_ca_dir("xcc.test", &dir.path().join("ca")).unwrap();
        Self { dir, ca }
    }

    fn cluster(&self, name: &str) -> TlsFiles {
        let mut req = IssueRequest::cluster(name);
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = self.ca.issue(&req).unwrap();
        pki::write_issued(&self.dir.path().join(name), &self.ca, &cert).unwrap()
    }
}

async fn node(
    pki: &Pki,
    name: &str,
    parent: Option<SocketAddr>,
    imports: &[(&str, &str)],
) -> (Registry, CancellationToken) {
    let mut cfg = RegistryConfig::loopback(pki.cluster(name));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
    };
    cfg.federation.parent = parent.map(|addr| ParentSpec {
        name: "parent".into(),
        address: addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
    });
    cfg.federation.imports = imports
        .iter()
        .map(|(ns, n)| {
            Question::new(
                Target::Name {
                    namespace: ns.to_string(),
                    name: n.to_string(),
                },
                "",
            )
        })
        .collect();
    // Not-found answers are asked again on this period (a bound on the test, not a sleep).
    cfg.federation.import_retry = Duration::from_millis(200);
    let cancel = CancellationToken::new();
    let reg = Registry::start(cfg, cancel.clone()).await.unwrap();
    (reg, cancel)
}

/// A service `cluster/ns/name` at `fqdn` whose origin labels say `origin` (`namespace/name`).
fn service(key: (&str, &str, &str), fqdn: &str, ip: &str, origin: (&str, &str)) -> ServiceEntry {
    let labels: BTreeMap<String, String> = [
        (
            ORIGIN_NAMESPACE_ANNOTATION.to_string(),
            origin.0.to_string(),
        ),
        (ORIGIN_NAME_ANNOTATION.to_string(), origin.1.to_string()),
    ]
    .into();
    ServiceEntry {
        key: ServiceKey::new(key.0, key.1, key.2),
        source: Source::Local,
        fqdn: fqdn.into(),
        endpoints: vec![Endpoint {
            address: ip.into(),
            port: 443,
        }],
        ports: vec![],
        labels: labels.into(),
        allowed_requesters: vec![],
        origin: None,
        revision: 0,
    }
}

/// Wait until `reg`'s catalog satisfies `cond`, re-checking on every change.
async fn wait_catalog(reg: &Registry, what: &str, cond: impl Fn(&Registry) -> bool) {
    let mut rx = reg.catalog.subscribe();
    let fut = async {
        while !cond(reg) {
            match rx.recv().await {
                // Lagged only means several changes came at once: check again.
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("catalog events ended: {e}"),
            }
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

fn imported(reg: &Registry) -> Vec<String> {
    let mut fqdns: Vec<String> = reg
        .catalog
        .list(&Default::default())
        .iter()
        .filter(|e| matches!(e.source, Source::Remote(_) | Source::Hierarchy(_)))
        .map(|e| e.fqdn.to_string())
        .collect();
    fqdns.sort();
    fqdns
}

/// The A records `xcc dns --feed imports` answers for `name` from what `reg` imported (the
/// records its file store writes, one file per remote or parent link).
fn dns_answer(reg: &Registry, name: &str) -> Vec<String> {
    let mut files: BTreeMap<String, Vec<ServiceRecord>> = BTreeMap::new();
    for e in reg.catalog.list(&Default::default()) {
        let (Source::Remote(from) | Source::Hierarchy(from)) = &e.source else {
            continue;
        };
        let record =
            xcc_registry::store::file::imported_record(from, "xcc", &Imported::of_entry(&e))
                .unwrap();
        files.entry(from.clone()).or_default().push(record);
    }
    let (services, _) = xcc_dns::imports_feed::services_from_records(&files);
    let zones = ZoneSet::build(
        &["clusterset.local".into(), "example.org".into()],
        services.iter(),
        None,
        1,
    );
    let name = Name::from_ascii(format!("{name}.")).unwrap();
    let mut got: Vec<String> = zones
        .find_zone(&name)
        .and_then(|z| z.node(&name))
        .map(|n| n.v4.iter().map(ToString::to_string).collect())
        .unwrap_or_default();
    got.sort();
    got
}

/// Flat repro: east exports `a.evil.example.org` annotated with origin `kube-system/kube-dns`;
/// west imports with `allowedDomains: [evil.example.org]`. West's DNS serves the FQDN, never
/// `kube-dns.kube-system.svc.clusterset.local`. A remote allowed in `shop.svc.clusterset.local`
/// is served under the clusterset name its origin gives, inside that zone only.
#[tokio::test]
async fn a_flat_import_is_served_only_under_names_its_allowed_domains_admit() {
    let pki = Pki::new();
    let (east, _ce) = node(&pki, "east", None, &[]).await;
    east.catalog.upsert(service(
        ("east", "default", "a.evil.example.org"),
        "a.evil.example.org",
        "6.6.6.7",
        ("kube-system", "kube-dns"),
    ));
    let (north, _cn) = node(&pki, "north", None, &[]).await;
    north.catalog.upsert(service(
        ("north", "shop", "api.example.org"),
        "api.example.org",
        "10.3.0.1",
        ("shop", "api"),
    ));
    north.catalog.upsert(service(
        ("north", "shop", "db.example.org"),
        "db.example.org",
        "10.3.0.2",
        ("kube-system", "coredns"),
    ));
    let (west, _cw) = node(&pki, "west", None, &[]).await;
    let remote = |name: &str, addr: SocketAddr, domains: &[&str]| RemoteSpec {
        name: name.into(),
        address: addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
        allowed_domains: domains.iter().map(ToString::to_string).collect(),
    };
    west.set_remotes(vec![
        remote("east", east.hamlet_addr, &["evil.example.org"]),
        remote(
            "north",
            north.hamlet_addr,
            &["example.org", "shop.svc.clusterset.local"],
        ),
    ])
    .await;
    wait_catalog(&west, "three imports", |r| imported(r).len() == 3).await;
    assert_eq!(dns_answer(&west, "a.evil.example.org"), ["6.6.6.7"]);
    assert_eq!(
        dns_answer(&west, "kube-dns.kube-system.svc.clusterset.local"),
        Vec::<String>::new(),
        "a name outside east's allowedDomains"
    );
    assert_eq!(
        dns_answer(&west, "api.shop.svc.clusterset.local"),
        ["10.3.0.1"]
    );
    assert_eq!(
        dns_answer(&west, "coredns.kube-system.svc.clusterset.local"),
        Vec::<String>::new()
    );
    assert_eq!(dns_answer(&west, "db.example.org"), ["10.3.0.2"]);
}

/// Tree repro: the root gave `shop/api` (`api.shop.svc.clusterset.local`) to c2; c3 exports
/// `a.shop.svc.clusterset.local` (its own name, sorting first) annotated with origin
/// `shop/api`. c1 imports both: its DNS answers `api.shop.svc.clusterset.local` with c2's
/// address only, and c3's service under its own FQDN.
#[tokio::test]
async fn a_child_cannot_take_a_clusterset_name_through_its_origin_labels() {
    let pki = Pki::new();
    let (root, _cr) = node(&pki, "root", None, &[]).await;
    let (c2, _c2) = node(&pki, "c2", Some(root.hamlet_addr), &[]).await;
    c2.catalog.upsert(service(
        ("c2", "shop", "api"),
        "api.shop.svc.clusterset.local",
        "10.2.0.1",
        ("shop", "api"),
    ));
    let (c3, _c3) = node(&pki, "c3", Some(root.hamlet_addr), &[]).await;
    c3.catalog.upsert(service(
        ("c3", "shop", "a"),
        "a.shop.svc.clusterset.local",
        "6.6.6.6",
        ("shop", "api"),
    ));
    let (c1, _c1) = node(
        &pki,
        "c1",
        Some(root.hamlet_addr),
        &[("shop", "api"), ("shop", "a")],
    )
    .await;
    wait_catalog(&c1, "both imports granted", |r| imported(r).len() == 2).await;
    assert_eq!(
        dns_answer(&c1, "api.shop.svc.clusterset.local"),
        ["10.2.0.1"]
    );
    assert_eq!(dns_answer(&c1, "a.shop.svc.clusterset.local"), ["6.6.6.6"]);
    // The root holds c3's service without the second name, so no level above or beside it
    // serves one either.
    let held = root
        .catalog
        .get(&ServiceKey::new("c3", "shop", "a"))
        .unwrap();
    assert_eq!(held.labels.get(ORIGIN_NAME_ANNOTATION), None);
}

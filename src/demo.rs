//! `xcc demo`: the embedded default, on loopback with a fresh PKI and real mTLS.
//!
//! 1. A three-level hierarchy: root; B with B1 and B2; C with C1. `api` in B2 admits only `web`
//!    in B1: web resolves it through the tree, a caller in C1 is told why it is denied, and the
//!    route notification reaches B2.
//! 2. Flat Hamlet (XCC v1): "east" exports three services (one only for cluster "north"),
//!    "west" imports from east; what west got and what it was not given is read back. West runs
//!    with the file store, and an `xcc dns` server fed by its imports directory answers a real
//!    UDP query for an imported FQDN and for its `svc.clusterset.local` name.
//!
//! Everything printed is read through the admin API, and the DNS answers are asked over UDP.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, IssueRequest};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_dns::imports_feed;
use xcc_dns::index::{DnsFeed, DnsIndex, FeedSource};
use xcc_dns::metrics::DnsMetrics;
use xcc_dns::server::{DnsServer, ServerConfig};
use xcc_proto::crd::{RemoteRegistry, RemoteRegistrySpec, TlsConfig};
use xcc_proto::mapping::{ORIGIN_NAME_ANNOTATION, ORIGIN_NAMESPACE_ANNOTATION};
use xcc_proto::names::CLUSTERSET_ZONE;
use xcc_proto::xcc::admin::v1 as api;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::run::StoreConfig;
use xcc_registry::store::file::{IMPORTS_DIR, REMOTES_DIR};
use xcc_registry::{Registry, RegistryConfig};

use crate::admin_cli::{
    endpoints, print_decision, print_peers, print_routes, print_services, print_tree,
};
use crate::args::{Output, table};
use xcc_registry::federation::link::ParentSpec;

fn export(ns: &str, name: &str, fqdn: &str, ips: &[&str], allowed: &[&str]) -> ServiceEntry {
    export_from("east", ns, name, fqdn, ips, allowed)
}

fn export_from(
    cluster: &str,
    ns: &str,
    name: &str,
    fqdn: &str,
    ips: &[&str],
    allowed: &[&str],
) -> ServiceEntry {
    let mut labels = xcc_registry::catalog::Labels::new();
    labels.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceEntry {
        key: ServiceKey::new(cluster, ns, name),
        source: Source::Local,
        fqdn: fqdn.into(),
        endpoints: ips
            .iter()
            .map(|ip| Endpoint {
                address: ip.to_string().into(),
                port: 443,
            })
            .collect(),
        ports: vec![],
        labels,
        allowed_requesters: allowed.iter().map(|s| s.to_string()).collect(),
        origin: None,
        revision: 0,
    }
}

struct Pki {
    dir: tempfile::TempDir,
    ca: pki::Ca,
}

impl Pki {
    fn issue(&self, name: &str, admin: bool) -> anyhow::Result<TlsFiles> {
        let mut req = if admin {
            IssueRequest::admin(name)
        } else {
            IssueRequest::cluster(name)
        };
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = self.ca.issue(&req)?;
        Ok(pki::write_issued(
            &self.dir.path().join(name),
            &self.ca,
            &cert,
        )?)
    }
}

pub async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let ca = pki::init_ca_dir("xcc.demo", &dir.path().join("ca"))?;
    let pki = Pki { dir, ca };
    let admin_tls = ReloadingTls::load(pki.issue("operator", true)?)?;
    println!("PKI: trust domain xcc.demo, one certificate per registry and one for the admin\n");
    let tree_ok = hierarchy(&pki, &admin_tls).await?;
    let flat_ok = flat(&pki, &admin_tls).await?;
    if !(tree_ok && flat_ok) {
        anyhow::bail!("the demo did not reach the expected outcome");
    }
    println!(
        "\ndemo complete: web in b1 reaches api in b2, c1 is refused with its reason, the route reached b2; \
         2 of 3 services imported over Hamlet, 1 withheld by its allowed requesters"
    );
    Ok(())
}

/// Poll an admin call (bounded) until `done` holds.
async fn until<T, F, Fut>(what: &str, mut call: F, done: impl Fn(&T) -> bool) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let v = call().await?;
        if done(&v) {
            return Ok(v);
        }
        if Instant::now() > deadline {
            anyhow::bail!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn hierarchy(pki: &Pki, admin_tls: &ReloadingTls) -> anyhow::Result<bool> {
    println!("######## 1. Hierarchy: root; b -> b1, b2; c -> c1\n");
    let cancel = CancellationToken::new();
    let nodes = start_tree(pki, &cancel).await?;
    export_tree_services(&nodes);
    let by = |n: &str| {
        nodes
            .iter()
            .find(|r| r.cluster == n)
            .map(|r| r.admin_addr.to_string())
    };
    let admin = |n: &str| {
        let tls = admin_tls.clone();
        let a = by(n).unwrap_or_default();
        async move { xcc_registry::admin::connect(tls, &a, None).await }
    };
    let mut root = admin("root").await?;
    show_root_catalog(&mut root).await?;

    let ask = |ns: &str, name: &str, svc: &str| api::ResolveRequest {
        namespace: ns.into(),
        name: name.into(),
        requester_service: svc.into(),
        ..Default::default()
    };
    let mut b1 = admin("b1").await?;
    println!("\n== b1 resolves shop/api as workload web (admin Resolve on b1)");
    let granted = b1.resolve(ask("shop", "api", "web")).await?.into_inner();
    print_decision(&granted, Output::Table);
    let mut c1 = admin("c1").await?;
    println!("\n== c1 resolves shop/api as workload batch (admin Resolve on c1)");
    let denied = c1.resolve(ask("shop", "api", "batch")).await?.into_inner();
    print_decision(&denied, Output::Table);

    let b2 = admin("b2").await?;
    let routes = until(
        "the route notification to reach b2",
        || {
            let mut c = b2.clone();
            async move {
                Ok(c.list_routes(api::ListRoutesRequest {})
                    .await?
                    .into_inner()
                    .routes)
            }
        },
        |r: &Vec<api::Route>| !r.is_empty(),
    )
    .await?;
    println!("\n== b2's route grants (admin ListRoutes on b2): the owner was told who will call");
    print_routes(&routes, Output::Table);
    println!("\n== the tree as the root sees it (admin GetTree on root)");
    let tree = root.get_tree(api::GetTreeRequest {}).await?.into_inner();
    print_tree(&tree, Output::Table);

    let ok = granted.allowed
        && granted.resolver_cluster == "b"
        && !denied.allowed
        && denied.condition == api::Condition::NotAllowedByCallee as i32
        && routes
            .iter()
            .any(|r| r.caller_cluster == "b1" && r.caller_service == "web");
    cancel.cancel();
    for r in nodes {
        r.shutdown().await?;
    }
    println!();
    Ok(ok)
}

/// The demo's tree, each registry started once its parent listens: root; b with b1 and b2; c
/// with c1. The root lets b carry b1 and b2, and c carry c1 (a child carries only itself
/// otherwise).
async fn start_tree(pki: &Pki, cancel: &CancellationToken) -> anyhow::Result<Vec<Registry>> {
    let mut nodes: Vec<Registry> = Vec::new();
    let mut addr = std::collections::BTreeMap::new();
    for (name, parent) in [
        ("root", None),
        ("b", Some("root")),
        ("c", Some("root")),
        ("b1", Some("b")),
        ("b2", Some("b")),
        ("c1", Some("c")),
    ] {
        let mut cfg = RegistryConfig::loopback(pki.issue(name, false)?);
        if name == "root" {
            cfg.federation.policies = vec![
                (
                    "carry-b.cedar".into(),
                    xcc_registry::authz::carry_policy("b", &["b1", "b2"])?,
                ),
                (
                    "carry-c.cedar".into(),
                    xcc_registry::authz::carry_policy("c", &["c1"])?,
                ),
            ];
        }
        cfg.federation.parent = parent.map(|p: &str| ParentSpec {
            name: p.to_string(),
            address: addr
                .get(p)
                .map(|a: &std::net::SocketAddr| a.to_string())
                .unwrap_or_default(),
            server_name: "localhost".into(),
            roots: None,
        });
        let reg = Registry::start(cfg, cancel.clone()).await?;
        addr.insert(name, reg.hamlet_addr);
        nodes.push(reg);
    }
    Ok(nodes)
}

/// b2's `api` (admitting only b1's `web`), b1's `web` and c1's `db` (admitting c).
fn export_tree_services(nodes: &[Registry]) {
    let fqdn = |svc: &str, ns: &str| xcc_proto::names::clusterset_fqdn(svc, ns);
    for r in nodes {
        match r.cluster.as_str() {
            "b2" => {
                r.catalog.upsert(export_from(
                    "b2",
                    "shop",
                    "api",
                    &fqdn("api", "shop"),
                    &["10.2.0.10"],
                    &["b1/web"],
                ));
            }
            "b1" => {
                r.catalog.upsert(export_from(
                    "b1",
                    "shop",
                    "web",
                    &fqdn("web", "shop"),
                    &["10.1.0.10"],
                    &[],
                ));
            }
            "c1" => {
                r.catalog.upsert(export_from(
                    "c1",
                    "data",
                    "db",
                    &fqdn("db", "data"),
                    &["10.3.0.10"],
                    &["c"],
                ));
            }
            _ => {}
        }
    }
}

/// Wait until every announcement reached the root, then print its catalog.
async fn show_root_catalog(
    root: &mut api::admin_client::AdminClient<tonic::transport::Channel>,
) -> anyhow::Result<()> {
    until(
        "every announcement to reach the root",
        || {
            let mut c = root.clone();
            async move {
                Ok(c.list_services(api::ListServicesRequest::default())
                    .await?
                    .into_inner()
                    .services)
            }
        },
        |s: &Vec<api::Service>| s.len() == 3,
    )
    .await?;
    println!("== the root's catalog: every subtree announced up");
    let services = root
        .list_services(api::ListServicesRequest::default())
        .await?
        .into_inner()
        .services;
    print_services(&services, Output::Table);

    Ok(())
}

async fn flat(pki: &Pki, admin_tls: &ReloadingTls) -> anyhow::Result<bool> {
    println!("######## 2. Flat Hamlet (XCC v1): east exports, west imports\n");
    let east_files = pki.issue("east", false)?;
    let west_files = pki.issue("west", false)?;
    let cancel = CancellationToken::new();
    let east = Registry::start(RegistryConfig::loopback(east_files), cancel.clone()).await?;
    // West keeps its state in files, as `xcc registry --store file` does: east is named in
    // remotes/, and what west imports lands in imports/, where `xcc dns` reads it.
    let west_state = pki.dir.path().join("west-state");
    write_remote(&west_state, "east", &east.hamlet_addr.to_string())?;
    let west = Registry::start(
        RegistryConfig {
            store: StoreConfig::File {
                state_dir: west_state.clone(),
                poll: Duration::from_secs(1),
            },
            ..RegistryConfig::loopback(west_files)
        },
        cancel.clone(),
    )
    .await?;
    println!(
        "east: hamlet {} admin {}\nwest: hamlet {} admin {}\n",
        east.hamlet_addr, east.admin_addr, west.hamlet_addr, west.admin_addr
    );

    export_flat_services(&east);
    let mut east_admin =
        xcc_registry::admin::connect(admin_tls.clone(), &east.admin_addr.to_string(), None).await?;
    let mut west_admin =
        xcc_registry::admin::connect(admin_tls.clone(), &west.admin_addr.to_string(), None).await?;

    synced_with_east(&mut west_admin).await?;

    let exported = east_admin
        .list_services(api::ListServicesRequest::default())
        .await?
        .into_inner()
        .services;
    let imported = west_admin
        .list_services(api::ListServicesRequest {
            owner_cluster: "east".into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .services;

    println!("== east exports (admin ListServices on east)");
    print_services(&exported, Output::Table);
    println!("\n== west imported from east (admin ListServices on west)");
    print_services(&imported, Output::Table);
    println!("\n== not given to west");
    let withheld: Vec<Vec<String>> = exported
        .iter()
        .filter(|e| !imported.iter().any(|i| i.fqdn == e.fqdn))
        .map(|e| {
            vec![
                e.fqdn.clone(),
                endpoints(e),
                format!(
                    "allowed requesters are [{}]; west is not one of them",
                    e.allowed_requesters.join(", ")
                ),
            ]
        })
        .collect();
    print!("{}", table(&["FQDN", "ENDPOINTS", "REASON"], &withheld));
    println!("\n== east's peers (admin ListPeers on east)");
    let peers = east_admin
        .list_peers(api::ListPeersRequest {})
        .await?
        .into_inner()
        .peers;
    print_peers(&peers, Output::Table);

    let dns_ok = dns_step(&west_state.join(IMPORTS_DIR)).await?;
    let ok = imported.len() == 2 && withheld.len() == 1 && dns_ok;
    cancel.cancel();
    east.shutdown().await?;
    west.shutdown().await?;
    Ok(ok)
}

/// East's three exports: `web` for everyone (with its clusterset identity), `api` for west,
/// `payments` for north only.
fn export_flat_services(east: &Registry) {
    let mut web = export(
        "shop",
        "web.shop.xcc.test",
        "web.shop.xcc.test",
        &["10.0.1.10", "10.0.1.11"],
        &[],
    );
    // The exported object's clusterset identity, which gives importers its MCS name.
    web.labels
        .insert(ORIGIN_NAMESPACE_ANNOTATION.to_string(), "shop".to_string());
    web.labels
        .insert(ORIGIN_NAME_ANNOTATION.to_string(), "web".to_string());
    east.catalog.upsert(web);
    east.catalog.upsert(export(
        "shop",
        "api.shop.xcc.test",
        "api.shop.xcc.test",
        &["10.0.1.20"],
        &["west"],
    ));
    east.catalog.upsert(export(
        "finance",
        "payments.xcc.test",
        "payments.xcc.test",
        &["10.0.2.30"],
        &["north"],
    ));
}

/// Wait (bounded) until west reports a completed sync with east.
async fn synced_with_east(
    west_admin: &mut api::admin_client::AdminClient<tonic::transport::Channel>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let peers = west_admin
            .list_peers(api::ListPeersRequest {})
            .await?
            .into_inner()
            .peers;
        if peers
            .iter()
            .any(|p| p.name == "east" && p.last_sync.is_some())
        {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!("west did not finish syncing with east within 15 s: {peers:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    Ok(())
}

/// Name `remote` at `address` in `<state_dir>/remotes/`, verified with this registry's own CA.
fn write_remote(state_dir: &Path, remote: &str, address: &str) -> anyhow::Result<()> {
    let rr = RemoteRegistry {
        metadata: ObjectMeta {
            name: Some(remote.to_string()),
            ..Default::default()
        },
        spec: RemoteRegistrySpec {
            address: address.to_string(),
            tls_config: TlsConfig {
                server_ca: String::new(),
                server_name: "localhost".to_string(),
            },
            ..Default::default()
        },
        status: None,
    };
    let dir = state_dir.join(REMOTES_DIR);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(format!("{remote}.yaml"));
    std::fs::write(&path, xcc_proto::resources::to_yaml_documents(&[rr])?)
        .with_context(|| format!("writing {}", path.display()))
}

/// `xcc dns` fed by west's imports directory (no Kubernetes), asked over UDP on loopback.
async fn dns_step(imports: &Path) -> anyhow::Result<bool> {
    let cancel = CancellationToken::new();
    let zones = vec!["xcc.test".to_string(), CLUSTERSET_ZONE.to_string()];
    let feed = DnsFeed::new(DnsIndex::new(zones, [FeedSource::Services]));
    let server = DnsServer::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = server.udp_addr()?;
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(imports_feed::run(
        imports.to_path_buf(),
        feed.clone(),
        imports_feed::POLL,
        cancel.clone(),
    ));
    let (snapshots, c) = (feed.subscribe(), cancel.clone());
    tasks.spawn(async move {
        if let Err(e) = server
            .run(snapshots, ServerConfig::default(), DnsMetrics::default(), c)
            .await
        {
            tracing::warn!(error = %e, "demo DNS server failed");
        }
    });
    println!("\n== xcc dns fed by west's imports directory, asked over UDP at {addr}");
    let want = ["10.0.1.10", "10.0.1.11"];
    let mut rows = Vec::new();
    let mut ok = true;
    for name in ["web.shop.xcc.test.", "web.shop.svc.clusterset.local."] {
        // West writes its imports file after the sync; ask until the name is served (bounded).
        let got = until(
            &format!("xcc dns to serve {name}"),
            || ask_a(addr, name),
            |(rcode, ips)| rcode == "NOERROR" && !ips.is_empty(),
        )
        .await?;
        ok &= got.1 == want;
        rows.push(vec![
            name.to_string(),
            "A".to_string(),
            got.0,
            got.1.join(", "),
        ]);
    }
    print!("{}", table(&["NAME", "TYPE", "RCODE", "ANSWER"], &rows));
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
    Ok(ok)
}

/// One A query over UDP: the response code and the addresses answered, sorted.
async fn ask_a(server: SocketAddr, name: &str) -> anyhow::Result<(String, Vec<String>)> {
    let mut query = Message::new(1, MessageType::Query, OpCode::Query);
    query.add_query(Query::query(Name::from_ascii(name)?, RecordType::A));
    let socket = tokio::net::UdpSocket::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    socket.send_to(&query.to_vec()?, server).await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), socket.recv(&mut buf))
        .await
        .context("no DNS answer within 5 s")??;
    let reply = Message::from_vec(&buf[..n])?;
    let mut ips: Vec<String> = reply
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect();
    ips.sort();
    // Response codes as dig prints them.
    let rcode = format!("{:?}", reply.metadata.response_code).to_uppercase();
    Ok((rcode, ips))
}

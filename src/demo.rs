//! `xcc demo`: the embedded default. Two registries on loopback with a fresh PKI and real mTLS:
//! "east" exports three services (one only for cluster "north"), "west" imports from east. What
//! west imported, and what it was not given and why, is read back through the admin API.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;
use xcc_certs::pki::{self, IssueRequest};
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::xcc::admin::v1 as api;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::hamlet::client::RemoteSpec;
use xcc_registry::{Registry, RegistryConfig};

use crate::admin_cli::{Output, endpoints, print_peers, print_services, table};

fn export(ns: &str, name: &str, fqdn: &str, ips: &[&str], allowed: &[&str]) -> ServiceEntry {
    let mut labels = std::collections::BTreeMap::new();
    labels.insert(
        xcc_proto::names::SERVICE_PORT_ANNOTATION.to_string(),
        "443".to_string(),
    );
    ServiceEntry {
        key: ServiceKey::new("east", ns, name),
        source: Source::Local,
        fqdn: fqdn.into(),
        endpoints: ips
            .iter()
            .map(|ip| Endpoint {
                address: ip.to_string(),
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

pub async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("creating a temporary directory")?;
    let ca = pki::init_ca_dir("xcc.demo", &dir.path().join("ca"))?;
    let issue = |name: &str, admin: bool| -> anyhow::Result<TlsFiles> {
        let mut req = if admin {
            IssueRequest::admin(name)
        } else {
            IssueRequest::cluster(name)
        };
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = ca.issue(&req)?;
        Ok(pki::write_issued(&dir.path().join(name), &ca, &cert)?)
    };
    let east_files = issue("east", false)?;
    let west_files = issue("west", false)?;
    let admin_files = issue("operator", true)?;
    println!("PKI: trust domain xcc.demo; certificates for east, west and admin operator\n");

    let cancel = CancellationToken::new();
    let east = Registry::start(RegistryConfig::loopback(east_files), cancel.clone()).await?;
    let west = Registry::start(RegistryConfig::loopback(west_files), cancel.clone()).await?;
    println!(
        "east: hamlet {} admin {}\nwest: hamlet {} admin {}\n",
        east.hamlet_addr, east.admin_addr, west.hamlet_addr, west.admin_addr
    );

    east.catalog.upsert(export(
        "shop",
        "web.shop.xcc.test",
        "web.shop.xcc.test",
        &["10.0.1.10", "10.0.1.11"],
        &[],
    ));
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
    west.set_remotes(vec![RemoteSpec {
        name: "east".into(),
        address: east.hamlet_addr.to_string(),
        server_name: "localhost".into(),
        roots: None,
        allowed_domains: vec![],
    }])
    .await;

    let admin_tls = ReloadingTls::load(admin_files)?;
    let mut east_admin =
        xcc_registry::admin::connect(admin_tls.clone(), &east.admin_addr.to_string(), None).await?;
    let mut west_admin =
        xcc_registry::admin::connect(admin_tls, &west.admin_addr.to_string(), None).await?;

    // Wait (bounded) until west reports a completed sync with east.
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

    let ok = imported.len() == 2 && withheld.len() == 1;
    cancel.cancel();
    east.shutdown().await?;
    west.shutdown().await?;
    if !ok {
        anyhow::bail!(
            "unexpected outcome: {} imported, {} withheld",
            imported.len(),
            withheld.len()
        );
    }
    println!("\ndemo complete: 2 of 3 services imported, 1 withheld by its allowed requesters");
    Ok(())
}

//! Identity and authorization, tried as an attacker would: peers holding
//! valid certificates from the federation's own CA that lie. Everything runs on 127.0.0.1,
//! bounded in count and time.
//!
//! * look-alike identities (an admin certificate named `west`, a DNS-SAN-only `west`,
//!   `spiffe://evil.test/cluster/west`) on the Hamlet, federation and admin listeners;
//! * one decision table run against every listener (Hamlet stream, federation answer, admin
//!   Explain) and against what becomes an import (what the DNS server would serve), with a
//!   Cedar `forbid` that must hold everywhere;
//! * a child claiming a cluster that is down (c3 claiming `[c3, c2]`), a never-seen c9, `a9`
//!   shadowing `shop/api`, oversized entries, garbage after the first message and a message
//!   past the stream's limit.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use tokio_util::sync::CancellationToken;
use xcc_certs::reload::{ReloadingTls, TlsFiles};
use xcc_proto::xcc::admin::v1 as api;
use xcc_proto::xcc::federation::v1 as fed;
use xcc_registry::catalog::{Endpoint, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::link::ParentSpec;
use xcc_registry::federation::{Question, Target};
use xcc_registry::hamlet::client::Backoff;
use xcc_registry::{Registry, RegistryConfig};

// ------------------------------------------------------------------------------- helpers

/// A certificate signed by the test CA but shaped by hand: `sans` only, CN `west`.
fn lookalike(pki: &Pki, dir: &str, sans: Vec<rcgen::SanType>) -> TlsFiles {
    use rcgen::{
        CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair,
    };
    let ca_key = KeyPair::from_pem(pki.ca.key_pem()).expect("ca key");
    let issuer = Issuer::from_ca_cert_pem(pki.ca.cert_pem(), ca_key).expect("issuer");
    let key = KeyPair::generate().expect("key");
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "west");
    params.distinguished_name = dn;
    params.subject_alt_names = sans;
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, &issuer).expect("sign");
    let d = pki.dir.path().join(dir);
    std::fs::create_dir_all(&d).expect("dir");
    let files = TlsFiles::in_dir(&d);
    std::fs::write(&files.cert, cert.pem()).expect("cert");
    std::fs::write(&files.key, key.serialize_pem()).expect("key");
    std::fs::write(&files.ca, pki.ca.cert_pem()).expect("ca");
    files
}

fn uri(s: &str) -> rcgen::SanType {
    rcgen::SanType::URI(s.try_into().expect("ia5"))
}

fn service(cluster: &str, ns: &str, name: &str, ip: &str, allowed: &[&str]) -> ServiceEntry {
    ServiceEntry {
        key: ServiceKey::new(cluster, ns, name),
        source: Source::Local,
        fqdn: format!("{name}.{ns}.svc.clusterset.local").into(),
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

async fn node(
    pki: &Pki,
    name: &str,
    up: Option<SocketAddr>,
    imports: &[(&str, &str)],
    policies: Vec<(String, String)>,
) -> (Registry, CancellationToken) {
    let mut cfg = RegistryConfig::loopback(pki.cluster(name));
    cfg.client.backoff = Backoff {
        min: Duration::from_millis(50),
        max: Duration::from_millis(200),
    };
    cfg.federation.parent = up.map(|addr| ParentSpec {
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
    cfg.federation.policies = policies;
    start_with(cfg).await
}

/// A hand-driven child session.
struct RawChild {
    tx: tokio::sync::mpsc::Sender<fed::ChildMessage>,
    rx: tonic::Streaming<fed::ParentMessage>,
}

impl RawChild {
    async fn open(
        tls: &ReloadingTls,
        addr: SocketAddr,
        first: fed::ChildMessage,
    ) -> Result<Self, tonic::Status> {
        let ch = channel(tls, addr).await.expect("channel");
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tx.send(first).await.expect("queue");
        let mut client = fed::federation_client::FederationClient::new(ch);
        let rx = client
            .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        Ok(Self { tx, rx })
    }

    async fn connect(pki: &Pki, name: &str, addr: SocketAddr, subtree: &[&str]) -> Self {
        let tls = ReloadingTls::load(pki.cluster(name)).expect("tls");
        Self::open(&tls, addr, membership(subtree))
            .await
            .expect("session opens")
    }

    async fn send(&self, p: fed::child_message::Payload) {
        self.tx
            .send(fed::ChildMessage { payload: Some(p) })
            .await
            .expect("send");
    }

    async fn next(&mut self) -> fed::parent_message::Payload {
        loop {
            let m = tokio::time::timeout(WAIT, self.rx.message())
                .await
                .expect("in time")
                .expect("stream open")
                .expect("not closed");
            if let Some(p) = m.payload {
                return p;
            }
        }
    }

    async fn rejection(&mut self) -> fed::Rejection {
        loop {
            if let fed::parent_message::Payload::Rejection(r) = self.next().await {
                return r;
            }
        }
    }

    async fn answer(&mut self) -> fed::ServiceQueryResponse {
        loop {
            if let fed::parent_message::Payload::ServiceQueryResponse(r) = self.next().await {
                return r;
            }
        }
    }
}

fn membership(clusters: &[&str]) -> fed::ChildMessage {
    fed::ChildMessage {
        payload: Some(fed::child_message::Payload::Subtree(
            fed::SubtreeMembership {
                clusters: clusters.iter().map(|s| s.to_string()).collect(),
                ..Default::default()
            },
        )),
    }
}

fn announce(cluster: &str, ns: &str, name: &str, ep: &str) -> fed::child_message::Payload {
    fed::child_message::Payload::ServiceAnnouncement(fed::ServiceAnnouncement {
        cluster: cluster.into(),
        namespace: ns.into(),
        name: name.into(),
        endpoints: vec![ep.into()],
        fqdn: format!("{name}.{ns}.svc.clusterset.local"),
        ..Default::default()
    })
}

async fn admin(
    pki: &Pki,
    reg: &Registry,
) -> api::admin_client::AdminClient<tonic::transport::Channel> {
    let tls = ReloadingTls::load(pki.admin("operator")).expect("tls");
    xcc_registry::admin::connect(tls, &reg.admin_addr.to_string(), None)
        .await
        .expect("admin")
}

/// Admin Explain of `api.shop.svc.clusterset.local` at `root` (asked for `requester`): owned
/// by c2, with a9's refused claim as its one clash.
async fn explain_shows_a9_refused(pki: &Pki, root: &Registry, requester: &str) {
    let d = admin(pki, root)
        .await
        .explain(api::ResolveRequest {
            fqdn: "api.shop.svc.clusterset.local".into(),
            requester_cluster: requester.into(),
            ..Default::default()
        })
        .await
        .expect("explain")
        .into_inner();
    assert_eq!(d.owner_cluster, "c2");
    assert_eq!(d.name_clashes.len(), 1);
    assert!(
        d.name_clashes[0].ends_with(
            " a9/shop/api claimed api.shop.svc.clusterset.local owned by c2/shop/api; refused by root"
        ),
        "{:?}",
        d.name_clashes
    );
}

/// The FQDNs a Hamlet consumer with `tls` receives in its snapshot, or the status it got.
async fn hamlet_snapshot(
    tls: &ReloadingTls,
    addr: SocketAddr,
) -> Result<BTreeSet<String>, tonic::Status> {
    let mut c = Consumer::connect(tls, addr, true).await?;
    assert!(c.marker, "the server honours the snapshot marker");
    let mut got = BTreeSet::new();
    loop {
        match c.next_or_status().await? {
            Some(seen) => {
                c.ack(&seen.nonce).await;
                match seen.fqdn {
                    Some(f) => {
                        got.insert(f);
                    }
                    None => return Ok(got),
                }
            }
            None => panic!("stream ended before the snapshot marker"),
        }
    }
}

// ---------------------------------------------------------------- identities and the table

/// Row 3: an admin certificate named `west`, a DNS-SAN-only `west` and
/// `spiffe://evil.test/cluster/west`, all signed by the federation's CA, are refused by the
/// Hamlet, federation and admin listeners; the real `west` is served. An admin certificate
/// of another trust domain (a stolen one from elsewhere) opens nothing.
#[tokio::test]
async fn look_alike_identities_are_refused_on_every_listener() {
    let pki = Pki::new("xcc.test");
    let (east, _cancel) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(service("east", "shop", "api", "10.1.0.1", &["west"]));

    let real = ReloadingTls::load(pki.cluster("west")).expect("tls");
    assert_eq!(
        hamlet_snapshot(&real, east.hamlet_addr)
            .await
            .expect("served"),
        BTreeSet::from(["api.shop.svc.clusterset.local".to_string()])
    );

    // (certificate, why it is no cluster, whether the admin listener serves it: only the
    // genuine admin certificate of this trust domain is an operator).
    let fakes = [
        (
            pki.admin("west"),
            "admin/west is not a cluster identity",
            true,
        ),
        (
            lookalike(
                &pki,
                "dns-west",
                vec![rcgen::SanType::DnsName("west".try_into().expect("ia5"))],
            ),
            "external/west is not a cluster identity",
            false,
        ),
        (
            lookalike(
                &pki,
                "evil-west",
                vec![uri("spiffe://evil.test/cluster/west")],
            ),
            "spiffe://evil.test/cluster/west belongs to trust domain \"evil.test\", not \"xcc.test\"",
            false,
        ),
    ];
    for (files, message, operator) in fakes {
        let tls = ReloadingTls::load(files).expect("tls");
        let status = hamlet_snapshot(&tls, east.hamlet_addr)
            .await
            .expect_err("hamlet refuses");
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::PermissionDenied, message),
            "hamlet"
        );
        let status = RawChild::open(&tls, east.hamlet_addr, membership(&["west"]))
            .await
            .err()
            .expect("federation refuses");
        assert_eq!(
            (status.code(), status.message()),
            (tonic::Code::PermissionDenied, message),
            "federation"
        );
        let mut client = xcc_registry::admin::connect(tls, &east.admin_addr.to_string(), None)
            .await
            .expect("connect");
        let listed = client
            .list_services(api::ListServicesRequest::default())
            .await;
        match (operator, listed) {
            (true, Ok(_)) => {}
            (false, Err(status)) => assert_eq!(status.code(), tonic::Code::PermissionDenied),
            (_, other) => panic!("admin listener, {message}: {other:?}"),
        }
    }
    let stolen = ReloadingTls::load(lookalike(
        &pki,
        "evil-admin",
        vec![uri("spiffe://evil.test/admin/ops")],
    ))
    .expect("tls");
    let mut client = xcc_registry::admin::connect(stolen, &east.admin_addr.to_string(), None)
        .await
        .expect("connect");
    let status = client
        .list_services(api::ListServicesRequest::default())
        .await
        .expect_err("foreign admin refused");
    assert_eq!(
        (status.code(), status.message()),
        (
            tonic::Code::PermissionDenied,
            "spiffe://evil.test/admin/ops belongs to trust domain \"evil.test\", not \"xcc.test\""
        )
    );
}

/// Row 3: one table (requester × service → condition) run against every listener: the Hamlet
/// stream, the federation answer, admin Explain, and what becomes an import (and so a DNS
/// name) through the hierarchy. `forbid discover` for c1 holds on all of them.
#[tokio::test]
async fn one_decision_table_on_every_listener() {
    let pki = Pki::new("xcc.test");
    let forbid = r#"
@id("no-c1")
forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource);
"#;
    let (east, _cancel) = node(
        &pki,
        "east",
        None,
        &[],
        vec![("forbid.cedar".into(), forbid.into())],
    )
    .await;
    east.catalog
        .upsert(service("east", "shop", "open", "10.1.0.1", &[]));
    east.catalog
        .upsert(service("east", "shop", "westonly", "10.1.0.2", &["west"]));
    use api::Condition::*;
    let table: &[(&str, &str, api::Condition)] = &[
        ("west", "open", Granted),
        ("west", "westonly", Granted),
        ("north", "open", Granted),
        ("north", "westonly", NotAllowedByCallee),
        ("c1", "open", PolicyDenied),
        ("c1", "westonly", NotAllowedByCallee),
    ];
    let mut admin = admin(&pki, &east).await;
    for requester in ["west", "north", "c1"] {
        let rows: Vec<_> = table.iter().filter(|r| r.0 == requester).collect();
        let granted: BTreeSet<String> = rows
            .iter()
            .filter(|r| r.2 == Granted)
            .map(|r| format!("{}.shop.svc.clusterset.local", r.1))
            .collect();
        // Hamlet listener.
        let tls = ReloadingTls::load(pki.cluster(requester)).expect("tls");
        assert_eq!(
            hamlet_snapshot(&tls, east.hamlet_addr)
                .await
                .expect("subscribed"),
            granted,
            "hamlet, {requester}"
        );
        // Federation answers.
        let mut child = RawChild::open(&tls, east.hamlet_addr, membership(&[requester]))
            .await
            .expect("session");
        for (i, (_, svc, want)) in rows.iter().enumerate() {
            child
                .send(fed::child_message::Payload::ServiceQuery(
                    fed::ServiceQuery {
                        namespace: "shop".into(),
                        name: svc.to_string(),
                        requester_cluster: requester.into(),
                        correlation_id: i as u64 + 1,
                        ..Default::default()
                    },
                ))
                .await;
            let a = child.answer().await;
            let deny = fed::DenyReason::try_from(a.deny_reason).expect("known");
            let got = match (a.access_allowed, deny) {
                (true, _) => Granted,
                (false, fed::DenyReason::NotAllowedByCallee) => NotAllowedByCallee,
                (false, fed::DenyReason::PolicyDenied) => PolicyDenied,
                (false, other) => panic!("unexpected {other:?}"),
            };
            assert_eq!(
                (a.found, got),
                (true, *want),
                "federation, {requester} → {svc}"
            );
        }
        // Admin Explain.
        for (_, svc, want) in &rows {
            let d = admin
                .explain(api::ResolveRequest {
                    namespace: "shop".into(),
                    name: svc.to_string(),
                    requester_cluster: requester.into(),
                    ..Default::default()
                })
                .await
                .expect("explain")
                .into_inner();
            assert_eq!(
                d.condition, *want as i32,
                "admin, {requester} → {svc}: {}",
                d.reason
            );
        }
    }
    // What becomes an import: c1 (forbidden) imports nothing, west both.
    let (west, _cw) = node(
        &pki,
        "west",
        Some(east.hamlet_addr),
        &[("shop", "open"), ("shop", "westonly")],
        vec![],
    )
    .await;
    let (c1, _cc) = node(
        &pki,
        "c1",
        Some(east.hamlet_addr),
        &[("shop", "open"), ("shop", "westonly")],
        vec![],
    )
    .await;
    let imported = |r: &Registry| -> Vec<String> {
        let mut v: Vec<String> = r
            .catalog
            .list(&Default::default())
            .iter()
            .filter(|e| matches!(e.source, Source::Hierarchy(_)))
            .map(|e| e.fqdn.to_string())
            .collect();
        v.sort();
        v
    };
    wait_level(&west, "both imports granted", |r| imported(r).len() == 2).await;
    wait_level(&c1, "both questions answered", |r| {
        r.level
            .subscriptions()
            .iter()
            .all(|(_, _, a)| a.as_ref().is_some_and(|a| a.found && !a.unavailable))
    })
    .await;
    assert_eq!(
        c1.level
            .subscriptions()
            .iter()
            .map(|(_, _, a)| a.as_ref().map(|a| a.access_allowed))
            .collect::<Vec<_>>(),
        [Some(false), Some(false)]
    );
    assert!(
        imported(&c1).is_empty(),
        "a denied import never becomes a name"
    );
}

/// Exactly the README's label `forbid` at the root holds for a service two
/// levels away, on the root's Hamlet listener and through the hierarchy. The owner c2 marks
/// `shop/restricted` with the policy label `connectivity.tanzu.vmware.com/tier: restricted`;
/// the label travels up with the announcement, so the root's Cedar sees `tier=restricted`.
#[tokio::test]
async fn the_readmes_label_forbid_holds_through_the_tree() {
    let pki = Pki::new("xcc.test");
    let readme = r#"
@id("no-restricted-for-c1")
forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource)
when { resource.labels.contains("tier=restricted") };
"#;
    let (root, _cr) = node(
        &pki,
        "root",
        None,
        &[],
        vec![("readme.cedar".into(), readme.into())],
    )
    .await;
    let (c2, _c2) = node(&pki, "c2", Some(root.hamlet_addr), &[], vec![]).await;
    let mut restricted = service("c2", "shop", "restricted", "10.2.0.9", &[]);
    restricted.labels.insert(
        "connectivity.tanzu.vmware.com/tier".into(),
        "restricted".into(),
    );
    c2.catalog.upsert(restricted);
    c2.catalog
        .upsert(service("c2", "shop", "open", "10.2.0.1", &[]));
    wait_level(&root, "c2's services announced", |r| {
        r.catalog
            .get(&ServiceKey::new("c2", "shop", "restricted"))
            .is_some()
            && r.catalog
                .get(&ServiceKey::new("c2", "shop", "open"))
                .is_some()
    })
    .await;
    // The root's Hamlet listener.
    let tls = ReloadingTls::load(pki.cluster("c1")).expect("tls");
    assert_eq!(
        hamlet_snapshot(&tls, root.hamlet_addr)
            .await
            .expect("subscribed"),
        BTreeSet::from(["open.shop.svc.clusterset.local".to_string()])
    );
    // Another requester is not touched by c1's forbid.
    let tls = ReloadingTls::load(pki.cluster("c4")).expect("tls");
    assert_eq!(
        hamlet_snapshot(&tls, root.hamlet_addr)
            .await
            .expect("subscribed"),
        BTreeSet::from([
            "open.shop.svc.clusterset.local".to_string(),
            "restricted.shop.svc.clusterset.local".to_string()
        ])
    );
    // Through the hierarchy: c1 asks for both.
    let (c1, _c1) = node(
        &pki,
        "c1",
        Some(root.hamlet_addr),
        &[("shop", "open"), ("shop", "restricted")],
        vec![],
    )
    .await;
    wait_level(&c1, "both questions answered", |r| {
        r.level
            .subscriptions()
            .iter()
            .all(|(_, _, a)| a.as_ref().is_some_and(|a| a.found && !a.unavailable))
    })
    .await;
    let mut answers: Vec<(String, bool, Vec<String>)> = c1
        .level
        .subscriptions()
        .iter()
        .filter_map(|(_, _, a)| a.as_ref())
        .map(|a| (a.name.clone(), a.access_allowed, a.policies.clone()))
        .collect();
    answers.sort();
    assert_eq!(
        answers,
        [
            ("open".to_string(), true, vec!["bilateral".to_string()]),
            (
                "restricted".to_string(),
                false,
                vec!["no-restricted-for-c1".to_string()]
            ),
        ]
    );
    let imported: Vec<String> = c1
        .catalog
        .list(&Default::default())
        .iter()
        .filter(|e| matches!(e.source, Source::Hierarchy(_)))
        .map(|e| e.fqdn.to_string())
        .collect();
    assert_eq!(imported, ["open.shop.svc.clusterset.local"]);
}

/// Row 3: a `forbid discover` for c1 written while c1 is subscribed holds on the open Hamlet
/// stream: c1 is sent a DELETE for what the forbid covers, on the same stream, and a new
/// subscription receives nothing it covers.
#[tokio::test]
async fn a_forbid_added_later_holds_on_open_hamlet_streams() {
    let pki = Pki::new("xcc.test");
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = RegistryConfig::loopback(pki.cluster("east"));
    cfg.federation.policy_dir = Some(dir.path().to_path_buf());
    let (east, _cancel) = start_with(cfg).await;
    east.catalog
        .upsert(service("east", "shop", "api", "10.1.0.1", &[]));
    let tls = ReloadingTls::load(pki.cluster("c1")).expect("tls");
    let mut c = Consumer::connect(&tls, east.hamlet_addr, true)
        .await
        .expect("subscribed");
    assert_eq!(
        c.next_acked().await.fqdn.as_deref(),
        Some("api.shop.svc.clusterset.local")
    );
    assert_eq!(c.next_acked().await.fqdn, None, "snapshot marker");
    std::fs::write(
        dir.path().join("forbid.cedar"),
        r#"@id("no-c1") forbid (principal in Xcc::Cluster::"c1", action == Xcc::Action::"discover", resource);"#,
    )
    .expect("write policy");
    let seen = match c.next_or_status().await {
        Ok(Some(seen)) => seen,
        other => panic!("the stream ended instead of sending the DELETE: {other:?}"),
    };
    c.ack(&seen.nonce).await;
    assert_eq!(
        (seen.op, seen.fqdn.as_deref()),
        (
            xcc_proto::federation::resourcediscovery::v1alpha1::stream_response::Operation::Delete,
            Some("api.shop.svc.clusterset.local")
        )
    );
    assert!(
        hamlet_snapshot(&tls, east.hamlet_addr)
            .await
            .expect("subscribed again")
            .is_empty()
    );
}

// ---------------------------------------------------------------- federation attacks

/// Rows 1 and 2: with c2 down, c3 claims `[c3, c2]`, announces `(c2, shop, api)` at
/// 6.6.6.6:443 and asks as c2; a never-seen c9 the same. Every entry is refused on its own,
/// c1's import never points at 6.6.6.6, and the real c2 attaches afterwards. Then `a9`
/// announces `shop/api`: refused, reported to both sides and visible in admin Explain.
#[tokio::test]
async fn a_child_cannot_speak_for_clusters_or_names_it_does_not_own() {
    let pki = Pki::new("xcc.test");
    let (root, _cr) = node(&pki, "root", None, &[], vec![]).await;
    let (c1, _c1) = node(
        &pki,
        "c1",
        Some(root.hamlet_addr),
        &[("shop", "api")],
        vec![],
    )
    .await;
    wait_level(&root, "c1 attached", |r| {
        r.level.subtree() == ["c1", "root"]
    })
    .await;

    let mut c3 = RawChild::connect(&pki, "c3", root.hamlet_addr, &["c3", "c2", "c9"]).await;
    for cluster in ["c2", "c9"] {
        let r = c3.rejection().await;
        assert_eq!(
            (r.kind.as_str(), r.cluster.as_str(), r.code),
            ("subtree", cluster, tonic::Code::PermissionDenied as i32)
        );
    }
    for cluster in ["c2", "c9"] {
        c3.send(announce(cluster, "shop", "api", "6.6.6.6:443"))
            .await;
        let r = c3.rejection().await;
        assert_eq!(
            (
                r.kind.as_str(),
                r.cluster.as_str(),
                r.code,
                r.refused_by.as_str()
            ),
            (
                "announcement",
                cluster,
                tonic::Code::PermissionDenied as i32,
                "root"
            )
        );
    }
    c3.send(fed::child_message::Payload::ServiceQuery(
        fed::ServiceQuery {
            namespace: "shop".into(),
            name: "api".into(),
            requester_cluster: "c2".into(),
            correlation_id: 1,
            ..Default::default()
        },
    ))
    .await;
    let r = c3.rejection().await;
    assert_eq!((r.kind.as_str(), r.cluster.as_str()), ("query", "c2"));
    assert_eq!(root.level.subtree(), ["c1", "c3", "root"]);
    assert!(root.catalog.by_name("shop", "api").is_empty());
    let why = admin(&pki, &root)
        .await
        .explain_policy(api::ExplainPolicyRequest {
            action: "carry".into(),
            principal_cluster: "c3".into(),
            name: "c2".into(),
            ..Default::default()
        })
        .await
        .expect("explain policy")
        .into_inner();
    assert_eq!(
        (why.allowed, why.reason.as_str()),
        (false, "no policy permits it")
    );
    wait_level(&c1, "c1's question answered", |r| {
        r.level.subscriptions()[0]
            .2
            .as_ref()
            .is_some_and(|a| !a.unavailable)
    })
    .await;
    assert!(
        !c1.level.subscriptions()[0]
            .2
            .as_ref()
            .is_some_and(|a| a.found)
    );

    // The real c2 comes up and is not refused; c1's import points at it.
    let (c2, _c2) = node(&pki, "c2", Some(root.hamlet_addr), &[], vec![]).await;
    c2.catalog
        .upsert(service("c2", "shop", "api", "10.2.0.1", &["c1"]));
    wait_level(&root, "c2 attached as itself", |r| {
        r.level.subtree() == ["c1", "c2", "c3", "root"]
    })
    .await;
    wait_level(&c1, "import granted from the real c2", |r| {
        r.catalog.list(&Default::default()).iter().any(|e| {
            matches!(e.source, Source::Hierarchy(_)) && e.endpoints[0].address == "10.2.0.1"
        })
    })
    .await;

    // a9 sorts before c2 and announces the same name: refused, both sides told.
    let mut a9 = RawChild::connect(&pki, "a9", root.hamlet_addr, &["a9"]).await;
    a9.send(announce("a9", "shop", "api", "6.6.6.6:443")).await;
    let r = a9.rejection().await;
    assert_eq!(
        (r.code, r.reason.as_str()),
        (
            tonic::Code::AlreadyExists as i32,
            "api.shop.svc.clusterset.local is owned by c2/shop/api; the first owner keeps a name"
        )
    );
    assert_eq!(
        root.catalog
            .hamlet_get("api.shop.svc.clusterset.local")
            .expect("served")
            .key,
        ServiceKey::new("c2", "shop", "api")
    );
    wait_level(&c2, "the owner saw the attempt", |r| {
        r.level.clashes(None).len() == 1
    })
    .await;
    assert_eq!(c2.level.clashes(None)[0].claimant.cluster, "a9");
    explain_shows_a9_refused(&pki, &root, "c1").await;
    drop(c3);
}

/// Row 2 across a restart: the parent keeps who owns which name in its state directory, so
/// after it restarts the attacker `a9`, reconnecting first, cannot take `shop/api` from `c2`:
/// it is refused with ALREADY_EXISTS, the owner is told when it is back and gets its name, and
/// admin Explain lists the clash.
#[tokio::test]
async fn a_parent_restart_does_not_hand_a_name_to_whoever_reconnects_first() {
    let pki = Pki::new("xcc.test");
    let state = tempfile::tempdir().expect("state dir");
    let root_config = || {
        let mut cfg = RegistryConfig::loopback(pki.cluster("root"));
        cfg.store = xcc_registry::StoreConfig::File {
            state_dir: state.path().to_path_buf(),
            poll: Duration::from_secs(60),
        };
        cfg
    };
    let (root, cancel) = start_with(root_config()).await;
    let owner = RawChild::connect(&pki, "c2", root.hamlet_addr, &["c2"]).await;
    owner
        .send(announce("c2", "shop", "api", "10.2.0.1:443"))
        .await;
    let attacker = RawChild::connect(&pki, "a9", root.hamlet_addr, &["a9"]).await;
    attacker
        .send(announce("a9", "shop", "web", "10.9.0.1:443"))
        .await;
    wait_level(&root, "both services held", |r| r.catalog.len() == 2).await;
    cancel.cancel();
    root.shutdown().await.expect("root stops");
    drop((owner, attacker));

    let (root, _cancel) = start_with(root_config()).await;
    let mut attacker = RawChild::connect(&pki, "a9", root.hamlet_addr, &["a9"]).await;
    attacker
        .send(announce("a9", "shop", "api", "6.6.6.6:443"))
        .await;
    let r = attacker.rejection().await;
    assert_eq!(
        (r.code, r.reason.as_str(), r.refused_by.as_str()),
        (
            tonic::Code::AlreadyExists as i32,
            "api.shop.svc.clusterset.local is owned by c2/shop/api; the first owner keeps a name",
            "root"
        )
    );
    // Its own service is still its own.
    attacker
        .send(announce("a9", "shop", "web", "10.9.0.1:443"))
        .await;
    wait_level(&root, "a9's own service held", |r| r.catalog.len() == 1).await;
    assert!(root.catalog.by_name("shop", "api").is_empty());

    let mut owner = RawChild::connect(&pki, "c2", root.hamlet_addr, &["c2"]).await;
    let notice = loop {
        if let fed::parent_message::Payload::NameClash(n) = owner.next().await {
            break n;
        }
    };
    assert_eq!(
        notice,
        fed::NameClash {
            fqdn: "api.shop.svc.clusterset.local".into(),
            owner_cluster: "c2".into(),
            owner_namespace: "shop".into(),
            owner_name: "api".into(),
            claimant_cluster: "a9".into(),
            claimant_namespace: "shop".into(),
            claimant_name: "api".into(),
            refused_by: "root".into(),
        }
    );
    owner
        .send(announce("c2", "shop", "api", "10.2.0.1:443"))
        .await;
    wait_level(&root, "the owner has its name back", |r| {
        r.catalog
            .hamlet_get("api.shop.svc.clusterset.local")
            .is_some_and(|e| e.key == ServiceKey::new("c2", "shop", "api"))
    })
    .await;
    explain_shows_a9_refused(&pki, &root, "a9").await;
}

/// An XCC v1 installation's certificate (DNS SANs, no SPIFFE URI) is no cluster identity: a
/// registry refuses to start on it, saying what it needs (README, "From XCC v1").
#[tokio::test]
async fn an_xcc_v1_certificate_cannot_start_a_registry() {
    let pki = Pki::new("xcc.test");
    let old = lookalike(
        &pki,
        "v1-west",
        vec![rcgen::SanType::DnsName(
            "west.registry.example".try_into().expect("ia5"),
        )],
    );
    let err = match xcc_registry::Registry::start(
        RegistryConfig::loopback(old),
        CancellationToken::new(),
    )
    .await
    {
        Ok(_) => panic!("a registry started on a certificate without a cluster identity"),
        Err(e) => e,
    };
    assert_eq!(
        err.to_string(),
        "the registry certificate must carry a cluster identity \
         (spiffe://<trust-domain>/cluster/<name>); it has external/west.registry.example"
    );
}

/// A damaged name-owner ledger stops the start (docs/security.md §3). The owner c2 is away, the
/// parent restarts on an emptied ledger, and c3 would take `shop/api`; instead the parent refuses
/// to start, saying which ledger is damaged and how. The same for a ledger cut short in a line and
/// for garbage; the ledger is left as it was.
#[tokio::test]
async fn a_parent_refuses_to_start_on_a_damaged_name_owner_ledger() {
    use xcc_registry::federation::level::LedgerError;
    use xcc_registry::run::StartError;
    let pki = Pki::new("xcc.test");
    let state = tempfile::tempdir().expect("state dir");
    let ledger = state.path().join("name-owners");
    let root_config = || {
        let mut cfg = RegistryConfig::loopback(pki.cluster("root"));
        cfg.store = xcc_registry::StoreConfig::File {
            state_dir: state.path().to_path_buf(),
            poll: Duration::from_secs(60),
        };
        cfg
    };
    let (root, cancel) = start_with(root_config()).await;
    let owner = RawChild::connect(&pki, "c2", root.hamlet_addr, &["c2"]).await;
    owner
        .send(announce("c2", "shop", "api", "10.2.0.1:443"))
        .await;
    wait_level(&root, "c2's service held", |r| r.catalog.len() == 1).await;
    cancel.cancel();
    root.shutdown().await.expect("root stops");
    drop(owner);
    let written = std::fs::read_to_string(&ledger).expect("the ledger");
    assert!(written.contains("+ shop/api c2 shop api "), "{written}");

    let place = format!("file {}", ledger.display());
    let cut = written.len() - 3;
    for (damage, text, expected) in [
        (
            "empty",
            String::new(),
            LedgerError::Empty {
                place: place.clone(),
            },
        ),
        (
            "truncated mid-line",
            written[..cut].to_string(),
            LedgerError::Truncated {
                place: place.clone(),
                line: written[..cut].lines().count(),
            },
        ),
        (
            "garbage",
            "\u{1f}\u{8b}\u{8}binary\n".to_string(),
            LedgerError::Unparsable {
                place: place.clone(),
                line: 1,
                reason: "not an xcc name-owner ledger header".into(),
            },
        ),
    ] {
        std::fs::write(&ledger, &text).expect("damage the ledger");
        let err = match xcc_registry::Registry::start(root_config(), CancellationToken::new()).await
        {
            Ok(_) => panic!("{damage}: the parent started on a damaged ledger"),
            Err(e) => e,
        };
        let StartError::Owners(source) = &err else {
            panic!("{damage}: {err:#}");
        };
        assert_eq!(
            source.downcast_ref::<LedgerError>(),
            Some(&expected),
            "{damage}"
        );
        assert!(
            format!("{:#}", anyhow::Error::from(err)).starts_with(&format!(
                "reading the name-owner ledger: the name-owner ledger {place} "
            )),
            "{damage}"
        );
        // Nothing was rewritten: the operator finds the ledger as it was.
        assert_eq!(
            std::fs::read_to_string(&ledger).expect("ledger"),
            text,
            "{damage}"
        );
    }

    // Restored, it holds c2's name against c3 again.
    std::fs::write(&ledger, &written).expect("restore");
    let (root, _cancel) = start_with(root_config()).await;
    let mut c3 = RawChild::connect(&pki, "c3", root.hamlet_addr, &["c3"]).await;
    c3.send(announce("c3", "shop", "api", "6.6.6.6:443")).await;
    let r = c3.rejection().await;
    assert_eq!(
        (r.code, r.reason.as_str()),
        (
            tonic::Code::AlreadyExists as i32,
            "api.shop.svc.clusterset.local is owned by c2/shop/api; the first owner keeps a name"
        )
    );
}

/// Row 5 (federation half): an announcement over 1 MiB is refused on its own with
/// RESOURCE_EXHAUSTED and the stream goes on; the child stores the rejection.
#[tokio::test]
async fn an_oversized_announcement_costs_that_entry_only() {
    let pki = Pki::new("xcc.test");
    let (root, _cr) = node(&pki, "root", None, &[], vec![]).await;
    let mut raw = RawChild::connect(&pki, "big", root.hamlet_addr, &["big"]).await;
    let mut huge = fed::ServiceAnnouncement {
        cluster: "big".into(),
        namespace: "shop".into(),
        name: "huge".into(),
        endpoints: vec!["10.9.0.1:443".into()],
        ..Default::default()
    };
    // 2 MiB of labels: over the per-entry limit, under the stream's.
    huge.labels
        .insert("pad".into(), "x".repeat(2 * 1024 * 1024));
    raw.send(fed::child_message::Payload::ServiceAnnouncement(huge))
        .await;
    let r = raw.rejection().await;
    assert_eq!(
        (r.kind.as_str(), r.name.as_str(), r.code),
        (
            "announcement",
            "huge",
            tonic::Code::ResourceExhausted as i32
        )
    );
    assert!(
        r.reason.ends_with("exceeds the 1048576-byte limit"),
        "{}",
        r.reason
    );
    raw.send(announce("big", "shop", "small", "10.9.0.2:443"))
        .await;
    wait_catalog(&root.catalog, "the next entry is stored", |c| {
        c.get(&ServiceKey::new("big", "shop", "small")).is_some()
    })
    .await;
    assert!(
        root.catalog
            .get(&ServiceKey::new("big", "shop", "huge"))
            .is_none()
    );

    // A real child stores and logs what its parent refused.
    let (leaf, _cl) = node(&pki, "leaf", Some(root.hamlet_addr), &[], vec![]).await;
    let mut big = service("leaf", "shop", "huge", "10.3.0.1", &[]);
    big.labels = [("pad".to_string(), "y".repeat(2 * 1024 * 1024))]
        .into_iter()
        .collect::<std::collections::BTreeMap<_, _>>()
        .into();
    leaf.catalog.upsert(big);
    leaf.catalog
        .upsert(service("leaf", "shop", "fine", "10.3.0.2", &[]));
    wait_level(&leaf, "the rejection stored", |r| {
        !r.level.rejections().is_empty()
    })
    .await;
    let (_, r) = &leaf.level.rejections()[0];
    assert_eq!(
        (r.name.as_str(), r.code),
        ("huge", tonic::Code::ResourceExhausted as i32)
    );
    wait_catalog(
        &root.catalog,
        "the rest of the leaf's entries arrive",
        |c| c.get(&ServiceKey::new("leaf", "shop", "fine")).is_some(),
    )
    .await;
}

/// Bytes straight onto the Connect stream: the raw gRPC payloads a hostile child sends.
#[derive(Clone, Default)]
struct Raw;
struct RawEnc;
struct RawDec;

impl tonic::codec::Encoder for RawEnc {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawDec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        use bytes::Buf;
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEnc;
    type Decoder = RawDec;
    fn encoder(&mut self) -> RawEnc {
        RawEnc
    }
    fn decoder(&mut self) -> RawDec {
        RawDec
    }
}

/// Send a valid membership, then `payload` as the second message; the session's final status.
async fn raw_session_status(
    pki: &Pki,
    name: &str,
    addr: SocketAddr,
    payload: Vec<u8>,
) -> tonic::Status {
    use prost::Message;
    let tls = ReloadingTls::load(pki.cluster(name)).expect("tls");
    let ch = channel(&tls, addr).await.expect("channel");
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(membership(&[name]).encode_to_vec())
        .await
        .expect("queue");
    tx.send(payload).await.expect("queue");
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.expect("ready");
    let path = http::uri::PathAndQuery::from_static("/xcc.federation.v1.Federation/Connect");
    let mut stream = grpc
        .streaming(
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx)),
            path,
            Raw,
        )
        .await
        .expect("session opens")
        .into_inner();
    loop {
        match tokio::time::timeout(WAIT, stream.message())
            .await
            .expect("in time")
        {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the session ended with status OK"),
            Err(status) => {
                drop(tx);
                return status;
            }
        }
    }
}

/// Row 5: garbage after the first message ends the stream with INVALID_ARGUMENT, and a message
/// past the stream's 16 MiB limit with RESOURCE_EXHAUSTED, never a silent OK.
#[tokio::test]
async fn garbage_and_huge_messages_end_the_stream_with_a_status_that_says_so() {
    let pki = Pki::new("xcc.test");
    let (root, _cr) = node(&pki, "root", None, &[], vec![]).await;
    let status = raw_session_status(&pki, "junk", root.hamlet_addr, vec![0xff; 7]).await;
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("malformed message: "),
        "{}",
        status.message()
    );
    let status =
        raw_session_status(&pki, "flood", root.hamlet_addr, vec![0; 17 * 1024 * 1024]).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    assert!(
        status
            .message()
            .starts_with("a message exceeds the 16777216-byte limit of this stream"),
        "{}",
        status.message()
    );
}

/// `n` questions for root's `shop/big` as `c1`-style raw child `from`.
fn ask_big(from: &str, n: u64) -> impl Iterator<Item = fed::ChildMessage> + use<> {
    let from = from.to_string();
    (1..=n).map(move |id| fed::ChildMessage {
        payload: Some(fed::child_message::Payload::ServiceQuery(
            fed::ServiceQuery {
                namespace: "shop".into(),
                name: "big".into(),
                requester_cluster: from.clone(),
                correlation_id: id,
                ..Default::default()
            },
        )),
    })
}

/// A child that never reads its stream while it asks, again and again, for a service with
/// 4,000 endpoints (~64 KiB per answer): once the answers queued for it fill half the
/// session's byte budget (here 256 KiB, far below its 8,192 messages) the parent stops reading
/// its questions, and after the stall period cuts it with a status naming the budget; the
/// queue's bytes are back to zero. A child that asks as much but reads gets every answer and
/// is never cut: its questions are paced by its own reading.
#[tokio::test]
async fn a_child_that_never_reads_is_cut_and_one_that_reads_is_paced() {
    let pki = Pki::new("xcc.test");
    let mut cfg = RegistryConfig::loopback(pki.cluster("root"));
    let limits = xcc_registry::budget::QueueLimits::new(8192, 256 * 1024);
    cfg.federation.queue_limits = limits;
    // What the test waits for is the cut itself (an event), this only makes it come sooner.
    cfg.federation.queue_stall = Duration::from_secs(2);
    let (root, _cr) = start_with(cfg).await;
    let mut big = service("root", "shop", "big", "10.0.0.1", &[]);
    big.endpoints = (0..4_000u32)
        .map(|i| Endpoint {
            address: format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255).into(),
            port: 443,
        })
        .collect();
    root.catalog.upsert(big);

    let mut c1 = RawChild::connect(&pki, "c1", root.hamlet_addr, &["c1"]).await;
    wait_level(&root, "c1 attached", |r| r.level.children().len() == 1).await;
    // 2,000 questions, and the parent stops reading them long before the last.
    let tx = c1.tx.clone();
    tokio::spawn(async move {
        for q in ask_big("c1", 2_000) {
            if tx.send(q).await.is_err() {
                break;
            }
        }
    });
    wait_level(&root, "c1 cut and detached", |r| {
        r.level.children().is_empty()
    })
    .await;
    assert_eq!(root.level.overflows().get(), 1);
    assert_eq!(root.level.queued_bytes().get(), 0);
    let mut answers = 0;
    let status = loop {
        match tokio::time::timeout(WAIT, c1.rx.message())
            .await
            .expect("in time")
        {
            Ok(Some(fed::ParentMessage {
                payload: Some(fed::parent_message::Payload::ServiceQueryResponse(r)),
            })) => {
                assert_eq!(r.endpoints.len(), 4_000);
                answers += 1;
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("the session ended with status OK"),
            Err(status) => break status,
        }
    };
    assert!(answers < 100, "{answers} answers");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(
        status.message(),
        "the parent's queue to this child stayed over half its budget of 8192 messages and \
         262144 bytes (--federation-queue-messages, --federation-queue-bytes) for 2 s \
         (--federation-queue-stall-seconds): the child is not reading; reconnect and \
         resynchronise"
    );

    let mut c2 = RawChild::connect(&pki, "c2", root.hamlet_addr, &["c2"]).await;
    let tx = c2.tx.clone();
    tokio::spawn(async move {
        for q in ask_big("c2", 400) {
            if tx.send(q).await.is_err() {
                break;
            }
        }
    });
    for id in 1..=400 {
        let a = c2.answer().await;
        assert_eq!((a.correlation_id, a.endpoints.len()), (id, 4_000));
    }
    assert_eq!(root.level.overflows().get(), 1, "c2 was never cut");
}

//! The fuzzed entry points, one per decoder that reads input from the network or from disk.
//! Each takes raw bytes and drives the project's own decode, conversion and validation code on
//! them exactly as a server, client or file loader would; none of them may panic. Shared by the
//! libFuzzer targets in `fuzz/fuzz_targets/` and by the stable regression test
//! (`tests/it/fuzz_corpora.rs`), which replays every corpus file through the same functions.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock, RwLock};

use prost::Message as _;
use xcc_dns::answer::{Settings, Snapshot};
use xcc_dns::wire::{self, Transport};
use xcc_dns::zone::{NamedPort, ServiceInfo, ServiceKey as DnsKey, ZoneSet};
use xcc_proto::crd::{RemoteRegistry, ServiceRecord};
use xcc_proto::federation::resourcediscovery::{v1alpha1 as rd1, v1alpha2 as rd2};
use xcc_proto::federation::types::{v1alpha1 as t1, v1alpha2 as t2};
use xcc_proto::hamlet;
use xcc_proto::names;
use xcc_proto::resources;
use xcc_proto::xcc::admin::v1 as admin;
use xcc_proto::xcc::federation::v1 as fed;
use xcc_registry::authz::{Gate, Policies};
use xcc_registry::catalog::{Catalog, ServiceEntry, ServiceKey, Source};
use xcc_registry::federation::convert::{entry_from_announcement, parse_endpoint};
use xcc_registry::federation::{Level, Target};
use xcc_registry::hamlet::convert::import_v1alpha1;
use xcc_registry::store::model::{export_entry, remote_spec};

/// The first byte picks what the rest is decoded as, so one corpus covers every message type of
/// a protocol and libFuzzer can move between them.
fn split(data: &[u8]) -> (u8, &[u8]) {
    match data.split_first() {
        Some((first, rest)) => (*first, rest),
        None => (0, &[]),
    }
}

/// A v1alpha1 resource the way the Hamlet client imports it (type check, decode, validation).
fn import_any(any: &prost_types::Any) {
    let _ = import_v1alpha1(any);
    let _ = hamlet::unpack_federated_service_v1alpha2(any);
}

/// Hamlet resource discovery, both versions: stream requests (what the server reads), stream
/// responses and their resources (what the client reads), and bare FederatedServices.
pub fn hamlet_messages(data: &[u8]) {
    let (kind, rest) = split(data);
    match kind % 6 {
        0 => {
            if let Ok(r) = rd1::StreamResponse::decode(rest)
                && let Some(any) = &r.resource
            {
                import_any(any);
            }
        }
        1 => {
            if let Ok(m) = rd2::BidirectionalStream::decode(rest)
                && let Some(any) = m.response.as_ref().and_then(|r| r.resource.as_ref())
            {
                import_any(any);
            }
        }
        2 => {
            if let Ok(r) = rd1::StreamRequest::decode(rest) {
                let _ = hamlet::type_name_of(&r.resource_url);
            }
        }
        3 => {
            if let Ok(m) = rd2::BidirectionalStream::decode(rest)
                && let Some(r) = m.request
            {
                let _ = hamlet::type_name_of(&r.resource_url);
            }
        }
        4 => {
            // The value of an Any that claims to be a v1alpha1 FederatedService.
            let any = prost_types::Any {
                type_url: format!(
                    "type.googleapis.com/{}",
                    hamlet::FEDERATED_SERVICE_V1ALPHA1_NAME
                ),
                value: rest.to_vec(),
            };
            import_any(&any);
            let _ = t1::FederatedService::decode(rest);
        }
        _ => {
            let any = prost_types::Any {
                type_url: format!(
                    "type.googleapis.com/{}",
                    hamlet::FEDERATED_SERVICE_V1ALPHA2_NAME
                ),
                value: rest.to_vec(),
            };
            import_any(&any);
            let _ = t2::FederatedService::decode(rest);
        }
    }
}

/// The owner of the fuzzed federation messages: cluster `b2`, exporting `shop/api`, no grant
/// objects (the route checks run before any sink).
fn level() -> &'static Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    LEVEL.get_or_init(|| {
        let catalog = Catalog::new();
        catalog.upsert(ServiceEntry {
            key: ServiceKey::new("b2", "shop", "api"),
            source: Source::Local,
            fqdn: "api.shop.svc.clusterset.local".into(),
            endpoints: vec![],
            ports: vec![],
            labels: Default::default(),
            allowed_requesters: vec![],
            origin: None,
            revision: 0,
        });
        Level::new(
            "b2",
            Some("b".into()),
            catalog,
            Gate::new(
                "xcc.test",
                Arc::new(RwLock::new(Arc::new(Policies::default_set()))),
            ),
        )
    })
}

/// `xcc.federation.v1`: what a parent reads from a child (announcements, queries) and what a
/// child reads from its parent (handled by the level: ancestry, answers, route notifications).
pub fn federation_messages(data: &[u8]) {
    let (kind, rest) = split(data);
    if kind % 2 == 0 {
        let Ok(m) = fed::ChildMessage::decode(rest) else {
            return;
        };
        use fed::child_message::Payload;
        match m.payload {
            Some(Payload::ServiceAnnouncement(a)) => {
                if let Ok(e) = entry_from_announcement(&a, Source::Child("b1".into())) {
                    let _ = level().policies().announce("b1", &e);
                }
                for s in &a.endpoints {
                    let _ = parse_endpoint(s);
                }
            }
            Some(Payload::ServiceQuery(q)) => {
                let _ = Target::from_query(&q).to_string();
            }
            _ => {}
        }
    } else {
        let Ok(m) = fed::ParentMessage::decode(rest) else {
            return;
        };
        // Only the message kinds whose handling is bounded by the message itself: an ancestry
        // path is kept (replaced by the next), a route notification is checked and recorded
        // for own exports only.
        use fed::parent_message::Payload;
        if matches!(
            m.payload,
            Some(Payload::Ancestry(_) | Payload::RouteNotification(_))
        ) {
            let _ = level().on_parent_message(m);
        }
    }
}

/// `xcc.admin.v1` requests as the admin server decodes them, and the name rules a Resolve
/// request's target goes through.
pub fn admin_requests(data: &[u8]) {
    let (kind, rest) = split(data);
    match kind % 4 {
        0 => {
            if let Ok(r) = admin::ResolveRequest::decode(rest) {
                if !r.fqdn.is_empty() {
                    let _ = names::canonical_fqdn(&r.fqdn);
                }
                let _ = names::is_dns1123_label(&r.namespace);
                let _ = names::is_dns1123_subdomain(&r.name);
                let _ = names::is_dns1123_label(&r.requester_cluster);
            }
        }
        1 => {
            let _ = admin::ListServicesRequest::decode(rest);
        }
        2 => {
            let _ = admin::GetServiceRequest::decode(rest);
        }
        _ => {
            let _ = admin::WatchRequest::decode(rest);
            let _ = admin::ExplainPolicyRequest::decode(rest);
        }
    }
}

/// The file store's records: `exports/*.yaml` ServiceRecords (parse, validate, catalog entry),
/// `remotes/*.yaml` RemoteRegistries (parse, validate, remote spec) and `imports/*.yaml`.
pub fn yaml_records(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(records) = resources::parse_documents::<ServiceRecord>(text, "fuzz.yaml") {
        for sr in &records {
            let _ = export_entry("b2", sr);
        }
    }
    if let Ok(remotes) = resources::parse_documents::<RemoteRegistry>(text, "fuzz.yaml") {
        for rr in &remotes {
            let _ = remote_spec(rr);
        }
    }
}

/// A Cedar policy file as the policy-directory loader reads it (parse, validate against the
/// schema), then one decision with the loaded set.
pub fn cedar_policies(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(policies) = Policies::from_sources(&[("fuzz.cedar".to_string(), text.to_string())])
    else {
        return;
    };
    let entry = ServiceEntry {
        key: ServiceKey::new("b2", "shop", "api"),
        source: Source::Local,
        fqdn: "api.shop.svc.clusterset.local".into(),
        endpoints: vec![],
        ports: vec![],
        labels: Default::default(),
        allowed_requesters: vec!["b1".into()],
        origin: None,
        revision: 0,
    };
    let _ = policies.discover(&entry, "b1", "web", true);
    let _ = policies.announce("b2", &entry);
}

/// The zone the DNS target answers from: an A, an AAAA and an SRV-capable name.
fn snapshot() -> &'static Snapshot {
    static SNAPSHOT: OnceLock<Snapshot> = OnceLock::new();
    SNAPSHOT.get_or_init(|| {
        let services = [ServiceInfo {
            key: DnsKey::new("shop", "api"),
            annotations: [(names::FQDN_ANNOTATION, "api.xcc.test")]
                .into_iter()
                .collect(),
            cluster_ips: vec![
                IpAddr::from([10, 0, 0, 1]),
                "fd00::1".parse().unwrap_or(IpAddr::from([0u8; 16])),
            ],
            ports: vec![NamedPort {
                name: Some("https".into()),
                port: 443,
                protocol: Default::default(),
            }],
        }];
        Snapshot {
            zones: Arc::new(ZoneSet::build(&["xcc.test".into()], &services, None, 1)),
            ready: true,
            ..Snapshot::default()
        }
    })
}

/// A DNS query as the DNS server receives it, over UDP and TCP, plain and transparent mode.
pub fn dns_packets(data: &[u8]) {
    let source = IpAddr::from([127, 0, 0, 1]);
    for transparent in [false, true] {
        let settings = Settings {
            ttl: 5,
            transparent,
            ns_addresses: vec![source],
        };
        for transport in [Transport::Udp, Transport::Tcp] {
            let _ = wire::handle(data, source, transport, snapshot(), &settings);
        }
    }
    let _ = wire::error_reply(data, hickory_proto::op::ResponseCode::ServFail);
}

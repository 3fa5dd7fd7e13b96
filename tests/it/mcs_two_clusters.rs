//! The Multi-Cluster Services API end to end on two real control planes (`xcc_testkube`), the
//! real `xcc` binary as processes under `deploy/overlays/mcs`'s RBAC with `--mcs true`, real
//! mTLS between the registries, the upstream MCS and About CRDs installed:
//!
//! - a ClusterProperty `cluster.clusterset.k8s.io` that names the cluster otherwise than the
//!   registry certificate stops the registry at start-up with a clear error; once it agrees,
//!   the registry runs;
//! - a `ServiceExport` in `east` (no XCC label) → `Valid`/`Ready` conditions there, and in
//!   `west` a `ServiceImport` of the same name and namespace (`ClusterSetIP`, the named ports,
//!   which travel over Hamlet as xcc's ports label, the IP of the binder's Service and its family,
//!   `clusters: [east]`) and EndpointSlices with the MCS labels holding east's ready pod on
//!   the pods' port (not east's cluster IP);
//! - a headless Service with a ServiceExport in `east` → in `west` a `Headless` ServiceImport
//!   without IPs, a headless Service and a slice carrying east's pod addresses and hostnames
//!   (they travel over Hamlet as record annotations);
//! - in `east` too (the exporting cluster, its binder running) a `ServiceImport` of its own
//!   export, `clusters: [east]`, with its slice in the service's namespace (MCS labels, east's
//!   pod) and the clusterset IP of east's binder Service, whose slice holds east's own pod;
//! - `xcc dns` running in `west` (deploy/dns/server's RBAC) answering over UDP:
//!   `<svc>.<ns>.svc.clusterset.local` with the ServiceImport's IP, the headless name with
//!   east's pods, and `<hostname>.east.<svc>.<ns>.svc.clusterset.local` with one pod; SRV at
//!   the bare names (one per port; for the headless one, per pod and port with the pod's name);
//! - the ServiceExport deleted → the ServiceImport and the slices gone in `west`.
//!
//! No request of any xcc process was refused. Every step waits on API state, never on time.
//!
//! The second test takes the hierarchy instead of a flat Hamlet import: `west`'s registry is a
//! child of `east`'s (a `role: Parent` RemoteRegistry whose `spec.imports` names east's headless
//! export), and the granted answer carries the headless marker, the pods' hostnames and every
//! named port (with its protocol and the pods' port serving it), so west writes a `Headless`
//! ServiceImport with exactly the export's ports, a headless Service and slices with the same
//! named ports, with east (the owner, not the RemoteRegistry) as the source cluster; a pod change
//! at east is pushed into west's slice and DNS names.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use crate::common::clusters::{
    Cluster, NS, World, remote_registry, retry_for, slice_addresses, slice_ports, wait_for,
};
use serde_json::json;
use xcc_proto::mcs::{MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL};
use xcc_proto::names::service_name;

const WAIT: Duration = Duration::from_secs(60);
const LOG: &str = "info,kube=warn,tower=warn,hyper=warn,h2=warn";
const MCS: &str = "multicluster.x-k8s.io/v1alpha1";

fn logs(a: &Cluster, b: &Cluster) -> String {
    format!("== east\n{}== west\n{}", a.logs(), b.logs())
}

/// The A records `xcc dns` at `server` answers for `name` (empty on any other answer).
async fn a_records(server: std::net::SocketAddr, name: &str) -> Vec<String> {
    answers(server, name, hickory_proto::rr::RecordType::A).await
}

/// The SRV records `xcc dns` at `server` answers for `name`, as `port target`, sorted (empty
/// on any other answer).
async fn srv_records(server: std::net::SocketAddr, name: &str) -> Vec<String> {
    let mut out = answers(server, name, hickory_proto::rr::RecordType::SRV).await;
    out.sort();
    out
}

/// The A or SRV records `xcc dns` at `server` answers for `name` of type `qtype`.
async fn answers(
    server: std::net::SocketAddr,
    name: &str,
    qtype: hickory_proto::rr::RecordType,
) -> Vec<String> {
    use hickory_proto::op::{Message, MessageType, OpCode, Query};
    use hickory_proto::rr::{Name, RData};
    let mut query = Message::new(7, MessageType::Query, OpCode::Query);
    query.add_query(Query::query(
        Name::from_ascii(format!("{name}.")).unwrap(),
        qtype,
    ));
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket
        .send_to(&query.to_vec().unwrap(), server)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let Ok(Ok(n)) = tokio::time::timeout(Duration::from_secs(2), socket.recv(&mut buf)).await
    else {
        return Vec::new();
    };
    let reply = Message::from_vec(&buf[..n]).unwrap();
    reply
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.to_string()),
            RData::SRV(srv) => Some(format!("{} {}", srv.port, srv.target)),
            _ => None,
        })
        .collect()
}

fn cluster_property(value: &str) -> serde_json::Value {
    json!({"apiVersion": "about.k8s.io/v1alpha1", "kind": "ClusterProperty",
           "metadata": {"name": "cluster.clusterset.k8s.io"}, "spec": {"value": value}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_export_in_east_is_a_service_import_in_west() {
    let _turn = xcc_testkube::Turn::shared().await;
    let world = World::new();
    let Some(mut east) = world.cluster("east", &["shop"], "overlays/mcs").await else {
        return;
    };
    let Some(mut west) = world.cluster("west", &["shop"], "overlays/mcs").await else {
        return;
    };
    east.mcs = true;
    west.mcs = true;

    // Cluster identity: a ClusterProperty that disagrees with the certificate stops the
    // registry; one that agrees lets it run.
    west.apply("clusterproperties", cluster_property("not-west"))
        .await;
    west.start_registry(LOG).await;
    let registry = west.registry.as_mut().unwrap();
    // A process's exit is no Kubernetes object and nothing here signals it: a bounded retry.
    retry_for(
        "west's registry to refuse to start",
        WAIT,
        async || (!registry.running()).then_some(()),
        || "it kept running with a ClusterProperty that names another cluster".to_string(),
    )
    .await;
    let log = west.registry.as_ref().unwrap().log().join("\n");
    assert!(
        log.contains(
            "ClusterProperty cluster.clusterset.k8s.io names this cluster \"not-west\" but the registry certificate names it \"west\""
        ),
        "{log}"
    );
    west.apply("clusterproperties", cluster_property("west"))
        .await;
    east.apply("clusterproperties", cluster_property("east"))
        .await;

    east.start_registry(LOG).await;
    east.start_publisher(LOG).await;
    // East's binder: the exporting cluster has the ServiceImport of its own export too.
    east.start_binder(LOG).await;
    west.start_registry(LOG).await;
    west.start_binder(LOG).await;
    west.apply(
        "remoteregistries",
        remote_registry(&world, "east", &east, None),
    )
    .await;

    // A plain Service, its pods (an EndpointSlice: these control planes run no pods) and a
    // ServiceExport of its name in east.
    east.apply(
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "api", "namespace": "shop"},
               "spec": {"ports": [{"name": "http", "port": 8080, "targetPort": 18080}]}}),
    )
    .await;
    east.apply(
        "endpointslices",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "api-pods", "namespace": "shop",
                            "labels": {"kubernetes.io/service-name": "api"}},
               "addressType": "IPv4",
               "ports": [{"name": "http", "port": 18080, "protocol": "TCP"}],
               "endpoints": [{"addresses": ["10.5.0.1"]},
                             {"addresses": ["10.5.0.2"], "conditions": {"ready": false}}]}),
    )
    .await;
    east.apply(
        "serviceexports",
        json!({"apiVersion": MCS, "kind": "ServiceExport",
               "metadata": {"name": "api", "namespace": "shop"}}),
    )
    .await;
    let conditions = wait_for(
        "east's ServiceExport Valid and Ready",
        WAIT,
        &[&east],
        async || {
            let e = east.get(MCS, "serviceexports", Some("shop"), "api").await?;
            let mut c: Vec<(String, String, String)> = e["status"]["conditions"]
                .as_array()?
                .iter()
                .map(|c| {
                    (
                        c["type"].as_str().unwrap().to_string(),
                        c["status"].as_str().unwrap().to_string(),
                        c["reason"].as_str().unwrap().to_string(),
                    )
                })
                .collect();
            c.sort();
            (c.len() == 3 && c.iter().any(|c| c.0 == "Ready" && c.1 == "True")).then_some(c)
        },
        || logs(&east, &west),
    )
    .await;
    assert_eq!(
        conditions,
        [
            ("Conflict".into(), "False".into(), "NoConflicts".into()),
            ("Ready".into(), "True".into(), "Exported".into()),
            ("Valid".into(), "True".into(), "Valid".into()),
        ]
    );

    // west: the ServiceImport, the binder's Service and slices.
    let fqdn = "api.shop.svc.clusterset.local";
    let svc = service_name(fqdn);
    let import = wait_for(
        "west's ServiceImport with its IP and clusters",
        WAIT,
        &[&west],
        async || {
            let i = west.get(MCS, "serviceimports", Some("shop"), "api").await?;
            (i["spec"]["ips"].is_array() && i["status"]["clusters"].is_array()).then_some(i)
        },
        || logs(&east, &west),
    )
    .await;
    let west_service = west.get("v1", "services", Some(NS), &svc).await.unwrap();
    let west_ip = west_service["spec"]["clusterIP"].as_str().unwrap();
    // A flat (Hamlet) import carries the named port too (xcc's ports label).
    assert_eq!(
        import["spec"],
        json!({"type": "ClusterSetIP", "ips": [west_ip], "ipFamilies": ["IPv4"],
               "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
    );
    assert_eq!(import["status"], json!({"clusters": [{"cluster": "east"}]}));
    // The endpoints are east's ready pod on the pods' port (a ServiceExport alone exports
    // pods, not the cluster IP); the publisher may have seen the slice after the export.
    wait_for(
        "west's slices with east's ready pod",
        WAIT,
        &[&west],
        async || (slice_addresses(&west, NS, &svc).await == ["10.5.0.1"]).then_some(()),
        || logs(&east, &west),
    )
    .await;
    assert_eq!(slice_ports(&west, NS, &svc).await, [18080]);
    let slices = west
        .list("discovery.k8s.io/v1", "endpointslices", Some(NS))
        .await;
    let labels: Vec<(&str, &str)> = slices
        .iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == svc.as_str())
        .map(|s| {
            let l = &s["metadata"]["labels"];
            (
                l[MCS_SERVICE_NAME_LABEL].as_str().unwrap(),
                l[MCS_SOURCE_CLUSTER_LABEL].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(labels, [("api", "east")]);

    // east, the exporting cluster: its own ServiceImport of `api` (KEP-1645: every cluster of
    // the clusterset has it), east as its cluster, its slice in `shop` with the MCS labels and
    // east's ready pod, and the IP of east's binder Service, which carries east's own pod.
    let east_import = wait_for(
        "east's own ServiceImport of api with its slice",
        WAIT,
        &[&east],
        async || {
            let i = east.get(MCS, "serviceimports", Some("shop"), "api").await?;
            let slices = east
                .list("discovery.k8s.io/v1", "endpointslices", Some("shop"))
                .await;
            let ours: Vec<(String, String, String)> = slices
                .iter()
                .filter(|s| s["metadata"]["labels"][MCS_SERVICE_NAME_LABEL] == "api")
                .map(|s| {
                    (
                        s["metadata"]["labels"][MCS_SOURCE_CLUSTER_LABEL]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        s["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                        s["endpoints"][0]["addresses"][0]
                            .as_str()
                            .unwrap_or_default()
                            .to_string(),
                    )
                })
                .collect();
            (ours.len() == 1
                && ours[0].2 == "10.5.0.1"
                && i["status"]["clusters"].is_array()
                && i["spec"]["ips"].is_array())
            .then_some((i, ours))
        },
        || logs(&east, &west),
    )
    .await;
    let east_service = east.get("v1", "services", Some(NS), &svc).await.unwrap();
    let east_ip = east_service["spec"]["clusterIP"].as_str().unwrap();
    assert_eq!(
        east_import.0["spec"],
        json!({"type": "ClusterSetIP", "ips": [east_ip], "ipFamilies": ["IPv4"],
               "ports": [{"name": "http", "protocol": "TCP", "port": 8080}]})
    );
    assert_eq!(slice_addresses(&east, NS, &svc).await, ["10.5.0.1"]);
    assert_eq!(
        east_import.0["status"],
        json!({"clusters": [{"cluster": "east"}]})
    );
    assert_eq!(
        east_import.1,
        [(
            "east".to_string(),
            "xcc-binder".to_string(),
            "10.5.0.1".to_string()
        )]
    );

    // A headless Service in east, exported with a ServiceExport: its pods (from its
    // EndpointSlice) and their hostnames travel over Hamlet; west writes a Headless
    // ServiceImport without IPs, a headless Service and a slice with the hostnames.
    east.apply(
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "db", "namespace": "shop"},
               "spec": {"clusterIP": "None", "ports": [{"name": "sql", "port": 5432}]}}),
    )
    .await;
    east.apply(
        "endpointslices",
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "db-pods", "namespace": "shop",
                            "labels": {"kubernetes.io/service-name": "db"}},
               "addressType": "IPv4",
               "ports": [{"name": "sql", "port": 15432, "protocol": "TCP"}],
               "endpoints": [{"addresses": ["10.4.0.1"], "hostname": "db-0"},
                             {"addresses": ["10.4.0.2"], "hostname": "db-1"}]}),
    )
    .await;
    east.apply(
        "serviceexports",
        json!({"apiVersion": MCS, "kind": "ServiceExport",
               "metadata": {"name": "db", "namespace": "shop"}}),
    )
    .await;
    let db_import = wait_for(
        "west's Headless ServiceImport db with its pods' IP family",
        WAIT,
        &[&west],
        // The family is the pods'; the publisher may have seen their slice after the export.
        async || {
            west.get(MCS, "serviceimports", Some("shop"), "db")
                .await
                .filter(|i| i["spec"]["ipFamilies"].is_array())
        },
        || logs(&east, &west),
    )
    .await;
    assert_eq!(
        db_import["spec"],
        json!({"type": "Headless", "ipFamilies": ["IPv4"],
               "ports": [{"name": "sql", "protocol": "TCP", "port": 5432}]})
    );
    let db_fqdn = "db.shop.svc.clusterset.local";
    let db_svc = service_name(db_fqdn);
    // A Headless ServiceImport names no IP of the binder's Service, so it may come first.
    let db_service = wait_for(
        "west's Service of db",
        WAIT,
        &[&west],
        async || west.get("v1", "services", Some(NS), &db_svc).await,
        || logs(&east, &west),
    )
    .await;
    assert_eq!(db_service["spec"]["clusterIP"], "None");
    let db_slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice> = wait_for(
        "west's slice of db with both pods",
        WAIT,
        &[&west],
        async || {
            let slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice> = west
                .list("discovery.k8s.io/v1", "endpointslices", Some(NS))
                .await
                .into_iter()
                .filter(|s| {
                    s["metadata"]["labels"]["kubernetes.io/service-name"] == db_svc.as_str()
                })
                .map(|s| serde_json::from_value(s).unwrap())
                .collect();
            (slices.len() == 1 && slices[0].endpoints.len() == 2).then_some(slices)
        },
        || logs(&east, &west),
    )
    .await;
    let pods: Vec<(String, Option<String>, Option<i32>)> = db_slices[0]
        .endpoints
        .iter()
        .map(|e| {
            (
                e.addresses[0].clone(),
                e.hostname.clone(),
                db_slices[0].ports.as_ref().unwrap()[0].port,
            )
        })
        .collect();
    assert_eq!(
        pods,
        [
            (
                "10.4.0.1".to_string(),
                Some("db-0".to_string()),
                Some(15432)
            ),
            (
                "10.4.0.2".to_string(),
                Some("db-1".to_string()),
                Some(15432)
            ),
        ]
    );

    // DNS through `xcc dns` running in west as its ServiceAccount, asked over UDP: the
    // ClusterSetIP name answers with the ServiceImport's IP, the headless one with east's pods,
    // and each pod's hostname name with that pod.
    let (dns, udp) = west.start_dns(LOG).await;
    for (name, want) in [
        (fqdn.to_string(), vec![west_ip.to_string()]),
        (
            db_fqdn.to_string(),
            vec!["10.4.0.1".into(), "10.4.0.2".into()],
        ),
        (format!("db-0.east.{db_fqdn}"), vec!["10.4.0.1".into()]),
        (format!("db-1.east.{db_fqdn}"), vec!["10.4.0.2".into()]),
    ] {
        // A UDP answer from a process has no change signal: a bounded retry.
        retry_for(
            &format!("xcc dns to answer {name} with {want:?}"),
            WAIT,
            async || (a_records(udp, &name).await == want).then_some(()),
            || dns.log().join("\n"),
        )
        .await;
    }
    // SRV at the bare names (KEP-1645): the ClusterSetIP name one per port, targeting itself;
    // the headless one per pod and port, targeting the pod's name. The records are there
    // since the A answers above were.
    assert_eq!(srv_records(udp, fqdn).await, [format!("8080 {fqdn}.")]);
    assert_eq!(
        srv_records(udp, db_fqdn).await,
        [
            format!("5432 db-0.east.{db_fqdn}."),
            format!("5432 db-1.east.{db_fqdn}.")
        ]
    );
    drop(dns);

    // Unexport: the ServiceImport and the slices leave west.
    east.delete(MCS, "ServiceExport", "serviceexports", Some("shop"), "api")
        .await;
    wait_for(
        "west's ServiceImport and slices removed",
        WAIT,
        &[&west],
        async || {
            (west
                .get(MCS, "serviceimports", Some("shop"), "api")
                .await
                .is_none()
                && slice_addresses(&west, NS, &svc).await.is_empty())
            .then_some(())
        },
        || logs(&east, &west),
    )
    .await;

    let refused: Vec<String> = east.refused().into_iter().chain(west.refused()).collect();
    assert_eq!(refused, Vec::<String>::new(), "{}", logs(&east, &west));
}

/// A `role: Parent` RemoteRegistry `parent` in the xcc namespace pointing at `remote`, asking
/// for `imports` by FQDN.
fn parent_registry(world: &World, remote: &Cluster, imports: &[&str]) -> serde_json::Value {
    let imports: Vec<serde_json::Value> = imports.iter().map(|f| json!({"fqdn": f})).collect();
    json!({
        "apiVersion": xcc_proto::names::API_VERSION, "kind": "RemoteRegistry",
        "metadata": {"name": "parent", "namespace": NS},
        "spec": {
            "address": remote.hamlet.to_string(),
            "tlsConfig": {"serverCA": world.server_ca(), "serverName": "localhost"},
            "role": "Parent",
            "imports": imports,
        },
    })
}

/// West's slices of the binder's Service `svc`: per endpoint (address, hostname, port), with
/// the slice's MCS labels (service name, source cluster); `None` until there is exactly one.
async fn headless_slice(
    west: &Cluster,
    svc: &str,
) -> Option<(Vec<(String, Option<String>, Option<i32>)>, (String, String))> {
    let slices: Vec<k8s_openapi::api::discovery::v1::EndpointSlice> = west
        .list("discovery.k8s.io/v1", "endpointslices", Some(NS))
        .await
        .into_iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == svc)
        .map(|s| serde_json::from_value(s).unwrap())
        .collect();
    let [slice] = slices.as_slice() else {
        return None;
    };
    let port = slice.ports.as_ref()?.first()?.port;
    let pods = slice
        .endpoints
        .iter()
        .map(|e| (e.addresses[0].clone(), e.hostname.clone(), port))
        .collect();
    let labels = slice.metadata.labels.as_ref()?;
    Some((
        pods,
        (
            labels.get(MCS_SERVICE_NAME_LABEL)?.clone(),
            labels.get(MCS_SOURCE_CLUSTER_LABEL)?.clone(),
        ),
    ))
}

/// East's slice of its headless Service `db`: `pods` as (address, hostname).
fn db_pods(pods: &[(&str, &str)]) -> serde_json::Value {
    let endpoints: Vec<serde_json::Value> = pods
        .iter()
        .map(|(ip, host)| json!({"addresses": [ip], "hostname": host}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "db-pods", "namespace": "shop",
                        "labels": {"kubernetes.io/service-name": "db"}},
           "addressType": "IPv4",
           "ports": [{"name": "sql", "port": 15432, "protocol": "TCP"},
                     {"name": "stats", "port": 9187, "protocol": "UDP"}],
           "endpoints": endpoints})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_export_in_east_is_imported_through_a_hierarchy_grant_in_west() {
    let _turn = xcc_testkube::Turn::shared().await;
    let world = World::new();
    let Some(mut east) = world.cluster("east", &["shop"], "overlays/mcs").await else {
        return;
    };
    let Some(mut west) = world.cluster("west", &["shop"], "overlays/mcs").await else {
        return;
    };
    east.mcs = true;
    west.mcs = true;
    east.apply("clusterproperties", cluster_property("east"))
        .await;
    west.apply("clusterproperties", cluster_property("west"))
        .await;

    // east: the root of the hierarchy, exporting a headless Service with two named pods and
    // two named ports (one UDP), served on other pod ports than the Service's.
    east.start_registry(LOG).await;
    east.start_publisher(LOG).await;
    east.apply(
        "services",
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "db", "namespace": "shop"},
               "spec": {"clusterIP": "None", "ports": [
                   {"name": "sql", "port": 5432, "targetPort": "sql"},
                   {"name": "stats", "port": 9187, "protocol": "UDP"}]}}),
    )
    .await;
    east.apply(
        "endpointslices",
        db_pods(&[("10.4.0.1", "db-0"), ("10.4.0.2", "db-1")]),
    )
    .await;
    east.apply(
        "serviceexports",
        json!({"apiVersion": MCS, "kind": "ServiceExport",
               "metadata": {"name": "db", "namespace": "shop"}}),
    )
    .await;

    // west: a child of east that asks the hierarchy for db; no flat Hamlet import at all.
    let db_fqdn = "db.shop.svc.clusterset.local";
    west.start_registry(LOG).await;
    west.start_binder(LOG).await;
    west.apply(
        "remoteregistries",
        parent_registry(&world, &east, &[db_fqdn]),
    )
    .await;

    let db_import = wait_for(
        "west's Headless ServiceImport db through the hierarchy",
        WAIT,
        &[&west],
        async || {
            west.get(MCS, "serviceimports", Some("shop"), "db")
                .await
                .filter(|i| {
                    i["status"]["clusters"].is_array() && i["spec"]["ipFamilies"].is_array()
                })
        },
        || logs(&east, &west),
    )
    .await;
    // Every port of the export, with its name and protocol: the granted answer carries them.
    assert_eq!(
        db_import["spec"],
        json!({"type": "Headless", "ipFamilies": ["IPv4"], "ports": [
            {"name": "sql", "protocol": "TCP", "port": 5432},
            {"name": "stats", "protocol": "UDP", "port": 9187},
        ]})
    );
    // The owner, not the RemoteRegistry ("parent"), is the source cluster.
    assert_eq!(
        db_import["status"],
        json!({"clusters": [{"cluster": "east"}]})
    );
    let db_svc = service_name(db_fqdn);
    let db_service = wait_for(
        "west's Service of db",
        WAIT,
        &[&west],
        async || west.get("v1", "services", Some(NS), &db_svc).await,
        || logs(&east, &west),
    )
    .await;
    assert_eq!(db_service["spec"]["clusterIP"], "None");
    assert_eq!(
        db_service["spec"]["ports"],
        json!([
            {"name": "sql", "port": 5432, "protocol": "TCP", "targetPort": 5432},
            {"name": "stats", "port": 9187, "protocol": "UDP", "targetPort": 9187},
        ])
    );
    let pod = |ip: &str, host: &str| (ip.to_string(), Some(host.to_string()), Some(15432));
    let slice = wait_for(
        "west's slice of db with both pods and their hostnames",
        WAIT,
        &[&west],
        async || {
            headless_slice(&west, &db_svc)
                .await
                .filter(|(pods, _)| pods.len() == 2)
        },
        || logs(&east, &west),
    )
    .await;
    assert_eq!(
        slice,
        (
            vec![pod("10.4.0.1", "db-0"), pod("10.4.0.2", "db-1")],
            ("db".to_string(), "east".to_string())
        )
    );
    // The slice serves each port on the pods' port of that name (the export's target ports).
    let slice_ports: Vec<serde_json::Value> = west
        .list("discovery.k8s.io/v1", "endpointslices", Some(NS))
        .await
        .into_iter()
        .filter(|s| s["metadata"]["labels"]["kubernetes.io/service-name"] == db_svc.as_str())
        .map(|s| s["ports"].clone())
        .collect();
    assert_eq!(
        slice_ports,
        [json!([
            {"name": "sql", "port": 15432, "protocol": "TCP"},
            {"name": "stats", "port": 9187, "protocol": "UDP"},
        ])]
    );
    // The imported record names where it came from: the owner, through the parent link.
    let record = west
        .list(xcc_proto::names::API_VERSION, "servicerecords", Some(NS))
        .await
        .into_iter()
        .find(|r| r["spec"]["fqdn"] == db_fqdn)
        .unwrap();
    assert_eq!(
        record["metadata"]["labels"][xcc_proto::names::REMOTE_REGISTRY_LABEL],
        "parent"
    );
    assert_eq!(
        record["spec"]["origin"],
        json!({"cluster": "east", "namespace": "shop", "name": "db"})
    );
    assert_eq!(
        record["spec"]["ports"],
        json!([
            {"name": "sql", "port": 5432, "protocol": "TCP", "targetPort": 15432},
            {"name": "stats", "port": 9187, "protocol": "UDP"},
        ])
    );

    // A pod replaced in east: the resolver pushes the new answer, west's slice follows.
    east.apply(
        "endpointslices",
        db_pods(&[("10.4.0.2", "db-1"), ("10.4.0.3", "db-2")]),
    )
    .await;
    let slice = wait_for(
        "west's slice of db with the new pod",
        WAIT,
        &[&west],
        async || {
            headless_slice(&west, &db_svc)
                .await
                .filter(|(pods, _)| pods.iter().any(|p| p.0 == "10.4.0.3"))
        },
        || logs(&east, &west),
    )
    .await;
    assert_eq!(
        slice,
        (
            vec![pod("10.4.0.2", "db-1"), pod("10.4.0.3", "db-2")],
            ("db".to_string(), "east".to_string())
        )
    );

    // `xcc dns` in west answers the MCS names of the pods, under the owner's cluster name.
    let (dns, udp) = west.start_dns(LOG).await;
    for (name, want) in [
        (
            db_fqdn.to_string(),
            vec!["10.4.0.2".to_string(), "10.4.0.3".into()],
        ),
        (format!("db-1.east.{db_fqdn}"), vec!["10.4.0.2".into()]),
        (format!("db-2.east.{db_fqdn}"), vec!["10.4.0.3".into()]),
    ] {
        // A UDP answer from a process has no change signal: a bounded retry.
        retry_for(
            &format!("xcc dns to answer {name} with {want:?}"),
            WAIT,
            async || (a_records(udp, &name).await == want).then_some(()),
            || dns.log().join("\n"),
        )
        .await;
    }
    assert_eq!(
        a_records(udp, &format!("db-0.east.{db_fqdn}")).await,
        Vec::<String>::new()
    );
    drop(dns);

    // Unexport: the grant is revoked and west's ServiceImport and slices go.
    east.delete(MCS, "ServiceExport", "serviceexports", Some("shop"), "db")
        .await;
    wait_for(
        "west's ServiceImport and slices of db removed",
        WAIT,
        &[&west],
        async || {
            (west
                .get(MCS, "serviceimports", Some("shop"), "db")
                .await
                .is_none()
                && slice_addresses(&west, NS, &db_svc).await.is_empty())
            .then_some(())
        },
        || logs(&east, &west),
    )
    .await;

    let refused: Vec<String> = east.refused().into_iter().chain(west.refused()).collect();
    assert_eq!(refused, Vec::<String>::new(), "{}", logs(&east, &west));
}

use serde_json::{Value, json};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::resources;

/// An exported and an imported ServiceRecord as XCC v1 documents them, verbatim: our types must
/// read what an XCC v1 cluster writes.
const XCC_EXPORTED: &str = r#"
apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: ServiceRecord
metadata:
  annotations:
    connectivity.tanzu.vmware.com/service-port: "443"
  labels:
    connectivity.tanzu.vmware.com/export: ""
  name: my-service.xcc.test
  namespace: cross-cluster-connectivity
spec:
  endpoints:
  - address: 172.17.0.5
    port: 443
  fqdn: my-service.xcc.test
"#;

const XCC_REMOTE_REGISTRY: &str = r#"
apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: RemoteRegistry
metadata:
  name: shared-services-registry
  namespace: cross-cluster-connectivity
spec:
  address: shared-services-registry.cross-cluster-connectivity.svc:443
  tlsConfig:
    serverCA: U0VSVkVSX0NBX0NFUlRJRklDQVRF
    serverName: shared-services-registry.xcc.test
  allowedDomains: []
"#;

fn schema_of(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    let schema = version
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap();
    serde_json::to_value(schema).unwrap()
}

fn at<'a>(value: &'a Value, path: &[&str]) -> &'a Value {
    path.iter().fold(value, |v, key| &v[*key])
}

#[test]
fn xcc_v1_manifests_parse_into_the_custom_resources() {
    let sr: ServiceRecord = yaml_serde::from_str(XCC_EXPORTED).unwrap();
    assert_eq!(sr.metadata.name.as_deref(), Some("my-service.xcc.test"));
    assert_eq!(
        sr.spec,
        ServiceRecordSpec {
            fqdn: "my-service.xcc.test".into(),
            endpoints: vec![Endpoint {
                address: "172.17.0.5".into(),
                port: 443
            }],
            ..Default::default()
        }
    );
    assert_eq!(sr.status, None);

    let rr: RemoteRegistry = yaml_serde::from_str(XCC_REMOTE_REGISTRY).unwrap();
    assert_eq!(
        rr.spec.tls_config.server_name,
        "shared-services-registry.xcc.test"
    );
    assert_eq!(rr.spec.allowed_domains, Some(vec![]));
    assert_eq!(rr.spec.role(), Role::Peer);
    assert_eq!(rr.spec.materialize(), Materialize::Service);
}

#[test]
fn serialising_keeps_xcc_field_names_and_omits_unset_additions() {
    let sr: ServiceRecord = yaml_serde::from_str(XCC_EXPORTED).unwrap();
    let value = serde_json::to_value(&sr).unwrap();
    assert_eq!(
        value["spec"],
        json!({"fqdn": "my-service.xcc.test", "endpoints": [{"address": "172.17.0.5", "port": 443}]})
    );
    assert_eq!(
        value["apiVersion"],
        "connectivity.tanzu.vmware.com/v1alpha1"
    );
    assert_eq!(value["kind"], "ServiceRecord");

    let rr: RemoteRegistry = yaml_serde::from_str(XCC_REMOTE_REGISTRY).unwrap();
    let value = serde_json::to_value(&rr).unwrap();
    assert_eq!(
        value["spec"]["tlsConfig"],
        json!({"serverCA": "U0VSVkVSX0NBX0NFUlRJRklDQVRF", "serverName": "shared-services-registry.xcc.test"})
    );
}

#[test]
fn crd_identity_matches_xcc() {
    let sr = ServiceRecord::crd();
    assert_eq!(
        sr.metadata.name.as_deref(),
        Some("servicerecords.connectivity.tanzu.vmware.com")
    );
    assert_eq!(sr.spec.group, "connectivity.tanzu.vmware.com");
    assert_eq!(sr.spec.scope, "Namespaced");
    assert_eq!(sr.spec.names.kind, "ServiceRecord");
    assert_eq!(sr.spec.names.plural, "servicerecords");
    assert_eq!(sr.spec.names.singular.as_deref(), Some("servicerecord"));
    assert_eq!(sr.spec.versions.len(), 1);
    let v = &sr.spec.versions[0];
    assert_eq!(
        (v.name.as_str(), v.served, v.storage),
        ("v1alpha1", true, true)
    );
    assert!(v.subresources.as_ref().is_some_and(|s| s.status.is_some()));

    let rr = RemoteRegistry::crd();
    assert_eq!(
        rr.metadata.name.as_deref(),
        Some("remoteregistries.connectivity.tanzu.vmware.com")
    );
    assert_eq!(rr.spec.names.plural, "remoteregistries");
    assert_eq!(rr.spec.scope, "Namespaced");
    assert!(
        rr.spec.versions[0]
            .subresources
            .as_ref()
            .is_some_and(|s| s.status.is_some())
    );
}

#[test]
fn service_record_schema_keeps_xcc_types_and_adds_validation() {
    let schema = schema_of(&ServiceRecord::crd());
    assert_eq!(schema["required"], json!(["spec"]));
    let spec = at(&schema, &["properties", "spec"]);
    assert_eq!(spec["required"], json!(["endpoints", "fqdn"]));
    let endpoint = at(spec, &["properties", "endpoints", "items"]);
    assert_eq!(endpoint["required"], json!(["address", "port"]));
    let port = at(endpoint, &["properties", "port"]);
    assert_eq!(port["type"], "integer");
    assert_eq!(port["format"], "int32");
    assert_eq!(port["minimum"], json!(1.0));
    assert_eq!(port["maximum"], json!(65535.0));
    let fqdn = at(spec, &["properties", "fqdn"]);
    assert_eq!(fqdn["type"], "string");
    assert_eq!(fqdn["pattern"], FQDN_PATTERN);
    let protocol = at(
        spec,
        &["properties", "ports", "items", "properties", "protocol"],
    );
    assert_eq!(protocol["enum"], json!(["TCP", "UDP", "SCTP"]));
    for optional in ["allowedRequesters", "ports", "origin"] {
        assert!(spec["properties"][optional].is_object(), "{optional}");
    }
    let conditions = at(
        &schema,
        &["properties", "status", "properties", "conditions"],
    );
    assert_eq!(conditions["x-kubernetes-list-type"], "map");
    assert_eq!(conditions["x-kubernetes-list-map-keys"], json!(["type"]));
    let grant = at(
        &schema,
        &["properties", "status", "properties", "grants", "items"],
    );
    assert_eq!(grant["required"], json!(["callerCluster", "since"]));
}

#[test]
fn remote_registry_schema_keeps_xcc_types_and_adds_enums() {
    let schema = schema_of(&RemoteRegistry::crd());
    let spec = at(&schema, &["properties", "spec"]);
    assert_eq!(spec["required"], json!(["address", "tlsConfig"]));
    let tls = at(spec, &["properties", "tlsConfig"]);
    assert_eq!(tls["required"], json!(["serverCA", "serverName"]));
    // A plain string, not XCC v1's `format: byte`, which refuses the documented empty value.
    assert_eq!(
        at(tls, &["properties", "serverCA"]).get("format"),
        None,
        "{tls}"
    );
    assert_eq!(at(tls, &["properties", "serverCA", "type"]), "string");
    assert_eq!(
        at(spec, &["properties", "allowedDomains", "items", "type"]),
        "string"
    );
    assert_eq!(
        at(spec, &["properties", "role", "enum"]),
        &json!(["Peer", "Parent"])
    );
    assert_eq!(
        at(spec, &["properties", "materialize", "enum"]),
        &json!(["Service", "CiliumGlobalService"])
    );
    let import = at(spec, &["properties", "imports", "items"]);
    assert!(
        import["x-kubernetes-validations"][0]["rule"]
            .as_str()
            .is_some_and(|r| r.contains("has(self.fqdn)"))
    );
    let status = at(&schema, &["properties", "status", "properties"]);
    assert_eq!(status["importedRecords"]["type"], "integer");
    assert_eq!(status["lastSyncTime"]["format"], "date-time");
    assert_eq!(status["observedGeneration"]["format"], "int64");
}

#[test]
fn printer_columns() {
    let columns = |crd: CustomResourceDefinition| -> Vec<(String, String)> {
        crd.spec.versions[0]
            .additional_printer_columns
            .iter()
            .flatten()
            .map(|c| (c.name.clone(), c.json_path.clone()))
            .collect()
    };
    let names = |cols: &[(String, String)]| cols.iter().map(|c| c.0.clone()).collect::<Vec<_>>();
    let sr = columns(ServiceRecord::crd());
    assert_eq!(names(&sr), ["FQDN", "Endpoints", "Age"]);
    let rr = columns(RemoteRegistry::crd());
    assert_eq!(
        names(&rr),
        ["Address", "Valid", "Connected", "Synced", "Imported", "Age"]
    );
    assert_eq!(rr[1].1, r#".status.conditions[?(@.type=="Valid")].status"#);
}

#[test]
fn field_docs_reach_the_schema() {
    let schema = schema_of(&RemoteRegistry::crd());
    let role = at(&schema, &["properties", "spec", "properties", "role"]);
    assert!(
        role["description"]
            .as_str()
            .is_some_and(|d| d.contains("`Parent`"))
    );
    let schema = schema_of(&ServiceRecord::crd());
    let fqdn = at(&schema, &["properties", "spec", "properties", "fqdn"]);
    assert!(
        fqdn["description"]
            .as_str()
            .is_some_and(|d| d.starts_with("DNS name of the service"))
    );
}

#[test]
fn fqdn_pattern_accepts_dns_names_and_rejects_the_rest() {
    // The API server evaluates the pattern with RE2; the `regex` crate shares its syntax and
    // semantics for this pattern (no look-around, no back-references).
    let re = regex::Regex::new(FQDN_PATTERN).unwrap();
    for good in [
        "my-service.xcc.test",
        "domain.with.dot.at.end.",
        "domain.WITH.mixed.case",
        "localhost",
        &format!("{}.some.domain", "a".repeat(63)),
    ] {
        assert!(re.is_match(good), "{good:?} should match");
    }
    for bad in [
        "",
        ".",
        "a..b",
        "-a.b",
        "a-.b",
        "http://x.y",
        "a b.c",
        &format!("{}.some.domain", "a".repeat(64)),
    ] {
        assert!(!re.is_match(bad), "{bad:?} should not match");
    }
}

#[test]
fn import_target() {
    let by_fqdn = Import {
        fqdn: Some("a.b".into()),
        ..Default::default()
    };
    assert_eq!(by_fqdn.target(), Some(ImportTarget::Fqdn("a.b")));
    let by_object = Import {
        namespace: Some("ns".into()),
        name: Some("svc".into()),
        requester_service: Some("client".into()),
        ..Default::default()
    };
    assert_eq!(
        by_object.target(),
        Some(ImportTarget::Object {
            namespace: "ns",
            name: "svc"
        })
    );
    let both = Import {
        fqdn: Some("a.b".into()),
        name: Some("svc".into()),
        ..Default::default()
    };
    assert_eq!(both.target(), None);
    assert_eq!(Import::default().target(), None);
}

fn full_spec() -> ServiceRecordSpec {
    ServiceRecordSpec {
        fqdn: "web.prod.svc.clusterset.local".into(),
        endpoints: vec![Endpoint {
            address: "10.0.0.1".into(),
            port: 8443,
        }],
        allowed_requesters: Some(vec!["east".into()]),
        ports: Some(vec![ServicePort {
            name: Some("https".into()),
            port: 443,
            protocol: Some(Protocol::Udp),
            target_port: None,
        }]),
        origin: Some(Origin {
            cluster: Some("west".into()),
            namespace: "prod".into(),
            name: "web".into(),
            kind: Some("Service".into()),
        }),
    }
}

#[test]
fn a_full_record_round_trips_through_a_file() {
    let sr = ServiceRecord {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("prod".into()),
            ..Default::default()
        },
        spec: ServiceRecordSpec {
            ports: Some(vec![ServicePort {
                target_port: Some(30443),
                ..full_spec().ports.unwrap()[0].clone()
            }]),
            ..full_spec()
        },
        status: None,
    };
    let text = resources::to_yaml_documents(std::slice::from_ref(&sr)).unwrap();
    let back: Vec<ServiceRecord> = resources::parse_documents(&text, "f.yaml").unwrap();
    assert_eq!(back, [sr]);
    assert_eq!(back[0].validate().ok(), Some(()));

    let rr = RemoteRegistry {
        metadata: ObjectMeta {
            name: Some("parent".into()),
            ..Default::default()
        },
        spec: RemoteRegistrySpec {
            address: "parent.example:443".into(),
            tls_config: TlsConfig {
                server_ca: "Q0E=".into(),
                server_name: "parent.example".into(),
            },
            allowed_domains: Some(vec!["example".into()]),
            role: Some(Role::Parent),
            materialize: Some(Materialize::CiliumGlobalService),
            imports: Some(vec![Import {
                fqdn: Some("api.example".into()),
                ..Default::default()
            }]),
        },
        status: None,
    };
    let text = resources::to_yaml_documents(std::slice::from_ref(&rr)).unwrap();
    assert!(
        text.contains("  role: Parent\n  materialize: CiliumGlobalService\n"),
        "{text}"
    );
    let back: Vec<RemoteRegistry> = resources::parse_documents(&text, "f.yaml").unwrap();
    assert_eq!(back, [rr]);
    assert_eq!(back[0].validate().ok(), Some(()));
}

#[test]
fn file_values_outside_the_schema_are_refused() {
    let file = |spec: &str| {
        format!(
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata: {{name: web}}\nspec:\n{spec}"
        )
    };
    let far = file("  fqdn: web.example\n  endpoints: [{address: 10.0.0.1, port: 70000}]\n");
    let records: Vec<ServiceRecord> = resources::parse_documents(&far, "f.yaml").unwrap();
    assert_eq!(
        records[0].validate().unwrap_err().to_string(),
        r#"invalid ServiceRecord "web": spec.endpoints[0].port: 70000 is out of range 1-65535"#
    );
    let lower = file(
        "  fqdn: web.example\n  endpoints: []\n  ports: [{name: web, port: 80, protocol: tcp}]\n",
    );
    assert_eq!(
        resources::parse_documents::<ServiceRecord>(&lower, "f.yaml")
            .unwrap_err()
            .to_string(),
        "f.yaml: document 1: spec.ports[0].protocol: unknown variant `tcp`, expected one of `TCP`, `UDP`, `SCTP`"
    );
    let child = XCC_REMOTE_REGISTRY.replace("spec:\n", "spec:\n  role: Child\n");
    assert_eq!(
        resources::parse_documents::<RemoteRegistry>(&child, "rr.yaml")
            .unwrap_err()
            .to_string(),
        "rr.yaml: document 1: spec.role: unknown variant `Child`, expected `Peer` or `Parent`"
    );
}

#[test]
fn xcc_manifests_are_files_too() {
    let records: Vec<ServiceRecord> = resources::parse_documents(XCC_EXPORTED, "sr.yaml").unwrap();
    let sr: ServiceRecord = yaml_serde::from_str(XCC_EXPORTED).unwrap();
    assert_eq!(records, [sr]);
    assert_eq!(records[0].validate().ok(), Some(()));
    let registries: Vec<RemoteRegistry> =
        resources::parse_documents(XCC_REMOTE_REGISTRY, "rr.yaml").unwrap();
    assert_eq!(
        registries[0]
            .spec
            .tls_config
            .server_ca_pem()
            .unwrap()
            .unwrap(),
        b"SERVER_CA_CERTIFICATE"
    );
}

#[test]
fn crd_files_are_named_after_the_crds_and_carry_the_header() {
    let files = crd_files().unwrap();
    let names: Vec<_> = files.keys().cloned().collect();
    assert_eq!(
        names,
        [
            "remoteregistries.connectivity.tanzu.vmware.com.yaml",
            "servicerecords.connectivity.tanzu.vmware.com.yaml"
        ]
    );
    for (name, text) in &files {
        assert!(text.starts_with(GENERATED_HEADER), "{name}");
        let crd: CustomResourceDefinition = yaml_serde::from_str(text).unwrap();
        assert_eq!(format!("{}.yaml", crd.metadata.name.unwrap()), *name);
    }
    let all = crds_yaml().unwrap();
    assert_eq!(all.matches("\n---\n").count() + 1, 2);
}

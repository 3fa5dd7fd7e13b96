use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::*;
use crate::crd::{
    Endpoint, Import, Materialize, Origin, Protocol, RemoteRegistrySpec, RequesterIdentity, Role,
    ServicePort, ServiceRecordSpec,
};
use crate::names::{EXPORT_LABEL, SERVICE_PORT_ANNOTATION};

const PEM: &[u8] = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
const PEM_B64: &str =
    "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUIKLS0tLS1FTkQgQ0VSVElGSUNBVEUtLS0tLQo=";

/// An exported ServiceRecord as XCC v1's publisher writes it.
const XCC_SERVICE_RECORD: &str = r#"
apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: ServiceRecord
metadata:
  name: test.some.domain
  namespace: http-proxy-namespace
  labels:
    connectivity.tanzu.vmware.com/export: ""
  annotations:
    connectivity.tanzu.vmware.com/service-port: "443"
  uid: 6f1c
  generation: 3
  resourceVersion: "12345"
  ownerReferences:
  - apiVersion: projectcontour.io/v1
    kind: HTTPProxy
    name: test
    uid: http-proxy-uid
spec:
  fqdn: test.some.domain
  endpoints:
  - address: 10.0.0.1
    port: 443
  - address: 10.0.0.2
    port: 443
"#;

fn xcc_service_record() -> ServiceRecord {
    ServiceRecord {
        metadata: ObjectMeta {
            name: Some("test.some.domain".into()),
            namespace: Some("http-proxy-namespace".into()),
            labels: Some(BTreeMap::from([(EXPORT_LABEL.to_string(), String::new())])),
            annotations: Some(BTreeMap::from([(
                SERVICE_PORT_ANNOTATION.to_string(),
                "443".to_string(),
            )])),
            uid: Some("6f1c".into()),
            generation: Some(3),
            resource_version: Some("12345".into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "projectcontour.io/v1".into(),
                kind: "HTTPProxy".into(),
                name: "test".into(),
                uid: "http-proxy-uid".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: ServiceRecordSpec {
            fqdn: "test.some.domain".into(),
            endpoints: vec![
                Endpoint {
                    address: "10.0.0.1".into(),
                    port: 443,
                },
                Endpoint {
                    address: "10.0.0.2".into(),
                    port: 443,
                },
            ],
            ..Default::default()
        },
        status: None,
    }
}

fn remote_registry_yaml() -> String {
    format!(
        r#"apiVersion: connectivity.tanzu.vmware.com/v1alpha1
kind: RemoteRegistry
metadata:
  name: shared-services-registry
  namespace: cross-cluster-connectivity
spec:
  address: 172.18.0.3:30001
  tlsConfig:
    serverCA: {PEM_B64}
    serverName: cross-cluster-connectivity-registry.xcc.test
  allowedDomains:
  - xcc.test
status:
  conditions:
  - type: Valid
    status: "True"
  observedGeneration: 1
"#
    )
}

fn sr(name: &str, fqdn: &str, endpoints: &[(&str, i32)]) -> ServiceRecord {
    ServiceRecord {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: ServiceRecordSpec {
            fqdn: fqdn.into(),
            endpoints: endpoints
                .iter()
                .map(|(address, port)| Endpoint {
                    address: address.to_string(),
                    port: *port,
                })
                .collect(),
            ..Default::default()
        },
        status: None,
    }
}

fn rr(spec: RemoteRegistrySpec) -> RemoteRegistry {
    RemoteRegistry {
        metadata: ObjectMeta {
            name: Some("peer".into()),
            namespace: Some("cross-cluster-connectivity".into()),
            ..Default::default()
        },
        spec,
        status: None,
    }
}

fn good_rr_spec() -> RemoteRegistrySpec {
    RemoteRegistrySpec {
        address: "registry.example:443".into(),
        tls_config: TlsConfig {
            server_ca: PEM_B64.into(),
            server_name: "registry.example".into(),
        },
        ..Default::default()
    }
}

#[test]
fn parses_an_xcc_v1_service_record() {
    let items: Vec<ServiceRecord> = parse_documents(XCC_SERVICE_RECORD, "sr.yaml").unwrap();
    assert_eq!(items, vec![xcc_service_record()]);
    assert_eq!(items[0].validate().ok(), Some(()));
}

/// The status (here with conditions the API server would refuse) is what a registry observed,
/// never input: it is not read.
#[test]
fn parses_a_remote_registry_and_ignores_its_status() {
    let items: Vec<RemoteRegistry> = parse_documents(&remote_registry_yaml(), "rr.yaml").unwrap();
    assert_eq!(items.len(), 1);
    let rr = &items[0];
    assert_eq!(
        rr.metadata.name.as_deref(),
        Some("shared-services-registry")
    );
    assert_eq!(rr.spec.address, "172.18.0.3:30001");
    assert_eq!(
        rr.spec.tls_config.server_name,
        "cross-cluster-connectivity-registry.xcc.test"
    );
    assert_eq!(
        rr.spec.tls_config.server_ca_pem().unwrap(),
        Some(PEM.to_vec())
    );
    assert_eq!(rr.spec.allowed_domains, Some(vec!["xcc.test".to_string()]));
    assert_eq!(rr.spec.role, None);
    assert_eq!(rr.status, None);
    assert_eq!(rr.validate().ok(), Some(()));
}

#[test]
fn multi_document_streams_skip_empty_documents() {
    let text = format!(
        "---\n# comment only\n---\n{XCC_SERVICE_RECORD}---\n---\n{}\n...\n",
        XCC_SERVICE_RECORD.replace("test.some.domain", "other.some.domain")
    );
    let items: Vec<ServiceRecord> = parse_documents(&text, "two.yaml").unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0], xcc_service_record());
    assert_eq!(items[1].metadata.name.as_deref(), Some("other.some.domain"));
    assert_eq!(items[1].spec.fqdn, "other.some.domain");
    let none: Vec<ServiceRecord> = parse_documents("", "empty.yaml").unwrap();
    assert!(none.is_empty());
    let none: Vec<ServiceRecord> = parse_documents("# nothing\n---\n", "c.yaml").unwrap();
    assert!(none.is_empty());
}

#[test]
fn json_documents_parse_too() {
    let json = serde_json::to_string(&xcc_service_record()).unwrap();
    let items: Vec<ServiceRecord> = parse_documents(&json, "sr.json").unwrap();
    assert_eq!(items, vec![xcc_service_record()]);
}

fn parse_error<T>(text: &str, file: &str) -> String
where
    T: kube::Resource<DynamicType = ()> + serde::de::DeserializeOwned + std::fmt::Debug,
{
    parse_documents::<T>(text, file).unwrap_err().to_string()
}

#[test]
fn errors_name_file_document_and_field() {
    let text = "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata: {name: web}\nspec:\n  fqdn: web.example\n  endpoints:\n  - address: 10.0.0.1\n    port: x\n";
    assert_eq!(
        parse_error::<ServiceRecord>(text, "exports/web.yaml"),
        r#"exports/web.yaml: document 1: spec.endpoints[0].port: invalid type: string "x", expected i32"#
    );
    let missing = format!(
        "{XCC_SERVICE_RECORD}---\napiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata: {{name: a}}\nspec:\n  endpoints: []\n"
    );
    assert_eq!(
        parse_error::<ServiceRecord>(&missing, "f.yaml"),
        "f.yaml: document 2: spec: missing field `fqdn`"
    );
    let negative = XCC_SERVICE_RECORD.replacen("port: 443", "port: -1", 1);
    let items: Vec<ServiceRecord> = parse_documents(&negative, "f.yaml").unwrap();
    assert_eq!(
        items[0].validate().unwrap_err().to_string(),
        r#"invalid ServiceRecord "http-proxy-namespace/test.some.domain": spec.endpoints[0].port: -1 is out of range 1-65535"#
    );
    let bad_label = XCC_SERVICE_RECORD.replace("export: \"\"", "export: [1]");
    assert_eq!(
        parse_error::<ServiceRecord>(&bad_label, "f.yaml"),
        "f.yaml: document 1: metadata.labels.connectivity.tanzu.vmware.com/export: invalid type: sequence, expected a string"
    );
    let rr_text = remote_registry_yaml().replace("serverName:", "serverNam:");
    assert_eq!(
        parse_error::<RemoteRegistry>(&rr_text, "rr.yaml"),
        "rr.yaml: document 1: spec.tlsConfig: missing field `serverName`"
    );
}

#[test]
fn api_version_and_kind_are_checked() {
    let v1 = XCC_SERVICE_RECORD.replace("connectivity.tanzu.vmware.com/v1alpha1", "v1");
    assert_eq!(
        parse_error::<ServiceRecord>(&v1, "f.yaml"),
        r#"f.yaml: document 1: apiVersion: expected "connectivity.tanzu.vmware.com/v1alpha1", found "v1""#
    );
    assert_eq!(
        parse_error::<RemoteRegistry>(XCC_SERVICE_RECORD, "f.yaml"),
        r#"f.yaml: document 1: kind: expected "RemoteRegistry", found "ServiceRecord""#
    );
    let no_kind = XCC_SERVICE_RECORD.replace("kind: ServiceRecord\n", "");
    assert_eq!(
        parse_error::<ServiceRecord>(&no_kind, "f.yaml"),
        r#"f.yaml: document 1: kind: missing, expected "ServiceRecord""#
    );
    let numeric = XCC_SERVICE_RECORD.replace("kind: ServiceRecord", "kind: 3");
    assert_eq!(
        parse_error::<ServiceRecord>(&numeric, "f.yaml"),
        r#"f.yaml: document 1: kind: expected "ServiceRecord", found a value that is not a string"#
    );
    assert_eq!(
        parse_error::<ServiceRecord>("- a\n- b\n", "list.yaml"),
        "list.yaml: document 1: expected a ServiceRecord object (a mapping)"
    );
}

#[test]
fn syntax_errors_name_the_document() {
    let text = format!("{XCC_SERVICE_RECORD}---\nspec: [unclosed\n");
    let err = parse_documents::<ServiceRecord>(&text, "f.yaml").unwrap_err();
    match &err {
        ResourceError::Document {
            file,
            document,
            path,
            ..
        } => {
            assert_eq!((file.as_str(), *document, path), ("f.yaml", 2, &None));
        }
        other => panic!("unexpected error {other:?}"),
    }
    assert!(err.to_string().starts_with("f.yaml: document 2: "), "{err}");
}

#[test]
fn null_labels_read_as_empty() {
    let text = XCC_SERVICE_RECORD
        .replace(
            "  labels:\n    connectivity.tanzu.vmware.com/export: \"\"\n",
            "  labels: null\n",
        )
        .replace(
            "  annotations:\n    connectivity.tanzu.vmware.com/service-port: \"443\"\n",
            "  annotations:\n",
        );
    let items: Vec<ServiceRecord> = parse_documents(&text, "f.yaml").unwrap();
    assert_eq!(items[0].metadata.labels, None);
    assert_eq!(items[0].metadata.annotations, None);
}

#[test]
fn yaml_round_trip() {
    let mut extended = sr(
        "web.shop-1a2b3c4d",
        "web.shop.example",
        &[("10.1.0.7", 8443)],
    );
    extended.spec.allowed_requesters = Some(vec!["eu-1".into(), "us-2".into()]);
    extended.spec.ports = Some(vec![
        ServicePort {
            name: Some("https".into()),
            port: 443,
            protocol: Some(Protocol::Tcp),
            target_port: None,
        },
        ServicePort {
            name: Some("dns".into()),
            port: 53,
            protocol: Some(Protocol::Udp),
            target_port: Some(5353),
        },
    ]);
    extended.spec.origin = Some(Origin {
        cluster: Some("eu-1".into()),
        namespace: "shop".into(),
        name: "web".into(),
        kind: Some("Service".into()),
    });
    let records = vec![xcc_service_record(), extended];
    let text = to_yaml_documents(&records).unwrap();
    assert_eq!(text.matches("\n---\n").count(), 1, "{text}");
    assert_eq!(
        parse_documents::<ServiceRecord>(&text, "rt.yaml").unwrap(),
        records
    );

    let mut parent = rr(good_rr_spec());
    parent.spec.allowed_domains = Some(Vec::new());
    parent.spec.role = Some(Role::Parent);
    parent.spec.materialize = Some(Materialize::CiliumGlobalService);
    let registries = vec![rr(good_rr_spec()), parent];
    let text = to_yaml_documents(&registries).unwrap();
    assert_eq!(
        parse_documents::<RemoteRegistry>(&text, "rt.yaml").unwrap(),
        registries
    );
    assert!(to_yaml_documents::<ServiceRecord>(&[]).unwrap().is_empty());
}

#[test]
fn serialised_field_names_follow_the_crd() {
    let text = to_yaml_documents(&[rr(good_rr_spec())]).unwrap();
    assert_eq!(
        text,
        format!(
            "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: RemoteRegistry\nmetadata:\n  name: peer\n  namespace: cross-cluster-connectivity\nspec:\n  address: registry.example:443\n  tlsConfig:\n    serverCA: {PEM_B64}\n    serverName: registry.example\n"
        )
    );
    let mut empty_list = rr(good_rr_spec());
    empty_list.spec.allowed_domains = Some(Vec::new());
    let text = to_yaml_documents(&[empty_list]).unwrap();
    assert!(text.ends_with("  allowedDomains: []\n"), "{text}");
    let record = to_yaml_documents(&[sr("a", "a.example", &[])]).unwrap();
    assert_eq!(
        record,
        "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata:\n  name: a\nspec:\n  fqdn: a.example\n  endpoints: []\n"
    );
}

#[test]
fn server_ca_decoding() {
    let mut tls = TlsConfig {
        server_ca: String::new(),
        server_name: "x".into(),
    };
    assert_eq!(tls.server_ca_pem().unwrap(), None);
    tls.server_ca = " \n ".into();
    assert_eq!(tls.server_ca_pem().unwrap(), None);
    tls.server_ca = format!("{}\n  {}", &PEM_B64[..40], &PEM_B64[40..]);
    assert_eq!(tls.server_ca_pem().unwrap(), Some(PEM.to_vec()));
    tls.server_ca = PEM_B64.trim_end_matches('=').into();
    assert_eq!(tls.server_ca_pem().unwrap(), Some(PEM.to_vec()));
    tls.server_ca = "not base64!".into();
    assert_eq!(
        tls.server_ca_pem().unwrap_err().to_string(),
        "spec.tlsConfig.serverCA: invalid base64: Invalid symbol 33, offset 9."
    );
}

#[test]
fn service_record_validation_reports_every_field() {
    let mut bad = sr(
        "Web",
        "web..example",
        &[
            ("10.0.0.1", 443),
            ("10.0.0.2", 70000),
            ("not an address", 0),
        ],
    );
    bad.metadata.namespace = Some("shop".into());
    bad.spec.allowed_requesters = Some(vec!["eu-1".into(), " ".into()]);
    bad.spec.ports = Some(vec![
        ServicePort {
            name: Some("web".into()),
            port: 443,
            protocol: Some(Protocol::Tcp),
            target_port: Some(70000),
        },
        ServicePort {
            name: Some("web".into()),
            port: 0,
            protocol: None,
            target_port: None,
        },
        ServicePort {
            name: None,
            port: 53,
            protocol: Some(Protocol::Udp),
            target_port: None,
        },
        ServicePort {
            name: Some("Bad_Name".into()),
            port: 80,
            protocol: Some(Protocol::Sctp),
            target_port: None,
        },
    ]);
    bad.spec.origin = Some(Origin {
        cluster: None,
        namespace: String::new(),
        name: String::new(),
        kind: None,
    });
    let err = bad.validate().unwrap_err();
    let ResourceError::Invalid {
        kind,
        name,
        violations,
    } = &err
    else {
        panic!("unexpected {err:?}");
    };
    assert_eq!((*kind, name.as_str()), ("ServiceRecord", "shop/Web"));
    let rendered: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        vec![
            r#"metadata.name: "Web" is not a valid DNS-1123 subdomain (at most 253 lowercase letters, digits, '-' and '.', each part starting and ending with a letter or digit)"#,
            r#"spec.fqdn: invalid FQDN "web..example": label 2 is empty"#,
            "spec.endpoints[1].port: 70000 is out of range 1-65535",
            r#"spec.endpoints[2].address: "not an address" is neither an IP address nor a DNS name (invalid FQDN "not an address": character ' ' is not allowed (only letters, digits, '-' and '.'))"#,
            "spec.endpoints[2].port: 0 is out of range 1-65535",
            "spec.allowedRequesters[1]: must not be empty",
            "spec.ports[0].targetPort: 70000 is out of range 1-65535",
            r#"spec.ports[1].name: duplicate name "web""#,
            "spec.ports[1].port: 0 is out of range 1-65535",
            "spec.ports[2].name: required when more than one port is listed",
            r#"spec.ports[3].name: "Bad_Name" is not a valid port name (a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)"#,
            "spec.origin.namespace: must not be empty",
            "spec.origin.name: must not be empty",
        ]
    );
    assert!(
        err.to_string()
            .starts_with(r#"invalid ServiceRecord "shop/Web": metadata.name: "Web" is not"#)
    );
}

#[test]
fn service_record_validation_accepts_good_shapes() {
    let mut ok = sr(
        "web.shop-1a2b3c4d",
        "Web.Shop.Example.",
        &[("10.0.0.1", 1), ("fd00::1", 65535), ("lb.example", 443)],
    );
    ok.spec.ports = Some(vec![ServicePort {
        name: None,
        port: 443,
        protocol: None,
        target_port: None,
    }]);
    assert_eq!(ok.validate().ok(), Some(()));
    let single = sr("x", "x.example", &[("10.0.0.1", 70000)]);
    assert_eq!(
        single.validate().unwrap_err().to_string(),
        r#"invalid ServiceRecord "x": spec.endpoints[0].port: 70000 is out of range 1-65535"#
    );
    let unnamed = sr("", "x.example", &[]);
    assert_eq!(
        unnamed.validate().unwrap_err().to_string(),
        r#"invalid ServiceRecord "": metadata.name: must not be empty"#
    );
}

#[test]
fn remote_registry_validation() {
    assert_eq!(rr(good_rr_spec()).validate().ok(), Some(()));
    let mut spec = good_rr_spec();
    spec.tls_config.server_ca = String::new();
    spec.role = Some(Role::Peer);
    spec.materialize = Some(Materialize::Service);
    spec.allowed_domains = Some(vec![".".into(), "xcc.test".into()]);
    assert_eq!(rr(spec).validate().ok(), Some(()));

    let bad = rr(RemoteRegistrySpec {
        address: "registry.example".into(),
        tls_config: TlsConfig {
            server_ca: "%%".into(),
            server_name: String::new(),
        },
        allowed_domains: Some(vec![
            "ok.example".into(),
            "invalid..domain".into(),
            "".into(),
        ]),
        role: None,
        materialize: None,
        imports: Some(vec![Import {
            name: Some("api".into()),
            ..Default::default()
        }]),
    });
    let ResourceError::Invalid { violations, .. } = bad.validate().unwrap_err() else {
        panic!("expected Invalid");
    };
    let rendered: Vec<String> = violations.iter().map(ToString::to_string).collect();
    assert_eq!(
        rendered,
        vec![
            r#"spec.address: "registry.example" is not host:port"#,
            "spec.tlsConfig.serverCA: invalid base64: Invalid symbol 37, offset 0.",
            "spec.tlsConfig.serverName: must not be empty",
            r#"spec.allowedDomains[1]: Invalid value: "invalid..domain": Invalid domain. For example, labels in the domain name must have between 1 and 63 characters. Check RFC1035 for more details."#,
            "spec.allowedDomains[2]: Required value: Invalid domain. For example, labels in the domain name must have between 1 and 63 characters. Check RFC1035 for more details.",
            "spec.imports[0]: imports need role Parent",
            "spec.imports[0]: give either fqdn, or namespace and name",
        ]
    );
}

/// An import's requester identity is held to the names the mesh gives it; every bad field is
/// reported with its path.
#[test]
fn remote_registry_import_identity() {
    let with = |namespace: &str, service_account: &str, trust_domain: Option<&str>| {
        let mut spec = good_rr_spec();
        spec.role = Some(Role::Parent);
        spec.imports = Some(vec![Import {
            fqdn: Some("api.shop.example".into()),
            requester_identity: Some(RequesterIdentity {
                namespace: namespace.into(),
                service_account: service_account.into(),
                trust_domain: trust_domain.map(str::to_string),
            }),
            ..Default::default()
        }]);
        match rr(spec).validate() {
            Ok(()) => vec![],
            Err(ResourceError::Invalid { violations, .. }) => {
                violations.iter().map(ToString::to_string).collect()
            }
            Err(other) => panic!("{other}"),
        }
    };
    assert_eq!(with("storefront", "web", None), Vec::<String>::new());
    assert_eq!(
        with("storefront", "web.v1", Some("west.mesh.example")),
        Vec::<String>::new()
    );
    assert_eq!(
        with("../x", &"a".repeat(64), Some("Mesh_Example")),
        vec![
            r#"spec.imports[0].requesterIdentity.namespace: "../x" is not a valid namespace name (a DNS-1123 label)"#
                .to_string(),
            format!(
                "spec.imports[0].requesterIdentity.serviceAccount: {:?} is not a service account name (a DNS-1123 subdomain of at most 63 characters)",
                "a".repeat(64)
            ),
            r#"spec.imports[0].requesterIdentity.trustDomain: "Mesh_Example" is not a trust domain (a lowercase DNS name)"#
                .to_string(),
        ]
    );
    assert_eq!(
        with("", "", None),
        vec![
            r#"spec.imports[0].requesterIdentity.namespace: "" is not a valid namespace name (a DNS-1123 label)"#,
            r#"spec.imports[0].requesterIdentity.serviceAccount: "" is not a service account name (a DNS-1123 subdomain of at most 63 characters)"#,
        ]
    );
}

#[test]
fn remote_registry_addresses() {
    let cases = [
        ("127.0.0.1:8000", None),
        ("[::1]:8443", None),
        ("registry.xcc.test:30001", None),
        ("localhost:1", None),
        (
            ":443",
            Some(
                r#"":443": host is neither an IP address nor a DNS name (invalid FQDN "": must not be empty)"#,
            ),
        ),
        (
            "host:0",
            Some(r#""host:0": port "0" is not a number in 1-65535"#),
        ),
        (
            "host:65536",
            Some(r#""host:65536": port "65536" is not a number in 1-65535"#),
        ),
        (
            "host:+80",
            Some(r#""host:+80": port "+80" is not a number in 1-65535"#),
        ),
        (
            "host:",
            Some(r#""host:": port "" is not a number in 1-65535"#),
        ),
        (
            "::1:443",
            Some(r#""::1:443": an IPv6 host must be written in brackets, e.g. [::1]:443"#),
        ),
        (
            "[zz]:443",
            Some(r#""[zz]:443": "zz" is not an IPv6 address"#),
        ),
        (
            "300.1.1.1:443",
            Some(
                r#""300.1.1.1:443": host is neither an IP address nor a DNS name (invalid FQDN "300.1.1.1": top-level label "1" is all-numeric)"#,
            ),
        ),
    ];
    for (address, expected) in cases {
        let mut spec = good_rr_spec();
        spec.address = address.into();
        let result = rr(spec).validate();
        match expected {
            None => assert_eq!(result.ok(), Some(()), "{address}"),
            Some(message) => {
                let Err(ResourceError::Invalid { violations, .. }) = result else {
                    panic!("{address}: expected Invalid");
                };
                assert_eq!(
                    violations,
                    vec![FieldViolation {
                        path: "spec.address".into(),
                        message: message.into()
                    }],
                    "{address}"
                );
            }
        }
    }
}

#[test]
fn dns1123_subdomains() {
    use crate::names::is_dns1123_subdomain;
    for ok in [
        "a",
        "web",
        "some-service.some.domain-06df7236",
        "0.1",
        &"a".repeat(253),
    ] {
        assert!(is_dns1123_subdomain(ok), "{ok}");
    }
    for bad in [
        "",
        "A",
        "-a",
        "a-",
        "a..b",
        ".a",
        "a.",
        "a_b",
        &"a".repeat(254),
        "a.-b",
    ] {
        assert!(!is_dns1123_subdomain(bad), "{bad}");
    }
}

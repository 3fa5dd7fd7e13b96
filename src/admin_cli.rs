//! `xcc admin …`: a command-line client of `xcc.admin.v1`, printing tables or JSON.

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use xcc_proto::xcc::admin::v1 as api;

use crate::args::{Output, TlsArgs, table};

#[derive(Args, Debug)]
pub struct AdminArgs {
    /// Admin API address (host:port).
    #[arg(long, env = "XCC_ADMIN_ADDR", default_value = "127.0.0.1:9443")]
    pub addr: String,
    /// Name to verify on the registry's certificate (default: the host of --addr).
    #[arg(long, env = "XCC_ADMIN_SERVER_NAME")]
    pub server_name: Option<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Output format: an aligned table or JSON; accepted before or after the subcommand.
    #[arg(short = 'o', long, value_enum, default_value = "table", global = true)]
    pub output: Output,
    #[command(subcommand)]
    pub command: AdminCommand,
}

#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// List services in the catalog.
    Services {
        /// Only services owned by this cluster.
        #[arg(long)]
        owner: Option<String>,
        /// Only services in this namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// Only services whose FQDN ends with this suffix (e.g. `example.org`).
        #[arg(long)]
        fqdn_suffix: Option<String>,
    },
    /// Show one service, by FQDN or by owner/namespace/name.
    Service {
        /// The service's FQDN (or give --owner, --namespace and --name).
        fqdn: Option<String>,
        /// The owner cluster.
        #[arg(long)]
        owner: Option<String>,
        /// The service's namespace.
        #[arg(long)]
        namespace: Option<String>,
        /// The service's name.
        #[arg(long)]
        name: Option<String>,
    },
    /// List Hamlet consumers and remote registries.
    Peers,
    /// Stream catalog events.
    Watch {
        /// Start with every current service.
        #[arg(long)]
        snapshot: bool,
    },
    /// Ask for a service through the hierarchy, as this cluster (or evaluate as another).
    Resolve(ResolveArgs),
    /// Evaluate the bilateral decision here, without asking the parent or recording a grant.
    Explain(ResolveArgs),
    /// Evaluate one Cedar request against the loaded policies: announce, discover, or carry
    /// (may child --cluster carry the cluster --name in its subtree).
    ExplainPolicy {
        /// `announce`, `discover` or `carry`.
        #[arg(long)]
        action: String,
        /// The principal: the cluster announcing, asking, or (carry) the child.
        #[arg(long)]
        cluster: String,
        /// The principal's workload (discover).
        #[arg(long, default_value = "")]
        service: String,
        /// The service's FQDN.
        #[arg(long, default_value = "")]
        fqdn: String,
        /// The service's namespace.
        #[arg(long, default_value = "")]
        namespace: String,
        /// The service's name (carry: the cluster carried).
        #[arg(long, default_value = "")]
        name: String,
    },
    /// Route grants held here (as owner) or recorded here (as resolver).
    Routes,
    /// This registry's place in the hierarchy: parent, children, subtree, imports.
    Tree,
}

#[derive(Args, Debug)]
pub struct ResolveArgs {
    /// FQDN of the service (or give --namespace and --name).
    pub fqdn: Option<String>,
    /// The service's namespace.
    #[arg(long)]
    pub namespace: Option<String>,
    /// The service's name.
    #[arg(long)]
    pub name: Option<String>,
    /// Requester cluster (default: the registry's own).
    #[arg(long)]
    pub requester_cluster: Option<String>,
    /// Requester workload.
    #[arg(long)]
    pub requester_service: Option<String>,
    /// The requesting workload's mesh trust domain (with --requester-namespace and
    /// --requester-service-account: the identity a grant admits).
    #[arg(long)]
    pub requester_trust_domain: Option<String>,
    /// The requesting workload's namespace.
    #[arg(long)]
    pub requester_namespace: Option<String>,
    /// The requesting workload's service account.
    #[arg(long)]
    pub requester_service_account: Option<String>,
}

impl ResolveArgs {
    fn request(self) -> api::ResolveRequest {
        api::ResolveRequest {
            fqdn: self.fqdn.unwrap_or_default(),
            namespace: self.namespace.unwrap_or_default(),
            name: self.name.unwrap_or_default(),
            requester_cluster: self.requester_cluster.unwrap_or_default(),
            requester_service: self.requester_service.unwrap_or_default(),
            requester_trust_domain: self.requester_trust_domain.unwrap_or_default(),
            requester_namespace: self.requester_namespace.unwrap_or_default(),
            requester_service_account: self.requester_service_account.unwrap_or_default(),
        }
    }
}

pub async fn run(args: AdminArgs) -> anyhow::Result<()> {
    let addr = args.addr.clone();
    call(args)
        .await
        .map_err(|e| xcc_registry::admin::call_error(e, &addr))
}

async fn call(args: AdminArgs) -> anyhow::Result<()> {
    let tls = xcc_certs::reload::ReloadingTls::load(args.tls.files()?)?;
    let mut client = xcc_registry::admin::connect(tls, &args.addr, args.server_name).await?;
    match args.command {
        AdminCommand::Services {
            owner,
            namespace,
            fqdn_suffix,
        } => {
            // Paged: any catalog size; printed once complete (`-o json` is one document).
            let services = xcc_registry::admin::list_all_services(
                &mut client,
                api::ListServicesRequest {
                    owner_cluster: owner.unwrap_or_default(),
                    namespace: namespace.unwrap_or_default(),
                    fqdn_suffix: fqdn_suffix.unwrap_or_default(),
                    ..Default::default()
                },
            )
            .await?;
            print_services(&services, args.output);
        }
        AdminCommand::Service {
            fqdn,
            owner,
            namespace,
            name,
        } => {
            let svc = client
                .get_service(api::GetServiceRequest {
                    fqdn: fqdn.unwrap_or_default(),
                    owner_cluster: owner.unwrap_or_default(),
                    namespace: namespace.unwrap_or_default(),
                    name: name.unwrap_or_default(),
                })
                .await?
                .into_inner();
            print_service(&svc, args.output);
        }
        AdminCommand::Peers => {
            let resp = client
                .list_peers(api::ListPeersRequest {})
                .await?
                .into_inner();
            print_peers(&resp.peers, args.output);
        }
        AdminCommand::Resolve(r) => {
            let d = client.resolve(r.request()).await?.into_inner();
            print_decision(&d, args.output);
            denied(&d)?;
        }
        AdminCommand::Explain(r) => {
            let d = client.explain(r.request()).await?.into_inner();
            print_decision(&d, args.output);
            denied(&d)?;
        }
        AdminCommand::ExplainPolicy {
            action,
            cluster,
            service,
            fqdn,
            namespace,
            name,
        } => {
            let d = client
                .explain_policy(api::ExplainPolicyRequest {
                    action,
                    principal_cluster: cluster,
                    principal_service: service,
                    fqdn,
                    namespace,
                    name,
                })
                .await?
                .into_inner();
            print_decision(&d, args.output);
            denied(&d)?;
        }
        AdminCommand::Routes => {
            let routes = client
                .list_routes(api::ListRoutesRequest {})
                .await?
                .into_inner()
                .routes;
            print_routes(&routes, args.output);
        }
        AdminCommand::Tree => {
            let tree = client.get_tree(api::GetTreeRequest {}).await?.into_inner();
            print_tree(&tree, args.output);
        }
        AdminCommand::Watch { snapshot } => watch(&mut client, snapshot, args.output).await?,
    }
    Ok(())
}

/// One service, as a JSON document or as `key value` lines.
fn print_service(svc: &api::Service, output: Output) {
    match output {
        Output::Json => println!("{:#}", service_json(svc)),
        Output::Table => {
            for (k, v) in service_json(svc).as_object().into_iter().flatten() {
                println!("{k:<20} {}", plain(v));
            }
        }
    }
}

/// Print the catalog's events as they come (after the snapshot, when asked for) until the
/// registry ends the stream.
async fn watch(
    client: &mut api::admin_client::AdminClient<tonic::transport::Channel>,
    snapshot: bool,
    output: Output,
) -> anyhow::Result<()> {
    let mut stream = client
        .watch(api::WatchRequest { snapshot })
        .await?
        .into_inner();
    while let Some(ev) = stream.message().await? {
        let kind = api::catalog_event::Kind::try_from(ev.kind)
            .map(|k| k.as_str_name().to_string())
            .unwrap_or_else(|_| ev.kind.to_string());
        match output {
            Output::Json => println!(
                "{}",
                json!({"kind": kind, "revision": ev.revision,
                       "service": ev.service.as_ref().map(service_json)})
            ),
            Output::Table => match &ev.service {
                Some(s) => println!(
                    "{kind:<18} rev={:<6} {} {}",
                    ev.revision,
                    s.fqdn,
                    endpoints(s)
                ),
                None => println!("{kind:<18} rev={}", ev.revision),
            },
        }
    }
    Ok(())
}

/// A decision printed as DENY: `xcc admin` exits with [`DENIED_EXIT`] (the decision on stdout
/// says why), so a script can tell a refusal from a failure.
#[derive(Debug)]
pub struct Denied;

impl std::fmt::Display for Denied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("denied")
    }
}

impl std::error::Error for Denied {}

/// The exit code of a DENY (see the `xcc admin` help).
pub const DENIED_EXIT: u8 = 3;

fn denied(d: &api::Decision) -> Result<(), Denied> {
    if d.allowed { Ok(()) } else { Err(Denied) }
}

pub fn endpoints(s: &api::Service) -> String {
    s.endpoints
        .iter()
        .map(|e| format!("{}:{}", e.address, e.port))
        .collect::<Vec<_>>()
        .join(",")
}

pub fn service_json(s: &api::Service) -> Value {
    json!({
        "ownerCluster": s.owner_cluster,
        "namespace": s.namespace,
        "name": s.name,
        "fqdn": s.fqdn,
        "endpoints": s.endpoints.iter().map(|e| json!({"address": e.address, "port": e.port})).collect::<Vec<_>>(),
        "ports": s.ports.iter().map(|p| json!({"name": p.name, "port": p.port, "protocol": p.protocol})).collect::<Vec<_>>(),
        "labels": s.labels,
        "allowedRequesters": s.allowed_requesters,
        "source": s.source,
        "revision": s.revision,
    })
}

fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub fn print_services(services: &[api::Service], output: Output) {
    match output {
        Output::Json => println!(
            "{:#}",
            Value::Array(services.iter().map(service_json).collect())
        ),
        Output::Table => {
            let rows: Vec<Vec<String>> = services
                .iter()
                .map(|s| {
                    vec![
                        s.fqdn.clone(),
                        s.owner_cluster.clone(),
                        s.namespace.clone(),
                        s.source.clone(),
                        endpoints(s),
                        if s.allowed_requesters.is_empty() {
                            "*".into()
                        } else {
                            s.allowed_requesters.join(",")
                        },
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "FQDN",
                        "OWNER",
                        "NAMESPACE",
                        "SOURCE",
                        "ENDPOINTS",
                        "ALLOWED"
                    ],
                    &rows
                )
            );
        }
    }
}

fn ago(ts: &Option<prost_types::Timestamp>) -> String {
    match ts {
        None => "-".into(),
        Some(t) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            format!("{}s ago", (now - t.seconds).max(0))
        }
    }
}

pub fn print_peers(peers: &[api::Peer], output: Output) {
    let kind = |k: i32| {
        api::peer::Kind::try_from(k)
            .map(|k| k.as_str_name().to_string())
            .unwrap_or_default()
    };
    let state = |s: i32| {
        api::peer::State::try_from(s)
            .map(|s| s.as_str_name().to_string())
            .unwrap_or_default()
    };
    match output {
        Output::Json => {
            let v: Vec<Value> = peers
                .iter()
                .map(|p| {
                    json!({"kind": kind(p.kind), "name": p.name, "identity": p.identity,
                       "address": p.address, "state": state(p.state),
                       "connectedSince": p.connected_since.map(|t| t.seconds),
                       "lastSync": p.last_sync.map(|t| t.seconds),
                       "records": p.record_count, "lastError": p.last_error,
                       "sent": p.responses_sent, "acks": p.acks, "nacks": p.nacks,
                       "reconnects": p.reconnects})
                })
                .collect();
            println!("{:#}", Value::Array(v));
        }
        Output::Table => {
            let rows: Vec<Vec<String>> = peers
                .iter()
                .map(|p| {
                    vec![
                        kind(p.kind),
                        p.name.clone(),
                        p.identity.clone(),
                        state(p.state),
                        p.record_count.to_string(),
                        ago(&p.last_sync),
                        p.last_error.clone(),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(
                    &[
                        "KIND",
                        "NAME",
                        "IDENTITY",
                        "STATE",
                        "RECORDS",
                        "LAST SYNC",
                        "LAST ERROR"
                    ],
                    &rows
                )
            );
        }
    }
}

pub fn condition_name(c: i32) -> String {
    api::Condition::try_from(c)
        .map(|c| c.as_str_name().to_string())
        .unwrap_or_else(|_| c.to_string())
}

pub fn decision_json(d: &api::Decision) -> Value {
    json!({
        "found": d.found,
        "allowed": d.allowed,
        "condition": condition_name(d.condition),
        "reason": d.reason,
        "policies": d.policies,
        "ownerCluster": d.owner_cluster,
        "resolverCluster": d.resolver_cluster,
        "calleeAdmits": d.callee_admits,
        "callerRequested": d.caller_requested,
        "policyPermits": d.policy_permits,
        "service": d.service.as_ref().map(service_json),
        "nameClashes": d.name_clashes,
    })
}

pub fn print_decision(d: &api::Decision, output: Output) {
    match output {
        Output::Json => println!("{:#}", decision_json(d)),
        Output::Table => {
            let mut rows = vec![
                vec![
                    "decision".to_string(),
                    if d.allowed {
                        "ALLOW".into()
                    } else {
                        "DENY".into()
                    },
                ],
                vec!["condition".into(), condition_name(d.condition)],
                vec!["reason".into(), d.reason.clone()],
                vec!["policies".into(), d.policies.join(", ")],
                vec!["owner".into(), d.owner_cluster.clone()],
                vec!["decided by".into(), d.resolver_cluster.clone()],
                vec![
                    "endpoints".into(),
                    d.service.as_ref().map(endpoints).unwrap_or_default(),
                ],
            ];
            for clash in &d.name_clashes {
                rows.push(vec!["name clash".into(), clash.clone()]);
            }
            print!("{}", table(&["FIELD", "VALUE"], &rows));
        }
    }
}

pub fn print_routes(routes: &[api::Route], output: Output) {
    match output {
        Output::Json => {
            let v: Vec<Value> = routes
                .iter()
                .map(|r| {
                    json!({"target": format!("{}/{}", r.target_namespace, r.target_service),
                       "caller": format!("{}/{}", r.caller_cluster, r.caller_service),
                       "resolver": r.resolver_cluster, "role": r.role,
                       "since": r.since.map(|t| t.seconds), "applied": r.applied_objects})
                })
                .collect();
            println!("{:#}", Value::Array(v));
        }
        Output::Table => {
            let rows: Vec<Vec<String>> = routes
                .iter()
                .map(|r| {
                    vec![
                        r.role.clone(),
                        format!("{}/{}", r.target_namespace, r.target_service),
                        format!("{}/{}", r.caller_cluster, r.caller_service),
                        r.resolver_cluster.clone(),
                        r.applied_objects.join(","),
                    ]
                })
                .collect();
            print!(
                "{}",
                table(&["ROLE", "SERVICE", "CALLER", "RESOLVER", "APPLIED"], &rows)
            );
        }
    }
}

pub fn print_tree(t: &api::Tree, output: Output) {
    match output {
        Output::Json => println!(
            "{:#}",
            json!({
                "cluster": t.cluster, "parent": t.parent, "parentState": t.parent_state,
                "subtree": t.subtree,
                "children": t.children.iter().map(|c| json!({"cluster": c.cluster, "subtree": c.subtree,
                    "address": c.address, "announcedServices": c.announced_services,
                    "queuedRoutes": c.queued_routes})).collect::<Vec<_>>(),
                "imports": t.imports.iter().map(|i| json!({"target": i.target,
                    "requesterService": i.requester_service, "state": i.state, "reason": i.reason,
                    "ownerCluster": i.owner_cluster})).collect::<Vec<_>>(),
                "refused": t.refused.iter().map(|r| json!({"kind": r.kind,
                    "entry": refused_entry(r), "fqdn": r.fqdn, "code": r.code, "check": r.check,
                    "policyIds": r.policy_ids, "refusedBy": r.refused_by, "reason": r.reason,
                    "at": r.at.map(|t| t.seconds)})).collect::<Vec<_>>(),
                "overflows": t.overflows,
                "heldNames": t.held_names.as_ref().map(|h| json!({"names": h.names,
                    "oldestSince": h.oldest_since.map(|t| t.seconds),
                    "oldestExpires": h.oldest_expires.map(|t| t.seconds),
                    "holdSeconds": h.hold_seconds})),
            })
        ),
        Output::Table => {
            println!(
                "cluster {}  parent {}{}  subtree [{}]",
                t.cluster,
                if t.parent.is_empty() { "-" } else { &t.parent },
                if t.parent_state.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", t.parent_state)
                },
                t.subtree.join(", ")
            );
            if !t.children.is_empty() {
                let rows: Vec<Vec<String>> = t
                    .children
                    .iter()
                    .map(|c| {
                        vec![
                            c.cluster.clone(),
                            c.subtree.join(","),
                            c.announced_services.to_string(),
                            c.queued_routes.to_string(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["CHILD", "SUBTREE", "SERVICES", "QUEUED ROUTES"], &rows)
                );
            }
            if !t.imports.is_empty() {
                let rows: Vec<Vec<String>> = t
                    .imports
                    .iter()
                    .map(|i| {
                        vec![
                            i.target.clone(),
                            i.requester_service.clone(),
                            i.state.clone(),
                            i.owner_cluster.clone(),
                            i.reason.clone(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(&["IMPORT", "AS", "STATE", "OWNER", "REASON"], &rows)
                );
            }
            if !t.refused.is_empty() {
                let rows: Vec<Vec<String>> = t
                    .refused
                    .iter()
                    .map(|r| {
                        vec![
                            r.kind.clone(),
                            refused_entry(r),
                            r.check.clone(),
                            r.policy_ids.join(","),
                            r.refused_by.clone(),
                            r.reason.clone(),
                        ]
                    })
                    .collect();
                print!(
                    "{}",
                    table(
                        &["REFUSED", "ENTRY", "CHECK", "POLICIES", "BY", "REASON"],
                        &rows
                    )
                );
            }
            if t.overflows > 0 {
                println!(
                    "federation queue overflows (streams reset): {}",
                    t.overflows
                );
            }
            if let Some(h) = &t.held_names {
                println!("{}", held_names_line(h));
            }
        }
    }
}

/// The names held for owners that are away, in one line.
fn held_names_line(h: &api::HeldNames) -> String {
    let hold = match h.hold_seconds {
        0 => "held until their owner is back".to_string(),
        s if s % 3600 == 0 => format!("hold {}h", s / 3600),
        s => format!("hold {s}s"),
    };
    let when = |t: &Option<prost_types::Timestamp>| {
        t.map(|t| {
            prost_types::Timestamp {
                seconds: t.seconds,
                nanos: 0,
            }
            .to_string()
        })
    };
    match (when(&h.oldest_since), when(&h.oldest_expires)) {
        (None, _) => format!("names held for absent owners: 0 ({hold})"),
        (Some(since), None) => format!(
            "names held for absent owners: {} (oldest since {since}; {hold})",
            h.names
        ),
        (Some(since), Some(expires)) => format!(
            "names held for absent owners: {} (oldest since {since}, free at {expires}; {hold})",
            h.names
        ),
    }
}

/// `cluster/namespace/name` of a refused entry (just the cluster for a subtree refusal).
fn refused_entry(r: &api::RefusedEntry) -> String {
    if r.name.is_empty() {
        r.cluster.clone()
    } else {
        format!("{}/{}/{}", r.cluster, r.namespace, r.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn held_names_say_how_many_since_when_and_until_when() {
        let ts = |seconds| Some(prost_types::Timestamp { seconds, nanos: 0 });
        let mut h = api::HeldNames {
            names: 4,
            oldest_since: ts(1_764_000_000),
            oldest_expires: ts(1_764_604_800),
            hold_seconds: 604_800,
        };
        assert_eq!(
            held_names_line(&h),
            "names held for absent owners: 4 (oldest since 2025-11-24T16:00:00Z, free at 2025-12-01T16:00:00Z; hold 168h)"
        );
        (h.oldest_expires, h.hold_seconds) = (None, 0);
        assert_eq!(
            held_names_line(&h),
            "names held for absent owners: 4 (oldest since 2025-11-24T16:00:00Z; held until their owner is back)"
        );
        assert_eq!(
            held_names_line(&api::HeldNames::default()),
            "names held for absent owners: 0 (held until their owner is back)"
        );
    }
}

//! What a registry is started with: listeners, store, Hamlet server and client settings,
//! hierarchy and grant settings.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use xcc_certs::reload::TlsFiles;

use crate::federation::Question;
use crate::federation::link::ParentSpec;
use crate::hamlet::client::ClientConfig;
use crate::hamlet::server::HamletConfig;

/// Where exports, remotes and imports live.
#[derive(Clone, Debug)]
pub enum StoreConfig {
    /// Nothing persisted; exports and remotes are set through the API (tests, demo).
    Memory,
    /// `xcc registry --store file --state-dir DIR`.
    File { state_dir: PathBuf, poll: Duration },
    /// `xcc registry --store kube`: ServiceRecords and RemoteRegistries in Kubernetes.
    Kube(crate::store::kube::KubeConfig),
}

/// Hierarchy settings.
#[derive(Clone, Debug)]
pub struct FederationConfig {
    /// The parent (memory store; in file mode a RemoteRegistry with `role: Parent`).
    pub parent: Option<ParentSpec>,
    /// Services to ask the hierarchy for (with `parent`).
    pub imports: Vec<Question>,
    /// Extra Cedar policies (`*.cedar`), watched and reloaded; the defaults always apply.
    pub policy_dir: Option<PathBuf>,
    /// Cedar policies given in code (the embedded demo, tests and the hierarchy bench use them
    /// to say which clusters each child may carry), in force with the defaults and `policy_dir`.
    /// Not combined with `policy_configmap`.
    pub policies: Vec<(String, String)>,
    /// `--store kube`: Cedar policies from this ConfigMap in the namespace (every `*.cedar`
    /// key), watched on every replica; the defaults always apply. Ignored with `policy_dir`.
    pub policy_configmap: Option<String>,
    /// How long a query waits for its answer.
    pub query_timeout: Duration,
    /// How often unanswered, denied or not-found imports are asked again.
    pub import_retry: Duration,
    /// What the owner of a service applies when a caller is granted.
    pub grant_mode: crate::federation::grants::GrantMode,
    /// `--grant-mode gateway`: the Gateway every HTTPRoute attaches to.
    pub grant_gateway: Option<crate::federation::grants::GatewayRef>,
    /// The trust domain of a caller cluster's workloads (`{cluster}` = its name).
    pub grant_trust_domain: String,
    /// The budget of every federation queue (each child session's, and the one up to the
    /// parent): a peer that falls further behind is cut and resynchronises.
    pub queue_limits: crate::budget::QueueLimits,
    /// How long a child's queue may stay over half its budget (its messages are not read
    /// meanwhile) before the child is cut.
    pub queue_stall: Duration,
    /// How long a name stays held for an owner that went away without withdrawing it
    /// ([`DEFAULT_NAME_HOLD`]); zero: until the owner is back.
    pub name_hold: Duration,
}

impl FederationConfig {
    /// The grant settings together.
    pub fn grants(&self) -> crate::federation::grants::GrantConfig {
        crate::federation::grants::GrantConfig {
            mode: self.grant_mode,
            gateway: self.grant_gateway.clone(),
            trust_domain: self.grant_trust_domain.clone(),
        }
    }
}

/// How long a name is held for an owner that went away without withdrawing it (7 days: a
/// cluster down over a long weekend keeps its names).
pub const DEFAULT_NAME_HOLD: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for FederationConfig {
    fn default() -> Self {
        Self {
            parent: None,
            imports: vec![],
            policy_dir: None,
            policies: vec![],
            policy_configmap: None,
            query_timeout: Duration::from_secs(5),
            import_retry: Duration::from_secs(30),
            grant_mode: Default::default(),
            grant_gateway: None,
            grant_trust_domain: crate::federation::grants::DEFAULT_TRUST_DOMAIN.into(),
            queue_limits: crate::budget::QueueLimits::FEDERATION,
            queue_stall: crate::federation::level::QUEUE_STALL,
            name_hold: DEFAULT_NAME_HOLD,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RegistryConfig {
    pub tls: TlsFiles,
    /// Namespace written into imported records.
    pub namespace: String,
    pub hamlet_listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub metrics_listen: Option<SocketAddr>,
    pub hamlet: HamletConfig,
    pub client: ClientConfig,
    pub store: StoreConfig,
    /// Fallback poll period for certificate files (filesystem events are used too).
    pub cert_poll: Duration,
    pub federation: FederationConfig,
    /// How long shutdown waits for open streams and connections to finish before it drops them.
    pub shutdown_grace: Duration,
}

impl RegistryConfig {
    /// Loopback listeners on free ports, memory store: for tests and the demo.
    pub fn loopback(tls: TlsFiles) -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            tls,
            namespace: xcc_proto::names::DEFAULT_NAMESPACE.to_string(),
            hamlet_listen: any,
            admin_listen: any,
            metrics_listen: None,
            hamlet: HamletConfig::default(),
            client: ClientConfig::default(),
            store: StoreConfig::Memory,
            cert_poll: Duration::from_secs(30),
            federation: FederationConfig::default(),
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

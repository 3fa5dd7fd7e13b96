//! `xcc dns`: wiring only. Flags → a [`DnsIndex`] fed by Kubernetes watches, a file-mode
//! registry's imports directory and/or a static records file → the UDP/TCP server, the metrics
//! endpoint and the snapshot observer, on the process runtime; if the server or a feed stops on
//! its own, the process exits non-zero.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;
use xcc_controller::runtime::Runtime;
use xcc_dns::answer::{DEFAULT_TTL, Settings};
use xcc_dns::imports_feed;
use xcc_dns::index::{DnsFeed, DnsIndex, FeedSource};
use xcc_dns::kube_feed::{self, KubeFeedConfig};
use xcc_dns::metrics::{self, DnsMetrics};
use xcc_dns::server::{DnsServer, ServerConfig};
use xcc_dns::static_records;

/// Where names come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Feed {
    /// Watch Services (and Pods and Namespaces when needed) in the cluster; a --static-records
    /// file, if given, is served as well.
    Kube,
    /// Only the --static-records file (no cluster access).
    Static,
    /// What a file-mode registry imported: the ServiceRecords in --imports-dir (its
    /// `<state-dir>/imports`), followed as they change (no cluster access).
    Imports,
}

/// How the UDP worker threads share the listen address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum UdpSockets {
    /// A socket per worker, all bound with `SO_REUSEPORT`.
    PerWorker,
    /// One socket that every worker reads.
    Shared,
}

#[derive(Args, Debug)]
pub struct DnsArgs {
    /// UDP and TCP listen address.
    #[arg(long, env = "XCC_DNS_LISTEN", default_value = "0.0.0.0:53")]
    pub listen: SocketAddr,
    /// A zone to answer for authoritatively (repeat, or comma-separate in the variable).
    #[arg(
        long = "zone",
        env = "XCC_DNS_ZONES",
        value_delimiter = ',',
        required = true
    )]
    pub zones: Vec<String>,
    /// Address of this server, served for the NS target `ns.dns.<zone>` (repeat for several;
    /// default: the --listen address unless it is a wildcard).
    #[arg(
        long = "ns-address",
        env = "XCC_DNS_NS_ADDRESSES",
        value_delimiter = ','
    )]
    pub ns_addresses: Vec<std::net::IpAddr>,
    /// TTL of every record, and the negative-caching TTL (seconds).
    #[arg(long, env = "XCC_DNS_TTL", default_value_t = DEFAULT_TTL)]
    pub ttl: u32,
    /// Answer `<svc>` and `<svc>.<ns>` as clusterset names for the asking pod and relay every
    /// other name to --upstream (transparent multicluster resolution). Needs --upstream.
    #[arg(long, env = "XCC_DNS_TRANSPARENT")]
    pub transparent: bool,
    /// Resolver for the names we do not hold (transparent mode), e.g. kube-dns: 10.96.0.10:53.
    #[arg(long, env = "XCC_DNS_UPSTREAM")]
    pub upstream: Option<SocketAddr>,
    /// Honour `multicluster.kubernetes.io/namespace` on Namespaces for pods asking full
    /// clusterset names (watches Pods and Namespaces; implied by --transparent).
    #[arg(long, env = "XCC_DNS_NAMESPACE_MAPPING")]
    pub namespace_mapping: bool,
    /// Where names come from.
    #[arg(long, value_enum, env = "XCC_DNS_FEED", default_value = "kube")]
    pub feed: Feed,
    /// YAML or JSON list of `{fqdn, addresses, ports}` to serve.
    #[arg(long, env = "XCC_DNS_STATIC_RECORDS")]
    pub static_records: Option<PathBuf>,
    /// The imports directory of `xcc registry --store file` (`<state-dir>/imports`).
    #[arg(long, env = "XCC_DNS_IMPORTS_DIR")]
    pub imports_dir: Option<PathBuf>,
    /// Watch Services in this namespace only (default: all namespaces).
    #[arg(long, env = "XCC_DNS_SERVICE_NAMESPACE")]
    pub service_namespace: Option<String>,
    /// Kubeconfig file (default: in-cluster configuration, then $KUBECONFIG / ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Plain-HTTP /metrics, /healthz, /readyz; empty to disable.
    #[arg(long, env = "XCC_METRICS_LISTEN", default_value = "0.0.0.0:9153")]
    pub metrics_listen: String,
    /// Threads receiving UDP queries (default: one per CPU).
    #[arg(long, env = "XCC_DNS_UDP_WORKERS")]
    pub udp_workers: Option<usize>,
    /// How the UDP workers take queries: `per-worker` sockets bound with `SO_REUSEPORT` (the
    /// kernel spreads clients over them by address and port), or one `shared` socket (whichever
    /// worker is free takes the next query: even when a few sources, e.g. one node-local cache,
    /// carry all the traffic).
    #[arg(
        long,
        value_enum,
        env = "XCC_DNS_UDP_SOCKETS",
        default_value = "per-worker"
    )]
    pub udp_sockets: UdpSockets,
    /// Close TCP connections idle this long (seconds).
    #[arg(long, env = "XCC_DNS_TCP_IDLE_SECONDS", default_value_t = 10, value_parser = crate::args::seconds())]
    pub tcp_idle_seconds: u64,
    /// Open TCP connections at most (lowered to fit under the open-file limit).
    #[arg(long, env = "XCC_DNS_MAX_TCP_CONNECTIONS", default_value_t = 1024)]
    pub max_tcp_connections: usize,
    /// Open TCP connections from one source address at most (RFC 7766 §10).
    #[arg(
        long,
        env = "XCC_DNS_MAX_TCP_PER_CLIENT",
        default_value_t = ServerConfig::default().max_tcp_per_client
    )]
    pub max_tcp_per_client: usize,
    /// Answer SERVFAIL when the upstream has not answered within this many milliseconds.
    #[arg(long, env = "XCC_DNS_FORWARD_TIMEOUT_MS", default_value_t = 2000)]
    pub forward_timeout_ms: u64,
}

pub async fn run(args: DnsArgs) -> anyhow::Result<()> {
    let zones = args
        .zones
        .iter()
        .map(|z| xcc_proto::names::canonical_fqdn(z).with_context(|| format!("--zone {z:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.transparent && args.upstream.is_none() {
        anyhow::bail!("--transparent needs --upstream (the resolver for every other name)");
    }
    if args.feed == Feed::Static && args.static_records.is_none() {
        anyhow::bail!("--feed static needs --static-records FILE");
    }
    if (args.feed == Feed::Imports) != args.imports_dir.is_some() {
        anyhow::bail!("--feed imports and --imports-dir DIR go together");
    }
    let kube_config = KubeFeedConfig {
        service_namespace: args.service_namespace.clone(),
        pods_and_namespaces: args.transparent || args.namespace_mapping,
    };
    let mut required = match args.feed {
        Feed::Kube => kube_config.required_sources(),
        Feed::Imports => vec![FeedSource::Services],
        Feed::Static => Vec::new(),
    };
    if args.static_records.is_some() {
        required.push(FeedSource::Static);
    }
    let feed = DnsFeed::new(DnsIndex::new(zones.clone(), required));
    if let Some(path) = &args.static_records {
        let records = static_records::load(path)?;
        tracing::info!(path = %path.display(), names = records.len(), "static records loaded");
        feed.set_static(records);
    }
    let client = match args.feed {
        Feed::Kube => Some(kube_feed::client(args.kubeconfig.as_deref()).await?),
        Feed::Static | Feed::Imports => None,
    };

    let metrics = DnsMetrics::default();
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let server =
        DnsServer::bind_with(args.listen, args.udp_sockets == UdpSockets::PerWorker).await?;
    let runtime = Runtime::new(CancellationToken::new());
    let cancel = runtime.token().clone();
    if let Some(addr) = crate::args::metrics_listen(&args.metrics_listen)? {
        runtime
            .serve_probes(addr, metrics::probes(registry, feed.subscribe()))
            .await?;
    }
    let spawner = runtime.spawner();
    spawner.spawn_infallible(
        "snapshot observer",
        metrics::observe_snapshots(feed.subscribe(), metrics.clone(), cancel.clone()),
    );
    if let Some(client) = client {
        spawner.spawn_infallible(
            "kube feed",
            kube_feed::run(client, feed.clone(), kube_config, cancel.clone()),
        );
    }
    if let Some(dir) = args.imports_dir.clone() {
        spawner.spawn_infallible(
            "imports feed",
            imports_feed::run(dir, feed.clone(), imports_feed::POLL, cancel.clone()),
        );
    }
    let config = ServerConfig {
        settings: Settings {
            ttl: args.ttl,
            transparent: args.transparent,
            ns_addresses: if args.ns_addresses.is_empty() && !args.listen.ip().is_unspecified() {
                vec![args.listen.ip()]
            } else {
                args.ns_addresses.clone()
            },
        },
        upstream: args.upstream,
        udp_workers: args.udp_workers.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        }),
        tcp_idle_timeout: Duration::from_secs(args.tcp_idle_seconds.max(1)),
        max_tcp_connections: args.max_tcp_connections,
        max_tcp_per_client: args.max_tcp_per_client,
        forward_timeout: Duration::from_millis(args.forward_timeout_ms.max(1)),
        ..ServerConfig::default()
    };
    // Signal handlers before announcing readiness, so a SIGTERM that follows the "serving" line
    // is always handled gracefully.
    runtime.stop_on_signals()?;
    tracing::info!(
        udp = %server.udp_addr()?,
        tcp = %server.tcp_addr()?,
        zones = ?zones,
        feed = ?args.feed,
        transparent = args.transparent,
        "xcc dns serving"
    );
    let snapshots = feed.subscribe();
    runtime.spawn("DNS server", async move {
        Ok(server.run(snapshots, config, metrics, cancel).await?)
    });
    Ok(runtime.run().await?)
}

//! The measurements over a started tree: attach and load, propagation, cold and cached
//! lookups, routes, the root's resolve step.

use super::*;

#[derive(Default)]
pub(super) struct Measured {
    pub(super) propagation: Option<Stats>,
    pub(super) propagation_lagged: usize,
    pub(super) cold: Option<Stats>,
    pub(super) cold_resolved_by_root: usize,
    pub(super) cold_not_granted: usize,
    pub(super) cached_via_cached: Option<Stats>,
    pub(super) cached_via_query: Option<Stats>,
    pub(super) cached_misses: usize,
    pub(super) route_from_issue: Option<Stats>,
    pub(super) route_from_return: Option<Stats>,
    pub(super) routes_before_return: usize,
    pub(super) root_resolve_by_name: Option<Stats>,
    pub(super) root_resolve_by_fqdn: Option<Stats>,
    /// Sum of `Level::overflows` over every registry of the tree after the measurements.
    pub(super) overflows: Option<u64>,
}

/// The started tree, as the measurements see it.
struct Tree<'a> {
    shape: &'a Shape,
    root: &'a Registry,
    leaves: &'a [Registry],
    timeout: Duration,
    started: Instant,
}

/// A cold lookup that was answered: (requesting leaf, service index, the question).
type Asked = (usize, usize, Target);

pub(super) async fn measure_tree(
    args: &HierarchyArgs,
    shape: &Shape,
    regs: &[Registry],
    setup: &mut Setup,
    timeout: Duration,
    started: Instant,
) -> anyhow::Result<(Probe, Environment, Measured)> {
    let t = Tree {
        shape,
        root: &regs[0],
        leaves: &regs[1 + shape.mids..],
        timeout,
        started,
    };
    let mut m = Measured::default();
    let (tree, environment) = attach_and_load(&t, setup).await?;
    let mut rng = Rng(args.seed);
    propagation(&t, args.announces, &mut rng, &mut m).await?;
    let pairs = cold_lookups(&t, args.lookups, &mut rng, &mut m).await?;
    cached_lookups(&t, args.cached_rounds, &pairs, &mut m).await;
    root_resolve(&t, &pairs, &mut m)?;
    m.overflows = Some(regs.iter().map(|r| r.level.overflows().get()).sum());
    Ok((tree, environment, m))
}

/// Waits for the tree to attach, loads every leaf's share and waits for the root to hold it
/// all; the tree's memory before and after the load.
async fn attach_and_load(t: &Tree<'_>, setup: &mut Setup) -> anyhow::Result<(Probe, Environment)> {
    // Attach: the root's subtree lists every cluster.
    let t0 = Instant::now();
    wait_for(
        t.root,
        &format!("all {} clusters in the root's subtree", t.shape.clusters),
        t.timeout,
        |r| r.level.subtree().len() == t.shape.clusters,
        tree_status,
    )
    .await?;
    setup.attach_s = t0.elapsed().as_secs_f64();
    progress(
        t.started,
        format!(
            "tree attached ({:.2} s to start, {:.2} s to attach)",
            setup.start_s, setup.attach_s
        ),
    );
    tokio::time::sleep(SETTLE).await;
    let rss_idle = rss_kib()?;

    // Load: every leaf's share in one replace_source; wait for the root to hold them all.
    progress(
        t.started,
        format!(
            "loading {} services over {} leaves",
            t.shape.services, t.shape.leaves
        ),
    );
    let mut per_leaf: Vec<Vec<ServiceEntry>> = vec![Vec::new(); t.shape.leaves];
    for i in 0..t.shape.services {
        per_leaf[t.shape.leaf_of(i)].push(initial_entry(t.shape, i));
    }
    let t0 = Instant::now();
    let waited = async {
        wait_for(
            t.root,
            &format!("all {} services at the root", t.shape.services),
            t.timeout,
            |r| r.catalog.len() >= t.shape.services,
            tree_status,
        )
        .await
    };
    let load = async {
        for (leaf, entries) in t.leaves.iter().zip(per_leaf) {
            leaf.catalog.replace_source(&Source::Local, entries);
            tokio::task::yield_now().await;
        }
    };
    let (waited, ()) = tokio::join!(waited, load);
    waited?;
    setup.load_s = t0.elapsed().as_secs_f64();
    if t.root.catalog.len() != t.shape.services {
        bail!(
            "the root holds {} services, expected {}",
            t.root.catalog.len(),
            t.shape.services
        );
    }
    progress(
        t.started,
        format!("root holds every service ({:.2} s)", setup.load_s),
    );
    tokio::time::sleep(SETTLE).await;
    let rss_loaded = rss_kib()?;
    let environment = Environment {
        nproc: std::thread::available_parallelism().map_or(0, |n| n.get()),
        open_file_limit: open_file_limit(),
        open_fds_with_tree: open_fds(),
        threads_with_tree: proc_status("Threads:"),
        inotify_max_user_instances: read_u64("/proc/sys/fs/inotify/max_user_instances"),
    };
    let tree = Probe::new(t.shape.services, rss_idle, rss_loaded);

    Ok((tree, environment))
}

/// Announce propagation: new services at random leaves, one at a time, to the root's catalog.
async fn propagation(
    t: &Tree<'_>,
    announces: usize,
    rng: &mut Rng,
    m: &mut Measured,
) -> anyhow::Result<()> {
    progress(
        t.started,
        format!(
            "propagation: {} new services at random leaves, one at a time",
            announces
        ),
    );
    let mut samples = Vec::with_capacity(announces);
    for k in 0..announces {
        let leaf = &t.leaves[rng.below(t.leaves.len())];
        let name = format!("new-{k:05}");
        let entry = service_entry(
            &leaf.cluster,
            &t.shape.namespace(k),
            &name,
            t.shape.services + k,
        );
        let key = entry.key.clone();
        let mut events = t.root.catalog.subscribe();
        let t0 = Instant::now();
        if leaf.catalog.upsert(entry).is_none() {
            bail!("the upsert of {key} changed nothing");
        }
        let seen = async {
            loop {
                match events.recv().await {
                    Ok(CatalogEvent::Upsert(e)) if e.key == key => {
                        return Ok((Instant::now(), false));
                    }
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => {
                        if t.root.catalog.get(&key).is_some() {
                            return Ok((Instant::now(), true));
                        }
                    }
                    Err(RecvError::Closed) => bail!("the root's catalog was closed"),
                }
            }
        };
        let (at, lagged) = tokio::time::timeout(t.timeout, seen)
            .await
            .map_err(|_| anyhow!("{key} did not reach the root within {:?}", t.timeout))??;
        samples.push(ns(at.saturating_duration_since(t0)));
        m.propagation_lagged += usize::from(lagged);
    }
    m.propagation = Stats::of(samples);
    if let Some(s) = &m.propagation {
        progress(
            t.started,
            format!(
                "          p50 {:.3} ms, p99 {:.3} ms",
                s.p50_ns as f64 / 1e6,
                s.p99_ns as f64 / 1e6
            ),
        );
    }
    tokio::time::sleep(SETTLE).await;

    Ok(())
}

/// Cold lookups, each followed by the wait for its route at the owner; returns the questions
/// that were answered.
async fn cold_lookups(
    t: &Tree<'_>,
    lookups: usize,
    rng: &mut Rng,
    m: &mut Measured,
) -> anyhow::Result<Vec<Asked>> {
    progress(
        t.started,
        format!(
            "cold lookups: {} new (leaf, service) pairs across subtrees, then the route at the owner",
            lookups
        ),
    );
    let mut asked: HashSet<(usize, usize)> = HashSet::new();
    let mut pairs: Vec<(usize, usize, Target)> = Vec::with_capacity(lookups);
    let mut cold = Vec::with_capacity(lookups);
    let mut from_issue = Vec::with_capacity(lookups);
    let mut from_return = Vec::with_capacity(lookups);
    for _ in 0..lookups {
        let mut pick = None;
        for _ in 0..10_000 {
            let l = rng.below(t.shape.leaves);
            let s = rng.below(t.shape.services);
            if t.shape.mid_of(t.shape.leaf_of(s)) != t.shape.mid_of(l) && asked.insert((l, s)) {
                pick = Some((l, s));
                break;
            }
        }
        let (l, s) = pick.context("no unasked (leaf, service) pair found; lower --lookups")?;
        let requester = &t.leaves[l];
        let owner = &t.leaves[t.shape.leaf_of(s)];
        let (namespace, name) = (t.shape.namespace(s), service_name(s));
        let target = Target::Name {
            namespace: namespace.clone(),
            name: name.clone(),
        };
        let issued = SystemTime::now();
        let t0 = Instant::now();
        let answer = requester
            .level
            .query(target.clone(), REQUESTER_SERVICE, false, t.timeout)
            .await;
        let elapsed = t0.elapsed();
        let returned = SystemTime::now();
        if answer.unavailable {
            bail!(
                "cold lookup of {namespace}/{name} from {}: {}",
                requester.cluster,
                answer.error
            );
        }
        cold.push(ns(elapsed));
        if !(answer.found && answer.access_allowed) {
            m.cold_not_granted += 1;
            continue;
        }
        m.cold_resolved_by_root += usize::from(answer.resolver_cluster == ROOT);
        pairs.push((l, s, target));
        let since = wait_route(owner, &namespace, &name, &requester.cluster, t.timeout).await?;
        from_issue.push(signed_ns(since, issued));
        let d = signed_ns(since, returned);
        m.routes_before_return += usize::from(d < 0);
        from_return.push(d);
    }
    m.cold = Stats::of(cold);
    m.route_from_issue = Stats::of(from_issue);
    m.route_from_return = Stats::of(from_return);
    if let Some(s) = &m.cold {
        progress(
            t.started,
            format!(
                "          cold p50 {:.3} ms, p99 {:.3} ms; {} resolved by the root, {} not granted",
                s.p50_ns as f64 / 1e6,
                s.p99_ns as f64 / 1e6,
                m.cold_resolved_by_root,
                m.cold_not_granted
            ),
        );
    }

    Ok(pairs)
}

/// Cached lookups: the same questions, many passes, through `Level::cached` and `Level::query`.
async fn cached_lookups(t: &Tree<'_>, rounds: usize, pairs: &[Asked], m: &mut Measured) {
    progress(
        t.started,
        format!(
            "cached lookups: {} passes over {} answered questions",
            rounds,
            pairs.len()
        ),
    );
    let calls = rounds * pairs.len();
    let mut via_cached = Vec::with_capacity(calls);
    let mut via_query = Vec::with_capacity(calls);
    for _ in 0..rounds {
        for (l, _, target) in pairs {
            let level = &t.leaves[*l].level;
            let t0 = Instant::now();
            let hit = level.cached(target, REQUESTER_SERVICE);
            let d = t0.elapsed();
            m.cached_misses += usize::from(hit.is_none());
            std::hint::black_box(hit);
            via_cached.push(ns(d));
        }
        tokio::task::yield_now().await;
    }
    for _ in 0..rounds {
        for (l, _, target) in pairs {
            let level = &t.leaves[*l].level;
            let target = target.clone();
            let t0 = Instant::now();
            let answer = level
                .query(target, REQUESTER_SERVICE, false, t.timeout)
                .await;
            let d = t0.elapsed();
            m.cached_misses += usize::from(!(answer.found && answer.access_allowed));
            std::hint::black_box(answer);
            via_query.push(ns(d));
        }
        tokio::task::yield_now().await;
    }
    m.cached_via_cached = Stats::of(via_cached);
    m.cached_via_query = Stats::of(via_query);
}

/// The root's resolve step alone, by name and by FQDN.
fn root_resolve(t: &Tree<'_>, pairs: &[Asked], m: &mut Measured) -> anyhow::Result<()> {
    let mut by_name = Vec::with_capacity(pairs.len());
    let mut by_fqdn = Vec::with_capacity(pairs.len());
    for (l, s, target) in pairs {
        let requester = &t.leaves[*l].cluster;
        let fqdn = Target::Fqdn(xcc_proto::names::clusterset_fqdn(
            &service_name(*s),
            &t.shape.namespace(*s),
        ));
        for (question, out) in [(target, &mut by_name), (&fqdn, &mut by_fqdn)] {
            let t0 = Instant::now();
            let found = t
                .root
                .level
                .explain(question, requester, REQUESTER_SERVICE, true);
            let d = t0.elapsed();
            if found.is_none() {
                bail!("the root cannot resolve {question}");
            }
            std::hint::black_box(found);
            out.push(ns(d));
        }
    }
    m.root_resolve_by_name = Stats::of(by_name);
    m.root_resolve_by_fqdn = Stats::of(by_fqdn);
    Ok(())
}

/// Wait for `owner` to record the route for (`namespace`/`name`, `caller`/svc); returns when
/// the owner stamped it.
pub(super) async fn wait_route(
    owner: &Registry,
    namespace: &str,
    name: &str,
    caller: &str,
    timeout: Duration,
) -> anyhow::Result<SystemTime> {
    let mut changes = owner.level.subscribe();
    let fut = async {
        loop {
            if let Some(r) = owner.level.owner_routes().into_iter().find(|r| {
                r.target_namespace == namespace
                    && r.target_service == name
                    && r.caller_cluster == caller
                    && r.caller_service == REQUESTER_SERVICE
            }) {
                return Ok(r.since);
            }
            if changes.changed().await.is_err() {
                bail!("the level of {} was dropped", owner.cluster);
            }
        }
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| {
        anyhow!(
            "{} did not record the route for {namespace}/{name} from {caller} within {timeout:?}",
            owner.cluster
        )
    })?
}

//! Two-cluster benchmark: export → EndpointSlice latency through the real processes, and API
//! writes at steady state with many imported records.
//!
//! ```sh
//! cargo bench --bench two_clusters                       # defaults: 50 samples, 1000 records, 60 s
//! cargo bench --bench two_clusters -- --samples 100 --records 1000 --steady-seconds 60
//! ```
//!
//! Setup (tests/common/clusters.rs): real control planes A and B (etcd + kube-apiserver +
//! kube-controller-manager from `KUBEBUILDER_ASSETS`); `xcc registry --store kube` and `xcc
//! publisher` against A, `xcc registry --store kube` and `xcc binder` against B, as child
//! processes (release build) under the RBAC of `deploy/`, real mTLS between the registries.
//!
//! 1. Latency: one Service at a time is labelled for export in A (server-side apply); the clock
//!    starts before the apply and stops when a watch on B's API server delivers an
//!    EndpointSlice with its cluster IP. p50/p90/p99/max.
//! 2. Bulk: `--records` Services exported at once (16 applies in flight); time until B holds a
//!    Service for each, and then until the binder's last writes (Endpoints, `Created` Event) of
//!    every one are in, so that the steady window starts after the bulk phase.
//! 3. Steady state: nothing changes for `--steady-seconds`; the API servers' audit logs give the
//!    xcc processes' requests per verb and resource, per minute. Lease renewals (leader
//!    election) are reported separately: they are the only writes expected.

#![allow(clippy::unwrap_used)]

#[path = "../tests/common/clusters.rs"]
mod clusters;

use std::time::{Duration, Instant};

use clusters::{NS, World, exported_service, remote_registry, wait_for};
use futures::StreamExt as _;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher;
use xcc_proto::names::service_name;

const LOG: &str = "warn";

struct Args {
    samples: usize,
    records: usize,
    steady_seconds: u64,
}

fn args() -> Args {
    let mut a = Args {
        samples: 50,
        records: 1000,
        steady_seconds: 60,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let value = || argv.get(i + 1).cloned().unwrap_or_default();
        match argv[i].as_str() {
            "--samples" => a.samples = value().parse().expect("--samples N"),
            "--records" => a.records = value().parse().expect("--records N"),
            "--steady-seconds" => a.steady_seconds = value().parse().expect("--steady-seconds N"),
            // `cargo bench` passes --bench; ignore it and anything unknown.
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

fn ms(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let args = args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(args));
}

async fn run(args: Args) {
    let world = World::new();
    let Some(mut a) = world
        .cluster("cluster-a", &["bench"], "overlays/exporter")
        .await
    else {
        return;
    };
    let Some(mut b) = world.cluster("cluster-b", &[], "overlays/importer").await else {
        return;
    };
    a.start_registry(LOG).await;
    a.start_publisher(LOG).await;
    b.start_registry(LOG).await;
    b.start_binder(LOG).await;
    b.apply(
        "remoteregistries",
        remote_registry(&world, "cluster-a", &a, None),
    )
    .await;
    let logs = || format!("{}{}", a.logs(), b.logs());

    // 1. One export at a time. B's EndpointSlices are watched (a poll would add its own
    // interval and a consistent list, tens of milliseconds, to every sample).
    let mut slices = {
        use kube::runtime::WatchStreamExt as _;
        let api: kube::Api<EndpointSlice> = kube::Api::namespaced(b.client(), NS);
        watcher(api, watcher::Config::default())
            .default_backoff()
            .boxed()
    };
    // Listed before the first sample, so that no sample pays for the initial list.
    while !matches!(slices.next().await, Some(Ok(watcher::Event::InitDone))) {}
    // Microseconds, three significant digits.
    let mut latencies = hdrhistogram::Histogram::<u64>::new(3).unwrap();
    let mut samples: Vec<Duration> = Vec::with_capacity(args.samples);
    for i in 0..args.samples {
        let name = format!("lat-{i}");
        let started = Instant::now();
        a.apply("services", exported_service("bench", &name, 8080))
            .await;
        // The cluster IP is allocated by A's API server on create; read it back.
        let ip = wait_for(
            "a cluster IP",
            Duration::from_secs(10),
            &[&a],
            async || {
                a.get("v1", "services", Some("bench"), &name)
                    .await
                    .and_then(|s| s["spec"]["clusterIP"].as_str().map(str::to_string))
            },
            logs,
        )
        .await;
        let svc = service_name(&format!("{name}.bench.svc.clusterset.local"));
        let seen = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(event) = slices.next().await {
                let Ok(watcher::Event::Apply(slice) | watcher::Event::InitApply(slice)) = event
                else {
                    continue;
                };
                let labels = slice.metadata.labels.unwrap_or_default();
                if labels.get("kubernetes.io/service-name") == Some(&svc)
                    && slice.endpoints.iter().any(|e| e.addresses == [ip.clone()])
                {
                    return;
                }
            }
        })
        .await;
        assert!(seen.is_ok(), "no EndpointSlice for {svc} in B\n{}", logs());
        let took = started.elapsed();
        latencies.record(took.as_micros() as u64).unwrap();
        samples.push(took);
    }
    drop(slices);
    // The slowest samples with their position: a slow first sample is warm-up (first
    // connection, first reconcile), a slow later one is not.
    let mut slowest: Vec<(usize, Duration)> = samples.iter().copied().enumerate().collect();
    slowest.sort_by_key(|s| std::cmp::Reverse(s.1));
    let slowest: Vec<String> = slowest
        .iter()
        .take(3)
        .map(|(i, d)| format!("#{i} {} ms", ms(*d)))
        .collect();

    // 2. Many at once.
    let started = Instant::now();
    {
        let a = &a;
        futures::stream::iter(0..args.records)
            .map(|i| async move {
                a.apply(
                    "services",
                    exported_service("bench", &format!("svc-{i}"), 8080),
                )
                .await
            })
            .buffer_unordered(16)
            .collect::<Vec<()>>()
            .await;
    }
    let applied = started.elapsed();
    let want = args.records + args.samples;
    // When each stage held every record: A's exported records (publisher), B's imported
    // records (both registries), B's Services (binder).
    let (mut exported_at, mut imported_at, mut services_at) = (None, None, None);
    wait_for(
        "every Service in B",
        Duration::from_secs(900),
        &[&a, &b],
        async || {
            if exported_at.is_none()
                && a.list(
                    xcc_proto::names::API_VERSION,
                    "servicerecords",
                    Some("bench"),
                )
                .await
                .len()
                    >= want
            {
                exported_at = Some(started.elapsed());
            }
            if imported_at.is_none() && b.imported().await.len() >= want {
                imported_at = Some(started.elapsed());
            }
            let managed = async |plural| {
                b.list("v1", plural, Some(NS))
                    .await
                    .iter()
                    .filter(|s| {
                        s["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "xcc-binder"
                    })
                    .count()
            };
            if managed("services").await < want {
                return None;
            }
            services_at.get_or_insert(started.elapsed());
            // The binder writes a new group's Service, EndpointSlice, Endpoints and then its
            // `Created` Event: the bulk phase is over when the last of those is there, not
            // when the last Service is (the steady window would see the rest).
            let created = b
                .list("events.k8s.io/v1", "events", Some(NS))
                .await
                .iter()
                .filter(|e| e["reason"] == "Created" && e["regarding"]["kind"] == "Service")
                .count();
            (managed("endpoints").await >= want && created >= want).then_some(())
        },
        logs,
    )
    .await;
    let converged = started.elapsed();

    // 3. Steady state.
    let marks = (a.cp.audit().len(), b.cp.audit().len());
    tokio::time::sleep(Duration::from_secs(args.steady_seconds)).await;
    let minutes = args.steady_seconds as f64 / 60.0;
    println!("== two clusters: export -> EndpointSlice in the other cluster");
    println!(
        "samples {}  p50 {} ms  p90 {} ms  p99 {} ms  max {} ms",
        latencies.len(),
        ms(Duration::from_micros(latencies.value_at_quantile(0.50))),
        ms(Duration::from_micros(latencies.value_at_quantile(0.90))),
        ms(Duration::from_micros(latencies.value_at_quantile(0.99))),
        ms(Duration::from_micros(latencies.max()))
    );
    println!("slowest samples: {}", slowest.join(", "));
    println!(
        "== bulk: {} exports applied in {} ms; all {} Services present in B after {} ms, with their Endpoints and Events after {} ms",
        args.records,
        ms(applied),
        want,
        services_at.map_or("-".into(), ms),
        ms(converged)
    );
    println!(
        "   stages: all exported records in A after {} ms, all imported records in B after {} ms",
        exported_at.map_or("-".into(), ms),
        imported_at.map_or("-".into(), ms),
    );
    println!(
        "== steady state over {} s with {} imported records (API server audit logs)",
        args.steady_seconds, want
    );
    for (cluster, c, mark) in [("A", &a, marks.0), ("B", &b, marks.1)] {
        let events = c.cp.audit();
        let mut per: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for e in &events[mark.min(events.len())..] {
            let verb = e["verb"].as_str().unwrap_or_default().to_string();
            let resource = e["objectRef"]["resource"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            *per.entry((verb, resource)).or_default() += 1;
        }
        let mutating = |v: &str| {
            matches!(
                v,
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
        };
        let sum = |f: &dyn Fn(&str, &str) -> bool| -> u64 {
            per.iter()
                .filter(|((v, r), _)| f(v, r))
                .map(|(_, n)| n)
                .sum()
        };
        let writes = sum(&|v, _| mutating(v));
        let lease = sum(&|v, r| mutating(v) && r == "leases");
        println!(
            "cluster {cluster}: writes {:.1}/min (Lease {:.1}/min); reads: get {} list {} watch {}",
            writes as f64 / minutes,
            lease as f64 / minutes,
            sum(&|v, _| v == "get"),
            sum(&|v, _| v == "list"),
            sum(&|v, _| v == "watch"),
        );
        let other: Vec<String> = per
            .iter()
            .filter(|((v, r), _)| mutating(v) && r != "leases")
            .map(|((v, r), n)| format!("{v} {r}: {n}"))
            .collect();
        let reads: Vec<String> = per
            .iter()
            .filter(|((v, r), _)| !mutating(v) && r != "leases")
            .map(|((v, r), n)| format!("{v} {r}: {n}"))
            .collect();
        for (what, list) in [
            ("writes other than Leases", other),
            ("reads other than Leases", reads),
        ] {
            println!(
                "  {what}: {}",
                if list.is_empty() {
                    "none".to_string()
                } else {
                    list.join(", ")
                }
            );
        }
    }
    for p in [
        a.publisher.take(),
        a.registry.take(),
        b.binder.take(),
        b.registry.take(),
    ]
    .into_iter()
    .flatten()
    {
        p.terminate();
    }
}

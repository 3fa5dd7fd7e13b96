//! Hamlet server over real mTLS on 127.0.0.1: ordering, snapshots without a size cap, consumer
//! isolation, NACK handling, bad input.

use crate::common::*;
use xcc_certs::reload::ReloadingTls;
use xcc_proto::federation::resourcediscovery::v1alpha1::stream_response::Operation;
use xcc_registry::catalog::ServiceKey;

/// Create, update and delete arrive in order, after the snapshot.
#[tokio::test]
async fn snapshot_then_create_update_delete_in_order() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    east.catalog
        .upsert(export("east", "a", "two.xcc.test", "10.0.0.2"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut c = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("subscribe");
    assert!(c.marker, "server announced the end-of-snapshot marker");

    let s1 = c.next_acked().await;
    let s2 = c.next_acked().await;
    let m = c.next_acked().await;
    assert_eq!(
        (s1.op, s1.fqdn.as_deref(), s2.op, s2.fqdn.as_deref(), m.op),
        (
            Operation::Create,
            Some("one.xcc.test"),
            Operation::Create,
            Some("two.xcc.test"),
            Operation::Unknown
        )
    );
    // Real, distinct nonces.
    assert_eq!(
        (s1.nonce.as_str(), s2.nonce.as_str(), m.nonce.as_str()),
        ("1", "2", "3")
    );
    let fs = s1.fs.expect("payload");
    assert_eq!(
        (fs.name.as_str(), fs.id.as_str()),
        ("one.xcc.test", "one.xcc.test")
    );
    assert_eq!(fs.protocols, vec!["https"]);
    assert_eq!(fs.endpoints[0].address, "10.0.0.1");

    east.catalog
        .upsert(export("east", "a", "three.xcc.test", "10.0.0.3"));
    let created = c.next_acked().await;
    assert_eq!(
        (created.op, created.fqdn.as_deref()),
        (Operation::Create, Some("three.xcc.test"))
    );

    east.catalog
        .upsert(export("east", "a", "three.xcc.test", "10.0.0.33"));
    let updated = c.next_acked().await;
    assert_eq!(updated.op, Operation::Update);
    assert_eq!(
        updated.fs.expect("payload").endpoints[0].address,
        "10.0.0.33"
    );

    east.catalog
        .remove(&ServiceKey::new("east", "a", "three.xcc.test"));
    let deleted = c.next_acked().await;
    assert_eq!(
        (deleted.op, deleted.fqdn.as_deref()),
        (Operation::Delete, Some("three.xcc.test"))
    );
    // DELETE carries the full last-known object, as Go servers do.
    assert_eq!(
        deleted.fs.expect("payload").endpoints[0].address,
        "10.0.0.33"
    );
}

/// Go peers ACK with the nonce they were given, or with an empty one: both work, and a plain
/// consumer (no marker requested) never sees the marker.
#[tokio::test]
async fn plain_consumer_with_empty_nonce_acks_gets_no_marker() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut c = Consumer::connect(&west, east.hamlet_addr, false)
        .await
        .expect("subscribe");
    assert!(!c.marker);
    let s = c.next().await;
    assert_eq!(s.op, Operation::Create);
    c.ack("").await;
    east.catalog
        .upsert(export("east", "a", "two.xcc.test", "10.0.0.2"));
    let s = c.next().await;
    assert_eq!(
        (s.op, s.fqdn.as_deref()),
        (Operation::Create, Some("two.xcc.test"))
    );
    assert_eq!(east.metrics.hamlet_acks.get(), 1);
}

/// A 5,000-record snapshot arrives whole (the Go server capped it at 4,096).
#[tokio::test]
async fn five_thousand_record_snapshot_is_delivered_whole() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    for i in 0..5000 {
        east.catalog.upsert(export(
            "east",
            "bulk",
            &format!("svc-{i:04}.xcc.test"),
            "10.1.0.1",
        ));
    }
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut c = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("subscribe");
    let mut got = std::collections::BTreeSet::new();
    loop {
        let s = c.next_acked().await;
        if s.op == Operation::Unknown {
            break;
        }
        assert_eq!(s.op, Operation::Create);
        got.insert(s.fqdn.expect("fqdn"));
    }
    assert_eq!(got.len(), 5000);
    assert!(got.contains("svc-0000.xcc.test") && got.contains("svc-4999.xcc.test"));
}

/// A consumer that never ACKs does not delay another consumer.
#[tokio::test]
async fn never_acking_consumer_does_not_delay_others() {
    let pki = Pki::new("xcc.test");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("east"));
    cfg.hamlet.window = 4;
    let (east, _c) = start_with(cfg).await;
    for i in 0..10 {
        east.catalog
            .upsert(export("east", "a", &format!("s{i}.xcc.test"), "10.0.0.1"));
    }
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut stuck = Consumer::connect(&west, east.hamlet_addr, false)
        .await
        .expect("subscribe");
    for _ in 0..4 {
        let s = stuck.next().await; // never ACKed
        assert_eq!(s.op, Operation::Create);
    }
    let mut good = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("subscribe");
    for _ in 0..11 {
        good.next_acked().await;
    }
    east.catalog
        .upsert(export("east", "a", "late.xcc.test", "10.0.0.9"));
    let s = good.next_acked().await;
    assert_eq!(
        (s.op, s.fqdn.as_deref()),
        (Operation::Create, Some("late.xcc.test"))
    );
    // The stuck consumer got nothing beyond its window.
    assert!(
        tokio::time::timeout(std::time::Duration::from_millis(200), stuck.rx.message())
            .await
            .is_err(),
        "window of 4 must hold"
    );
}

/// A NACK is counted and the current resource is sent again after the backoff — as a CREATE,
/// since the consumer never accepted it — for both API versions' resources.
#[tokio::test]
async fn nack_is_counted_and_resent() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let urls = [
        xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL,
        xcc_proto::FEDERATED_SERVICE_V1ALPHA2_URL,
    ];
    for (n, url) in urls.into_iter().enumerate() {
        let ch = channel(&west, east.hamlet_addr).await.expect("channel");
        let mut c = Consumer::on_channel(ch, false, url)
            .await
            .expect("subscribe");
        let s = c.next().await;
        assert_eq!(s.op, Operation::Create, "{url}");
        c.nack(&s.nonce, "cannot persist").await;
        let again = c.next().await;
        assert_eq!(again.op, Operation::Create, "never accepted: {url}");
        if url == xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL {
            assert_eq!(again.fqdn.as_deref(), Some("one.xcc.test"));
        }
        assert_ne!(again.nonce, s.nonce);
        c.ack(&again.nonce).await;
        assert_eq!(east.metrics.hamlet_nacks.get(), n as u64 + 1);
    }
}

/// Allowed requesters filter what each consumer is streamed.
#[tokio::test]
async fn consumers_only_see_what_admits_them() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    let mut secret = export("east", "a", "secret.xcc.test", "10.0.0.1");
    secret.allowed_requesters = vec!["north".into()];
    east.catalog.upsert(secret);
    east.catalog
        .upsert(export("east", "a", "public.xcc.test", "10.0.0.2"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let north = ReloadingTls::load(pki.cluster("north")).expect("tls");
    let mut w = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("west");
    let mut n = Consumer::connect(&north, east.hamlet_addr, true)
        .await
        .expect("north");
    let mut seen_w = vec![];
    loop {
        let s = w.next_acked().await;
        if s.op == Operation::Unknown {
            break;
        }
        seen_w.push(s.fqdn.expect("fqdn"));
    }
    let mut seen_n = vec![];
    loop {
        let s = n.next_acked().await;
        if s.op == Operation::Unknown {
            break;
        }
        seen_n.push(s.fqdn.expect("fqdn"));
    }
    assert_eq!(seen_w, vec!["public.xcc.test"]);
    assert_eq!(seen_n, vec!["public.xcc.test", "secret.xcc.test"]);
}

/// Unknown resource URL → InvalidArgument; oversized request → rejected with OutOfRange; the
/// server keeps serving others.
#[tokio::test]
async fn bad_input_gets_exact_status_codes() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");

    let ch = channel(&west, east.hamlet_addr).await.expect("channel");
    let err = Consumer::on_channel(ch.clone(), false, "type.googleapis.com/some.Other")
        .await
        .err()
        .expect("rejected");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().contains("unsupported resource_url"),
        "{}",
        err.message()
    );

    let huge = format!(
        "{}{}",
        xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL,
        "x".repeat(100_000)
    );
    let err = Consumer::on_channel(ch.clone(), false, &huge)
        .await
        .err()
        .expect("rejected");
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err:?}");

    // Still serving.
    let mut ok = Consumer::on_channel(ch, false, xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL)
        .await
        .expect("subscribe");
    assert_eq!(ok.next().await.fqdn.as_deref(), Some("one.xcc.test"));
    assert_eq!(east.catalog.len(), 1, "nothing stored was lost");
}

/// The v1alpha2 service speaks the wrapper protocol with UPSERT/DELETE and echoes the context.
#[tokio::test]
async fn v1alpha2_upsert_delete_and_context() {
    use tokio_stream::wrappers::ReceiverStream;
    use xcc_proto::federation::resourcediscovery::v1alpha2 as rd2;
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let ch = channel(&west, east.hamlet_addr).await.expect("channel");
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let req = |nonce: &str, ack: bool| rd2::BidirectionalStream {
        request: Some(rd2::StreamRequest {
            resource_url: xcc_proto::FEDERATED_SERVICE_V1ALPHA2_URL.into(),
            response_nonce: nonce.into(),
            status: ack.then(Default::default),
            context: "ctx-1".into(),
        }),
        response: None,
    };
    tx.send(req("", false)).await.expect("send");
    let mut client = rd2::discovery_service_client::DiscoveryServiceClient::new(ch);
    let mut stream = client
        .establish_stream(ReceiverStream::new(rx))
        .await
        .expect("stream")
        .into_inner();
    let r = stream
        .message()
        .await
        .expect("ok")
        .expect("msg")
        .response
        .expect("response");
    assert_eq!(r.operation, rd2::stream_response::Operation::Upsert as i32);
    assert_eq!(
        (r.resource_id.as_str(), r.context.as_str()),
        ("one.xcc.test", "ctx-1")
    );
    tx.send(req(&r.nonce, true)).await.expect("ack");
    east.catalog
        .remove(&ServiceKey::new("east", "a", "one.xcc.test"));
    let r = stream
        .message()
        .await
        .expect("ok")
        .expect("msg")
        .response
        .expect("response");
    assert_eq!(r.operation, rd2::stream_response::Operation::Delete as i32);
}

/// A consumer that reads but never ACKs is closed with `Unavailable` once its oldest response
/// has waited the ACK timeout, and leaves the peer table and the stream gauge.
#[tokio::test]
async fn unacknowledged_stream_is_closed_after_the_ack_timeout() {
    let pki = Pki::new("xcc.test");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("east"));
    cfg.hamlet.ack_timeout = std::time::Duration::from_millis(300);
    let (east, _c) = start_with(cfg).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut c = Consumer::connect(&west, east.hamlet_addr, false)
        .await
        .expect("subscribe");
    let first = c.next().await;
    assert_eq!(first.op, Operation::Create);
    let status = c
        .next_or_status()
        .await
        .expect_err("the stream ends with a status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status.message().starts_with("no ACK within 300ms"),
        "{}",
        status.message()
    );
    assert_eq!(east.metrics.hamlet_ack_timeouts.get(), 1);
    wait_consumers(&east, 0, "the closed stream leaves the peer table").await;
    assert_eq!(streams(&east), 0);
}

fn consumers(reg: &xcc_registry::Registry) -> usize {
    reg.peers
        .count(xcc_registry::peers::PeerKind::HamletConsumer)
}

/// Wait until `n` Hamlet consumers are listed, re-checking on every peer change.
async fn wait_consumers(reg: &xcc_registry::Registry, n: usize, what: &str) {
    let mut changes = reg.peers.subscribe();
    tokio::time::timeout(WAIT, async {
        while consumers(reg) != n {
            changes.changed().await.expect("peer table");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out: {what}"));
}

fn streams(reg: &xcc_registry::Registry) -> i64 {
    reg.metrics
        .hamlet_streams
        .get_or_create(&xcc_registry::metrics::ApiLabels {
            api: xcc_registry::metrics::Api::V1alpha1,
        })
        .get()
}

/// A consumer that goes away is dropped from the peer table and the stream gauge; one that
/// stays keeps its stream.
#[tokio::test]
async fn disconnected_consumer_leaves_the_peer_table() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut stays = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("subscribe");
    let mut leaves = Consumer::connect(&west, east.hamlet_addr, true)
        .await
        .expect("subscribe");
    for c in [&mut stays, &mut leaves] {
        c.next_acked().await;
        c.next_acked().await; // marker
    }
    assert_eq!(consumers(&east), 2);
    drop(leaves);
    wait_consumers(&east, 1, "the departed consumer is dropped").await;
    assert_eq!(streams(&east), 1);
    // The remaining consumer is still served.
    east.catalog
        .upsert(export("east", "a", "two.xcc.test", "10.0.0.2"));
    let s = stays.next_acked().await;
    assert_eq!(
        (s.op, s.fqdn.as_deref()),
        (Operation::Create, Some("two.xcc.test"))
    );
}

/// A consumer that stops reading (its HTTP/2 flow-control window fills) does not hold up the
/// registry's shutdown past the grace period.
#[tokio::test]
async fn shutdown_is_bounded_by_a_consumer_that_stopped_reading() {
    let pki = Pki::new("xcc.test");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("east"));
    cfg.shutdown_grace = std::time::Duration::from_millis(300);
    // A window of unacknowledged responses large enough that HTTP/2 flow control, not the
    // window, stops the stream: 5,000 responses of 32 endpoints each are several MiB, more than
    // the client's stream and connection windows (2 and 5 MiB).
    cfg.hamlet.window = 100_000;
    let (east, cancel) = start_with(cfg).await;
    for i in 0..5_000 {
        let mut e = export("east", "a", &format!("service-{i:04}.xcc.test"), "10.0.0.1");
        e.endpoints = (0..32)
            .map(|j| xcc_registry::catalog::Endpoint {
                address: format!("10.1.{}.{j}", i % 250).into(),
                port: 443,
            })
            .collect();
        east.catalog.upsert(e);
    }
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut reader = Consumer::connect(&west, east.hamlet_addr, false)
        .await
        .expect("subscribe");
    reader.next().await; // then never reads again
    let metrics = east.metrics.clone();
    cancel.cancel();
    tokio::time::timeout(WAIT, east.shutdown())
        .await
        .expect("shutdown finishes within the grace period")
        .expect("clean shutdown");
    // Flow control had stopped the stream well before the end of the snapshot.
    let sent = metrics
        .hamlet_responses
        .get_or_create(&xcc_registry::metrics::OpLabels {
            op: xcc_registry::metrics::OpLabel::Create,
        })
        .get();
    assert!((1..5_000).contains(&sent), "{sent} responses sent");
    drop(reader);
}

/// A consumer message over the size limit ends its stream with RESOURCE_EXHAUSTED,
/// never with a silent OK.
#[tokio::test]
async fn oversized_request_ends_the_stream_with_resource_exhausted() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    east.catalog
        .upsert(export("east", "a", "one.xcc.test", "10.0.0.1"));
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let mut c = Consumer::connect(&west, east.hamlet_addr, false)
        .await
        .expect("subscribe");
    let s = c.next().await;
    assert_eq!(s.fqdn.as_deref(), Some("one.xcc.test"));
    c.ack(&"9".repeat(5 * 1024 * 1024)).await;
    let end = c
        .next_or_status()
        .await
        .expect_err("the stream ends with a status");
    assert_eq!(end.code(), tonic::Code::ResourceExhausted, "{end:?}");
}

/// A consumer that keeps its connection up (its HTTP/2 layer still answers pings) but never
/// reads, so it never opens its 1 KiB stream window again, fills that window with the first few
/// responses; HTTP/2 then stops polling its stream and the stream's own ACK timer cannot fire. The watchdog
/// closes its connection once the ACK timeout and the grace have passed: the peer entry and the
/// stream gauge are released, and a consumer that reads keeps being served.
#[tokio::test]
async fn consumer_that_never_reads_is_disconnected_after_the_ack_timeout() {
    let pki = Pki::new("xcc.test");
    let mut cfg = xcc_registry::RegistryConfig::loopback(pki.cluster("east"));
    // Long enough for the reading consumer to ACK each response on a busy machine.
    cfg.hamlet.ack_timeout = std::time::Duration::from_secs(2);
    let (east, _c) = start_with(cfg).await;
    // 64 records are several KiB of responses: far more than the stuck consumer's window.
    for i in 0..64 {
        east.catalog.upsert(export(
            "east",
            "a",
            &format!("svc-{i:02}.xcc.test"),
            "10.0.0.1",
        ));
    }
    let west = ReloadingTls::load(pki.cluster("west")).expect("tls");
    let connector = xcc_certs::client::TlsConnector::new(west.clone(), "localhost".into(), None)
        .expect("connector");
    let stuck_channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", east.hamlet_addr))
            .expect("uri")
            .initial_stream_window_size(1024)
            .connect_with_connector(connector)
            .await
            .expect("connect");
    let mut stuck = Consumer::on_channel(
        stuck_channel,
        false,
        xcc_proto::FEDERATED_SERVICE_V1ALPHA1_URL,
    )
    .await
    .expect("subscribe");
    let mut reads = Consumer::connect(&west, east.hamlet_addr, false)
        .await
        .expect("subscribe");
    for _ in 0..64 {
        assert_eq!(reads.next_acked().await.op, Operation::Create);
    }
    assert_eq!(consumers(&east), 2);

    wait_consumers(&east, 1, "the consumer that never reads is disconnected").await;
    assert_eq!(streams(&east), 1);
    assert_eq!(east.metrics.hamlet_ack_timeouts.get(), 1);
    // Its connection is gone: what it buffered is readable, then the stream fails.
    let end = tokio::time::timeout(WAIT, async {
        loop {
            match stuck.rx.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await
    .expect("stream ends in time");
    assert!(
        end.is_err(),
        "the stuck stream ends with an error, not cleanly"
    );

    // The reading consumer is still served.
    east.catalog
        .upsert(export("east", "a", "new.xcc.test", "10.0.0.2"));
    let s = reads.next_acked().await;
    assert_eq!(
        (s.op, s.fqdn.as_deref()),
        (Operation::Create, Some("new.xcc.test"))
    );
}

/// Everything `c` receives up to and including the first response for `last` (each ACKed), as
/// (operation, FQDN); a stream that ends fails the test.
async fn until(c: &mut Consumer, last: &str) -> Vec<(Operation, String)> {
    let mut seen = Vec::new();
    loop {
        let s = match c.next_or_status().await {
            Ok(Some(s)) => s,
            Ok(None) => panic!("the stream ended (OK) before {last}"),
            Err(status) => panic!("the stream ended before {last}: {status:?}"),
        };
        c.ack(&s.nonce).await;
        let fqdn = s.fqdn.unwrap_or_default();
        let done = fqdn == last;
        seen.push((s.op, fqdn));
        if done {
            return seen;
        }
    }
}

/// A policy reload keeps every Hamlet stream open and sends each consumer exactly the records
/// whose decision changed for it: a CREATE for one newly allowed, a DELETE for one newly denied,
/// nothing for the rest. Two streams of one cluster (sharing one re-decision) get the same.
/// A later catalog change still arrives on every stream, right after those records, so nothing
/// else was sent in between and no stream was ended.
#[tokio::test]
async fn a_policy_reload_sends_only_the_flipped_decisions_on_open_streams() {
    let pki = Pki::new("xcc.test");
    let (east, _c) = start(pki.cluster("east")).await;
    for (name, ip) in [
        ("a", "10.0.0.1"),
        ("b", "10.0.0.2"),
        ("c", "10.0.0.3"),
        ("d", "10.0.0.4"),
    ] {
        east.catalog
            .upsert(export("east", "ns", &format!("{name}.xcc.test"), ip));
    }
    let forbid = |id: &str, cluster: &str, name: &str| {
        format!(
            r#"@id("{id}") forbid (principal == Xcc::Cluster::"{cluster}", action == Xcc::Action::"discover", resource) when {{ resource.name == "{name}.xcc.test" }};"#
        )
    };
    let set = |rules: &[String]| {
        xcc_registry::authz::Policies::from_sources(&[("p.cedar".to_string(), rules.join("\n"))])
            .expect("valid policies")
    };
    let gate = east.level.gate().clone();
    gate.set_policies(set(&[forbid("c1-b", "c1", "b"), forbid("c2-c", "c2", "c")]));

    let c1 = ReloadingTls::load(pki.cluster("c1")).expect("tls");
    let c2 = ReloadingTls::load(pki.cluster("c2")).expect("tls");
    let mut consumers = Vec::new();
    for tls in [&c1, &c1, &c2] {
        consumers.push(
            Consumer::connect(tls, east.hamlet_addr, true)
                .await
                .expect("subscribe"),
        );
    }
    let snapshot = |names: &[&str]| -> Vec<(Operation, String)> {
        let mut v: Vec<_> = names
            .iter()
            .map(|n| (Operation::Create, format!("{n}.xcc.test")))
            .collect();
        v.push((Operation::Unknown, String::new()));
        v
    };
    let mut snapshots = Vec::new();
    for c in &mut consumers {
        snapshots.push(until(c, "").await);
    }
    assert_eq!(
        snapshots,
        [
            snapshot(&["a", "c", "d"]),
            snapshot(&["a", "c", "d"]),
            snapshot(&["a", "b", "d"])
        ]
    );

    // c1 loses a and gains b; c2 loses d and keeps c denied.
    gate.set_policies(set(&[
        forbid("c1-a", "c1", "a"),
        forbid("c2-c", "c2", "c"),
        forbid("c2-d", "c2", "d"),
    ]));
    // Marks the end of what the reload sent on each stream.
    east.catalog
        .upsert(export("east", "ns", "z.xcc.test", "10.0.0.9"));
    let mut after = Vec::new();
    for c in &mut consumers {
        let mut seen = until(c, "z.xcc.test").await;
        // The reload's records come as one batch in any order; the change after them last.
        let batch = seen.len() - 1;
        seen[..batch].sort_by(|x, y| x.1.cmp(&y.1));
        after.push(seen);
    }
    let op = |o: Operation, n: &str| (o, format!("{n}.xcc.test"));
    let c1_sees = vec![
        op(Operation::Delete, "a"),
        op(Operation::Create, "b"),
        op(Operation::Create, "z"),
    ];
    assert_eq!(
        after,
        [
            c1_sees.clone(),
            c1_sees,
            vec![op(Operation::Delete, "d"), op(Operation::Create, "z")]
        ]
    );
    // The same three streams, still registered and connected.
    let states: Vec<_> = east
        .peers
        .list()
        .iter()
        .filter(|p| p.kind == xcc_registry::peers::PeerKind::HamletConsumer)
        .map(|p| {
            (
                p.state(),
                p.reconnects.load(std::sync::atomic::Ordering::Relaxed),
            )
        })
        .collect();
    assert_eq!(states, [(xcc_registry::peers::PeerState::Connected, 0); 3]);
}

//! Batched receive and send on real loopback sockets. Datagrams sent on loopback are queued at
//! the receiver before `send_to` returns, so what one `receive` takes is exact.

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use super::*;

fn bound() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

#[test]
fn one_receive_takes_every_queued_datagram_with_its_sender() {
    let server = bound();
    let to = server.local_addr().unwrap();
    let (a, b) = (bound(), bound());
    a.send_to(b"first", to).unwrap();
    b.send_to(b"second", to).unwrap();
    a.send_to(b"third", to).unwrap();
    let mut batch = Batch::new();
    assert_eq!(batch.receive(&server).unwrap(), 3);
    let got: Vec<(Vec<u8>, Option<SocketAddr>, bool)> = (0..3)
        .map(|i| {
            let (bytes, meta) = batch.get(i);
            (bytes.to_vec(), meta.peer(), meta.truncated)
        })
        .collect();
    let (pa, pb) = (Some(a.local_addr().unwrap()), Some(b.local_addr().unwrap()));
    assert_eq!(
        got,
        vec![
            (b"first".to_vec(), pa, false),
            (b"second".to_vec(), pb, false),
            (b"third".to_vec(), pa, false),
        ]
    );
}

#[test]
fn a_batch_is_at_most_udp_batch_and_the_rest_waits_for_the_next() {
    let server = bound();
    let to = server.local_addr().unwrap();
    let client = bound();
    for i in 0..UDP_BATCH + 3 {
        client.send_to(&[i as u8], to).unwrap();
    }
    let mut batch = Batch::new();
    assert_eq!(batch.receive(&server).unwrap(), UDP_BATCH);
    assert_eq!(batch.get(UDP_BATCH - 1).0, [(UDP_BATCH - 1) as u8]);
    assert_eq!(batch.receive(&server).unwrap(), 3);
    assert_eq!(batch.get(0).0, [UDP_BATCH as u8]);
    assert_eq!(batch.get(2).0, [(UDP_BATCH + 2) as u8]);
}

#[test]
fn a_datagram_longer_than_a_slot_is_marked_truncated() {
    let server = bound();
    let client = bound();
    client
        .send_to(&vec![7u8; UDP_SLOT + 100], server.local_addr().unwrap())
        .unwrap();
    client.send_to(b"ok", server.local_addr().unwrap()).unwrap();
    let mut batch = Batch::new();
    assert_eq!(batch.receive(&server).unwrap(), 2);
    let (bytes, meta) = batch.get(0);
    assert!(meta.truncated);
    assert_eq!(bytes.len(), UDP_SLOT);
    let (bytes, meta) = batch.get(1);
    assert!(!meta.truncated);
    assert_eq!(bytes, b"ok");
}

#[test]
fn the_read_timeout_surfaces_as_would_block() {
    let server = bound();
    server
        .set_read_timeout(Some(Duration::from_millis(1)))
        .unwrap();
    let err = Batch::new().receive(&server).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ),
        "{err:?}"
    );
}

#[test]
fn flush_sends_each_answer_to_its_client_and_skips_one_the_kernel_refuses() {
    let server = bound();
    let clients: Vec<UdpSocket> = (0..3).map(|_| bound()).collect();
    let mut batch = Batch::new();
    batch.answer(b"to-0".to_vec(), clients[0].local_addr().unwrap());
    // An IPv6 destination on an IPv4 socket: the kernel refuses this one message.
    batch.answer(b"nowhere".to_vec(), "[::1]:53".parse().unwrap());
    batch.answer(b"to-1".to_vec(), clients[1].local_addr().unwrap());
    batch.answer(b"to-2".to_vec(), clients[2].local_addr().unwrap());
    assert_eq!(batch.flush(&server), 1);
    let mut buf = [0u8; 64];
    for (i, c) in clients.iter().enumerate() {
        let (n, from) = c.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], format!("to-{i}").as_bytes());
        assert_eq!(from, server.local_addr().unwrap());
    }
    // Nothing is left queued: the next flush sends nothing.
    assert_eq!(batch.flush(&server), 0);
}

#[test]
fn more_answers_than_a_batch_all_go() {
    let server = bound();
    let client = bound();
    let to = client.local_addr().unwrap();
    let mut batch = Batch::new();
    for i in 0..UDP_BATCH + 5 {
        batch.answer(vec![i as u8], to);
    }
    assert_eq!(batch.flush(&server), 0);
    let mut buf = [0u8; 8];
    for i in 0..UDP_BATCH + 5 {
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], [i as u8]);
    }
}

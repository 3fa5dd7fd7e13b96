//! `xcc dns` as an operator runs it: the real binary serving a static records file over UDP and
//! TCP, exiting cleanly on SIGTERM, and refusing inconsistent flags with a clear message.

#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

pub(crate) fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::new(7, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

pub(crate) fn answers(reply: &[u8]) -> (ResponseCode, Vec<String>) {
    let m = Message::from_vec(reply).unwrap();
    let lines = m
        .answers
        .iter()
        .map(|r| format!("{} {} {}", r.name, r.record_type(), r.data))
        .collect();
    (m.metadata.response_code, lines)
}

#[test]
fn serves_a_static_records_file_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.yaml");
    std::fs::write(
        &records,
        "- fqdn: web.xcc.test\n  addresses: [10.0.0.1, \"fd00::1\"]\n  ports: [{name: http, port: 80}]\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args([
            "dns",
            "--listen",
            "127.0.0.1:0",
            "--zone",
            "xcc.test",
            "--feed",
            "static",
        ])
        .arg("--static-records")
        .arg(&records)
        .args(["--metrics-listen", ""])
        .env("XCC_LOG", "info")
        .env_remove("XCC_LOG_JSON")
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xcc dns");
    // The "serving" line is logged after both sockets are bound; it carries the port.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let addr: SocketAddr = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "xcc dns exited:\n{log}"
        );
        log.push_str(&line);
        if line.contains("xcc dns serving") {
            let udp = line
                .split("udp=")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            break udp.parse().unwrap();
        }
    };

    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    udp.send_to(&query("WEB.xcc.test.", RecordType::A), addr)
        .unwrap();
    let mut buf = [0u8; 1500];
    let n = udp.recv(&mut buf).unwrap();
    assert_eq!(
        answers(&buf[..n]),
        (
            ResponseCode::NoError,
            vec!["WEB.xcc.test. A 10.0.0.1".to_string()]
        )
    );

    let mut tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let q = query("_http._tcp.web.xcc.test.", RecordType::SRV);
    tcp.write_all(&(q.len() as u16).to_be_bytes()).unwrap();
    tcp.write_all(&q).unwrap();
    let mut len = [0u8; 2];
    tcp.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
    tcp.read_exact(&mut reply).unwrap();
    assert_eq!(
        answers(&reply),
        (
            ResponseCode::NoError,
            vec!["_http._tcp.web.xcc.test. SRV 0 100 80 web.xcc.test.".to_string()]
        )
    );
    drop(tcp);

    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = child.wait().unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(status.success(), "exit {status:?}\n{log}{rest}");
    assert!(rest.contains("shutdown requested"), "{rest}");
}

#[test]
fn inconsistent_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "- fqdn: a_b.xcc.test\n  addresses: [10.0.0.1]\n").unwrap();
    let bad = bad.to_string_lossy().to_string();
    let cases: [(&[&str], &str); 5] = [
        (&["--transparent"], "--transparent needs --upstream"),
        (
            &["--feed", "static"],
            "--feed static needs --static-records FILE",
        ),
        (
            &["--feed", "static", "--static-records", &bad],
            "entry 0: invalid FQDN \"a_b.xcc.test\"",
        ),
        (&["--zone=bad_zone.test"], "--zone \"bad_zone.test\""),
        (
            &["--feed", "imports"],
            "--feed imports and --imports-dir DIR go together",
        ),
    ];
    for (extra, expected) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_xcc"))
            .args([
                "dns",
                "--listen",
                "127.0.0.1:0",
                "--zone",
                "xcc.test",
                "--metrics-listen",
                "",
            ])
            .args(extra)
            .env("XCC_LOG", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} should fail");
        assert!(stderr.contains(expected), "{extra:?}: {stderr}");
    }
}

/// A child process killed when the test ends, also when it fails.
pub(crate) struct Killed(Option<std::process::Child>);

impl Drop for Killed {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Start `xcc dns` for zone `xcc.test` with `extra` flags, through `sh -c` so the child can run
/// under a lower open-file limit (`ulimit -n`) than this test process. Returns the child, its
/// stderr reader and the UDP/TCP address from the "serving" line.
pub(crate) fn spawn_dns(
    ulimit: Option<u32>,
    extra: &[&std::ffi::OsStr],
) -> (Killed, BufReader<std::process::ChildStderr>, SocketAddr) {
    let prefix = ulimit.map_or(String::new(), |n| format!("ulimit -n {n} && "));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("{prefix}exec \"$0\" \"$@\""))
        .arg(env!("CARGO_BIN_EXE_xcc"))
        .args(["dns", "--listen", "127.0.0.1:0", "--zone", "xcc.test"])
        .args(["--metrics-listen", ""])
        .args(extra)
        .env("XCC_LOG", "info")
        .env_remove("XCC_LOG_JSON")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xcc dns");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let child = Killed(Some(child));
    let mut log = String::new();
    let addr = loop {
        let mut line = String::new();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "xcc dns exited:\n{log}"
        );
        log.push_str(&line);
        if line.contains("xcc dns serving") {
            let udp = line.split("udp=").nth(1).unwrap();
            break udp.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    (child, stderr, addr)
}

pub(crate) fn stop(mut running: Killed) {
    let mut child = running.0.take().unwrap();
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    assert!(child.wait().unwrap().success());
}

#[test]
fn more_idle_clients_than_open_files_are_refused_not_left_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let records = dir.path().join("records.yaml");
    std::fs::write(&records, "- fqdn: web.xcc.test\n  addresses: [10.0.0.1]\n").unwrap();
    // 64 open files, the default 1,024 TCP connections and no per-source limit to speak of:
    // without the budget the server accepts until EMFILE and the rest wait in the backlog.
    let flags = [
        "--feed",
        "static",
        "--tcp-idle-seconds",
        "60",
        "--max-tcp-per-client",
        "1000",
        "--static-records",
    ];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    args.push(records.as_os_str());
    let (child, _stderr, addr) = spawn_dns(Some(64), &args);
    // 80 idle clients (bounded; loopback): more than the child has descriptors for.
    let clients: Vec<TcpStream> = (0..80)
        .map(|_| {
            let c = TcpStream::connect(addr).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            c
        })
        .collect();
    // The last one is closed by the server (EOF or reset), not left without an answer.
    let mut last = clients.last().unwrap();
    let mut byte = [0u8; 1];
    match last.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("expected the server to close the 80th connection, got {other:?}"),
    }
    // The first is still served, and so is UDP.
    let mut first = &clients[0];
    let q = query("web.xcc.test.", RecordType::A);
    first.write_all(&(q.len() as u16).to_be_bytes()).unwrap();
    first.write_all(&q).unwrap();
    let mut len = [0u8; 2];
    first.read_exact(&mut len).unwrap();
    let mut reply = vec![0u8; u16::from_be_bytes(len) as usize];
    first.read_exact(&mut reply).unwrap();
    assert_eq!(
        answers(&reply).1,
        vec!["web.xcc.test. A 10.0.0.1".to_string()]
    );
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    udp.send_to(&q, addr).unwrap();
    let mut buf = [0u8; 512];
    let n = udp.recv(&mut buf).unwrap();
    assert_eq!(
        answers(&buf[..n]).1,
        vec!["web.xcc.test. A 10.0.0.1".to_string()]
    );
    drop(clients);
    stop(child);
}

/// A ServiceRecord as `xcc registry --store file` writes it to `imports/<remote>.yaml`.
fn imported(name: &str, fqdn: &str, ip: &str) -> String {
    format!(
        "apiVersion: connectivity.tanzu.vmware.com/v1alpha1\nkind: ServiceRecord\nmetadata:\n  name: {name}\n  namespace: xcc\n  labels:\n    connectivity.tanzu.vmware.com/imported: \"\"\n  annotations:\n    connectivity.tanzu.vmware.com/origin-namespace: shop\n    connectivity.tanzu.vmware.com/origin-name: {name}\nspec:\n  fqdn: {fqdn}\n  endpoints:\n  - address: {ip}\n    port: 443\n"
    )
}

/// Replace `path` as the registry does: a temporary file renamed over it.
fn write_atomic(path: &std::path::Path, text: &str) {
    let tmp = path.with_file_name(".writing");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Ask over UDP until `want` holds for (rcode, answers), within 10 s.
fn until_udp(addr: SocketAddr, name: &str, want: impl Fn(&(ResponseCode, Vec<String>)) -> bool) {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        udp.send_to(&query(name, RecordType::A), addr).unwrap();
        let mut buf = [0u8; 1500];
        let n = udp.recv(&mut buf).unwrap();
        let got = answers(&buf[..n]);
        if want(&got) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name}: still {got:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn serves_a_file_mode_registrys_imports_as_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let imports = dir.path().join("imports");
    std::fs::create_dir(&imports).unwrap();
    let east = imports.join("east.yaml");
    write_atomic(&east, &imported("web", "web.shop.xcc.test", "10.0.1.10"));
    let flags = [
        "--zone",
        "clusterset.local",
        "--feed",
        "imports",
        "--imports-dir",
    ];
    let mut args: Vec<&std::ffi::OsStr> = flags.iter().map(std::ffi::OsStr::new).collect();
    args.push(imports.as_os_str());
    let (child, _stderr, addr) = spawn_dns(None, &args);
    let a = |name: &str, ip: &str| vec![format!("{name} A {ip}")];
    for name in ["web.shop.xcc.test.", "web.shop.svc.clusterset.local."] {
        until_udp(addr, name, |got| {
            *got == (ResponseCode::NoError, a(name, "10.0.1.10"))
        });
    }
    // The registry rewrites the file: the new address is served.
    write_atomic(&east, &imported("web", "web.shop.xcc.test", "10.0.1.11"));
    until_udp(addr, "web.shop.xcc.test.", |got| {
        got.1 == a("web.shop.xcc.test.", "10.0.1.11")
    });
    // A broken file keeps its last good content; another remote's file is still read.
    write_atomic(&east, "kind: [");
    let north = imports.join("north.yaml");
    write_atomic(&north, &imported("api", "api.xcc.test", "10.0.2.20"));
    until_udp(addr, "api.xcc.test.", |got| {
        got.1 == a("api.xcc.test.", "10.0.2.20")
    });
    until_udp(addr, "web.shop.xcc.test.", |got| {
        *got == (ResponseCode::NoError, a("web.shop.xcc.test.", "10.0.1.11"))
    });
    // A headless import through the hierarchy (the RemoteRegistry `parent`, the owner east):
    // each pod with a hostname is `<hostname>.east.<svc>.<ns>.svc.clusterset.local`.
    let headless = imported("db", "db.shop.svc.clusterset.local", "10.0.3.30").replace(
        "  annotations:\n",
        "  annotations:\n    connectivity.tanzu.vmware.com/headless: \"true\"\n    connectivity.tanzu.vmware.com/hostnames: \"10.0.3.30=db-0\"\n",
    );
    write_atomic(
        &imports.join("parent.yaml"),
        &(headless + "  origin:\n    cluster: east\n    namespace: shop\n    name: db\n"),
    );
    until_udp(addr, "db-0.east.db.shop.svc.clusterset.local.", |got| {
        *got == (
            ResponseCode::NoError,
            a("db-0.east.db.shop.svc.clusterset.local.", "10.0.3.30"),
        )
    });
    // A removed file takes its names with it.
    std::fs::remove_file(&north).unwrap();
    until_udp(addr, "api.xcc.test.", |got| got.0 == ResponseCode::NXDomain);
    stop(child);
}

/// `--imports-dir` that does not exist (a typo) is said so at WARN, not served silently empty.
#[test]
fn a_missing_imports_dir_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("state/imports");
    let mut child = Command::new(env!("CARGO_BIN_EXE_xcc"))
        .args([
            "dns",
            "--listen",
            "127.0.0.1:0",
            "--zone",
            "xcc.test",
            "--feed",
            "imports",
        ])
        .arg("--imports-dir")
        .arg(&missing)
        .args(["--metrics-listen", ""])
        .env("XCC_LOG", "info")
        .env_remove("XCC_LOG_JSON")
        .stderr(Stdio::piped())
        .spawn()
        .expect("run xcc dns");
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut log = String::new();
    let found = loop {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break false;
        }
        log.push_str(&line);
        if line.contains("--imports-dir did not exist") {
            break line.contains("WARN");
        }
        // The feed's first load comes after its check of the directory.
        if line.contains("imports loaded") {
            break false;
        }
    };
    let _ = child.kill();
    let _ = child.wait();
    assert!(found, "{log}");
}

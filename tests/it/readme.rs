//! README.md's walkthroughs as a new user runs them: the code blocks of a section, extracted
//! from the README itself and run by `bash` in an empty directory with the real `xcc` first on
//! `PATH`, so a change to the README that breaks them fails here. Only `dig` (not installed
//! everywhere) is not run by the shell: the test asks the same server the same question and
//! expects the answer the README's comment gives.

#![allow(clippy::unwrap_used)]

use std::net::UdpSocket;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

use crate::dns_cli::{answers, query};

/// The blocks fenced as `lang` in the README section whose heading starts with `heading`.
pub(crate) fn blocks(readme: &str, heading: &str, lang: &str) -> Vec<String> {
    let start = readme
        .find(&format!("\n## {heading}"))
        .unwrap_or_else(|| panic!("README has no section {heading:?}"));
    let rest = &readme[start + 1..];
    let section = match rest[3..].find("\n## ") {
        Some(end) => &rest[..end + 3],
        None => rest,
    };
    let mut out = vec![];
    let mut lines = section.lines();
    while let Some(line) = lines.next() {
        if line.trim_end() == format!("```{lang}") {
            let body: Vec<&str> = lines
                .by_ref()
                .take_while(|l| l.trim_end() != "```")
                .collect();
            out.push(body.join("\n") + "\n");
        }
    }
    out
}

/// Kills a process group (the walkthrough's shell and everything it left running) when dropped.
struct Group(u32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0)])
            .status();
    }
}

/// Run `script` with `bash -e` in `dir`, in a process group of its own; returns the group (kill
/// it to stop what the script left running in the background) and the script's stdout, once
/// the script itself ended. Fails with its log if it failed or did not end in time.
fn run(dir: &Path, script: &str) -> (Group, String) {
    let xcc = Path::new(env!("CARGO_BIN_EXE_xcc"));
    let path = format!(
        "{}:{}",
        xcc.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    std::fs::write(dir.join("walkthrough.sh"), script).unwrap();
    // Files, not pipes: the background processes keep their stdout and stderr open.
    let (out, log) = (dir.join("walkthrough.out"), dir.join("walkthrough.log"));
    let mut child = Command::new("bash")
        .args(["-e", "walkthrough.sh"])
        .current_dir(dir)
        .env("PATH", path)
        .env("XCC_LOG", "info")
        .env_remove("XCC_LOG_JSON")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&log).unwrap())
        .process_group(0)
        .spawn()
        .expect("bash");
    let group = Group(child.id());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(Duration::from_secs(120));
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    match status {
        Ok(Ok(s)) if s.success() => {}
        other => panic!(
            "the walkthrough failed ({other:?})\n--- script\n{script}\n--- stdout\n{}\n--- log\n{}",
            read(&out),
            read(&log)
        ),
    }
    (group, read(&out))
}

/// Ask the DNS server on 127.0.0.1:`port` for `name`'s A records. The server was started in the
/// background just before: a bounded re-check while it binds and loads (there is no event to
/// wait on from outside the process).
fn dig(port: u16, name: &str) -> Vec<String> {
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut last = None;
    for _ in 0..60 {
        let _ = udp.send_to(
            &query(&format!("{name}."), RecordType::A),
            ("127.0.0.1", port),
        );
        let mut buf = [0u8; 1500];
        if let Ok(n) = udp.recv(&mut buf) {
            let (code, lines) = answers(&buf[..n]);
            if code == ResponseCode::NoError && !lines.is_empty() {
                return lines
                    .iter()
                    .filter_map(|l| l.rsplit(' ').next().map(str::to_string))
                    .collect();
            }
            last = Some((code, lines));
        } else {
            // Not bound yet: the read timed out; wait a little before asking again.
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    panic!("no answer for {name} on port {port}: {last:?}");
}

/// The file-mode section: PKI, east exporting, west importing, the admin API, `xcc dns`.
#[test]
fn readme_file_mode_walkthrough_runs_as_printed() {
    let _turn = xcc_testkube::Turn::shared_blocking();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = "Run a registry without Kubernetes (file mode)";
    let sh = blocks(&readme, section, "sh");
    assert!(sh.len() >= 3, "{sh:?}");
    // `dig` lines are asked by the test: `dig @127.0.0.1 -p PORT +short NAME    # ADDRESS`.
    let mut digs = vec![];
    let mut script = String::new();
    for line in sh.concat().lines() {
        if let Some(rest) = line.strip_prefix("dig ") {
            let (args, expect) = rest.split_once('#').expect("dig line gives its answer");
            let words: Vec<&str> = args.split_whitespace().collect();
            let port = words[words.iter().position(|w| *w == "-p").expect("-p") + 1];
            digs.push((
                port.parse::<u16>().unwrap(),
                words.last().unwrap().to_string(),
                expect.trim().to_string(),
            ));
        } else {
            script.push_str(line);
            script.push('\n');
        }
    }
    assert_eq!(digs.len(), 1, "the section asks DNS once");
    let dir = tempfile::tempdir().unwrap();
    let (_group, out) = run(dir.path(), &script);

    // `services` lists the import, `peers -o json` is JSON naming east.
    assert!(
        out.lines()
            .any(|l| l.contains("web.shop.example.org") && l.contains("remote/east")),
        "{out}"
    );
    let json_start = out
        .find("[\n")
        .or_else(|| out.find('['))
        .expect("peers JSON");
    let peers: serde_json::Value = serde_json::Deserializer::from_str(&out[json_start..])
        .into_iter::<serde_json::Value>()
        .next()
        .expect("a JSON value")
        .expect("peers -o json parses");
    assert!(peers.to_string().contains("east"), "{peers}");
    // `xcc check` passed every check (bash -e: a failed one would have ended the script).
    assert!(
        out.contains(
            "✓ remote east: 127.0.0.1:8443 is spiffe://example.org/cluster/east; Hamlet stream open"
        ),
        "{out}"
    );
    assert!(out.contains("6 checks: 0 failed, 0 warnings"), "{out}");
    for (port, name, expect) in digs {
        assert_eq!(dig(port, &name), [expect], "dig {name}");
    }
}

/// The hierarchy section: certificates, the parent and two children, the owner's export, the
/// caller's import, the grant seen in `tree` and `routes`; its Cedar block parses.
#[test]
fn readme_hierarchy_walkthrough_runs_as_printed() {
    let _turn = xcc_testkube::Turn::shared_blocking();
    xcc_certs::install_crypto_provider();
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let section = "A hierarchy of registries";
    let sh = blocks(&readme, section, "sh");
    assert_eq!(sh.len(), 1, "{sh:?}");
    let cedar = blocks(&readme, section, "cedar");
    assert_eq!(cedar.len(), 2, "the carry permit and the policy example");
    for (i, text) in cedar.iter().enumerate() {
        xcc_registry::authz::Policies::from_sources(&[(format!("readme-{i}.cedar"), text.clone())])
            .unwrap_or_else(|e| panic!("README cedar block {i}: {e}"));
    }
    let dir = tempfile::tempdir().unwrap();
    let (_group, out) = run(dir.path(), &sh[0]);
    let granted = out
        .lines()
        .find(|l| l.contains("api.shop.svc.clusterset.local") || l.contains("shop/api"))
        .unwrap_or_default();
    assert!(
        out.contains("Granted") && out.contains("b2"),
        "{granted}\n{out}"
    );

    // `xcc admin explain`: ALLOW exits 0, DENY exits 3 (the decision is printed either way).
    let explain = |cluster: &str, service: &str| {
        Command::new(env!("CARGO_BIN_EXE_xcc"))
            .current_dir(dir.path())
            .args([
                "admin",
                "--addr",
                "127.0.0.1:9543",
                "--tls-dir",
                "alice",
                "--server-name",
                "b.example.org",
                "explain",
                "--namespace",
                "shop",
                "--name",
                "api",
                "--requester-cluster",
                cluster,
                "--requester-service",
                service,
                "-o",
                "json",
            ])
            .env_remove("XCC_LOG")
            .output()
            .unwrap()
    };
    let allow = explain("b1", "web");
    assert_eq!(allow.status.code(), Some(0), "{allow:?}");
    let deny = explain("b1", "batch");
    assert_eq!(deny.status.code(), Some(3), "{deny:?}");
    let decision: serde_json::Value = serde_json::from_slice(&deny.stdout).unwrap();
    assert_eq!(
        decision["allowed"],
        serde_json::Value::Bool(false),
        "{decision}"
    );
    assert!(
        deny.stderr.is_empty(),
        "one answer, no log: {}",
        String::from_utf8_lossy(&deny.stderr)
    );
}

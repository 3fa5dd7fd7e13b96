//! The embedded default, as a user runs it: the real `xcc` binary, `xcc demo`.

use std::process::Command;

#[test]
fn demo_prints_imports_and_withheld_services_and_exits_zero() {
    // The demo waits 15 s for its imports: not while the other tests boot control planes.
    let _turn = xcc_testkube::Turn::alone_blocking();
    let out = Command::new(env!("CARGO_BIN_EXE_xcc"))
        .arg("demo")
        .env("XCC_LOG", "warn")
        .output()
        .expect("run xcc demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "exit {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let section = |title: &str| -> Vec<String> {
        stdout
            .split("\n\n")
            .find(|block| block.starts_with(title))
            .unwrap_or_else(|| panic!("no section {title:?} in:\n{stdout}"))
            .lines()
            .skip(2) // title, header
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        section("== west imported from east"),
        ["api.shop.xcc.test", "web.shop.xcc.test"]
    );
    assert_eq!(section("== not given to west"), ["payments.xcc.test"]);
    assert!(stdout.contains("allowed requesters are [north]; west is not one of them"));
    // xcc dns, fed by west's imports directory, answers a real UDP query for the imported FQDN
    // and for its clusterset name with both of east's addresses.
    let dns: Vec<Vec<String>> = stdout
        .split("\n\n")
        .find(|block| block.starts_with("== xcc dns fed by west's imports directory"))
        .unwrap_or_else(|| panic!("no DNS section in:\n{stdout}"))
        .lines()
        .skip(2)
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    assert_eq!(
        dns,
        [
            [
                "web.shop.xcc.test.",
                "A",
                "NOERROR",
                "10.0.1.10,",
                "10.0.1.11"
            ],
            [
                "web.shop.svc.clusterset.local.",
                "A",
                "NOERROR",
                "10.0.1.10,",
                "10.0.1.11"
            ],
        ]
    );
    // The hierarchy part: every announcement reached the root; web is granted by b; batch in
    // c1 is refused with the callee's reason; the owner b2 holds the route.
    assert_eq!(
        section("== the root's catalog"),
        [
            "web.shop.svc.clusterset.local",
            "api.shop.svc.clusterset.local",
            "db.data.svc.clusterset.local"
        ]
    );
    let field = |title: &str, name: &str| -> String {
        stdout
            .split("\n\n")
            .find(|block| block.starts_with(title))
            .and_then(|b| b.lines().find(|l| l.starts_with(name)))
            .map(|l| l[name.len()..].trim().to_string())
            .unwrap_or_else(|| panic!("no {name} in {title}"))
    };
    assert_eq!(field("== b1 resolves", "decision"), "ALLOW");
    assert_eq!(field("== b1 resolves", "decided by"), "b");
    assert_eq!(field("== b1 resolves", "endpoints"), "10.2.0.10:443");
    assert_eq!(field("== c1 resolves", "decision"), "DENY");
    assert_eq!(
        field("== c1 resolves", "condition"),
        "NOT_ALLOWED_BY_CALLEE"
    );
    assert_eq!(
        field("== c1 resolves", "reason"),
        "b2/shop/api allows [b1/web]; c1/batch is not among them"
    );
    assert_eq!(section("== b2's route grants"), ["owner"]);
    assert!(stdout.contains("owner  shop/api  b1/web  b"));
    assert!(stdout.contains("demo complete:"));
}

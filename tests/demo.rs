//! The embedded default, as a user runs it: the real `xcc` binary, `xcc demo`.

use std::process::Command;

#[test]
fn demo_prints_imports_and_withheld_services_and_exits_zero() {
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
    assert!(stdout.contains("demo complete: 2 of 3 services imported"));
}

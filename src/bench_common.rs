//! What `xcc bench hamlet` and `xcc bench hierarchy` share: the target verdict rows and the
//! machine's load average recorded with every run.

use serde::Serialize;

use crate::admin_cli::table;

/// One benchmark target: what was measured against which limit, and the verdict.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    pub name: String,
    pub limit: String,
    pub measured: String,
    pub pass: bool,
}

/// The `PASS`/`MISS` table of `targets`.
pub fn targets_table(targets: &[Target]) -> String {
    let rows: Vec<Vec<String>> = targets
        .iter()
        .map(|t| {
            vec![
                if t.pass { "PASS" } else { "MISS" }.to_string(),
                t.name.clone(),
                t.limit.clone(),
                t.measured.clone(),
            ]
        })
        .collect();
    table(&["", "TARGET", "LIMIT", "MEASURED"], &rows)
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`), or `unknown`.
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

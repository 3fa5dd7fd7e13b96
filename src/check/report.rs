//! What `xcc check` found: one line per check, ✓ / ! / ✗ / -, each failure or warning with the
//! one-line fix. Pure: no I/O beyond the writer it is given.

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warn,
    Fail,
    /// Not applicable here, or not checkable because an earlier check failed.
    Skip,
}

impl Status {
    fn mark(self) -> &'static str {
        match self {
            Status::Ok => "✓",
            Status::Warn => "!",
            Status::Fail => "✗",
            Status::Skip => "-",
        }
    }
}

/// One check's verdict.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Stable id, e.g. `certificate`, `remote/east`, `rbac`.
    pub id: String,
    pub status: Status,
    /// What was found.
    pub detail: String,
    /// The fix, for a warning or a failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl Check {
    pub fn ok(id: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            status: Status::Ok,
            detail: detail.into(),
            hint: None,
        }
    }
    pub fn warn(id: impl Into<String>, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            status: Status::Warn,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
    pub fn fail(id: impl Into<String>, detail: impl Into<String>, hint: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            status: Status::Fail,
            detail: detail.into(),
            hint: Some(hint.into()),
        }
    }
    pub fn skip(id: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            status: Status::Skip,
            detail: detail.into(),
            hint: None,
        }
    }
}

/// Every check of one run.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn push(&mut self, c: Check) {
        self.checks.push(c);
    }

    pub fn failed(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .count()
    }

    pub fn warned(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c.status == Status::Warn)
            .count()
    }

    /// The text form: `✓ id: detail`, and `    fix: hint` under a warning or failure; a summary
    /// line at the end.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{} {}: {}\n", c.status.mark(), c.id, c.detail));
            if let Some(h) = &c.hint {
                out.push_str(&format!("    fix: {h}\n"));
            }
        }
        out.push_str(&format!(
            "{} checks: {} failed, {} warnings\n",
            self.checks.len(),
            self.failed(),
            self.warned()
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_marks_each_check_and_gives_the_fix_under_it() {
        let mut r = Report::default();
        r.push(Check::ok("certificate", "spiffe://xcc.test/cluster/east"));
        r.push(Check::warn(
            "certificate expiry",
            "expires in 12 days",
            "renew it",
        ));
        r.push(Check::fail(
            "remote/west",
            "cannot reach 10.0.0.1:8443",
            "check spec.address",
        ));
        r.push(Check::skip("rbac", "file store"));
        assert_eq!(
            r.text(),
            "✓ certificate: spiffe://xcc.test/cluster/east\n\
             ! certificate expiry: expires in 12 days\n    fix: renew it\n\
             ✗ remote/west: cannot reach 10.0.0.1:8443\n    fix: check spec.address\n\
             - rbac: file store\n\
             4 checks: 1 failed, 1 warnings\n"
        );
        assert_eq!(r.failed(), 1);
        let json = serde_json::to_value(&r).unwrap_or_default();
        assert_eq!(json["checks"][2]["status"], "fail");
        assert_eq!(json["checks"][0].get("hint"), None);
    }
}

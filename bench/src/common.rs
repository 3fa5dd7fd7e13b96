//! What `xcc bench hamlet` and `xcc bench hierarchy` share: the target verdict rows and the
//! machine's load average recorded with every run.

use std::path::Path;

use serde::Serialize;
use xcc_certs::pki::{self, IssueRequest};
use xcc_certs::reload::TlsFiles;

use xcc_output::table;

/// A fresh CA under `dir/ca` and one cluster certificate per name (valid for `localhost` and
/// 127.0.0.1), written under `dir/<name>`: the TLS material of a bench's peers.
pub fn localhost_pki<const N: usize>(
    dir: &Path,
    names: [&str; N],
) -> anyhow::Result<[TlsFiles; N]> {
    let ca = pki::init_ca_dir("xcc.bench", &dir.join("ca"))?;
    let issue = |name: &str| -> anyhow::Result<TlsFiles> {
        let mut req = IssueRequest::cluster(name);
        req.dns = vec!["localhost".into()];
        req.ips = vec![std::net::Ipv4Addr::LOCALHOST.into()];
        let cert = ca.issue(&req)?;
        Ok(pki::write_issued(&dir.join(name), &ca, &cert)?)
    };
    let mut out = Vec::with_capacity(N);
    for name in names {
        out.push(issue(name)?);
    }
    out.try_into()
        .map_err(|_| anyhow::anyhow!("one certificate per name"))
}

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

/// Nearest-rank percentiles of signed samples, kept in an HDR histogram at three significant
/// digits (a figure is exact up to 2,048 and within 0.1 % above). The histogram holds each
/// sample's distance from the smallest, so negative samples (clock differences) keep their sign.
pub struct Summary {
    pub min: i64,
    pub max: i64,
    pub mean: f64,
    above_min: hdrhistogram::Histogram<u64>,
}

impl Summary {
    /// `None` without samples.
    pub fn of(samples: &[i64]) -> Option<Self> {
        let (&min, &max) = (samples.iter().min()?, samples.iter().max()?);
        let mut above_min = hdrhistogram::Histogram::new(3).expect("3 significant digits is valid");
        for &s in samples {
            above_min
                .record(s.abs_diff(min))
                .expect("an auto-resizing histogram records any value");
        }
        Some(Self {
            min,
            max,
            mean: samples.iter().map(|&s| s as f64).sum::<f64>() / samples.len() as f64,
            above_min,
        })
    }

    /// The sample at percentile `p` (0–100), nearest rank.
    pub fn percentile(&self, p: f64) -> i64 {
        let above = self.above_min.value_at_quantile(p / 100.0);
        self.min.saturating_add_unsigned(above).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn percentiles_use_nearest_rank_and_keep_signs() {
        let s = Summary::of(&(1..=100).collect::<Vec<_>>()).expect("samples");
        assert_eq!((s.percentile(50.0), s.percentile(99.0)), (50, 99));
        assert_eq!((s.min, s.max, s.mean), (1, 100, 50.5));
        let s = Summary::of(&[-5, 3]).expect("samples");
        assert_eq!((s.percentile(50.0), s.percentile(99.0), s.min), (-5, 3, -5));
        let s = Summary::of(&[7]).expect("samples");
        assert_eq!((s.percentile(50.0), s.percentile(99.0)), (7, 7));
        assert!(Summary::of(&[]).is_none());
    }

    #[test]
    fn large_samples_keep_three_significant_digits() {
        // 1 ms .. 100 ms in nanoseconds: p99 is 99 ms within 0.1 %.
        let v: Vec<i64> = (1..=100).map(|ms| ms * 1_000_000).collect();
        let p99 = Summary::of(&v).expect("samples").percentile(99.0);
        assert!((p99 - 99_000_000).abs() <= 99_000, "{p99}");
    }
}

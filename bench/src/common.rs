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

/// CPU time this process has used so far (every thread, user and system).
pub fn process_cpu() -> std::time::Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    std::time::Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

/// A random cyclic permutation of `0..n` (Sattolo's algorithm over a xorshift64* stream from
/// `seed`): following `next[i]` from any slot visits all `n` before it returns. At most
/// `u32::MAX` slots.
pub fn random_cycle(n: usize, seed: u64) -> Vec<u32> {
    let n = n.min(u32::MAX as usize);
    let mut next: Vec<u32> = (0..n as u32).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let j = (x.wrapping_mul(0x2545_f491_4f6c_dd1d) % i as u64) as usize;
        next.swap(i, j);
    }
    next
}

/// This machine's memory latency now: nanoseconds per read over a `mib` MiB buffer, each read
/// depending on the last (a chase through one random cycle of its cache lines, `reads` reads).
/// On a VM it depends on the host (its other guests, where it placed this guest's memory) and
/// moves from run to run; a bench whose work is mostly memory-bound (a thousand connections'
/// state on both ends) moves with it, so each run states it.
pub fn random_read_ns(mib: usize, reads: usize) -> f64 {
    let buf = std::hint::black_box(chase_buffer(mib));
    let started = std::time::Instant::now();
    let mut at = 0usize;
    for _ in 0..reads {
        at = buf[at * CHASE_LINE] as usize;
    }
    std::hint::black_box(at);
    started.elapsed().as_nanos() as f64 / reads.max(1) as f64
}

/// `u32`s in a 64-byte cache line: [`random_read_ns`] reads one per line.
const CHASE_LINE: usize = 16;

/// [`random_read_ns`]'s buffer of `mib` MiB (at least two lines): the first `u32` of each
/// cache line holds the next line of one random cycle through all of them.
fn chase_buffer(mib: usize) -> Vec<u32> {
    let lines = ((mib << 20) / 64).clamp(2, u32::MAX as usize);
    let mut buf = vec![0u32; lines * CHASE_LINE];
    for (line, next) in random_cycle(lines, 0x9e37_79b9_7f4a_7c15)
        .into_iter()
        .enumerate()
    {
        buf[line * CHASE_LINE] = next;
    }
    buf
}

#[cfg(test)]
mod tests {
    use super::{CHASE_LINE, Summary, chase_buffer, random_cycle, random_read_ns};

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

    #[test]
    fn a_random_cycle_visits_every_slot_once() {
        for n in [2, 3, 17, 1000] {
            let next = random_cycle(n, 7);
            let mut seen = vec![false; n];
            let mut at = 0usize;
            for _ in 0..n {
                assert!(!seen[at], "slot {at} of {n} visited twice");
                seen[at] = true;
                at = next[at] as usize;
            }
            assert_eq!(at, 0, "back at the start after {n} steps");
            assert!(seen.iter().all(|&s| s));
        }
        assert_ne!(random_cycle(1000, 7), random_cycle(1000, 8));
    }

    /// The probe's chase reads a different cache line every time until it has read them all.
    #[test]
    fn the_memory_probe_visits_every_cache_line_once() {
        let buf = chase_buffer(1);
        let lines = (1 << 20) / 64;
        assert_eq!(buf.len(), lines * CHASE_LINE);
        let mut seen = vec![false; lines];
        let mut at = 0usize;
        for _ in 0..lines {
            assert!(!seen[at], "line {at} read twice");
            seen[at] = true;
            at = buf[at * CHASE_LINE] as usize;
        }
        assert_eq!(at, 0);
        assert!(random_read_ns(1, 1_000).is_finite());
    }
}

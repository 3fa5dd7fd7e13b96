//! Per-consumer delivery state of the Hamlet server, with no I/O: which FQDNs need sending, what
//! the consumer is believed to hold, which responses are awaiting an ACK, and when a NACKed
//! resource is due again.
//!
//! Changes are coalesced per FQDN (a key is queued at most once), so a slow consumer costs at most
//! one queue slot per service and always receives the *current* state, never a backlog. A bounded
//! window of unacknowledged responses gives pipelining to fast consumers while a consumer that
//! never ACKs stalls only itself.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::catalog::ServiceEntry;

/// Operation of one response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Create,
    Update,
    Delete,
    /// xcc's end-of-snapshot marker (opt-in).
    SnapshotComplete,
}

/// A response the transport must send, already assigned its nonce.
#[derive(Clone, Debug)]
pub struct Outgoing {
    pub nonce: String,
    pub op: Op,
    /// The full object (for DELETE: the last object the consumer was sent).
    pub entry: Option<Arc<ServiceEntry>>,
}

#[derive(Clone, Debug)]
enum Work {
    Key(Arc<str>),
    Marker,
}

#[derive(Debug)]
struct Inflight {
    nonce: u64,
    op: Op,
    fqdn: Option<Arc<str>>,
    entry: Option<Arc<ServiceEntry>>,
    sent_at: Instant,
}

/// What an ACK or NACK matched.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Acked(Op),
    /// NACK; the resource is scheduled again after `retry_in`.
    Nacked {
        op: Op,
        retry_in: Duration,
    },
    /// No outstanding response carries that nonce.
    UnknownNonce,
}

/// First retry delay after a NACK; doubles per consecutive NACK of the same FQDN.
const NACK_RETRY_MIN: Duration = Duration::from_secs(1);
/// Retry delay cap after repeated NACKs.
const NACK_RETRY_MAX: Duration = Duration::from_secs(60);

pub struct ConsumerState {
    window: usize,
    queue: VecDeque<Work>,
    queued: HashSet<Arc<str>>,
    forced: HashSet<Arc<str>>,
    sent: HashMap<Arc<str>, Arc<ServiceEntry>>,
    inflight: VecDeque<Inflight>,
    next_nonce: u64,
    retries: BTreeMap<(Instant, u64), Arc<str>>,
    nack_streak: HashMap<Arc<str>, u32>,
    /// Work items of the initial snapshot still queued (they are at the queue's front).
    snapshot_left: usize,
}

impl ConsumerState {
    /// `window`: responses that may await an ACK at once (at least 1).
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            queue: VecDeque::new(),
            queued: HashSet::new(),
            forced: HashSet::new(),
            sent: HashMap::new(),
            inflight: VecDeque::new(),
            next_nonce: 1,
            retries: BTreeMap::new(),
            nack_streak: HashMap::new(),
            snapshot_left: 0,
        }
    }

    /// Queue the initial snapshot (`fqdns` as served at subscription time), optionally followed
    /// by the end-of-snapshot marker.
    pub fn start_snapshot(&mut self, fqdns: Vec<Arc<str>>, marker: bool) {
        for fqdn in fqdns {
            self.mark_dirty(fqdn);
        }
        if marker {
            self.queue.push_back(Work::Marker);
        }
        self.snapshot_left = self.queue.len();
    }

    /// The served record for `fqdn` may have changed.
    pub fn mark_dirty(&mut self, fqdn: Arc<str>) {
        if self.queued.insert(fqdn.clone()) {
            self.queue.push_back(Work::Key(fqdn));
        }
    }

    /// The change feed was lost (lagged): re-check everything served now and everything the
    /// consumer holds.
    pub fn mark_all_dirty(&mut self, current: Vec<Arc<str>>) {
        let held: Vec<Arc<str>> = self.sent.keys().cloned().collect();
        for fqdn in current.into_iter().chain(held) {
            self.mark_dirty(fqdn);
        }
    }

    /// Whether a response could be produced now (work queued and room in the window).
    pub fn can_send(&self) -> bool {
        self.inflight.len() < self.window && !self.queue.is_empty()
    }

    /// True once every snapshot item has been handed out.
    pub fn snapshot_sent(&self) -> bool {
        self.snapshot_left == 0
    }

    /// Number of FQDNs the consumer is believed to hold.
    pub fn held(&self) -> usize {
        self.sent.len()
    }

    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// Produce the next response, if any is needed. `lookup` returns the record currently
    /// served *to this consumer* for an FQDN (None: absent or not visible to it).
    pub fn next(
        &mut self,
        now: Instant,
        lookup: impl Fn(&str) -> Option<Arc<ServiceEntry>>,
    ) -> Option<Outgoing> {
        if self.inflight.len() >= self.window {
            return None;
        }
        while let Some(work) = self.queue.pop_front() {
            self.snapshot_left = self.snapshot_left.saturating_sub(1);
            let fqdn = match work {
                Work::Marker => {
                    return Some(self.emit(now, Op::SnapshotComplete, None, None));
                }
                Work::Key(fqdn) => fqdn,
            };
            self.queued.remove(&fqdn);
            let forced = self.forced.remove(&fqdn);
            let current = lookup(&fqdn);
            let held = self.sent.get(&fqdn).cloned();
            let out = match (current, held) {
                (Some(cur), None) => {
                    self.sent.insert(fqdn.clone(), cur.clone());
                    Some(self.emit(now, Op::Create, Some(fqdn), Some(cur)))
                }
                (Some(cur), Some(prev)) => {
                    if forced || (!Arc::ptr_eq(&cur, &prev) && *cur != *prev) {
                        self.sent.insert(fqdn.clone(), cur.clone());
                        Some(self.emit(now, Op::Update, Some(fqdn), Some(cur)))
                    } else {
                        None
                    }
                }
                (None, Some(prev)) => {
                    self.sent.remove(&fqdn);
                    Some(self.emit(now, Op::Delete, Some(fqdn), Some(prev)))
                }
                (None, None) => None,
            };
            if out.is_some() {
                return out;
            }
        }
        None
    }

    fn emit(
        &mut self,
        now: Instant,
        op: Op,
        fqdn: Option<Arc<str>>,
        entry: Option<Arc<ServiceEntry>>,
    ) -> Outgoing {
        let nonce = self.next_nonce;
        self.next_nonce += 1;
        self.inflight.push_back(Inflight {
            nonce,
            op,
            fqdn,
            entry: entry.clone(),
            sent_at: now,
        });
        Outgoing {
            nonce: nonce.to_string(),
            op,
            entry,
        }
    }

    fn take_inflight(&mut self, nonce: &str) -> Option<Inflight> {
        if nonce.is_empty() {
            // Go peers echo the empty nonce the reference server sends; with one reply per
            // response, in order, an empty nonce acknowledges the oldest outstanding response.
            return self.inflight.pop_front();
        }
        let n: u64 = nonce.parse().ok()?;
        let idx = self.inflight.iter().position(|i| i.nonce == n)?;
        self.inflight.remove(idx)
    }

    pub fn on_ack(&mut self, nonce: &str) -> Reply {
        match self.take_inflight(nonce) {
            Some(inflight) => {
                if let Some(fqdn) = &inflight.fqdn {
                    self.nack_streak.remove(fqdn);
                }
                Reply::Acked(inflight.op)
            }
            None => Reply::UnknownNonce,
        }
    }

    pub fn on_nack(&mut self, nonce: &str, now: Instant) -> Reply {
        let Some(inflight) = self.take_inflight(nonce) else {
            return Reply::UnknownNonce;
        };
        let Some(fqdn) = inflight.fqdn else {
            // A rejected marker is not resent: it carries no state.
            return Reply::Nacked {
                op: inflight.op,
                retry_in: Duration::ZERO,
            };
        };
        let streak = self.nack_streak.entry(fqdn.clone()).or_insert(0);
        let retry_in = NACK_RETRY_MIN
            .saturating_mul(1u32 << (*streak).min(16))
            .min(NACK_RETRY_MAX);
        *streak += 1;
        if inflight.op == Op::Delete
            && let Some(prev) = inflight.entry
        {
            // The consumer still holds it: make the retry send DELETE again.
            self.sent.entry(fqdn.clone()).or_insert(prev);
        }
        self.forced.insert(fqdn.clone());
        self.retries.insert((now + retry_in, inflight.nonce), fqdn);
        Reply::Nacked {
            op: inflight.op,
            retry_in,
        }
    }

    /// When the next NACK retry is due.
    pub fn next_retry_at(&self) -> Option<Instant> {
        self.retries.keys().next().map(|(at, _)| *at)
    }

    /// Queue every retry due at `now`.
    pub fn run_due_retries(&mut self, now: Instant) {
        while let Some(entry) = self.retries.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let fqdn = entry.remove();
            self.mark_dirty(fqdn);
        }
    }

    /// Send time of the oldest unacknowledged response.
    pub fn oldest_unacked(&self) -> Option<Instant> {
        self.inflight.front().map(|i| i.sent_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Endpoint, ServiceKey, Source};
    use std::collections::BTreeMap;

    fn entry(fqdn: &str, ip: &str, rev: u64) -> Arc<ServiceEntry> {
        Arc::new(ServiceEntry {
            key: ServiceKey::new("east", "ns", fqdn),
            source: Source::Local,
            fqdn: fqdn.into(),
            endpoints: vec![Endpoint {
                address: ip.into(),
                port: 443,
            }],
            ports: vec![],
            labels: BTreeMap::new(),
            allowed_requesters: vec![],
            origin: None,
            revision: rev,
        })
    }

    fn view(items: &[Arc<ServiceEntry>]) -> impl Fn(&str) -> Option<Arc<ServiceEntry>> + '_ {
        move |f| items.iter().find(|e| e.fqdn == f).cloned()
    }

    fn drain(
        st: &mut ConsumerState,
        items: &[Arc<ServiceEntry>],
        now: Instant,
    ) -> Vec<(String, Op, Option<String>)> {
        let mut out = Vec::new();
        while let Some(o) = st.next(now, view(items)) {
            out.push((o.nonce.clone(), o.op, o.entry.map(|e| e.fqdn.clone())));
            st.on_ack(&o.nonce);
        }
        out
    }

    #[test]
    fn snapshot_then_marker_then_changes_in_order() {
        let now = Instant::now();
        let a = entry("a.x", "10.0.0.1", 1);
        let b = entry("b.x", "10.0.0.2", 2);
        let mut st = ConsumerState::new(8);
        st.start_snapshot(vec!["a.x".into(), "b.x".into()], true);
        let items = vec![a.clone(), b.clone()];
        let got = drain(&mut st, &items, now);
        assert_eq!(
            got,
            vec![
                ("1".into(), Op::Create, Some("a.x".into())),
                ("2".into(), Op::Create, Some("b.x".into())),
                ("3".into(), Op::SnapshotComplete, None),
            ]
        );
        assert!(st.snapshot_sent());
        let a2 = entry("a.x", "10.0.0.9", 3);
        let items = vec![a2, b];
        st.mark_dirty("a.x".into());
        st.mark_dirty("b.x".into()); // unchanged: nothing sent
        st.mark_dirty("c.x".into()); // never existed: nothing sent
        assert_eq!(
            drain(&mut st, &items, now),
            vec![("4".into(), Op::Update, Some("a.x".into()))]
        );
        let items = vec![items[1].clone()];
        st.mark_dirty("a.x".into());
        assert_eq!(
            drain(&mut st, &items, now),
            vec![("5".into(), Op::Delete, Some("a.x".into()))]
        );
        assert_eq!(st.held(), 1);
    }

    #[test]
    fn changes_coalesce_while_window_is_full() {
        let now = Instant::now();
        let mut st = ConsumerState::new(1);
        st.start_snapshot(vec!["a.x".into()], false);
        let v1 = vec![entry("a.x", "10.0.0.1", 1)];
        let first = st.next(now, view(&v1)).expect("create");
        assert_eq!(first.op, Op::Create);
        // Window full: three more changes queue once.
        for _ in 0..3 {
            st.mark_dirty("a.x".into());
        }
        assert!(!st.can_send());
        assert!(st.next(now, view(&v1)).is_none());
        assert_eq!(st.on_ack(""), Reply::Acked(Op::Create));
        let v2 = vec![entry("a.x", "10.0.0.3", 4)];
        let second = st.next(now, view(&v2)).expect("update");
        assert_eq!(second.op, Op::Update);
        assert_eq!(
            second.entry.expect("entry").endpoints[0].address,
            "10.0.0.3"
        );
        assert_eq!(st.on_ack(&second.nonce), Reply::Acked(Op::Update));
        assert!(st.next(now, view(&v2)).is_none());
    }

    #[test]
    fn nack_resends_current_state_after_backoff() {
        let t0 = Instant::now();
        let mut st = ConsumerState::new(4);
        st.start_snapshot(vec!["a.x".into()], false);
        let v = vec![entry("a.x", "10.0.0.1", 1)];
        let o = st.next(t0, view(&v)).expect("create");
        assert_eq!(
            st.on_nack(&o.nonce, t0),
            Reply::Nacked {
                op: Op::Create,
                retry_in: Duration::from_secs(1)
            }
        );
        assert!(st.next(t0, view(&v)).is_none(), "not before the backoff");
        st.run_due_retries(t0 + Duration::from_millis(999));
        assert!(st.next(t0, view(&v)).is_none());
        st.run_due_retries(t0 + Duration::from_secs(1));
        let again = st.next(t0, view(&v)).expect("resent");
        assert_eq!(again.op, Op::Update);
        assert_eq!(again.nonce, "2");
        // Second NACK doubles the delay.
        assert_eq!(
            st.on_nack("2", t0),
            Reply::Nacked {
                op: Op::Update,
                retry_in: Duration::from_secs(2)
            }
        );
        assert_eq!(st.next_retry_at(), Some(t0 + Duration::from_secs(2)));
    }

    #[test]
    fn nacked_delete_is_sent_again() {
        let t0 = Instant::now();
        let mut st = ConsumerState::new(4);
        st.start_snapshot(vec!["a.x".into()], false);
        let v = vec![entry("a.x", "10.0.0.1", 1)];
        let o = st.next(t0, view(&v)).expect("create");
        st.on_ack(&o.nonce);
        st.mark_dirty("a.x".into());
        let d = st.next(t0, view(&[])).expect("delete");
        assert_eq!(d.op, Op::Delete);
        st.on_nack(&d.nonce, t0);
        st.run_due_retries(t0 + Duration::from_secs(5));
        let d2 = st.next(t0, view(&[])).expect("delete again");
        assert_eq!(d2.op, Op::Delete);
        assert_eq!(d2.entry.expect("last object").fqdn, "a.x");
    }

    #[test]
    fn unknown_nonce_and_lag_recovery() {
        let t0 = Instant::now();
        let mut st = ConsumerState::new(4);
        assert_eq!(st.on_ack("99"), Reply::UnknownNonce);
        assert_eq!(st.on_ack("not-a-number"), Reply::UnknownNonce);
        st.start_snapshot(vec!["a.x".into(), "b.x".into()], false);
        let v = vec![entry("a.x", "1.1.1.1", 1), entry("b.x", "1.1.1.2", 2)];
        drain(&mut st, &v, t0);
        // Lagged: b deleted and c created meanwhile; recompute from current state.
        let v2 = vec![v[0].clone(), entry("c.x", "1.1.1.3", 5)];
        st.mark_all_dirty(vec!["a.x".into(), "c.x".into()]);
        let got: Vec<(Op, Option<String>)> = drain(&mut st, &v2, t0)
            .into_iter()
            .map(|(_, op, f)| (op, f))
            .collect();
        let mut got_sorted = got.clone();
        got_sorted.sort_by(|a, b| a.1.cmp(&b.1));
        assert_eq!(
            got_sorted,
            vec![
                (Op::Delete, Some("b.x".into())),
                (Op::Create, Some("c.x".into()))
            ]
        );
    }
}

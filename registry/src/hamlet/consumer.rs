//! Per-consumer delivery state of the Hamlet server, with no I/O: which FQDNs need sending, what
//! the consumer is believed to hold, which responses are awaiting an ACK, and when a NACKed
//! resource is due again.
//!
//! Changes are coalesced per FQDN (a key is queued at most once), so a slow consumer costs at most
//! one queue slot per service and always receives the *current* state, never a backlog. A bounded
//! window of unacknowledged responses gives pipelining to fast consumers while a consumer that
//! never ACKs stalls only itself.
//!
//! Memory: what a consumer holds is not copied per consumer. It is a shared [`HamletView`]
//! version (the *base*, shared with the catalog and every other consumer on that version) plus a
//! small map of the FQDNs where the consumer differs from it. The snapshot walks the base in
//! FQDN order with a cursor instead of queueing every FQDN. When the differences grow, the
//! consumer moves its base to the catalog's current version ([`ConsumerState::rebase`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use xcc_controller::backoff::{Backoff, Delays};

use super::convert;
use crate::catalog::{HamletView, ServiceEntry, ViewPos};

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

#[derive(Debug)]
struct Inflight {
    nonce: u64,
    op: Op,
    fqdn: Option<Arc<str>>,
    entry: Option<Arc<ServiceEntry>>,
    /// [`convert::wire_size_bound`] of `entry`.
    bytes: usize,
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

/// Retry delays after a NACK: 1 s, doubling per consecutive NACK of the same FQDN, at most 60 s.
const NACK_RETRY: Backoff = Backoff {
    min: Duration::from_secs(1),
    max: Duration::from_secs(60),
};
/// Differences from the base that trigger a rebase (at least; more for large views).
const REBASE_MIN: usize = 64;
/// Buffers larger than this are released once empty (the snapshot and change bursts leave
/// large capacities behind that an idle consumer must not keep).
const KEEP_CAPACITY: usize = 32;

/// Progress of the initial snapshot through the base view.
struct Snapshot {
    /// Next item of the base to consider.
    pos: ViewPos,
    /// Last FQDN handed out; everything up to it is covered.
    last: Option<Arc<str>>,
    /// Send the end-of-snapshot marker once the base is exhausted.
    marker: bool,
}

pub struct ConsumerState {
    window: usize,
    /// Encoded bytes (upper bounds) the unacknowledged responses may add up to before the
    /// next waits for an ACK: a window of large entries pins their old versions until it is
    /// acknowledged. One response always fits.
    window_bytes: usize,
    inflight_bytes: usize,
    /// Certificate identity of the consumer (None: sees everything). Decides which base
    /// entries it holds; the `lookup` passed to [`ConsumerState::next`] must apply the same rule.
    requester: Option<String>,
    /// Shared version of the view; the consumer holds its visible entries, except where
    /// `differs` says otherwise (and, during the snapshot, only up to the cursor).
    base: HamletView,
    /// FQDN → what the consumer holds where that is not the base's (visible) entry.
    differs: HashMap<Arc<str>, Option<Arc<ServiceEntry>>>,
    held: usize,
    /// `differs` must reach this size before the next rebase.
    rebase_floor: usize,
    snapshot: Option<Snapshot>,
    queue: VecDeque<Arc<str>>,
    queued: HashSet<Arc<str>>,
    forced: HashSet<Arc<str>>,
    inflight: VecDeque<Inflight>,
    next_nonce: u64,
    retries: BTreeMap<(Instant, u64), Arc<str>>,
    /// Retry delays of the FQDNs NACKed since their last ACK.
    nack_streak: HashMap<Arc<str>, Delays>,
}

/// What a consumer holds for an FQDN, beside what the base holds for it.
struct Held {
    held: Option<Arc<ServiceEntry>>,
    base: Option<Arc<ServiceEntry>>,
}

fn same(a: Option<&Arc<ServiceEntry>>, b: Option<&Arc<ServiceEntry>>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

impl ConsumerState {
    /// `window`: responses that may await an ACK at once (at least 1). The consumer sees every
    /// entry.
    pub fn new(window: usize) -> Self {
        Self {
            window: window.max(1),
            window_bytes: usize::MAX,
            inflight_bytes: 0,
            requester: None,
            base: HamletView::default(),
            differs: HashMap::new(),
            held: 0,
            rebase_floor: 0,
            snapshot: None,
            queue: VecDeque::new(),
            queued: HashSet::new(),
            forced: HashSet::new(),
            inflight: VecDeque::new(),
            next_nonce: 1,
            retries: BTreeMap::new(),
            nack_streak: HashMap::new(),
        }
    }

    /// A consumer that sees only the entries whose allowed requesters admit `requester`.
    pub fn for_requester(window: usize, requester: impl Into<String>) -> Self {
        Self {
            requester: Some(requester.into()),
            ..Self::new(window)
        }
    }

    /// Also bound the unacknowledged responses by their encoded size (at least one is sent).
    pub fn with_window_bytes(mut self, bytes: usize) -> Self {
        self.window_bytes = bytes;
        self
    }

    /// Whether the window has room for another response.
    fn window_open(&self) -> bool {
        self.inflight.len() < self.window
            && (self.inflight.is_empty() || self.inflight_bytes < self.window_bytes)
    }

    fn visible<'a>(&self, e: Option<&'a Arc<ServiceEntry>>) -> Option<&'a Arc<ServiceEntry>> {
        let e = e.filter(|e| convert::fits_on_the_wire(e));
        match &self.requester {
            Some(r) => e.filter(|e| e.admits(r)),
            None => e,
        }
    }

    fn covered(&self, fqdn: &str) -> bool {
        match &self.snapshot {
            None => true,
            Some(s) => s.last.as_deref().is_some_and(|last| fqdn <= last),
        }
    }

    /// The base's entry for `fqdn` as this consumer holds it (nothing past the snapshot cursor).
    fn base_held(&self, fqdn: &str) -> Option<&Arc<ServiceEntry>> {
        if self.covered(fqdn) {
            self.visible(self.base.get(fqdn))
        } else {
            None
        }
    }

    /// What the consumer is believed to hold for `fqdn`.
    fn holds(&self, fqdn: &str) -> Option<Arc<ServiceEntry>> {
        self.held_at(fqdn).held
    }

    /// What the consumer holds for `fqdn` and what the base holds for it, found once for a
    /// [`Self::record`] that follows.
    fn held_at(&self, fqdn: &str) -> Held {
        let base = self.base_held(fqdn).cloned();
        let held = match self.differs.get(fqdn) {
            Some(v) => v.clone(),
            None => base.clone(),
        };
        Held { held, base }
    }

    fn set_holds(&mut self, fqdn: &Arc<str>, value: Option<Arc<ServiceEntry>>) {
        let at = self.held_at(fqdn);
        self.record(fqdn, &at, value);
    }

    /// The consumer now holds `value` for `fqdn`, where it held what `at` says.
    fn record(&mut self, fqdn: &Arc<str>, at: &Held, value: Option<Arc<ServiceEntry>>) {
        match (at.held.is_some(), value.is_some()) {
            (false, true) => self.held += 1,
            (true, false) => self.held -= 1,
            _ => {}
        }
        if same(value.as_ref(), at.base.as_ref()) {
            // Removing from an empty map would still hash the key.
            if !self.differs.is_empty() {
                self.differs.remove(fqdn);
            }
        } else {
            self.differs.insert(fqdn.clone(), value);
        }
    }

    /// Queue the initial snapshot: every FQDN of `view` (the catalog's view at subscription
    /// time), in FQDN order, each sent with its state when its turn comes; optionally followed
    /// by the end-of-snapshot marker.
    pub fn start_snapshot(&mut self, view: HamletView, marker: bool) {
        self.base = view;
        self.differs.clear();
        self.held = 0;
        self.snapshot = Some(Snapshot {
            pos: ViewPos::default(),
            last: None,
            marker,
        });
        if self.base.is_empty() && !marker {
            self.snapshot = None;
        }
    }

    /// The served record for `fqdn` may have changed.
    pub fn mark_dirty(&mut self, fqdn: Arc<str>) {
        if self.queued.insert(fqdn.clone()) {
            self.queue.push_back(fqdn);
        }
    }

    /// FQDNs queued for a re-check (changes not yet sent or found unchanged).
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The change feed was lost (lagged): re-check every FQDN where `current` (the catalog's
    /// view now) may differ from what the consumer holds.
    pub fn mark_all_dirty(&mut self, current: &HamletView) {
        let mut keys: Vec<Arc<str>> = Vec::new();
        self.base.diff(current, |k, _, _| keys.push(k.clone()));
        keys.extend(self.differs.keys().cloned());
        for k in keys {
            self.mark_dirty(k);
        }
    }

    /// Whether enough differences from the base have accumulated to move to a newer base.
    pub fn wants_rebase(&self) -> bool {
        self.snapshot.is_none()
            && self.differs.len() >= REBASE_MIN.max(self.base.len() / 64).max(self.rebase_floor)
    }

    /// Move the base to `current` (the catalog's view now), keeping what the consumer holds
    /// unchanged: only FQDNs where it differs from `current` stay recorded. Queued work, the
    /// window and retries are unaffected. Ignored during the snapshot (the cursor walks the old
    /// base).
    pub fn rebase(&mut self, current: HamletView) {
        if self.snapshot.is_some() {
            return;
        }
        let mut differs: HashMap<Arc<str>, Option<Arc<ServiceEntry>>> = HashMap::new();
        self.base.diff(&current, |k, old, new| {
            if self.differs.contains_key(k) {
                return;
            }
            let held = self.visible(old);
            if !same(held, self.visible(new)) {
                differs.insert(k.clone(), held.cloned());
            }
        });
        for (k, v) in self.differs.drain() {
            let now_visible = match &self.requester {
                Some(r) => current.get(&k).filter(|e| e.admits(r)),
                None => current.get(&k),
            };
            if !same(v.as_ref(), now_visible) {
                differs.insert(k, v);
            }
        }
        differs.shrink_to_fit();
        // Differences that survive a rebase (a consumer that is behind) must double before the
        // next one, so a stalled consumer does not rebase on every change.
        self.rebase_floor = differs.len() * 2;
        self.differs = differs;
        self.base = current;
    }

    /// Whether a response could be produced now (work queued and room in the window).
    pub fn can_send(&self) -> bool {
        self.window_open() && (self.snapshot.is_some() || !self.queue.is_empty())
    }

    /// True once every snapshot item has been handed out.
    pub fn snapshot_sent(&self) -> bool {
        self.snapshot.is_none()
    }

    /// The shared view version the consumer's state is relative to.
    pub fn base(&self) -> &HamletView {
        &self.base
    }

    /// Number of FQDNs the consumer is believed to hold.
    pub fn held(&self) -> usize {
        self.held
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
        self.next_with(now, |fqdn, _| lookup(fqdn))
    }

    /// [`ConsumerState::next`] with a `lookup` that is also handed the base's entry for the
    /// FQDN when the state has it at hand (the snapshot cursor's): a caller that knows the
    /// catalog still serves the base version ([`ConsumerState::base`]) returns it without a
    /// search.
    pub fn next_with(
        &mut self,
        now: Instant,
        lookup: impl Fn(&str, Option<&Arc<ServiceEntry>>) -> Option<Arc<ServiceEntry>>,
    ) -> Option<Outgoing> {
        if !self.window_open() {
            return None;
        }
        // An entry no peer could decode is never sent (for this consumer it does not exist).
        let lookup = |fqdn: &str, base: Option<&Arc<ServiceEntry>>| {
            lookup(fqdn, base).filter(|e| convert::fits_on_the_wire(e))
        };
        if let Some(out) = self.next_snapshot(now, &lookup) {
            return Some(out);
        }
        while let Some(fqdn) = self.queue.pop_front() {
            self.queued.remove(&fqdn);
            // Guarded: removing from an empty set would still hash the key.
            let forced = !self.forced.is_empty() && self.forced.remove(&fqdn);
            let current = lookup(&fqdn, None);
            let at = self.held_at(&fqdn);
            let out = match (current, at.held.clone()) {
                (Some(cur), None) => {
                    self.record(&fqdn, &at, Some(cur.clone()));
                    Some(self.emit(now, Op::Create, Some(fqdn), Some(cur)))
                }
                (Some(cur), Some(prev)) => {
                    if forced || (!Arc::ptr_eq(&cur, &prev) && *cur != *prev) {
                        self.record(&fqdn, &at, Some(cur.clone()));
                        Some(self.emit(now, Op::Update, Some(fqdn), Some(cur)))
                    } else {
                        None
                    }
                }
                (None, Some(prev)) => {
                    self.record(&fqdn, &at, None);
                    Some(self.emit(now, Op::Delete, Some(fqdn), Some(prev)))
                }
                (None, None) => None,
            };
            if out.is_some() {
                return out;
            }
        }
        self.release_idle_buffers();
        None
    }

    /// The next snapshot response; None once the snapshot (and its marker) is done.
    fn next_snapshot(
        &mut self,
        now: Instant,
        lookup: &impl Fn(&str, Option<&Arc<ServiceEntry>>) -> Option<Arc<ServiceEntry>>,
    ) -> Option<Outgoing> {
        loop {
            let snap = self.snapshot.as_mut()?;
            let Some(((key, entry), next)) = self.base.at(snap.pos) else {
                let marker = snap.marker;
                self.snapshot = None;
                return marker.then(|| self.emit(now, Op::SnapshotComplete, None, None));
            };
            let (fqdn, entry) = (key.clone(), entry.clone());
            snap.pos = next;
            snap.last = Some(fqdn.clone());
            let current = lookup(&fqdn, Some(&entry));
            // Before this step the consumer held nothing for `fqdn` (it was past the cursor).
            if current.is_some() {
                self.held += 1;
            }
            // The cursor now covers `fqdn`: what the base holds for it is `entry`, if visible.
            if same(current.as_ref(), self.visible(Some(&entry))) {
                if !self.differs.is_empty() {
                    self.differs.remove(&fqdn);
                }
            } else {
                self.differs.insert(fqdn.clone(), current.clone());
            }
            if let Some(cur) = current {
                return Some(self.emit(now, Op::Create, Some(fqdn), Some(cur)));
            }
        }
    }

    fn release_idle_buffers(&mut self) {
        if self.queue.is_empty() && self.queue.capacity() > KEEP_CAPACITY {
            self.queue = VecDeque::new();
        }
        if self.queued.is_empty() && self.queued.capacity() > KEEP_CAPACITY {
            self.queued = HashSet::new();
        }
        if self.inflight.is_empty() && self.inflight.capacity() > KEEP_CAPACITY {
            self.inflight = VecDeque::new();
        }
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
        let bytes = entry.as_deref().map_or(0, convert::wire_size_bound);
        self.inflight_bytes += bytes;
        self.inflight.push_back(Inflight {
            nonce,
            op,
            fqdn,
            entry: entry.clone(),
            bytes,
            sent_at: now,
        });
        Outgoing {
            nonce: nonce.to_string(),
            op,
            entry,
        }
    }

    fn take_inflight(&mut self, nonce: &str) -> Option<Inflight> {
        let taken = if nonce.is_empty() {
            // Go peers echo the empty nonce the reference server sends; with one reply per
            // response, in order, an empty nonce acknowledges the oldest outstanding response.
            self.inflight.pop_front()
        } else {
            let n: u64 = nonce.parse().ok()?;
            let idx = self.inflight.iter().position(|i| i.nonce == n)?;
            self.inflight.remove(idx)
        };
        if let Some(i) = &taken {
            self.inflight_bytes -= i.bytes;
        }
        taken
    }

    /// Encoded bytes (upper bounds) of the unacknowledged responses.
    pub fn inflight_bytes(&self) -> usize {
        self.inflight_bytes
    }

    pub fn on_ack(&mut self, nonce: &str) -> Reply {
        match self.take_inflight(nonce) {
            Some(inflight) => {
                if let Some(fqdn) = &inflight.fqdn
                    && !self.nack_streak.is_empty()
                {
                    self.nack_streak.remove(fqdn);
                }
                if self.inflight.is_empty() && self.queue.is_empty() {
                    self.release_idle_buffers();
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
        let retry_in = self
            .nack_streak
            .entry(fqdn.clone())
            .or_insert_with(|| NACK_RETRY.delays())
            .next_delay();
        if inflight.op == Op::Delete
            && let Some(prev) = inflight.entry
            && self.holds(&fqdn).is_none()
        {
            // The consumer still holds it: make the retry send DELETE again.
            self.set_holds(&fqdn, Some(prev));
        } else if inflight.op == Op::Create && self.holds(&fqdn).is_some() {
            // The consumer refused the object, so it holds none: the retry is a CREATE again (a
            // strict consumer rejects an UPDATE of an object it never accepted). An UPDATE sent
            // meanwhile and NACKed in turn is then resent as a CREATE too.
            self.set_holds(&fqdn, None);
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
            labels: Default::default(),
            allowed_requesters: vec![],
            origin: None,
            revision: rev,
        })
    }

    fn snap(items: &[Arc<ServiceEntry>]) -> HamletView {
        HamletView::from_entries(items.iter().cloned())
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
            out.push((o.nonce.clone(), o.op, o.entry.map(|e| e.fqdn.to_string())));
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
        let items = vec![a.clone(), b.clone()];
        st.start_snapshot(snap(&items), true);
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

    /// The window is bounded in bytes too: a consumer that does not ACK holds at most
    /// `window_bytes` (plus the one response that always fits), however many responses the
    /// window would allow; every ACK returns its bytes.
    #[test]
    fn the_window_is_bounded_in_bytes_as_well_as_responses() {
        let now = Instant::now();
        let items: Vec<_> = (0..5)
            .map(|i| entry(&format!("s{i}.x"), "10.0.0.1", i))
            .collect();
        let one = convert::wire_size_bound(&items[0]);
        // Room for two and a half entries' bytes, and 100 responses.
        let mut st = ConsumerState::new(100).with_window_bytes(one * 5 / 2);
        st.start_snapshot(snap(&items), false);
        let sent: Vec<_> = std::iter::from_fn(|| st.next(now, view(&items))).collect();
        // Two fill 2/2.5 of the budget; the third starts below it and is sent; then none.
        assert_eq!(sent.len(), 3);
        assert_eq!(st.inflight_bytes(), 3 * one);
        assert!(!st.can_send());
        assert_eq!(st.on_ack(&sent[0].nonce), Reply::Acked(Op::Create));
        assert_eq!(st.inflight_bytes(), 2 * one);
        assert_eq!(st.next(now, view(&items)).map(|o| o.op), Some(Op::Create));
        for o in ["2", "3", "4"] {
            assert_eq!(st.on_ack(o), Reply::Acked(Op::Create));
        }
        assert_eq!(st.inflight_bytes(), 0);
        // An entry larger than the whole budget is still sent, alone.
        let mut st = ConsumerState::new(100).with_window_bytes(1);
        st.start_snapshot(snap(&items), false);
        assert!(st.next(now, view(&items)).is_some());
        assert!(st.next(now, view(&items)).is_none());
    }

    #[test]
    fn changes_coalesce_while_window_is_full() {
        let now = Instant::now();
        let mut st = ConsumerState::new(1);
        let v1 = vec![entry("a.x", "10.0.0.1", 1)];
        st.start_snapshot(snap(&v1), false);
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
        let v = vec![entry("a.x", "10.0.0.1", 1)];
        st.start_snapshot(snap(&v), false);
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
        assert_eq!(again.op, Op::Create, "never accepted: CREATE again");
        assert_eq!(again.nonce, "2");
        // Second NACK doubles the delay.
        assert_eq!(
            st.on_nack("2", t0),
            Reply::Nacked {
                op: Op::Create,
                retry_in: Duration::from_secs(2)
            }
        );
        assert_eq!(st.next_retry_at(), Some(t0 + Duration::from_secs(2)));
        // Once accepted, a NACKed change is resent as what it is: an UPDATE.
        st.run_due_retries(t0 + Duration::from_secs(2));
        let third = st.next(t0, view(&v)).expect("resent");
        assert_eq!(third.op, Op::Create);
        assert_eq!(st.on_ack(&third.nonce), Reply::Acked(Op::Create));
        let v2 = vec![entry("a.x", "10.0.0.2", 2)];
        st.mark_dirty("a.x".into());
        let update = st.next(t0, view(&v2)).expect("update");
        assert_eq!(update.op, Op::Update);
        st.on_nack(&update.nonce, t0);
        st.run_due_retries(t0 + Duration::from_secs(60));
        assert_eq!(st.next(t0, view(&v2)).expect("resent").op, Op::Update);
    }

    #[test]
    fn an_entry_too_large_for_the_wire_is_never_sent_and_the_rest_goes_on() {
        let t0 = Instant::now();
        let mut st = ConsumerState::new(4);
        let mut huge = (*entry("b.x", "10.0.0.2", 2)).clone();
        huge.labels.insert(
            "connectivity.tanzu.vmware.com/blob".into(),
            "x".repeat(convert::MAX_WIRE_RESOURCE_BYTES),
        );
        let v = vec![
            entry("a.x", "10.0.0.1", 1),
            Arc::new(huge),
            entry("c.x", "10.0.0.3", 3),
        ];
        st.start_snapshot(snap(&v), false);
        let sent: Vec<String> = drain(&mut st, &v, t0)
            .into_iter()
            .filter_map(|(_, _, f)| f)
            .collect();
        assert_eq!(sent, ["a.x", "c.x"]);
    }

    #[test]
    fn create_and_update_in_flight_both_nacked_resend_a_create() {
        let t0 = Instant::now();
        let mut st = ConsumerState::new(4);
        let v = vec![entry("a.x", "10.0.0.1", 1)];
        st.start_snapshot(snap(&v), false);
        let create = st.next(t0, view(&v)).expect("create");
        let v2 = vec![entry("a.x", "10.0.0.2", 2)];
        st.mark_dirty("a.x".into());
        let update = st.next(t0, view(&v2)).expect("update in the window");
        assert_eq!(update.op, Op::Update);
        st.on_nack(&create.nonce, t0);
        st.on_nack(&update.nonce, t0);
        st.run_due_retries(t0 + Duration::from_secs(60));
        let again = st.next(t0, view(&v2)).expect("resent");
        assert_eq!(again.op, Op::Create);
        assert_eq!(
            again.entry.expect("current").endpoints[0].address,
            "10.0.0.2"
        );
        assert!(st.next(t0, view(&v2)).is_none(), "sent once");
    }

    #[test]
    fn nacked_delete_is_sent_again() {
        let t0 = Instant::now();
        let mut st = ConsumerState::new(4);
        let v = vec![entry("a.x", "10.0.0.1", 1)];
        st.start_snapshot(snap(&v), false);
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
        let v = vec![entry("a.x", "1.1.1.1", 1), entry("b.x", "1.1.1.2", 2)];
        st.start_snapshot(snap(&v), false);
        drain(&mut st, &v, t0);
        // Lagged: b deleted and c created meanwhile; recompute from current state.
        let v2 = vec![v[0].clone(), entry("c.x", "1.1.1.3", 5)];
        st.mark_all_dirty(&snap(&v2));
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
    /// Drive the same change sequence through two consumers, one rebasing after every step, and
    /// compare what they send.
    #[test]
    fn rebase_keeps_what_the_consumer_holds() {
        let now = Instant::now();
        let mk = |n: usize, ip: &str| -> Vec<Arc<ServiceEntry>> {
            (0..n)
                .map(|i| entry(&format!("s{i:03}.x"), ip, i as u64))
                .collect()
        };
        let v0 = mk(300, "10.0.0.1");
        let mut plain = ConsumerState::new(1000);
        let mut rebasing = ConsumerState::new(1000);
        plain.start_snapshot(snap(&v0), true);
        rebasing.start_snapshot(snap(&v0), true);
        assert_eq!(drain(&mut plain, &v0, now), drain(&mut rebasing, &v0, now));
        assert_eq!(rebasing.held(), 300);
        // Change 100 services, delete 50, add 20; the consumers learn of it only later.
        let mut v1: Vec<Arc<ServiceEntry>> = v0[..250].to_vec();
        for e in v1.iter_mut().take(100) {
            *e = entry(&e.fqdn, "10.0.0.2", 1000);
        }
        v1.extend((300..320).map(|i| entry(&format!("s{i:03}.x"), "10.0.0.3", 2000)));
        // The rebasing consumer moves to the new version before processing anything.
        rebasing.rebase(snap(&v1));
        assert_eq!(rebasing.held(), 300);
        for e in v0.iter().chain(v1.iter()) {
            plain.mark_dirty(e.fqdn.as_str().into());
            rebasing.mark_dirty(e.fqdn.as_str().into());
        }
        let a = drain(&mut plain, &v1, now);
        let b = drain(&mut rebasing, &v1, now);
        assert_eq!(a, b);
        let ops =
            |v: &[(String, Op, Option<String>)], op: Op| v.iter().filter(|x| x.1 == op).count();
        assert_eq!(
            (
                ops(&a, Op::Update),
                ops(&a, Op::Delete),
                ops(&a, Op::Create)
            ),
            (100, 50, 20)
        );
        assert_eq!((plain.held(), rebasing.held()), (270, 270));
        // Caught up: after a rebase onto the same content nothing differs.
        rebasing.rebase(snap(&v1));
        assert!(rebasing.differs.is_empty());
    }

    #[test]
    fn requester_sees_only_admitted_entries() {
        let now = Instant::now();
        let open = entry("a.x", "10.0.0.1", 1);
        let mut closed = (*entry("b.x", "10.0.0.2", 2)).clone();
        closed.allowed_requesters = vec!["north".into()];
        let closed = Arc::new(closed);
        let items = vec![open, closed];
        let mut st = ConsumerState::for_requester(8, "west");
        st.start_snapshot(snap(&items), true);
        let lookup = |f: &str| view(&items)(f).filter(|e| e.admits("west"));
        let mut got = Vec::new();
        while let Some(o) = st.next(now, lookup) {
            got.push((o.op, o.entry.map(|e| e.fqdn.clone())));
            st.on_ack(&o.nonce);
        }
        assert_eq!(
            got,
            vec![
                (Op::Create, Some("a.x".into())),
                (Op::SnapshotComplete, None)
            ]
        );
        assert_eq!(st.held(), 1);
        // Re-checking the hidden one sends nothing (the consumer does not hold it).
        st.mark_dirty("b.x".into());
        assert!(st.next(now, lookup).is_none());
    }
}

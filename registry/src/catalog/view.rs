//! The Hamlet view: what Hamlet consumers are served, as immutable shared versions.

use std::fmt;
use std::sync::Arc;

use super::ServiceEntry;

/// Entries per chunk of a [`HamletView`] before it is split in two.
const VIEW_CHUNK_MAX: usize = 128;

type ViewChunk = Vec<(Arc<str>, Arc<ServiceEntry>)>;

/// The view's key for `fqdn` served by `e`: the entry's own FQDN allocation when it is one.
fn view_key(fqdn: &str, e: &ServiceEntry) -> Arc<str> {
    if e.fqdn == fqdn {
        Arc::from(e.fqdn.clone())
    } else {
        Arc::from(fqdn)
    }
}

/// One (FQDN, entry) of a [`HamletView`].
pub type ViewItem<'a> = (&'a Arc<str>, &'a Arc<ServiceEntry>);

/// An immutable version of the Hamlet view (FQDN → served entry, sorted by FQDN) that many
/// readers can hold at once. A clone is two reference counts. The catalog changes its own copy
/// in place when nobody else holds it; otherwise a change copies only the chunk it touches (at
/// most [`VIEW_CHUNK_MAX`] entries) and the chunk list, so versions held by Hamlet consumers
/// share everything else. The FQDN keys are interned: every holder shares one `Arc<str>`.
#[derive(Clone, Default)]
pub struct HamletView {
    pub(super) chunks: Arc<Vec<Arc<ViewChunk>>>,
    len: usize,
}

impl fmt::Debug for HamletView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(self.iter().map(|(k, e)| (k, e.revision)))
            .finish()
    }
}

/// Names one version of a [`HamletView`] without holding it ([`HamletView::version`]).
#[derive(Clone, Debug)]
pub struct ViewVersion(std::sync::Weak<Vec<Arc<ViewChunk>>>);

/// Position in a [`HamletView`] (chunk, offset); only meaningful for the version it came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ViewPos {
    chunk: usize,
    offset: usize,
}

impl HamletView {
    /// A view of `entries` keyed by their FQDN (later duplicates win). For tests and tools; the
    /// catalog maintains its own.
    pub fn from_entries(entries: impl IntoIterator<Item = Arc<ServiceEntry>>) -> Self {
        let mut v = Self::default();
        for e in entries {
            let fqdn = e.fqdn.clone();
            v.set(&fqdn, Some(e));
        }
        v
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether two handles are the same version (cheap; false does not imply different content).
    pub fn same_version(&self, other: &HamletView) -> bool {
        Arc::ptr_eq(&self.chunks, &other.chunks)
    }

    /// A token for this version that does not keep its entries alive.
    pub fn version(&self) -> ViewVersion {
        ViewVersion(Arc::downgrade(&self.chunks))
    }

    /// Whether this handle is the version `v` was taken from. A token keeps its version's
    /// allocation (not its entries) reserved, so no later version can share its address.
    pub fn is_version(&self, v: &ViewVersion) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.chunks), v.0.as_ptr())
    }

    /// Index of the chunk that holds, or would hold, `fqdn`.
    fn chunk_for(&self, fqdn: &str) -> usize {
        // The last chunk whose first key is <= fqdn (0 when fqdn sorts before everything).
        self.chunks
            .partition_point(|c| c.first().is_some_and(|(k, _)| &**k <= fqdn))
            .saturating_sub(1)
    }

    fn find(&self, fqdn: &str) -> Option<&(Arc<str>, Arc<ServiceEntry>)> {
        let chunk = self.chunks.get(self.chunk_for(fqdn))?;
        let at = chunk.binary_search_by(|(k, _)| (**k).cmp(fqdn)).ok()?;
        chunk.get(at)
    }

    pub fn get(&self, fqdn: &str) -> Option<&Arc<ServiceEntry>> {
        self.find(fqdn).map(|(_, e)| e)
    }

    /// The interned key for `fqdn`, if served.
    pub fn key(&self, fqdn: &str) -> Option<&Arc<str>> {
        self.find(fqdn).map(|(k, _)| k)
    }

    /// Every (FQDN, entry), sorted by FQDN.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<ServiceEntry>)> {
        self.chunks
            .iter()
            .flat_map(|c| c.iter().map(|(k, e)| (k, e)))
    }

    /// The FQDNs, sorted (shared `Arc`s, no copies of the strings).
    pub fn fqdns(&self) -> Vec<Arc<str>> {
        self.iter().map(|(k, _)| k.clone()).collect()
    }

    /// The item at `pos` and the position after it; None at the end.
    pub fn at(&self, pos: ViewPos) -> Option<(ViewItem<'_>, ViewPos)> {
        let mut pos = pos;
        loop {
            let chunk = self.chunks.get(pos.chunk)?;
            if let Some((k, e)) = chunk.get(pos.offset) {
                let next = ViewPos {
                    chunk: pos.chunk,
                    offset: pos.offset + 1,
                };
                return Some(((k, e), next));
            }
            pos = ViewPos {
                chunk: pos.chunk + 1,
                offset: 0,
            };
        }
    }

    /// Set (Some) or remove (None) the entry served for `fqdn`; copy-on-write.
    pub(super) fn set(&mut self, fqdn: &str, entry: Option<Arc<ServiceEntry>>) {
        let idx = self.chunk_for(fqdn);
        let found = self
            .chunks
            .get(idx)
            .map(|c| c.binary_search_by(|(k, _)| (**k).cmp(fqdn)));
        match (found, entry) {
            (Some(Ok(at)), Some(e)) => {
                let chunks = Arc::make_mut(&mut self.chunks);
                let chunk = Arc::make_mut(&mut chunks[idx]);
                chunk[at].1 = e;
            }
            (Some(Ok(at)), None) => {
                let chunks = Arc::make_mut(&mut self.chunks);
                let chunk = Arc::make_mut(&mut chunks[idx]);
                chunk.remove(at);
                if chunk.is_empty() {
                    chunks.remove(idx);
                }
                self.len -= 1;
            }
            (Some(Err(at)), Some(e)) => {
                let chunks = Arc::make_mut(&mut self.chunks);
                let chunk = Arc::make_mut(&mut chunks[idx]);
                // Grow a full chunk straight to the size at which it splits, not by doubling
                // (a doubled chunk keeps up to half its slots empty for good).
                if chunk.len() == chunk.capacity() {
                    chunk.reserve_exact((VIEW_CHUNK_MAX + 1).saturating_sub(chunk.len()).max(1));
                }
                chunk.insert(at, (view_key(fqdn, &e), e));
                if chunk.len() > VIEW_CHUNK_MAX {
                    let tail = chunk.split_off(chunk.len() / 2);
                    chunk.shrink_to_fit();
                    chunks.insert(idx + 1, Arc::new(tail));
                }
                self.len += 1;
            }
            (None, Some(e)) => {
                let key = view_key(fqdn, &e);
                Arc::make_mut(&mut self.chunks).push(Arc::new(vec![(key, e)]));
                self.len += 1;
            }
            (Some(Err(_)) | None, None) => {}
        }
    }

    /// Calls `f(fqdn, in_self, in_other)` for every FQDN whose entry differs between the two
    /// versions (by identity: entries are immutable and shared between versions). Chunks shared
    /// by both versions are skipped without looking inside, so the cost is about the number of
    /// chunks plus the size of the changed ones.
    pub fn diff(
        &self,
        other: &HamletView,
        mut f: impl FnMut(&Arc<str>, Option<&Arc<ServiceEntry>>, Option<&Arc<ServiceEntry>>),
    ) {
        if self.same_version(other) {
            return;
        }
        let (a, b) = (&self.chunks, &other.chunks);
        let (mut ia, mut ib) = (ViewPos::default(), ViewPos::default());
        loop {
            // Skip a chunk both versions share, when both cursors stand at its start.
            if ia.offset == 0
                && ib.offset == 0
                && let (Some(ca), Some(cb)) = (a.get(ia.chunk), b.get(ib.chunk))
                && Arc::ptr_eq(ca, cb)
            {
                ia.chunk += 1;
                ib.chunk += 1;
                continue;
            }
            match (self.at(ia), other.at(ib)) {
                (None, None) => return,
                (Some(((ka, ea), na)), None) => {
                    f(ka, Some(ea), None);
                    ia = na;
                }
                (None, Some(((kb, eb), nb))) => {
                    f(kb, None, Some(eb));
                    ib = nb;
                }
                (Some(((ka, ea), na)), Some(((kb, eb), nb))) => match ka.cmp(kb) {
                    std::cmp::Ordering::Less => {
                        f(ka, Some(ea), None);
                        ia = na;
                    }
                    std::cmp::Ordering::Greater => {
                        f(kb, None, Some(eb));
                        ib = nb;
                    }
                    std::cmp::Ordering::Equal => {
                        if !Arc::ptr_eq(ea, eb) {
                            f(ka, Some(ea), Some(eb));
                        }
                        ia = na;
                        ib = nb;
                    }
                },
            }
            // Normalise positions at a chunk end to the next chunk's start, so shared chunks
            // are recognised.
            if a.get(ia.chunk).is_some_and(|c| ia.offset >= c.len()) {
                ia = ViewPos {
                    chunk: ia.chunk + 1,
                    offset: 0,
                };
            }
            if b.get(ib.chunk).is_some_and(|c| ib.offset >= c.len()) {
                ib = ViewPos {
                    chunk: ib.chunk + 1,
                    offset: 0,
                };
            }
        }
    }
}

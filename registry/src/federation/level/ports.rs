//! Where a level's messages go. The level decides what each peer is sent, as plain messages;
//! the sessions own the queues and the transport (`federation::queues`), each bounded in
//! bytes, and turn a [`Resync`] into the status that ends a child's stream.

use xcc_proto::xcc::federation::v1 as fed;

/// A message did not fit a peer's queue. It was not dropped on its own: the port ended the
/// session, the peer resynchronises when it reconnects, and the level counts the overflow
/// ([`super::Level::overflows`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Overflow;

/// Why a level ends a child's session: the child reconnects at once and sends its snapshot
/// again, so what it announces is decided anew.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Resync {
    /// The parent's policies changed: the child carries more, or a policy refused one of its
    /// entries.
    #[error("the parent's policies changed; reconnect to announce again")]
    PoliciesChanged,
    /// A refusal above of what the child's subtree announced was lifted.
    #[error("a refusal above was lifted; reconnect to announce again")]
    RefusalLifted,
}

/// The way down to one child's session.
pub trait ChildPort: Send + Sync {
    /// Queue `msg` for the child, after everything queued before it.
    fn send(&self, msg: fed::parent_message::Payload) -> Result<(), Overflow>;
    /// End the session (what is still queued is discarded) for `why`.
    fn resync(&self, why: Resync);
}

/// The way up to the parent for what is not a catalog change (subtree membership, queries,
/// route acknowledgements).
pub trait ParentPort: Send + Sync {
    /// Queue `msg` for the parent, after everything queued before it.
    fn send(&self, msg: fed::ChildMessage) -> Result<(), Overflow>;
}

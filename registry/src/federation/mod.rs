//! Hierarchical federation: announcements up, queries up, answers and route
//! notifications down, over `xcc.federation.v1.Federation/Connect` streams dialled by children.
//!
//! Each module uses only those listed before it: `types` (the shared values) and `tree`;
//! `convert` and `grants` (over `types`); `level` (the index of what a level believes: no
//! transport, it hands plain messages to ports); `queues` (the sessions' bounded queues, the
//! ports' side); `session` (a child's stream), `upward` and `link` (the parent link); `imports`
//! and `kube_grants` beside them.

pub mod convert;
pub mod grants;
pub mod imports;
pub mod kube_grants;
pub mod level;
pub mod link;
pub mod queues;
pub mod session;
pub mod tree;
pub mod types;
pub mod upward;

pub use level::Level;
pub use types::{Question, Target};

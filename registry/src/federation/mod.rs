//! Hierarchical federation: announcements up, queries up, answers and route
//! notifications down, over `xcc.federation.v1.Federation/Connect` streams dialled by children.

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

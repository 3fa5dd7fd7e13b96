//! All integration tests of this crate in one binary (one link instead of one per file); each
//! module was a test binary of its own. Tests on a shared control plane (`xcc_testkube::shared`)
//! share one per binary, each in its own namespace.

mod crd_drift;
mod hamlet_vectors;

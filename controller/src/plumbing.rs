//! Small helpers every controller used to write for itself: a lock that survives a panicked
//! holder, and the API errors a reconcile treats as outcomes rather than failures.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Lock `m`, taking the data over from a holder that panicked: every value guarded this way is
/// left consistent between statements, so the panic lost no invariant (the panic itself is
/// reported by the task supervisor).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for reading an `RwLock`.
pub fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

/// [`lock`] for writing an `RwLock`.
pub fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

/// The API server answered 404: the object (or its API) is not there.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// The API server answered 409: another write won (a stale resourceVersion, a failed uid
/// precondition, an existing name).
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn api_errors_are_told_apart_by_code() {
        assert!(is_not_found(&api(404)) && !is_conflict(&api(404)));
        assert!(is_conflict(&api(409)) && !is_not_found(&api(409)));
        assert!(!is_not_found(&api(500)) && !is_conflict(&api(500)));
    }

    #[test]
    fn a_poisoned_lock_is_taken_over() {
        let m = std::sync::Arc::new(Mutex::new(1));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock().unwrap();
            panic!("holder panics");
        })
        .join();
        assert!(m.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
    }
}

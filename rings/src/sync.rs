//! The one place that chooses between loom's model-checked primitives and the real ones
//! (the crossbeam-utils pattern): under `--cfg loom` every atomic, fence and slot cell of the
//! ring goes through loom so its model checker sees each access.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering, fence};

#[cfg(not(loom))]
pub(crate) use core::sync::atomic::{AtomicU32, Ordering, fence};

/// Slot cell: loom's tracked `UnsafeCell` under loom (so a publish that is too weak shows up
/// as a data race on the slot), else a thin wrapper over `core::cell::UnsafeCell` with the
/// same closure-based interface.
#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(value: T) -> Self {
        Self(core::cell::UnsafeCell::new(value))
    }
}

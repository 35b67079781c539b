//! Plain-old-data entries: what may travel through a ring in shared memory.

/// A type whose values are plain bytes: `Copy`, no pointers or references, no padding that
/// matters, no drop glue, and **every bit pattern is a valid value**.
///
/// The ring copies entries out of memory another process may be writing at the same time, so
/// the consumer can observe any bytes at all; this trait is the promise that doing so is not
/// undefined behaviour. Validation of the *meaning* of those bytes is the reader's job
/// (e.g. [`crate::Descriptor::validate`]).
///
/// # Safety
/// Implementors guarantee that:
/// - every bit pattern of `size_of::<Self>()` bytes (including all zeroes) is a valid `Self`;
/// - `Self` holds no pointer, reference, or handle whose validity depends on the process
///   (values cross address spaces);
/// - `Self` has no interior mutability and no `Drop`.
pub unsafe trait Pod: Copy + Send + 'static {}

// SAFETY: integers accept every bit pattern and carry no pointers.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}
// SAFETY: as above.
unsafe impl Pod for u128 {}
// SAFETY: an array of `Pod` is `Pod`: no padding between elements, each element any bits.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// An all-zero value of a [`Pod`] type (used to initialise slots and output buffers).
pub fn zeroed<T: Pod>() -> T {
    // SAFETY: `T: Pod` promises that every bit pattern, all zeroes included, is a valid `T`.
    unsafe { core::mem::MaybeUninit::<T>::zeroed().assume_init() }
}

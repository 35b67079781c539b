//! The host swap area: KV pages copied out of the device pool into page-locked host memory
//! when a sequence is preempted, and back before it runs again.
//!
//! Allocated once when the backend is built (one `cuMemHostAlloc`, counted as a pinned
//! allocation like the staging ring), `[swap_pages, page]` in the byte layout of a KV page of
//! the arena (a page is contiguous there: `[layers, 2 (k, v), page_tokens, kv_dim]`). Nothing
//! here allocates after that.
//!
//! # Ordering
//! Every copy is enqueued on the backend's one stream, the stream every step, page copy and
//! cuBLAS call goes to; a stream runs its work in the order it was enqueued. That is the whole
//! argument, spelled out for the cases that matter while steps are pipelined (the engine may
//! have launched step t+1 before collecting step t):
//! - *Out after the writers.* A swap-out enqueued after the launches of steps t and t+1 starts
//!   only once both have finished, so it copies the KV values they wrote, not an earlier state
//!   of the page. The host never waits for it.
//! - *Page reuse after out.* Once `swap_out` returns, the engine may give the page to another
//!   sequence; whatever writes it next (a step, `copy_page`, a swap-in) is enqueued later and
//!   so runs after the copy has read the page.
//! - *In before the readers.* A swap-in enqueued before the launch of the step that reads the
//!   page has finished when that step starts. It also runs after every step launched before
//!   it, so a previous holder of the page (a step in flight that still reads or writes it)
//!   is done with it before the copy overwrites it.
//! - *Host slot reuse.* A host slot freed by a swap-in is only rewritten by a later swap-out,
//!   enqueued after the swap-in and so run after it has read the slot; the host itself never
//!   reads or writes the area. Hence the pinned source of an asynchronous host-to-device copy
//!   stays unchanged until the copy has run (the driver's requirement), without a host wait.
//!
//! The bytes are counted in the driver counters (`h2d_bytes`/`d2h_bytes`) and so land in the
//! ledger of the next step launched, like every other copy made between steps.

use super::driver::{DevBuf, Gpu, Pinned};
use crate::backend::BackendError;

/// The page-locked host memory that swapped-out KV pages live in.
pub struct SwapArea {
    /// `None` when the area holds no page (nothing is allocated then).
    host: Option<Pinned>,
    pages: usize,
    page_bytes: usize,
}

impl SwapArea {
    /// Allocate room for `pages` pages of `page_bytes` (pinned, zeroed), or nothing for 0.
    pub fn new(gpu: &mut Gpu, pages: usize, page_bytes: usize) -> Result<Self, BackendError> {
        let host = if pages == 0 {
            None
        } else {
            let bytes = pages.checked_mul(page_bytes).ok_or_else(|| {
                BackendError::Limits(format!("{pages} swap pages overflow the address space"))
            })?;
            Some(gpu.pinned(bytes).map_err(|e| {
                BackendError::Device(format!(
                    "cannot page-lock {bytes} bytes of host memory for the swap area \
                     ({pages} KV pages): {e}; lower --swap-space"
                ))
            })?)
        };
        Ok(SwapArea {
            host,
            pages,
            page_bytes,
        })
    }

    /// Pages the area holds.
    pub fn pages(&self) -> usize {
        self.pages
    }

    /// Enqueue copies of device pages `pages[i]` of the KV pool `kv` into host slots
    /// `host[i]` (checked by the caller). Runs of pages consecutive on both sides go as one
    /// copy.
    pub fn swap_out(
        &mut self,
        gpu: &mut Gpu,
        kv: DevBuf,
        pages: &[u32],
        host: &[u32],
    ) -> Result<(), BackendError> {
        let pb = self.page_bytes;
        let Some(area) = self.host.as_mut() else {
            return no_area(pages.len());
        };
        for (page, slot, n) in runs(pages, host) {
            let at = slot as usize * pb;
            gpu.download(area, at..at + n * pb, kv.at(page as usize * pb))?;
        }
        Ok(())
    }

    /// Enqueue copies of host slots `host[i]` into device pages `pages[i]` of the KV pool
    /// `kv` (checked by the caller). Runs as in [`SwapArea::swap_out`].
    pub fn swap_in(
        &mut self,
        gpu: &mut Gpu,
        kv: DevBuf,
        host: &[u32],
        pages: &[u32],
    ) -> Result<(), BackendError> {
        let pb = self.page_bytes;
        let Some(area) = self.host.as_ref() else {
            return no_area(pages.len());
        };
        for (page, slot, n) in runs(pages, host) {
            let at = slot as usize * pb;
            // Pinned and left unchanged until the stream has run this copy (module docs:
            // host slot reuse), so the copy is asynchronous and the driver stages nothing.
            gpu.upload(kv.at(page as usize * pb), &area.bytes()[at..at + n * pb])?;
        }
        Ok(())
    }
}

fn no_area(pages: usize) -> Result<(), BackendError> {
    if pages == 0 {
        Ok(())
    } else {
        Err(BackendError::Limits("the backend has no swap area".into()))
    }
}

/// Maximal runs `(first page, first slot, length)` over which both `pages` and `slots` count
/// up by one.
fn runs<'a>(pages: &'a [u32], slots: &'a [u32]) -> impl Iterator<Item = (u32, u32, usize)> + 'a {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= pages.len() {
            return None;
        }
        let start = i;
        i += 1;
        while i < pages.len()
            && pages[i] == pages[i - 1].wrapping_add(1)
            && slots[i] == slots[i - 1].wrapping_add(1)
        {
            i += 1;
        }
        Some((pages[start], slots[start], i - start))
    })
}

#[cfg(test)]
mod tests {
    use super::runs;

    #[test]
    fn runs_merge_pages_consecutive_on_both_sides() {
        let pages = [4, 5, 6, 9, 10, 2];
        let slots = [0, 1, 3, 4, 5, 6];
        let got: Vec<_> = runs(&pages, &slots).collect();
        assert_eq!(got, vec![(4, 0, 2), (6, 3, 1), (9, 4, 2), (2, 6, 1)]);
        assert_eq!(runs(&[], &[]).count(), 0);
    }
}

//! Per-step figures of the CUDA backend: which driver actions belong to which step, and when a
//! step finished on the host's clock.
//!
//! Steps overlap (the engine launches step t+1 before collecting step t), so a step's figures
//! cannot be read as "counters after collect minus counters before launch". Instead a mark
//! moves forward at the end of every `launch` and `collect`: what the driver was asked between
//! two marks belongs to the step that call launched or collected. Every counted action lands
//! in exactly one step, so the reports sum to the cumulative counters.

use std::time::{Duration, Instant};

use super::driver::{DriverCounters, Event, Gpu};
use crate::backend::{BackendError, StepReport};

/// The counters as of the last `launch` or `collect`.
#[derive(Debug, Clone, Copy)]
pub struct CounterMark(DriverCounters);

impl CounterMark {
    /// A mark at `now` (what happened before it belongs to no step: start-up).
    pub fn new(now: DriverCounters) -> Self {
        CounterMark(now)
    }

    /// Add what the driver did since the mark to `report`, and move the mark to `now`.
    pub fn charge(&mut self, now: DriverCounters, report: &mut StepReport) {
        let was = self.0;
        report.launches += now.launches - was.launches;
        report.graph_replays += now.graph_launches - was.graph_launches;
        report.graph_nodes += now.graph_nodes - was.graph_nodes;
        report.hard_syncs += now.hard_syncs - was.hard_syncs;
        report.policy_syncs += now.policy_syncs - was.policy_syncs;
        report.debug_syncs += now.debug_syncs - was.debug_syncs;
        report.h2d_bytes += now.h2d_bytes - was.h2d_bytes;
        report.d2h_bytes += now.d2h_bytes - was.d2h_bytes;
        report.device_allocs += now.device_allocs - was.device_allocs;
        report.pinned_allocs += now.pinned_allocs - was.pinned_allocs;
        self.0 = now;
    }
}

/// How old the anchor may grow before an idle collect renews it. Event times are f32
/// milliseconds since the anchor: at 2 s their resolution is about 0.1 µs, at an hour 0.25 ms.
const REANCHOR_AFTER: Duration = Duration::from_secs(2);

/// Maps device event times onto the host's clock: a reference event recorded on an idle stream
/// and the host instant at which the host saw it complete. A step's end on the host clock is
/// that instant plus `cuEventElapsedTime(reference, end)`.
///
/// The instant is taken after the wait returns, so it is late by the wake-up (a few µs): device
/// times map slightly late and observation lags computed from them are lower bounds. The
/// anchor is renewed whenever a collect leaves the stream idle and the anchor is older than
/// [`REANCHOR_AFTER`], which bounds both the f32 rounding and any drift between the clocks;
/// that renewal is a policy sync and never happens while steps are in flight.
pub struct DeviceClock {
    reference: Event,
    host: Instant,
}

impl DeviceClock {
    /// Anchor on `gpu`'s stream now (a policy sync).
    pub fn new(gpu: &mut Gpu) -> Result<Self, BackendError> {
        let reference = gpu.event(true)?;
        gpu.record(&reference)?;
        gpu.wait(&reference, true)?;
        Ok(DeviceClock {
            reference,
            host: Instant::now(),
        })
    }

    /// Host instant at which the completed timing event `end` happened on the device.
    pub fn host_time(&self, gpu: &Gpu, end: &Event) -> Result<Instant, BackendError> {
        let ms = gpu.elapsed_ms(&self.reference, end)?;
        // An end before the anchor cannot happen for a step collected after it; clamp anyway
        // so a rounding error never panics in Duration arithmetic.
        let since = Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3);
        Ok(self.host + since)
    }

    /// Renew the anchor if it is old and nothing is in flight (`idle`).
    pub fn renew_if_idle(&mut self, gpu: &mut Gpu, idle: bool) -> Result<(), BackendError> {
        if !idle || self.host.elapsed() < REANCHOR_AFTER {
            return Ok(());
        }
        gpu.record(&self.reference)?;
        gpu.wait(&self.reference, true)?;
        self.host = Instant::now();
        Ok(())
    }
}

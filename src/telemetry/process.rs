//! The gauges read when scraped rather than kept up to date: Tokio tasks alive, open file
//! descriptors, resident memory, the memory store's fill. A leak shows as a line that only
//! climbs. Reading them must never fail a scrape: a value that cannot be read is left as it was.

use std::sync::OnceLock;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::register::register;

type Fill = Box<dyn Fn() -> f64 + Send + Sync>;

#[derive(Default)]
pub(super) struct ProcessGauges {
    runtime_alive_tasks: Gauge,
    process_open_fds: Gauge,
    process_resident_memory_bytes: Gauge,
    /// Counters the memory store holds over its cap (0 on Redis).
    memory_store_fill_ratio: Gauge<f64, AtomicU64>,
    memory_fill: OnceLock<Fill>,
}

impl ProcessGauges {
    pub(super) fn register(&self, registry: &mut Registry, names: &mut Vec<String>) {
        register(
            registry,
            names,
            "runtime_alive_tasks",
            "Tokio tasks alive when scraped (calls in progress, connections, background work)",
            self.runtime_alive_tasks.clone(),
        );
        register(
            registry,
            names,
            "process_open_fds",
            "File descriptors this process holds when scraped (listeners, connections, files)",
            self.process_open_fds.clone(),
        );
        register(
            registry,
            names,
            "process_resident_memory_bytes",
            "Resident memory of this process when scraped (VmRSS)",
            self.process_resident_memory_bytes.clone(),
        );
        register(
            registry,
            names,
            "memory_store_fill_ratio",
            "Counters the memory store holds over --memory-max-counters, when scraped (at 1 new descriptors are answered by the failure mode)",
            self.memory_store_fill_ratio.clone(),
        );
    }

    pub(super) fn watch_memory_fill(&self, fill: Fill) {
        let _ = self.memory_fill.set(fill);
    }

    pub(super) fn sample(&self) {
        if let Some(fill) = self.memory_fill.get() {
            self.memory_store_fill_ratio.set(fill());
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let tasks = handle.metrics().num_alive_tasks();
            self.runtime_alive_tasks
                .set(i64::try_from(tasks).unwrap_or(i64::MAX));
        }
        if let Ok(entries) = std::fs::read_dir("/proc/self/fd") {
            // The directory handle reading the list is one of the entries: not counted.
            let fds = entries.count().saturating_sub(1);
            self.process_open_fds
                .set(i64::try_from(fds).unwrap_or(i64::MAX));
        }
        if let Some(kib) = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| resident_kib(&status))
        {
            self.process_resident_memory_bytes
                .set(i64::try_from(kib.saturating_mul(1024)).unwrap_or(i64::MAX));
        }
    }
}

/// `VmRSS:   1234 kB` from `/proc/self/status`.
fn resident_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
}

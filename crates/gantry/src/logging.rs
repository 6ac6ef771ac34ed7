//! Structured logs on stderr. The level starts at info (or `RUST_LOG`) so configuration
//! warnings are visible, and follows klog's `-v` once the configuration is known.

use tracing_subscriber::{EnvFilter, Registry, layer::SubscriberExt, reload, util::SubscriberInitExt};

/// kube's watcher warns on every failed attempt; Gantry's watch loops report failures
/// themselves, once per cause (`cluster::retry`), so its repeats stay out below -v=8.
const QUIET_WATCHER: &str = "kube_runtime::watcher=error";

pub struct Logging {
    handle: reload::Handle<EnvFilter, Registry>,
    from_env: bool,
}

pub fn init() -> Logging {
    let from_env = std::env::var_os("RUST_LOG").is_some();
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) => EnvFilter::new(with_quiet_watcher(&directives)),
        Err(_) => EnvFilter::new(format!("info,{QUIET_WATCHER}")),
    };
    let (layer, handle) = reload::Layer::new(filter);
    tracing_subscriber::registry()
        .with(layer)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .init();
    Logging { handle, from_env }
}

/// `RUST_LOG`'s directives, with kube's watcher kept quiet unless they say something of
/// `kube_runtime` themselves.
fn with_quiet_watcher(directives: &str) -> String {
    if directives.contains("kube_runtime") { directives.to_string() } else { format!("{directives},{QUIET_WATCHER}") }
}

impl Logging {
    /// Applies klog verbosity to Gantry's own crates: 0-3 info, 4-5 debug, 6+ trace; library
    /// internals (gRPC, HTTP/2) stay at info up to -v=7 (unless RUST_LOG decides).
    pub fn set_verbosity(&self, v: u8) {
        if self.from_env {
            return;
        }
        let ours = match v {
            0..=3 => "info",
            4..=5 => "debug",
            _ => "trace",
        };
        let libraries = if v >= 8 { "debug".to_string() } else { format!("info,{QUIET_WATCHER}") };
        let directives = format!(
            "{libraries},gantry={ours},gantry_agent={ours},gantry_server={ours},gantry_config={ours},gantry_logs={ours},gantry_pod={ours},gantry_cri={ours}"
        );
        let _ = self.handle.modify(|f| *f = EnvFilter::new(directives));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_keeps_the_watcher_quiet_unless_it_names_kube_runtime() {
        assert_eq!(with_quiet_watcher("debug"), "debug,kube_runtime::watcher=error");
        assert_eq!(with_quiet_watcher("info,kube_runtime=debug"), "info,kube_runtime=debug");
    }
}

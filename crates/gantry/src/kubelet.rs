//! `gantry kubelet`: resolve the configuration, set up logging and the async runtime, and run
//! the node agent (`gantry-node`) until a signal.

use std::process::ExitCode;

use gantry_config::{self as config, ConfigError, RUNONCE_DEPRECATION, Settings};
use gantry_node::Node;

use crate::version::{self, KubeletVersionFlag};
use crate::{code_pages, logging};

pub fn main(args: &[String]) -> ExitCode {
    let mut args = args.to_vec();
    match version::kubelet_flag(&mut args) {
        KubeletVersionFlag::Absent => {}
        KubeletVersionFlag::Print => {
            println!("{}", version::line());
            return ExitCode::SUCCESS;
        }
        KubeletVersionFlag::Raw => {
            println!("{}", version::info());
            return ExitCode::SUCCESS;
        }
        KubeletVersionFlag::Invalid(value) => {
            eprintln!("gantry kubelet: invalid value {value:?} for flag --version: true, false or raw");
            return ExitCode::from(2);
        }
    }
    let args = &args[..];
    let logging = logging::init();
    let settings = match config::load(args) {
        Ok(settings) => settings,
        Err(ConfigError::HelpRequested(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("gantry kubelet: {e}");
            return ExitCode::from(2);
        }
    };
    logging.set_verbosity(settings.verbosity);
    limit_malloc_arenas();
    // One worker: the agent waits on the runtime and the API server, and every extra worker
    // thread costs a stack and a malloc arena (measured: ~2 MiB RSS each, no latency gain).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .max_blocking_threads(BLOCKING_THREADS)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gantry kubelet: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(code) => code,
        Err(e) => {
            // The whole chain of causes, each said once (a message often repeats its cause).
            eprintln!("gantry kubelet: {}", gantry_agent::api::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// The blocking pool's bound (tokio's default is 512). Its threads hand file and cgroup I/O
/// off the async worker and each stays 10 s after its last task, so a steady trickle of such
/// tasks keeps many alive (35 threads at 110 pods before the bound). Followed container logs (`kubectl logs -f`) hold one
/// each while they stream, so the bound leaves room for several besides the pods' own I/O.
const BLOCKING_THREADS: usize = 16;

/// glibc gives each thread that allocates its own arena, which stays resident; the agent's
/// threads allocate little and rarely at once, so one shared arena is enough.
fn limit_malloc_arenas() {
    // SAFETY: called before any other thread exists; mallopt only adjusts allocator tuning.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the heap's free pages to the system once the pods settled after a burst: glibc
/// gives back only the top of its heap by itself, so the start-up peak stayed resident
/// (heaptrack at 110 pods: 19 MB live against 43.5 MiB anonymous RSS). Measured with the
/// density bench at 110 pods, together with sharing pods instead of copying them per event:
/// anonymous RSS 17.4 → 9.1 MiB without API objects, 38.6 → 19.7 MiB with a ConfigMap and
/// Secret per pod.
fn trim_malloc() {
    // SAFETY: malloc_trim only releases free memory; it is safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// What a settled node hands back: the heap's free pages, and the pages of its code mapped
/// from the binary (`code_pages`: file-backed RSS 17.9–18.3 → 13.6–15.5 MiB at 110 pods).
fn release_memory() {
    trim_malloc();
    code_pages::page_out();
}

async fn run(settings: Settings) -> anyhow::Result<ExitCode> {
    tracing::info!(node = %settings.node_name, "starting gantry kubelet: {}", settings.redacted_summary());
    apply_oom_score_adj(settings.oom_score_adj);
    if settings.run_once {
        tracing::warn!("{RUNONCE_DEPRECATION}");
        let results = gantry_node::run_once(&settings).await?;
        for r in &results {
            println!("{r}");
        }
        let failed: Vec<&str> = results.iter().filter(|r| r.error.is_some()).map(|r| r.pod.as_str()).collect();
        if !failed.is_empty() {
            anyhow::bail!("error running pods: {}", failed.join(", "));
        }
        tracing::info!(pods = results.len(), "pods started");
        return Ok(ExitCode::SUCCESS);
    }
    let shutdown = async {
        let signal = shutdown_signal().await;
        tracing::info!(signal, "shutting down; running pods keep running");
    };
    Node::new(settings).with_memory_release(release_memory).run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

/// Makes the agent one of the last processes the kernel's OOM killer picks (`oomScoreAdj`,
/// -999 by default), as upstream does at start-up. Like upstream, a failure (no privilege to
/// lower the score, no /proc) is logged and the agent goes on.
fn apply_oom_score_adj(value: i32) {
    const FILE: &str = "/proc/self/oom_score_adj";
    let current = std::fs::read_to_string(FILE);
    if current.as_deref().is_ok_and(|c| c.trim() == value.to_string()) {
        return;
    }
    match std::fs::write(FILE, value.to_string()) {
        Ok(()) => tracing::debug!(oom_score_adj = value, "applied the agent's oom_score_adj"),
        Err(e) => tracing::info!(oom_score_adj = value, error = %e, "Failed to ApplyOOMScoreAdj"),
    }
}

async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = term.recv() => "SIGTERM",
    }
}

//! Developer environment: a private containerd exactly as the tests run it.
//!
//! `gantry-devenv containerd --dir DIR` builds and imports the test images,
//! runs containerd rooted at DIR (socket DIR/containerd.sock) in the
//! foreground, and on SIGINT/SIGTERM removes all pods and stops it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use gantry_testkit::{Containerd, ContainerdOptions, prereq};
use tokio::signal::unix::{SignalKind, signal};

#[derive(Parser)]
#[command(about = "Gantry development environment")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a private containerd (CRI, CNI bridge, test images) until signalled.
    Containerd {
        /// Base directory: root/, state/, containerd.sock, config.toml, containerd.log.
        #[arg(long)]
        dir: PathBuf,
        /// Image tarball cache (default: $GANTRY_IMAGE_CACHE or <target>/gantry-images).
        #[arg(long, env = "GANTRY_IMAGE_CACHE")]
        image_cache: Option<PathBuf>,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let Cmd::Containerd { dir, image_cache } = Cli::parse().command;
    match run_containerd(dir, image_cache).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("gantry-devenv: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run_containerd(dir: PathBuf, image_cache: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(reason) = prereq::missing_prerequisite() {
        return Err(format!("cannot run containerd: {reason}").into());
    }
    // Subscribe before starting so an early signal is not lost.
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let options = ContainerdOptions { dir: Some(dir), image_cache };
    let mut ctd = Containerd::start_with(options).await?;
    // stdout carries only the endpoint, so scripts can capture it.
    println!("{}", ctd.endpoint());
    eprintln!(
        "containerd ready in {:?}: subnet {} on bridge {}, log {}",
        ctd.startup_time(),
        ctd.network().subnet(),
        ctd.network().bridge(),
        ctd.log_path().display()
    );
    let mut check = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = interrupt.recv() => break,
            _ = terminate.recv() => break,
            _ = check.tick() => {
                if let Some(status) = ctd.exit_status() {
                    let log = ctd.log_tail(20);
                    return Err(format!("containerd exited unexpectedly ({status}):\n{log}").into());
                }
            }
        }
    }
    eprintln!("stopping containerd (removing pods first)");
    drop(ctd);
    Ok(())
}

//! `gantry-test-apiserver`: runs the in-process test API server on its own, for trying
//! Gantry's cluster mode by hand. Writes an admin and a node kubeconfig and serves until
//! SIGINT/SIGTERM.

use std::path::PathBuf;

use clap::Parser;
use gantry_test_apiserver::{TestApiServer, User};

#[derive(Parser)]
#[command(about = "Run the Gantry test API server until interrupted")]
struct Args {
    /// Directory to write the kubeconfigs into.
    #[arg(long)]
    dir: PathBuf,
    /// Node name for the node kubeconfig.
    #[arg(long, default_value = "gantry-node")]
    node: String,
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let server = TestApiServer::start().await;
    let admin = server.kubeconfig(&args.dir, &User::Admin);
    let node = server.kubeconfig(&args.dir, &User::Node(args.node.clone()));
    println!("server: {}", server.url());
    println!("admin kubeconfig: {}", admin.display());
    println!("node kubeconfig ({}): {}", args.node, node.display());
    wait_for_signal().await;
    drop(server);
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

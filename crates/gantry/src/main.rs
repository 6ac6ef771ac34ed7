//! `gantry`: one binary, several commands. Invoked as `kubelet` (through a symlink) it is
//! `gantry kubelet`, so it can replace the Go kubelet in an existing systemd unit.

mod kubelet;
mod logging;
mod maintenance;
mod pods;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "gantry", version, about = "A Kubernetes node agent that talks to container runtimes through CRI v1")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent. Takes the Go kubelet's flags (see `gantry kubelet --help`).
    #[command(disable_help_flag = true)]
    Kubelet {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Show the pods a standalone node agent runs, from its status file.
    Pods {
        /// The node agent's --root-dir.
        #[arg(long, default_value = gantry_kubelet::config::DEFAULT_ROOT_DIR)]
        root_dir: PathBuf,
        /// Print the raw PodList JSON instead of a table.
        #[arg(long, short = 'o', value_parser = ["table", "json"], default_value = "table")]
        output: String,
    },
    /// Print the NodeMaintenance CustomResourceDefinition (maintenance.gantry.dev) as YAML.
    Crd,
    /// Run the NodeMaintenance controller (cordon, drain in plan order, restore).
    MaintenanceController {
        /// Kubeconfig to use; without it, the in-cluster service account.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        #[command(flatten)]
        options: maintenance::ControllerFlags,
    },
}

fn main() -> ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    if invoked_as_kubelet(argv.first().map(String::as_str)) {
        argv.insert(1, "kubelet".to_string());
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match cli.command {
        Command::Kubelet { args } => kubelet::main(&args),
        Command::Pods { root_dir, output } => pods::main(&root_dir, &output),
        Command::Crd => print_crd(),
        Command::MaintenanceController { kubeconfig, options } => {
            maintenance::controller(kubeconfig.as_deref(), &options)
        }
    }
}

fn print_crd() -> ExitCode {
    match gantry_maintenance::api::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gantry crd: {e}");
            ExitCode::FAILURE
        }
    }
}

fn invoked_as_kubelet(argv0: Option<&str>) -> bool {
    argv0.and_then(|a| Path::new(a).file_name()).is_some_and(|name| name == "kubelet")
}

//! `gantry`: one binary, several commands. Invoked as `kubelet` (through a symlink) it is
//! `gantry kubelet`, so it can replace the Go kubelet in an existing systemd unit; invoked as
//! `kubectl-maintenance` (found by kubectl on the PATH) it is `gantry maintenance`.

mod code_pages;
mod kubelet;
mod logging;
mod maintenance;
mod plugin;
mod pods;
mod version;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "gantry",
    about = "A Kubernetes node agent that talks to container runtimes through CRI v1",
    subcommand_required = true,
    arg_required_else_help = true
)]
struct Cli {
    /// Print the version as the Go kubelet does (`Kubernetes v1.34.0-…`) and exit.
    #[arg(long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
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
        #[arg(long, default_value = gantry_config::DEFAULT_ROOT_DIR)]
        root_dir: PathBuf,
        /// Print the PodList as (indented) JSON instead of a table.
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
    /// Create, list, inspect, complete and dry-run NodeMaintenances (the `kubectl maintenance` plugin).
    Maintenance(plugin::Plugin),
    /// Print the version and the build's git commit.
    Version {
        /// `json` for upstream's version info fields.
        #[arg(long, short = 'o', value_parser = ["line", "json"], default_value = "line")]
        output: String,
    },
    /// Print a shell completion script (bash, zsh, fish, …) for `gantry`.
    Completion { shell: clap_complete::Shell },
}

fn main() -> ExitCode {
    let mut argv: Vec<String> = std::env::args().collect();
    if let Some(command) = invoked_as(argv.first().map(String::as_str)) {
        if command == "maintenance" {
            argv[0] = "kubectl".to_string(); // usage lines then read `kubectl maintenance ...`
        }
        argv.insert(1, command.to_string());
    }
    if argv.get(1).is_some_and(|a| a == "--version") {
        println!("{}", version::line());
        return ExitCode::SUCCESS;
    }
    let cli = match Cli::try_parse_from(&argv) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let Some(command) = cli.command else { return ExitCode::SUCCESS };
    match command {
        Command::Kubelet { args } => kubelet::main(&args),
        Command::Pods { root_dir, output } => pods::main(&root_dir, &output),
        Command::Crd => print_crd(),
        Command::MaintenanceController { kubeconfig, options } => {
            maintenance::controller(kubeconfig.as_deref(), &options)
        }
        Command::Maintenance(p) => plugin::main(p),
        Command::Version { output } => {
            match output.as_str() {
                "json" => println!("{:#}", version::info()),
                _ => println!("{}", version::line()),
            }
            ExitCode::SUCCESS
        }
        Command::Completion { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut command, "gantry", &mut script);
            // A closed pipe (`| head`) is the reader's choice, not an error worth a panic.
            let _ = std::io::Write::write_all(&mut std::io::stdout(), &script);
            ExitCode::SUCCESS
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

/// The command a link name stands for: `kubelet`, or `kubectl-maintenance` (kubectl runs
/// plugins as `kubectl-<name>` with the remaining arguments).
fn invoked_as(argv0: Option<&str>) -> Option<&'static str> {
    let name = argv0.and_then(|a| Path::new(a).file_name())?.to_str()?;
    match name {
        "kubelet" => Some("kubelet"),
        "kubectl-maintenance" => Some("maintenance"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::invoked_as;

    #[test]
    fn link_names_select_the_command() {
        assert_eq!(invoked_as(Some("/usr/bin/kubelet")), Some("kubelet"));
        assert_eq!(invoked_as(Some("/home/u/bin/kubectl-maintenance")), Some("maintenance"));
        assert_eq!(invoked_as(Some("kubectl-maintenance")), Some("maintenance"));
        assert_eq!(invoked_as(Some("/usr/bin/gantry")), None);
        assert_eq!(invoked_as(None), None);
    }
}

//! `gantry maintenance <cmd>`, also `kubectl maintenance <cmd>` when the binary is linked as
//! `kubectl-maintenance`: the NodeMaintenance plugin. Only I/O lives here (kubeconfig, API
//! calls, printing); parsing and formatting are in `gantry_maintenance::cli`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};
use futures::StreamExt as _;
use gantry_maintenance::api::{NodeMaintenance, NodeSelector, Stage};
use gantry_maintenance::cli::{self, dry_run, selector, table};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::json;

const RESOURCE: &str = "nodemaintenance.maintenance.gantry.dev";

#[derive(Args)]
pub struct Plugin {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, as kubectl).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true)]
    context: Option<String>,
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct Target {
    /// Label selector of the nodes, kubectl syntax: `k=v,k2 in (a,b),!k3`.
    #[arg(long, short = 'l')]
    selector: Option<String>,
    /// Names of the nodes, comma separated.
    #[arg(long)]
    nodes: Option<String>,
}

impl Target {
    fn node_selector(&self) -> Result<NodeSelector, cli::FlagError> {
        match (&self.selector, &self.nodes) {
            (Some(s), _) => selector::parse_selector(s),
            (None, Some(n)) => selector::parse_nodes(n),
            (None, None) => unreachable!("clap requires one of --selector and --nodes"),
        }
    }
}

/// The drain's opt-ins for pods whose eviction loses something (kubectl drain's flags).
#[derive(Args)]
struct Losses {
    /// Also evict pods no controller owns; they are gone for good (spec.evictBarePods, like kubectl drain --force).
    #[arg(long)]
    evict_bare_pods: bool,
    /// Also evict pods with emptyDir volumes, deleting their data (spec.deleteEmptyDirData).
    #[arg(long)]
    delete_emptydir_data: bool,
}

impl Losses {
    fn apply(&self, m: &mut NodeMaintenance) {
        m.spec.evict_bare_pods = self.evict_bare_pods;
        m.spec.delete_empty_dir_data = self.delete_emptydir_data;
    }
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Create a NodeMaintenance for the selected nodes.
    Create {
        name: String,
        #[command(flatten)]
        target: Target,
        /// Starting stage: Idle (preview only), Cordon or Drain.
        #[arg(long, default_value = "Idle")]
        stage: String,
        /// Why, for humans (spec.reason).
        #[arg(long, default_value = "")]
        reason: String,
        #[command(flatten)]
        losses: Losses,
    },
    /// List NodeMaintenances.
    List,
    /// Show one NodeMaintenance per node: pods remaining and what blocks each.
    Status {
        name: String,
        /// Follow it: print it again whenever what it shows changes, until it is drained or
        /// complete (or deleted).
        #[arg(long, short = 'w')]
        watch: bool,
    },
    /// Move a NodeMaintenance to Complete: the controller uncordons and releases the nodes.
    Complete { name: String },
    /// Dry run: in plan order, which pods a drain would take from which nodes. Changes nothing.
    Plan {
        /// An existing NodeMaintenance; or give --selector/--nodes for a new one.
        #[arg(conflicts_with_all = ["selector", "nodes"], required_unless_present_any = ["selector", "nodes"])]
        name: Option<String>,
        #[arg(long, short = 'l', conflicts_with = "nodes")]
        selector: Option<String>,
        #[arg(long)]
        nodes: Option<String>,
        /// With --selector/--nodes; an existing NodeMaintenance's own spec decides otherwise.
        #[command(flatten)]
        losses: Losses,
    },
}

pub fn main(plugin: Plugin) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(plugin)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(plugin: Plugin) -> anyhow::Result<()> {
    // Flags are checked before any connection, so a typo fails fast and says which flag.
    match &plugin.command {
        PluginCommand::Create { name, target, stage, .. } => {
            cli::check_name(name)?;
            target.node_selector()?;
            cli::parse_stage(stage)?;
        }
        PluginCommand::Plan { selector: Some(s), .. } => drop(selector::parse_selector(s)?),
        PluginCommand::Plan { nodes: Some(n), .. } => drop(selector::parse_nodes(n)?),
        _ => {}
    }
    let client = client(plugin.kubeconfig, plugin.context).await?;
    let api: Api<NodeMaintenance> = Api::all(client.clone());
    match plugin.command {
        PluginCommand::Create { name, target, stage, reason, losses } => {
            let mut m = cli::new_maintenance(&name, target.node_selector()?, cli::parse_stage(&stage)?, &reason);
            losses.apply(&mut m);
            api.create(&PostParams::default(), &m).await.map_err(|e| api_error(e, &name))?;
            println!("{RESOURCE}/{name} created");
        }
        PluginCommand::List => {
            let items = api.list(&ListParams::default()).await.map_err(|e| api_error(e, ""))?.items;
            if items.is_empty() {
                eprintln!("No resources found");
            } else {
                print!("{}", table::list(&items, jiff::Timestamp::now()));
            }
        }
        PluginCommand::Status { name, watch } => {
            let m = api.get(&name).await.map_err(|e| api_error(e, &name))?;
            print!("{}", table::status(&m));
            if watch && !table::settled(&m) {
                follow(&api, &name, table::status(&m)).await?;
            }
        }
        PluginCommand::Complete { name } => {
            let patch = Patch::Merge(json!({"spec": {"stage": Stage::Complete}}));
            api.patch(&name, &PatchParams::default(), &patch).await.map_err(|e| api_error(e, &name))?;
            println!("{RESOURCE}/{name} patched (stage Complete)");
        }
        PluginCommand::Plan { name, selector: s, nodes, losses } => {
            let mut m = match (name, s, nodes) {
                (Some(name), _, _) => api.get(&name).await.map_err(|e| api_error(e, &name))?,
                (None, Some(s), _) => cli::new_maintenance("dry-run", selector::parse_selector(&s)?, Stage::Drain, ""),
                (None, None, Some(n)) => cli::new_maintenance("dry-run", selector::parse_nodes(&n)?, Stage::Drain, ""),
                (None, None, None) => bail!("give a NodeMaintenance NAME, --selector or --nodes"),
            };
            if m.metadata.resource_version.is_none() {
                losses.apply(&mut m);
            } else if losses.evict_bare_pods || losses.delete_emptydir_data {
                bail!(
                    "--evict-bare-pods and --delete-emptydir-data apply to --selector/--nodes; an existing maintenance uses its spec"
                );
            }
            let nodes =
                Api::<Node>::all(client.clone()).list(&ListParams::default()).await.context("cannot list nodes")?;
            let pods = Api::<Pod>::all(client).list(&ListParams::default()).await.context("cannot list pods")?;
            print!("{}", dry_run::render_plan(&m, &nodes.items, &pods.items));
        }
    }
    Ok(())
}

/// `status --watch`: one watch of the named maintenance; the status is printed again, after a
/// blank line, whenever its text changes, until the maintenance settles or is deleted.
async fn follow(api: &Api<NodeMaintenance>, name: &str, mut shown: String) -> anyhow::Result<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher::watcher(api.clone(), config).boxed();
    while let Some(event) = events.next().await {
        let m = match event.with_context(|| format!("watching {RESOURCE} {name:?}"))? {
            Event::Apply(m) | Event::InitApply(m) => m,
            Event::Delete(_) => {
                println!("\n{RESOURCE}/{name} deleted");
                return Ok(());
            }
            Event::Init | Event::InitDone => continue,
        };
        let text = table::status(&m);
        if text != shown {
            print!("\n{text}");
            shown = text;
        }
        if table::settled(&m) {
            return Ok(());
        }
    }
    Ok(())
}

/// The client kubectl would use: `--kubeconfig`, else `$KUBECONFIG`, `~/.kube/config`, then
/// the in-cluster service account (kube's inference order).
async fn client(kubeconfig: Option<PathBuf>, context: Option<String>) -> anyhow::Result<Client> {
    let options = KubeConfigOptions { context, ..Default::default() };
    let config = match kubeconfig {
        Some(path) => {
            let file =
                Kubeconfig::read_from(&path).with_context(|| format!("cannot read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .with_context(|| format!("kubeconfig {} is not usable", path.display()))?
        }
        None if options.context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .context("cannot load the kubeconfig ($KUBECONFIG or ~/.kube/config)")?,
        None => kube::Config::infer()
            .await
            .context("no usable kubeconfig ($KUBECONFIG, ~/.kube/config) or in-cluster config")?,
    };
    Client::try_from(config).context("cannot build the API client")
}

/// kubectl-like messages for the API errors a user can act on.
fn api_error(e: kube::Error, name: &str) -> anyhow::Error {
    match &e {
        kube::Error::Api(s) if s.code == 404 && (name.is_empty() || s.message.contains("requested resource")) => {
            anyhow::anyhow!(
                "the server does not know {RESOURCE} ({}); install the CRD with `gantry crd | kubectl apply -f -`",
                s.message
            )
        }
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!("{RESOURCE} {name:?} not found"),
        kube::Error::Api(s) if s.code == 409 => anyhow::anyhow!("{RESOURCE} {name:?} already exists"),
        kube::Error::Api(s) => anyhow::anyhow!("{} ({}): {}", s.reason, s.code, s.message),
        _ => anyhow::Error::new(e).context("cannot reach the API server"),
    }
}

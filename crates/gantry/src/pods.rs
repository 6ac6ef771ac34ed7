//! `gantry pods`: the standalone agent's pods as a table, the way `kubectl get pods -o wide`
//! shows them.

use std::path::Path;
use std::process::ExitCode;

use gantry_agent::status_store::{STATUS_FILE, read_pod_list};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::jiff::Timestamp;

pub fn main(root_dir: &Path, output: &str) -> ExitCode {
    let path = root_dir.join(STATUS_FILE);
    let pods = match read_pod_list(&path) {
        Ok(pods) => pods,
        Err(e) => return fail(&format!("{e}; is gantry kubelet running with --root-dir {}?", root_dir.display())),
    };
    if output == "json" {
        // The agent writes the file compact; people read it indented, as `kubectl -o json`.
        let list = k8s_openapi::List::<Pod> { items: pods, metadata: Default::default() };
        match serde_json::to_string_pretty(&list) {
            Ok(text) => println!("{text}"),
            Err(e) => return fail(&format!("{}: {e}", path.display())),
        }
    } else {
        print!("{}", table(&pods, Timestamp::now()));
    }
    ExitCode::SUCCESS
}

fn fail(message: &str) -> ExitCode {
    eprintln!("gantry pods: {message}");
    ExitCode::FAILURE
}

pub fn table(pods: &[Pod], now: Timestamp) -> String {
    let mut rows = vec![["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"].map(String::from).to_vec()];
    for pod in pods {
        let status = pod.status.clone().unwrap_or_default();
        let (ready, total, restarts) = counts(pod);
        let age = status.start_time.map(|t| age(now, t.0)).unwrap_or_else(|| "<none>".into());
        rows.push(vec![
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
            format!("{ready}/{total}"),
            display_status(pod),
            restarts.to_string(),
            age,
            status.pod_ip.unwrap_or_else(|| "<none>".into()),
        ]);
    }
    let widths: Vec<usize> = (0..rows[0].len()).map(|i| rows.iter().map(|r| r[i].len()).max().unwrap_or(0)).collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            format!("{}\n", cells.join("   ").trim_end())
        })
        .collect()
}

/// The READY and RESTARTS columns as kubectl counts them: regular containers and sidecars
/// (a sidecar is ready once started and ready).
fn counts(pod: &Pod) -> (usize, usize, i32) {
    let status = pod.status.clone().unwrap_or_default();
    let containers = status.container_statuses.unwrap_or_default();
    let sidecars: Vec<ContainerStatus> =
        status.init_container_statuses.unwrap_or_default().into_iter().filter(|s| is_sidecar(pod, &s.name)).collect();
    let ready = containers.iter().filter(|c| c.ready).count()
        + sidecars.iter().filter(|s| s.ready && s.started == Some(true)).count();
    let restarts = containers.iter().chain(&sidecars).map(|c| c.restart_count).sum();
    (ready, containers.len() + sidecars.len(), restarts)
}

fn is_sidecar(pod: &Pod, name: &str) -> bool {
    gantry_vocab::spec::sidecars(pod).any(|c| c.name == name)
}

/// The STATUS column as kubectl computes it: an init step, a container's waiting or
/// terminated reason, or the phase.
fn display_status(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_else(|| "Unknown".into());
    let inits = status.init_container_statuses.unwrap_or_default();
    for (i, c) in inits.iter().enumerate().filter(|(_, c)| !is_sidecar(pod, &c.name)) {
        let state = c.state.clone().unwrap_or_default();
        if let Some(t) = state.terminated.filter(|t| t.exit_code != 0) {
            return format!("Init:{}", t.reason.unwrap_or_else(|| format!("ExitCode:{}", t.exit_code)));
        }
        if let Some(w) = state.waiting.and_then(|w| w.reason).filter(|r| r != "PodInitializing") {
            return format!("Init:{w}");
        }
        if !c.ready {
            return format!("Init:{i}/{}", inits.len());
        }
    }
    let containers = status.container_statuses.unwrap_or_default();
    containers.iter().rev().find_map(reason).unwrap_or(phase)
}

fn reason(c: &ContainerStatus) -> Option<String> {
    let state = c.state.clone()?;
    if let Some(w) = state.waiting {
        return w.reason;
    }
    state.terminated.map(|t| t.reason.unwrap_or_else(|| format!("ExitCode:{}", t.exit_code)))
}

fn age(now: Timestamp, then: Timestamp) -> String {
    let secs = (now.as_second() - then.as_second()).max(0);
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateWaiting, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn status(name: &str, ready: bool, waiting: Option<&str>) -> ContainerStatus {
        ContainerStatus {
            name: name.into(),
            ready,
            restart_count: 2,
            state: Some(ContainerState {
                waiting: waiting.map(|r| ContainerStateWaiting { reason: Some(r.into()), message: None }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn pod(init: Vec<ContainerStatus>, containers: Vec<ContainerStatus>) -> Pod {
        Pod {
            metadata: ObjectMeta { name: Some("web".into()), namespace: Some("default".into()), ..Default::default() },
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("10.244.0.2".into()),
                init_container_statuses: Some(init),
                container_statuses: Some(containers),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn status_column_follows_kubectl() {
        assert_eq!(display_status(&pod(vec![], vec![status("a", true, None)])), "Running");
        assert_eq!(
            display_status(&pod(vec![], vec![status("a", false, Some("CrashLoopBackOff"))])),
            "CrashLoopBackOff"
        );
        assert_eq!(
            display_status(&pod(vec![status("i", false, None)], vec![status("a", false, Some("PodInitializing"))])),
            "Init:0/1"
        );
        assert_eq!(display_status(&pod(vec![status("i", false, Some("ErrImagePull"))], vec![])), "Init:ErrImagePull");
    }

    #[test]
    fn table_lists_ready_restarts_and_ip() {
        let text = table(&[pod(vec![], vec![status("a", true, None), status("b", false, None)])], Timestamp::now());
        let row = text.lines().nth(1).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells, ["default", "web", "1/2", "Running", "4", "<none>", "10.244.0.2"]);
    }

    #[test]
    fn sidecars_count_in_ready_and_restarts() {
        let mut p = pod(
            vec![ContainerStatus { started: Some(true), ..status("proxy", true, None) }],
            vec![status("a", true, None)],
        );
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            init_containers: Some(vec![k8s_openapi::api::core::v1::Container {
                name: "proxy".into(),
                restart_policy: Some("Always".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let text = table(&[p.clone()], Timestamp::now());
        let cells: Vec<&str> = text.lines().nth(1).unwrap().split_whitespace().collect();
        assert_eq!(cells[2..5], ["2/2", "Running", "4"]);
        assert_eq!(display_status(&p), "Running", "a running sidecar is no init step");
    }
}

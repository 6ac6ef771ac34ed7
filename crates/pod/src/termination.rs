//! The order in which a pod's containers stop (upstream `terminationOrdering`): regular
//! containers stop at once; a sidecar waits until every regular container and every sidecar
//! declared after it has stopped, so sidecars stop in reverse order, serving the others to
//! the end. Everyone's preStop hook runs at once, and the waiting is bounded by the grace period.

use k8s_openapi::api::core::v1::Pod;

use gantry_vocab::spec;

/// The containers among `running` that must have stopped before container `name` is stopped.
pub fn stop_after<'a>(pod: &Pod, name: &str, running: &[&'a str]) -> Vec<&'a str> {
    let init = spec::init_containers(pod);
    let Some(position) = init.iter().position(|c| c.name == name && spec::is_sidecar(c)) else {
        return Vec::new();
    };
    let later_sidecar = |n: &str| init.iter().skip(position + 1).any(|c| c.name == n && spec::is_sidecar(c));
    let is_earlier_sidecar = |n: &str| init.iter().take(position + 1).any(|c| c.name == n && spec::is_sidecar(c));
    running.iter().copied().filter(|n| later_sidecar(n) || !is_earlier_sidecar(n)).collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    use super::*;

    fn pod() -> Pod {
        let c = |name: &str, sidecar: bool| Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".into()),
            ..Default::default()
        };
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![c("log", true), c("setup", false), c("proxy", true)]),
                containers: vec![c("app", false), c("worker", false)],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn regular_containers_first_then_sidecars_in_reverse() {
        let p = pod();
        let running = ["log", "proxy", "app", "worker"];
        assert!(stop_after(&p, "app", &running).is_empty());
        assert!(stop_after(&p, "worker", &running).is_empty());
        assert_eq!(stop_after(&p, "proxy", &running), ["app", "worker"]);
        assert_eq!(stop_after(&p, "log", &running), ["proxy", "app", "worker"]);
        assert_eq!(stop_after(&p, "log", &["log", "app"]), ["app"], "only what still runs");
    }
}

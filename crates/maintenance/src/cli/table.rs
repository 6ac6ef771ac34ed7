//! kubectl-style tables for `list` and `status`: upper-case headers, columns padded to the
//! widest cell plus three spaces, `<none>` for missing values, ages as kubectl prints them.

use jiff::Timestamp;

use crate::api::{CONDITION_DRAINED, NodeMaintenance, Stage};
use crate::plan::effective_drain_plan;

const NONE: &str = "<none>";

/// Aligns rows under the header like kubectl's printer (no trailing spaces).
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| rows.iter().map(|r| r[i].chars().count()).chain([header[i].len()]).max().unwrap_or(0))
        .collect();
    let line = |cells: Vec<&str>| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i + 1 < cells.len() {
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 3));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

/// kubectl's `HumanDuration`: 45s, 3m20s, 12m, 5h30m, 2d3h, 400d, 3y20d.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    let s = seconds.max(0);
    let (m, h) = (s / 60, s / 3600);
    let with = |big: i64, unit: &str, small: i64, small_unit: &str| {
        if small == 0 { format!("{big}{unit}") } else { format!("{big}{unit}{small}{small_unit}") }
    };
    if s < 120 {
        format!("{s}s")
    } else if m < 10 {
        with(m, "m", s % 60, "s")
    } else if m < 180 {
        format!("{m}m")
    } else if h < 8 {
        with(h, "h", m % 60, "m")
    } else if h < 48 {
        format!("{h}h")
    } else if h < 24 * 8 {
        with(h / 24, "d", h % 24, "h")
    } else if h < 24 * 365 * 2 {
        format!("{}d", h / 24)
    } else if h < 24 * 365 * 8 {
        with(h / 24 / 365, "y", (h / 24) % 365, "d")
    } else {
        format!("{}y", h / 24 / 365)
    }
}

fn age(m: &NodeMaintenance, now: Timestamp) -> String {
    match &m.metadata.creation_timestamp {
        Some(t) => human_duration(now.as_second() - t.0.as_second()),
        None => NONE.into(),
    }
}

fn drained(m: &NodeMaintenance) -> String {
    let conditions = m.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    conditions.iter().find(|c| c.type_ == CONDITION_DRAINED).map_or(NONE.into(), |c| c.status.clone())
}

/// Where `status --watch` stops following: the drain is done, or the maintenance is over.
pub fn settled(m: &NodeMaintenance) -> bool {
    m.spec.stage == Stage::Complete || drained(m) == "True"
}

fn or_none(s: &str) -> String {
    if s.is_empty() { NONE.into() } else { s.to_string() }
}

/// `list`: NAME STAGE NODES DRAINED AGE REASON, sorted by name as kubectl does.
pub fn list(maintenances: &[NodeMaintenance], now: Timestamp) -> String {
    let mut sorted: Vec<&NodeMaintenance> = maintenances.iter().collect();
    sorted.sort_by_key(|m| m.metadata.name.clone());
    let rows: Vec<Vec<String>> = sorted
        .iter()
        .map(|m| {
            let nodes = m.status.as_ref().map_or(0, |s| s.node_statuses.len());
            vec![
                m.metadata.name.clone().unwrap_or_default(),
                m.spec.stage.as_str().to_string(),
                nodes.to_string(),
                drained(m),
                age(m, now),
                or_none(&m.spec.reason),
            ]
        })
        .collect();
    render(&["NAME", "STAGE", "NODES", "DRAINED", "AGE", "REASON"], &rows)
}

/// `status NAME`: a short summary, then one row per node and one more per extra blocking pod.
pub fn status(m: &NodeMaintenance) -> String {
    let status = m.status.clone().unwrap_or_default();
    let plan = effective_drain_plan(m);
    let mut out = format!(
        "Name:     {}\nStage:    {}\nReason:   {}\nDrained:  {}\nDrain:    {} of {} plan entries reached, {} pods pending eviction, {} evictions active\n",
        m.metadata.name.as_deref().unwrap_or_default(),
        m.spec.stage.as_str(),
        or_none(&m.spec.reason),
        drained(m),
        status.drain_status.reached_drain_targets.len(),
        plan.len(),
        status.drain_status.pods_pending_eviction,
        status.drain_status.active_evictions,
    );
    for c in status.conditions.iter().filter(|c| c.status == "True" && c.type_ != CONDITION_DRAINED) {
        out.push_str(&format!("Condition: {} ({}): {}\n", c.type_, c.reason, c.message));
    }
    out.push('\n');
    if status.node_statuses.is_empty() {
        out.push_str("No nodes reported yet (the controller writes them on its first reconcile).\n");
        return out;
    }
    let mut rows = Vec::new();
    for node in &status.node_statuses {
        let mut first = vec![
            node.node_name.clone(),
            m.spec.stage.as_str().to_string(),
            node.pods_remaining.to_string(),
            NONE.to_string(),
            or_none(&node.drain_message),
        ];
        match node.blocking_pods.split_first() {
            None => rows.push(first),
            Some((head, rest)) => {
                first[3] = format!("{}/{}", head.namespace, head.name);
                first[4] = head.reason.clone();
                rows.push(first);
                for pod in rest {
                    let pod_name = format!("{}/{}", pod.namespace, pod.name);
                    rows.push(vec![String::new(), String::new(), String::new(), pod_name, pod.reason.clone()]);
                }
            }
        }
    }
    out.push_str(&render(&["NODE", "STAGE", "PODS REMAINING", "BLOCKING POD", "REASON"], &rows));
    out
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::api::{BlockingPod, Condition, NodeMaintenanceStatus, NodeSelector, NodeStatus, Stage};
    use crate::cli::new_maintenance;
    use crate::fixtures::now;

    #[test]
    fn durations_print_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (0, "0s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (3 * 3600, "3h"),
            (5 * 3600 + 30 * 60, "5h30m"),
            (30 * 3600, "30h"),
            (51 * 3600, "2d3h"),
            (400 * 86400, "400d"),
            ((3 * 365 + 20) * 86400, "3y20d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    fn maintenance(name: &str, stage: Stage, reason: &str) -> NodeMaintenance {
        let mut m = new_maintenance(name, NodeSelector::default(), stage, reason);
        m.metadata.creation_timestamp = Some(Time(now() - jiff::SignedDuration::from_secs(200)));
        m
    }

    #[test]
    fn list_is_a_sorted_aligned_table() {
        let mut drained = maintenance("b-kernel", Stage::Drain, "kernel upgrade");
        drained.status = Some(NodeMaintenanceStatus {
            node_statuses: vec![NodeStatus { node_name: "n1".into(), ..Default::default() }; 2],
            conditions: vec![Condition { type_: "Drained".into(), status: "True".into(), ..Default::default() }],
            ..Default::default()
        });
        let table = list(&[drained, maintenance("a", Stage::Idle, "")], now());
        assert_eq!(
            table,
            "NAME       STAGE   NODES   DRAINED   AGE     REASON\n\
             a          Idle    0       <none>    3m20s   <none>\n\
             b-kernel   Drain   2       True      3m20s   kernel upgrade\n"
        );
    }

    #[test]
    fn status_lists_each_blocking_pod_with_its_reason() {
        let mut m = maintenance("m", Stage::Drain, "disk");
        let blocking = |name: &str, reason: &str| BlockingPod {
            namespace: "default".into(),
            name: name.into(),
            reason: reason.into(),
        };
        m.status = Some(NodeMaintenanceStatus {
            node_statuses: vec![
                NodeStatus {
                    node_name: "n1".into(),
                    pods_remaining: 2,
                    drain_message: "Draining".into(),
                    blocking_pods: vec![
                        blocking("web-b", "PodDisruptionBudget default/web allows no more disruptions"),
                        blocking("db-0", "terminating"),
                    ],
                    ..Default::default()
                },
                NodeStatus { node_name: "n2".into(), drain_message: "Drained".into(), ..Default::default() },
            ],
            ..Default::default()
        });
        let text = status(&m);
        assert!(text.contains("Stage:    Drain\n"), "{text}");
        assert!(text.contains("0 of 12 plan entries reached"), "{text}");
        let table: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("NODE")).collect();
        assert_eq!(
            table,
            [
                "NODE   STAGE   PODS REMAINING   BLOCKING POD    REASON",
                "n1     Drain   2                default/web-b   PodDisruptionBudget default/web allows no more disruptions",
                "                                default/db-0    terminating",
                "n2     Drain   0                <none>          Drained",
            ]
        );
    }

    #[test]
    fn following_stops_once_drained_or_complete() {
        let with_drained = |stage, value: &str| {
            let mut m = maintenance("m", stage, "");
            m.status = Some(NodeMaintenanceStatus {
                conditions: vec![Condition { type_: "Drained".into(), status: value.into(), ..Default::default() }],
                ..Default::default()
            });
            m
        };
        assert!(!settled(&maintenance("m", Stage::Drain, "")), "no status yet");
        assert!(!settled(&with_drained(Stage::Drain, "False")));
        assert!(!settled(&maintenance("m", Stage::Cordon, "")));
        assert!(settled(&with_drained(Stage::Drain, "True")));
        assert!(settled(&maintenance("m", Stage::Complete, "")));
    }

    #[test]
    fn status_without_nodes_says_so() {
        assert!(status(&maintenance("m", Stage::Idle, "")).contains("No nodes reported yet"));
    }
}

//! `/metrics/resource`: the Prometheus text metrics-server reads, with upstream's names,
//! labels, help texts and sample timestamps (the time each value was measured), rendered from
//! a summary (pure).

use std::fmt::Write;

use k8s_openapi::jiff::Timestamp;

use super::types::Summary;

struct Family {
    name: &'static str,
    help: &'static str,
    kind: &'static str,
    samples: Vec<(String, f64, Option<i64>)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Family { name, help, kind, samples: Vec::new() }
    }
    fn push(&mut self, labels: String, value: f64, time: &str) {
        let ms = time.parse::<Timestamp>().ok().map(|t| t.as_millisecond());
        self.samples.push((labels, value, ms));
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Renders the resource metrics; `scrape_error` is 1 when the summary could not be built.
pub fn render(summary: Option<&Summary>) -> String {
    let mut node_cpu = Family::new(
        "node_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
    );
    let mut node_mem =
        Family::new("node_memory_working_set_bytes", "gauge", "[STABLE] Current working set of the node in bytes");
    let mut c_cpu = Family::new(
        "container_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the container in core-seconds",
    );
    let mut c_mem = Family::new(
        "container_memory_working_set_bytes",
        "gauge",
        "[STABLE] Current working set of the container in bytes",
    );
    let mut c_start = Family::new(
        "container_start_time_seconds",
        "gauge",
        "[STABLE] Start time of the container since unix epoch in seconds",
    );
    let mut p_cpu = Family::new(
        "pod_cpu_usage_seconds_total",
        "counter",
        "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
    );
    let mut p_mem =
        Family::new("pod_memory_working_set_bytes", "gauge", "[STABLE] Current working set of the pod in bytes");
    let mut scrape = Family::new(
        "scrape_error",
        "gauge",
        "[ALPHA] 1 if there was an error while getting container metrics, 0 otherwise",
    );
    scrape.samples.push((String::new(), if summary.is_some() { 0.0 } else { 1.0 }, None));

    if let Some(s) = summary {
        if let Some(cpu) = &s.node.cpu
            && let Some(t) = cpu.usage_core_nano_seconds
        {
            node_cpu.push(String::new(), t as f64 / 1e9, &cpu.time);
        }
        if let Some(m) = &s.node.memory
            && let Some(ws) = m.working_set_bytes
        {
            node_mem.push(String::new(), ws as f64, &m.time);
        }
        for pod in &s.pods {
            let (ns, name) = (escape(&pod.pod_ref.namespace), escape(&pod.pod_ref.name));
            for c in &pod.containers {
                let labels = format!("container=\"{}\",namespace=\"{ns}\",pod=\"{name}\"", escape(&c.name));
                if let Some(cpu) = &c.cpu
                    && let Some(t) = cpu.usage_core_nano_seconds
                {
                    c_cpu.push(labels.clone(), t as f64 / 1e9, &cpu.time);
                }
                if let Some(m) = &c.memory
                    && let Some(ws) = m.working_set_bytes
                {
                    c_mem.push(labels.clone(), ws as f64, &m.time);
                }
                if let Ok(start) = c.start_time.parse::<Timestamp>() {
                    let secs = start.as_nanosecond() as f64 / 1e9;
                    c_start.push(labels, secs, &c.start_time);
                }
            }
            let labels = format!("namespace=\"{ns}\",pod=\"{name}\"");
            if let Some(cpu) = &pod.cpu
                && let Some(t) = cpu.usage_core_nano_seconds
            {
                p_cpu.push(labels.clone(), t as f64 / 1e9, &cpu.time);
            }
            if let Some(m) = &pod.memory
                && let Some(ws) = m.working_set_bytes
            {
                p_mem.push(labels, ws as f64, &m.time);
            }
        }
    }
    let mut out = String::new();
    for f in [c_cpu, c_mem, c_start, node_cpu, node_mem, p_cpu, p_mem, scrape] {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (labels, value, ms) in f.samples {
            let labels = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
            match ms {
                Some(ms) => {
                    let _ = writeln!(out, "{}{labels} {value} {ms}", f.name);
                }
                None => {
                    let _ = writeln!(out, "{}{labels} {value}", f.name);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::types::*;

    #[test]
    fn renders_upstream_series() {
        let t = "2024-01-01T00:00:00Z".to_string();
        let s = Summary {
            node: NodeStats {
                cpu: Some(CpuStats {
                    time: t.clone(),
                    usage_core_nano_seconds: Some(2_500_000_000),
                    ..Default::default()
                }),
                memory: Some(MemoryStats { time: t.clone(), working_set_bytes: Some(1024), ..Default::default() }),
                ..Default::default()
            },
            pods: vec![PodStats {
                pod_ref: PodReference { name: "web".into(), namespace: "default".into(), uid: "u".into() },
                containers: vec![ContainerStats {
                    name: "app".into(),
                    start_time: "2023-12-31T23:59:00Z".into(),
                    memory: Some(MemoryStats { time: t.clone(), working_set_bytes: Some(77), ..Default::default() }),
                    ..Default::default()
                }],
                memory: Some(MemoryStats { time: t.clone(), working_set_bytes: Some(77), ..Default::default() }),
                ..Default::default()
            }],
        };
        let text = render(Some(&s));
        assert!(text.contains("node_cpu_usage_seconds_total 2.5 1704067200000\n"), "{text}");
        assert!(text.contains("node_memory_working_set_bytes 1024 1704067200000\n"), "{text}");
        assert!(
            text.contains(
                "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 77 "
            )
        );
        assert!(
            text.contains(
                "container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1704067140 "
            )
        );
        assert!(text.contains("pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 77 "));
        assert!(text.contains("# TYPE container_cpu_usage_seconds_total counter\n"));
        assert!(text.contains("scrape_error 0\n"));
        assert!(render(None).contains("scrape_error 1\n"));
    }
}

//! End-to-end: RunOnce mode (KEP-4580), refused without its feature gate.

mod common;

use std::process::Command;

use common::{Env, pod_yaml, static_name};

fn gantry(args: &[String]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gantry")).arg("kubelet").args(args).output().expect("run gantry")
}

#[test]
fn runonce_is_refused_without_the_feature_gate() {
    let out = gantry(&["--runonce".into(), "--pod-manifest-path=/nonexistent".into()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("LegacyNodeRunOnceMode"), "{stderr}");
    assert!(stderr.contains("deprecated"), "{stderr}");
}

#[tokio::test]
async fn runonce_with_the_gate_runs_pods_reports_and_exits() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest("a.yaml", &pod_yaml("a", "sleep 3600", ""));
    env.write_manifest("b.yaml", &pod_yaml("b", "sleep 3600", ""));
    let mut args = env.args();
    args.extend(["--runonce".to_string(), "--feature-gates=LegacyNodeRunOnceMode=true".to_string()]);
    let out = tokio::task::spawn_blocking(move || gantry(&args)).await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("RunOnce mode is deprecated"), "deprecation warning logged:\n{stderr}");
    for name in ["a", "b"] {
        let line = format!("pod default/{}: running", static_name(name));
        assert!(stdout.lines().any(|l| l == line), "missing {line:?} in:\n{stdout}");
        assert_eq!(env.running(&static_name(name)).await.len(), 1, "containers keep running after exit");
    }
}

#[tokio::test]
async fn runonce_reports_a_failed_pod_and_exits_non_zero() {
    let Some(env) = Env::start().await else { return };
    env.write_manifest("ok.yaml", &pod_yaml("ok", "sleep 3600", ""));
    // A command that cannot start, so the container is never seen running (a quick `exit 1`
    // can be, for an instant, which is upstream's rule too).
    let bad = pod_yaml("bad", "", "  restartPolicy: Never\n").replace(r#"["sh", "-c", ""]"#, r#"["/no-such-command"]"#);
    env.write_manifest("bad.yaml", &bad);
    let mut args = env.args();
    args.extend(["--runonce=true".to_string(), "--feature-gates=LegacyNodeRunOnceMode=true".to_string()]);
    let out = tokio::task::spawn_blocking(move || gantry(&args)).await.unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let bad = static_name("bad");
    assert!(stdout.contains(&format!("pod default/{bad}: failed")), "{stdout}");
    assert!(stdout.contains(&format!("pod default/{}: running", static_name("ok"))), "{stdout}");
    assert!(stderr.contains(&format!("error running pods: default/{bad}")), "{stderr}");
}

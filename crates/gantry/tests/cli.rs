//! End-to-end: the binary's command line, without a runtime.

use std::process::Command;

fn run(argv0_dir: Option<&std::path::Path>, args: &[&str]) -> (bool, String, String) {
    let program = match argv0_dir {
        Some(dir) => {
            let link = dir.join("kubelet");
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gantry"), &link).unwrap();
            link
        }
        None => env!("CARGO_BIN_EXE_gantry").into(),
    };
    let out = Command::new(program).args(args).output().expect("run gantry");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn invoked_as_kubelet_it_is_gantry_kubelet() {
    let dir = tempfile::tempdir().unwrap();
    let (ok, stdout, _) = run(Some(dir.path()), &["--help"]);
    assert!(ok);
    assert!(stdout.contains("--pod-manifest-path"), "{stdout}");
    let (ok, _, stderr) = run(None, &["kubelet", "--network-plugin=cni"]);
    assert!(!ok);
    assert!(stderr.contains("--network-plugin") && stderr.contains("dockershim"), "{stderr}");
}

#[test]
fn a_bad_config_file_stops_startup_naming_file_field_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubelet.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfileCheckFrequency: soon\n",
    )
    .unwrap();
    let (ok, _, stderr) = run(None, &["kubelet", &format!("--config={}", config.display())]);
    assert!(!ok);
    assert!(stderr.contains(&config.display().to_string()), "{stderr}");
    assert!(stderr.contains("fileCheckFrequency"), "{stderr}");

    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodPth: /x\n",
    )
    .unwrap();
    let (ok, _, stderr) = run(None, &["kubelet", &format!("--config={}", config.display())]);
    assert!(!ok);
    assert!(stderr.contains("staticPodPth"), "unknown field named: {stderr}");
}

#[test]
fn unknown_flags_are_named() {
    let (ok, _, stderr) = run(None, &["kubelet", "--pod-manifest-pth=/x"]);
    assert!(!ok);
    assert!(stderr.contains("--pod-manifest-pth"), "{stderr}");
}

/// On a cgroup v1 host, `failCgroupV1: true` stops start-up with upstream's message, and
/// without it a warning says v1 is deprecated (the v2 side runs in `vm_node.rs`).
#[test]
fn fail_cgroup_v1_on_a_v1_host() {
    use gantry_agent::runtime::cgroups::{self, Hierarchy};
    if cgroups::hierarchy(std::path::Path::new(cgroups::MOUNT)) != Some(Hierarchy::V1) {
        eprintln!("not a cgroup v1 host: nothing to check here");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kubelet.yaml");
    let start = |fail: bool| {
        let yaml = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nenableServer: false\nfailCgroupV1: {fail}\n"
        );
        std::fs::write(&config, yaml).unwrap();
        let args = [
            "kubelet".to_string(),
            format!("--config={}", config.display()),
            format!("--root-dir={}", dir.path().join("root").display()),
            format!("--pod-manifest-path={}", dir.path().display()),
            // Nothing listens here: start-up ends at the runtime if the cgroup check passed.
            format!("--container-runtime-endpoint=unix://{}", dir.path().join("none.sock").display()),
        ];
        run(None, &args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let (ok, _, stderr) = start(true);
    assert!(!ok);
    assert!(stderr.contains("kubelet is configured to not run on a host using cgroup v1"), "{stderr}");
    let (ok, _, stderr) = start(false);
    assert!(!ok, "no runtime to connect to");
    assert!(
        stderr.contains("cgroup v1 detected. cgroup v1 support has been transitioned into maintenance mode"),
        "{stderr}"
    );
    assert!(!stderr.contains("configured to not run"), "{stderr}");
}

#[test]
fn versions_read_as_the_go_kubelet_prints_them() {
    let reported = gantry_vocab::keys::KUBELET_VERSION;
    for args in [&["--version"][..], &["kubelet", "--version"], &["kubelet", "--version=true"], &["version"]] {
        let (ok, stdout, stderr) = run(None, args);
        assert!(ok, "{args:?}: {stderr}");
        assert_eq!(stdout.trim(), format!("Kubernetes {reported}"), "{args:?}");
    }
    let (ok, stdout, _) = run(None, &["version", "-o", "json"]);
    assert!(ok);
    let info: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(info["gitVersion"], reported);
    assert_eq!((info["major"].as_str(), info["minor"].as_str()), (Some("1"), Some("34")));
    let commit = info["gitCommit"].as_str().unwrap_or_default();
    assert!(commit.len() == 40 && commit.chars().all(|c| c.is_ascii_hexdigit()), "{info}");
    let (ok, raw, _) = run(None, &["kubelet", "--version=raw"]);
    assert!(ok);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&raw).unwrap(), info);
    let (ok, _, stderr) = run(None, &["kubelet", "--version=soon"]);
    assert!(!ok && stderr.contains("--version"), "{stderr}");
}

#[test]
fn completion_scripts_cover_the_subcommands() {
    let (ok, stdout, _) = run(None, &["completion", "bash"]);
    assert!(ok);
    assert!(stdout.contains("_gantry") && stdout.contains("maintenance-controller"), "{stdout}");
    let (ok, stdout, _) = run(None, &["completion", "zsh"]);
    assert!(ok && stdout.starts_with("#compdef gantry") && stdout.contains("maintenance-controller"), "{stdout}");
    let (ok, stdout, _) = run(None, &["completion", "fish"]);
    assert!(ok && stdout.contains("complete -c gantry"), "{stdout}");
    let (ok, _, stderr) = run(None, &["completion", "tcsh"]);
    assert!(!ok && stderr.contains("tcsh"), "{stderr}");
}

#[test]
fn pods_reads_the_status_file_as_a_table_or_indented_json() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_str().unwrap();
    let (ok, _, stderr) = run(None, &["pods", "--root-dir", root]);
    assert!(!ok && stderr.contains("pods.json") && stderr.contains("--root-dir"), "{stderr}");
    // As the agent writes it: one line.
    let list = r#"{"apiVersion":"v1","kind":"PodList","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"web","namespace":"default","uid":"u1"},"status":{"phase":"Running","podIP":"10.88.0.7"}}]}"#;
    std::fs::write(dir.path().join("pods.json"), list).unwrap();
    let (ok, table, stderr) = run(None, &["pods", "--root-dir", root]);
    assert!(ok, "{stderr}");
    let row = table.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with("default") && row.contains("web") && row.contains("10.88.0.7"), "{table}");
    let (ok, json, stderr) = run(None, &["pods", "--root-dir", root, "-o", "json"]);
    assert!(ok, "{stderr}");
    assert!(json.lines().count() > 5 && json.contains("\n  \"items\""), "indented: {json}");
    let printed: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(printed["kind"], "PodList");
    assert_eq!(printed["items"][0]["metadata"]["name"], "web");
    assert_eq!(printed["items"][0]["status"]["podIP"], "10.88.0.7");
}

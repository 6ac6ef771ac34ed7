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

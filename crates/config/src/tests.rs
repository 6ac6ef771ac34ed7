//! Tests of resolution: precedence, validation, gates, RunOnce, masking.

use super::*;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn flags(args: &[&str]) -> Flags {
    Flags::parse_args(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn file_path() -> PathBuf {
    PathBuf::from("/etc/gantry/kubelet.yaml")
}

fn resolve_with(args: &[&str], body: Option<&str>) -> Result<Settings, ConfigError> {
    let text = body.map(|b| format!("{HEAD}{b}"));
    resolve(flags(args), text.as_deref().map(|t| (file_path(), t)), "Machine-1\n")
}

fn ok(args: &[&str], body: Option<&str>) -> Settings {
    resolve_with(args, body).unwrap_or_else(|e| panic!("{e}"))
}

fn err(args: &[&str], body: Option<&str>) -> ConfigError {
    resolve_with(args, body).expect_err("should fail")
}

#[test]
fn defaults_without_flags_or_file() {
    let s = ok(&[], None);
    assert_eq!(s.node_name, "machine-1");
    assert_eq!(s.hostname, "machine-1");
    assert_eq!(s.root_dir, PathBuf::from("/var/lib/kubelet"));
    assert_eq!(s.pod_logs_dir, PathBuf::from("/var/log/pods"));
    assert_eq!(s.static_pod_path, None);
    assert_eq!(s.static_pod_url, None);
    assert!(s.static_pod_url_header.is_empty());
    assert_eq!(s.file_check_frequency, Duration::from_secs(20));
    assert_eq!(s.http_check_frequency, Duration::from_secs(20));
    assert_eq!(s.sync_frequency, Duration::from_secs(60));
    assert_eq!(s.change_detection, ChangeDetection::Watch);
    assert_eq!(s.container_runtime_endpoint, "unix:///run/containerd/containerd.sock");
    assert_eq!(s.image_service_endpoint, None);
    assert_eq!(s.effective_image_service_endpoint(), "unix:///run/containerd/containerd.sock");
    assert_eq!(s.runtime_request_timeout, Duration::from_secs(120));
    assert_eq!(s.kubeconfig, None);
    assert!(s.standalone());
    assert!(!s.run_once);
    assert!(!s.feature_gates.enabled(Gate::LegacyNodeRunOnceMode));
    assert!(s.feature_gates.enabled(Gate::DisableNodeKubeProxyVersion));
    assert_eq!(s.verbosity, 0);
    assert_eq!(s.max_pods, 110);
    assert_eq!(s.config_file, None);
    // Without a config file the node API keeps upstream's legacy (open) defaults.
    let server = crate::ServerSettings::legacy();
    assert_eq!(
        s,
        Settings { node_name: "machine-1".into(), hostname: "machine-1".into(), server, ..Settings::default() }
    );
}

const FULL_FILE: &str = "staticPodPath: /file/manifests
staticPodURL: http://file/pods
staticPodURLHeader:
  X-File: [f1]
fileCheckFrequency: 7s
httpCheckFrequency: 8s
syncFrequency: 9s
containerRuntimeEndpoint: unix:///file/runtime.sock
imageServiceEndpoint: unix:///file/image.sock
runtimeRequestTimeout: 10s
podLogsDir: /file/logs
maxPods: 11
logging:
  verbosity: 3
featureGates:
  DisableNodeKubeProxyVersion: false
";

#[test]
fn file_overrides_defaults() {
    let s = ok(&[], Some(FULL_FILE));
    assert_eq!(s.static_pod_path, Some(PathBuf::from("/file/manifests")));
    assert_eq!(s.static_pod_url.as_deref(), Some("http://file/pods"));
    assert_eq!(s.static_pod_url_header, vec![("X-File".to_string(), "f1".to_string())]);
    assert_eq!(s.file_check_frequency, Duration::from_secs(7));
    assert_eq!(s.http_check_frequency, Duration::from_secs(8));
    assert_eq!(s.sync_frequency, Duration::from_secs(9));
    assert_eq!(s.container_runtime_endpoint, "unix:///file/runtime.sock");
    assert_eq!(s.image_service_endpoint.as_deref(), Some("unix:///file/image.sock"));
    assert_eq!(s.runtime_request_timeout, Duration::from_secs(10));
    assert_eq!(s.pod_logs_dir, PathBuf::from("/file/logs"));
    assert_eq!(s.max_pods, 11);
    assert_eq!(s.verbosity, 3);
    assert!(!s.feature_gates.enabled(Gate::DisableNodeKubeProxyVersion));
    assert_eq!(s.config_file, Some(file_path()));
}

#[test]
fn given_flags_override_the_file() {
    let s = ok(
        &[
            "--pod-manifest-path=/flag/manifests",
            "--manifest-url=http://flag/pods",
            "--manifest-url-header=X-Flag:v1",
            "--file-check-frequency=1s",
            "--http-check-frequency=2s",
            "--sync-frequency=3s",
            "--container-runtime-endpoint=unix:///flag/runtime.sock",
            "--image-service-endpoint=unix:///flag/image.sock",
            "--runtime-request-timeout=4s",
            "--max-pods=5",
            "-v=6",
            "--feature-gates=DisableNodeKubeProxyVersion=true",
        ],
        Some(FULL_FILE),
    );
    assert_eq!(s.static_pod_path, Some(PathBuf::from("/flag/manifests")));
    assert_eq!(s.static_pod_url.as_deref(), Some("http://flag/pods"));
    assert_eq!(s.static_pod_url_header, vec![("X-Flag".to_string(), "v1".to_string())]);
    assert_eq!(s.file_check_frequency, Duration::from_secs(1));
    assert_eq!(s.http_check_frequency, Duration::from_secs(2));
    assert_eq!(s.sync_frequency, Duration::from_secs(3));
    assert_eq!(s.container_runtime_endpoint, "unix:///flag/runtime.sock");
    assert_eq!(s.image_service_endpoint.as_deref(), Some("unix:///flag/image.sock"));
    assert_eq!(s.runtime_request_timeout, Duration::from_secs(4));
    assert_eq!(s.max_pods, 5);
    assert_eq!(s.verbosity, 6);
    assert!(s.feature_gates.enabled(Gate::DisableNodeKubeProxyVersion));
    // Not overridden: still from the file.
    assert_eq!(s.pod_logs_dir, PathBuf::from("/file/logs"));
}

#[test]
fn flags_not_given_leave_the_file_alone() {
    let s = ok(&["--max-pods=5"], Some(FULL_FILE));
    assert_eq!(s.max_pods, 5);
    assert_eq!(s.sync_frequency, Duration::from_secs(9));
    assert_eq!(s.static_pod_path, Some(PathBuf::from("/file/manifests")));
}

#[test]
fn empty_flag_values_clear_file_settings() {
    let s = ok(&["--pod-manifest-path=", "--manifest-url=", "--image-service-endpoint="], Some(FULL_FILE));
    assert_eq!(s.static_pod_path, None);
    assert_eq!(s.static_pod_url, None);
    assert_eq!(s.image_service_endpoint, None);
}

#[test]
fn zero_values_in_the_file_mean_default() {
    let s = ok(
        &[],
        Some(
            "syncFrequency: 0s\nfileCheckFrequency: \"0\"\nmaxPods: 0\ncontainerRuntimeEndpoint: \"\"\nstaticPodPath: \"\"\npodLogsDir: \"\"\n",
        ),
    );
    assert_eq!(s.sync_frequency, DEFAULT_SYNC_FREQUENCY);
    assert_eq!(s.file_check_frequency, DEFAULT_FILE_CHECK_FREQUENCY);
    assert_eq!(s.max_pods, 110);
    assert_eq!(s.container_runtime_endpoint, DEFAULT_CONTAINER_RUNTIME_ENDPOINT);
    assert_eq!(s.static_pod_path, None);
    assert_eq!(s.pod_logs_dir, PathBuf::from(DEFAULT_POD_LOGS_DIR));
}

#[test]
fn oom_score_adj_defaults_to_upstreams_and_the_flag_wins_over_the_file() {
    assert_eq!(ok(&[], None).oom_score_adj, -999);
    assert_eq!(ok(&[], Some("oomScoreAdj: -500\n")).oom_score_adj, -500);
    assert_eq!(ok(&["--oom-score-adj=10"], Some("oomScoreAdj: -500\n")).oom_score_adj, 10);
    assert_eq!(ok(&["--oom-score-adj", "-1000"], None).oom_score_adj, -1000);
}

#[test]
fn oom_score_adj_out_of_the_kernels_range_is_rejected_naming_its_source() {
    let e = err(&[], Some("oomScoreAdj: 1001\n"));
    assert!(
        matches!(&e, ConfigError::InvalidValue { input: Input::ConfigFile(_), field, .. } if field == "oomScoreAdj"),
        "{e:?}"
    );
    assert!(e.to_string().contains("1001 must be between -1000 and 1000, inclusive"), "{e}");
    let e = err(&["--oom-score-adj=-1001"], None);
    assert!(
        matches!(&e, ConfigError::InvalidValue { input: Input::CommandLine, field, .. } if field == "--oom-score-adj"),
        "{e:?}"
    );
}

#[test]
fn max_pods_zero_from_a_flag_is_kept() {
    assert_eq!(ok(&["--max-pods=0"], Some("maxPods: 20\n")).max_pods, 0);
}

#[test]
fn negative_and_zero_values_are_rejected_with_their_source() {
    let e = err(&[], Some("maxPods: -1\n"));
    assert!(
        matches!(&e, ConfigError::InvalidValue { input: Input::ConfigFile(_), field, .. } if field == "maxPods"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("maxPods") && msg.contains("/etc/gantry/kubelet.yaml") && msg.contains("negative"), "{msg}");

    let e = err(&["--max-pods=-3"], None);
    assert!(
        matches!(&e, ConfigError::InvalidValue { input: Input::CommandLine, field, .. } if field == "--max-pods"),
        "{e:?}"
    );
    assert!(e.to_string().contains("--max-pods on the command line"), "{e}");

    let e = err(&[], Some("syncFrequency: -5s\n"));
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "syncFrequency"), "{e:?}");
    assert!(e.to_string().contains("positive"), "{e}");

    for flag in ["--sync-frequency", "--file-check-frequency", "--http-check-frequency", "--runtime-request-timeout"] {
        for value in ["0s", "-1s"] {
            let arg = format!("{flag}={value}");
            let e = err(&[&arg], None);
            assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == flag), "{arg}: {e:?}");
            assert!(e.to_string().contains("greater than zero"), "{e}");
        }
    }
}

#[test]
fn endpoints_are_checked() {
    let e = err(&["--container-runtime-endpoint="], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--container-runtime-endpoint"), "{e:?}");
    assert!(e.to_string().contains("must not be empty"), "{e}");

    let e = err(&[], Some("containerRuntimeEndpoint: containerd.sock\n"));
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "containerRuntimeEndpoint"), "{e:?}");
    let e = err(&["--image-service-endpoint=unix://relative.sock"], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--image-service-endpoint"), "{e:?}");

    // Plain absolute socket paths and tcp endpoints are accepted as upstream does.
    assert_eq!(
        ok(&["--container-runtime-endpoint=/run/crio/crio.sock"], None).container_runtime_endpoint,
        "/run/crio/crio.sock"
    );
    ok(&["--container-runtime-endpoint=tcp://127.0.0.1:3735"], None);
}

#[test]
fn pod_logs_dir_is_validated_like_upstream() {
    for bad in ["var/log/pods", "/var/log/pods/", "/var//log", "/var/log/./pods", "/var/log/../pods", "/var/lög"] {
        let e = err(&[], Some(&format!("podLogsDir: \"{bad}\"\n")));
        assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "podLogsDir"), "{bad}: {e:?}");
    }
    let e = err(&[], Some("podLogsDir: /var/log/pods/\n"));
    assert!(e.to_string().contains("did you mean \"/var/log/pods\""), "{e}");
}

#[test]
fn root_dir_and_kubeconfig() {
    let s = ok(&["--root-dir=/srv/kubelet", "--kubeconfig=/etc/kubernetes/kubelet.conf"], None);
    assert_eq!(s.root_dir, PathBuf::from("/srv/kubelet"));
    assert_eq!(s.kubeconfig, Some(PathBuf::from("/etc/kubernetes/kubelet.conf")));
    assert!(!s.standalone());
    assert_eq!(ok(&["--kubeconfig="], None).kubeconfig, None);
    let e = err(&["--root-dir="], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--root-dir"), "{e:?}");
}

#[test]
fn bootstrap_kubeconfig_needs_kubeconfig() {
    let s = ok(
        &["--kubeconfig=/etc/kubernetes/kubelet.conf", "--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf"],
        None,
    );
    assert_eq!(s.bootstrap_kubeconfig, Some(PathBuf::from("/etc/kubernetes/bootstrap-kubelet.conf")));
    let e = err(&["--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf"], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--bootstrap-kubeconfig"), "{e:?}");
    assert!(e.to_string().contains("needs --kubeconfig"), "{e}");
}

#[test]
fn config_file_recorded_from_flag() {
    let s = resolve(flags(&["--config=/x.yaml"]), Some((PathBuf::from("/x.yaml"), HEAD)), "h").unwrap();
    assert_eq!(s.config_file, Some(PathBuf::from("/x.yaml")));
}

#[test]
fn hostname_override_and_normalisation() {
    assert_eq!(ok(&["--hostname-override=  Worker-7.Example.COM "], None).node_name, "worker-7.example.com");
    // An empty override falls back to the machine hostname.
    assert_eq!(ok(&["--hostname-override="], None).node_name, "machine-1");
    let e = resolve(flags(&[]), None, "  \n").unwrap_err();
    assert!(matches!(e, ConfigError::NoHostname), "{e:?}");
    assert!(e.to_string().contains("--hostname-override"), "{e}");
    assert_eq!(resolve(flags(&["--hostname-override=n1"]), None, "").unwrap().node_name, "n1");
}

#[test]
fn manifest_url_header_order_and_replacement() {
    let s = ok(
        &["--manifest-url-header", "a:hello,b:again,c:world", "--manifest-url-header", "b:beautiful"],
        Some("staticPodURLHeader:\n  Z: [from-file]\n"),
    );
    // Flag replaces the file's headers; repeated names keep their order.
    assert_eq!(
        s.static_pod_url_header,
        vec![
            ("a".to_string(), "hello".to_string()),
            ("b".to_string(), "again".to_string()),
            ("b".to_string(), "beautiful".to_string()),
            ("c".to_string(), "world".to_string()),
        ]
    );

    let e = err(&["--manifest-url-header=novalue"], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--manifest-url-header"), "{e:?}");
    let e = err(&["--manifest-url-header=bad name:x"], None);
    assert!(e.to_string().contains("not allowed in an HTTP header name"), "{e}");
    let e = err(&[], Some("staticPodURLHeader:\n  \"Bad Name\": [x]\n"));
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "staticPodURLHeader.Bad Name"), "{e:?}");
}

#[test]
fn feature_gates_merge_per_gate() {
    let s = ok(
        &["--feature-gates=LegacyNodeRunOnceMode=true"],
        Some("featureGates:\n  DisableNodeKubeProxyVersion: false\n  LegacyNodeRunOnceMode: false\n"),
    );
    assert!(s.feature_gates.enabled(Gate::LegacyNodeRunOnceMode), "flag overrides the file for that gate");
    assert!(!s.feature_gates.enabled(Gate::DisableNodeKubeProxyVersion), "other gates from the file stay");

    // Repeated flags merge; the last setting of a gate wins.
    let s = ok(
        &[
            "--feature-gates=LegacyNodeRunOnceMode=true,DisableNodeKubeProxyVersion=false",
            "--feature-gates=LegacyNodeRunOnceMode=false",
        ],
        None,
    );
    assert!(!s.feature_gates.enabled(Gate::LegacyNodeRunOnceMode));
    assert!(!s.feature_gates.enabled(Gate::DisableNodeKubeProxyVersion));

    // Upstream gates are accepted (and have no effect).
    let s = ok(&["--feature-gates=KubeletTracing=true"], Some("featureGates: {AllAlpha: true}\n"));
    assert_eq!(s.feature_gates.without_effect(), vec!["AllAlpha", "KubeletTracing"]);
    assert!(!s.feature_gates.enabled(Gate::LegacyNodeRunOnceMode));
}

#[test]
fn unknown_feature_gates_name_their_source() {
    let e = err(&["--feature-gates=NoSuchGate=true"], None);
    assert!(
        matches!(&e, ConfigError::UnknownFeatureGate { input: Input::CommandLine, gate, .. } if gate == "NoSuchGate"),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.starts_with("unrecognized feature gate: NoSuchGate"), "{msg}");
    assert!(msg.contains("--feature-gates on the command line"), "{msg}");

    let e = err(&[], Some("featureGates:\n  NoSuchGate: true\n"));
    let msg = e.to_string();
    assert!(msg.starts_with("unrecognized feature gate: NoSuchGate"), "{msg}");
    assert!(msg.contains("featureGates.NoSuchGate in config file /etc/gantry/kubelet.yaml"), "{msg}");

    let e = err(&["--feature-gates=LegacyNodeRunOnceMode=perhaps"], None);
    assert!(matches!(&e, ConfigError::InvalidFeatureGate { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("LegacyNodeRunOnceMode") && msg.contains("perhaps") && msg.contains("--feature-gates"),
        "{msg}"
    );

    let e = err(&["--feature-gates=LegacyNodeRunOnceMode"], None);
    assert!(e.to_string().contains("Name=true"), "{e}");
}

#[test]
fn runonce_requires_the_legacy_gate() {
    let e = err(&["--runonce"], None);
    assert!(matches!(&e, ConfigError::RunOnceDeprecated { set_by } if set_by == "--runonce"), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("deprecated"), "{msg}");
    assert!(msg.contains("LegacyNodeRunOnceMode"), "{msg}");
    assert!(msg.contains("standalone mode") && msg.contains("--pod-manifest-path"), "{msg}");

    let e = err(&[], Some("runOnce: true\n"));
    assert!(e.to_string().contains("runOnce: true in config file /etc/gantry/kubelet.yaml"), "{e}");

    let s = ok(&["--runonce", "--feature-gates=LegacyNodeRunOnceMode=true"], None);
    assert!(s.run_once);
    let s = ok(&[], Some("runOnce: true\nfeatureGates: {LegacyNodeRunOnceMode: true}\n"));
    assert!(s.run_once);

    // --runonce=false on the command line overrides the file.
    let s = ok(&["--runonce=false"], Some("runOnce: true\n"));
    assert!(!s.run_once);
    // Explicitly off never needs the gate.
    assert!(!ok(&["--runonce=false"], None).run_once);
}

#[test]
fn dockershim_flags_fail_in_resolve_too() {
    let mut f = Flags::default();
    f.compat.dockershim.push("network-plugin".to_string());
    let e = resolve(f, None, "h").unwrap_err();
    assert!(matches!(&e, ConfigError::DockershimFlag { flag, .. } if flag == "--network-plugin"), "{e:?}");
}

#[test]
fn file_errors_propagate() {
    let e = resolve(flags(&[]), Some((file_path(), "apiVersion: v1\nkind: Pod\n")), "h").unwrap_err();
    assert!(matches!(&e, ConfigError::TypeMeta { field: "apiVersion", .. }), "{e:?}");
    let e = err(&[], Some("staticPodPaths: /x\n"));
    assert!(matches!(&e, ConfigError::UnknownField { field, .. } if field == "staticPodPaths"), "{e:?}");
}

#[test]
fn summary_masks_header_values() {
    let s = ok(
        &[
            "--manifest-url=https://user:s3cret@example.com/pods?x=1",
            "--manifest-url-header=Authorization:Bearer TOPSECRET,X-Other:alsosecret",
            "--manifest-url-header=Authorization:Second",
        ],
        None,
    );
    for text in [s.redacted_summary(), s.to_string(), format!("{s:?}")] {
        assert!(!text.contains("TOPSECRET") && !text.contains("alsosecret") && !text.contains("Second"), "{text}");
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains("<masked>"), "{text}");
        assert!(text.contains("Authorization"), "{text}");
    }
    let summary = s.redacted_summary();
    assert!(summary.contains("staticPodURLHeader={Authorization:[<masked>,<masked>],X-Other:[<masked>]}"), "{summary}");
    assert!(summary.contains("staticPodURL=https://user:<masked>@example.com/pods?x=1"), "{summary}");
    assert!(summary.contains("syncFrequency=1m0s"), "{summary}");
    assert!(summary.contains("nodeName=machine-1"), "{summary}");
    assert!(
        summary.contains("featureGates=DisableNodeKubeProxyVersion=true,GracefulNodeShutdown=true,GracefulNodeShutdownBasedOnPodPriority=true,KubeletPSI=true,LegacyNodeRunOnceMode=false,MemoryQoS=false"),
        "{summary}"
    );
    assert!(!summary.contains('\n'), "one line: {summary}");
}

#[test]
fn url_password_masking() {
    assert_eq!(mask_url_password("http://h/p"), "http://h/p");
    assert_eq!(mask_url_password("http://u@h/p"), "http://u@h/p");
    assert_eq!(mask_url_password("http://u:p@h/p@x"), "http://u:<masked>@h/p@x");
    assert_eq!(mask_url_password("not a url"), "not a url");
}

#[test]
fn load_reads_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubelet.yaml");
    std::fs::write(&path, format!("{HEAD}maxPods: 17\nstaticPodPath: /m\n")).unwrap();
    let config = format!("--config={}", path.display());
    let s = load(&[config.as_str(), "--hostname-override=node-a", "--max-pods=18"]).unwrap();
    assert_eq!(s.max_pods, 18);
    assert_eq!(s.static_pod_path, Some(PathBuf::from("/m")));
    assert_eq!(s.config_file, Some(path.clone()));
    assert_eq!(s.node_name, "node-a");

    let missing = format!("--config={}", dir.path().join("nope.yaml").display());
    let e = load(&[missing.as_str()]).unwrap_err();
    assert!(matches!(e, ConfigError::ReadConfigFile { .. }), "{e:?}");
    assert!(e.to_string().contains("nope.yaml"), "{e}");

    std::fs::write(&path, format!("{HEAD}maxPods: [\n")).unwrap();
    let e = load(&[config.as_str(), "--hostname-override=n"]).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("kubelet.yaml") && msg.contains("line"), "{msg}");

    let e = load(&["--unknown-flag"]).unwrap_err();
    assert!(matches!(e, ConfigError::UnknownFlag { .. }), "{e:?}");
    let e = load(&["--docker-endpoint", "unix:///var/run/docker.sock"]).unwrap_err();
    assert!(matches!(e, ConfigError::DockershimFlag { .. }), "{e:?}");
}

#[test]
fn machine_hostname_is_normalised_input() {
    // Whatever the machine has, resolve lowercases and trims it.
    let h = machine_hostname();
    assert_eq!(h, h.trim());
}

#[test]
fn never_panics_on_odd_input() {
    let bodies = [
        "",
        "~",
        "[]",
        "\"str\"",
        "42",
        "{",
        "}",
        ": :",
        "- - -",
        "apiVersion: [",
        "\u{0}",
        "a: &x 1\nb: *x\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 99999999999\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nlogging: {verbosity: 4294967295}\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: 99999999999h\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nstaticPodURLHeader: {a: null}\n",
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n---\nmaxPods: 1\n",
    ];
    for body in bodies {
        let _ = resolve(Flags::default(), Some((file_path(), body)), "h");
    }
    for args in [
        &["--"][..],
        &["-"],
        &["---"],
        &["--="],
        &["-v"],
        &["--v="],
        &["--feature-gates=,,,"],
        &["--feature-gates==true"],
        &["--manifest-url-header=:"],
        &["--sync-frequency=9223372036854775807ns"],
    ] {
        let _ = Flags::parse_args(args).map(|f| resolve(f, None, "h"));
    }
}

#[test]
fn cluster_defaults() {
    let s = ok(&[], None);
    assert!(s.node_ips.is_empty());
    assert!(s.node_labels.is_empty());
    assert!(s.register_node);
    assert!(s.register_with_taints.is_empty());
    assert_eq!((s.kube_api_qps, s.kube_api_burst), (50, 100));
    assert_eq!(s.node_status_update_frequency, Duration::from_secs(10));
    assert_eq!(s.node_status_report_frequency, Duration::from_secs(300));
    assert_eq!(s.node_lease_duration_seconds, 40);
    assert!(s.kube_reserved.is_empty() && s.system_reserved.is_empty());
    assert_eq!(
        s.eviction_hard.iter().map(|(k, v)| format!("{k}<{v}")).collect::<Vec<_>>(),
        vec!["imagefs.available<15%", "memory.available<100Mi", "nodefs.available<10%", "nodefs.inodesFree<5%"]
    );
    assert_eq!(s.port, 10250);
    assert_eq!(s.pods_per_core, 0);
}

const CLUSTER_FILE: &str = "registerNode: false
registerWithTaints:
- {key: dedicated, value: infra, effect: NoSchedule}
- {key: example.com/maint, effect: NoExecute}
kubeAPIQPS: 7
kubeAPIBurst: 9
nodeStatusUpdateFrequency: 4s
nodeLeaseDurationSeconds: 12
kubeReserved: {cpu: 100m, memory: 100Mi}
systemReserved: {memory: 1Gi}
evictionHard: {memory.available: 1Gi}
port: 11250
podsPerCore: 3
";

#[test]
fn cluster_settings_from_the_file() {
    let s = ok(&[], Some(CLUSTER_FILE));
    assert!(!s.register_node);
    assert_eq!(
        s.register_with_taints.iter().map(Taint::to_string).collect::<Vec<_>>(),
        vec!["dedicated=infra:NoSchedule", "example.com/maint:NoExecute"]
    );
    assert_eq!((s.kube_api_qps, s.kube_api_burst), (7, 9));
    assert_eq!(s.node_status_update_frequency, Duration::from_secs(4));
    // Only the update frequency was set: the report frequency follows it.
    assert_eq!(s.node_status_report_frequency, Duration::from_secs(4));
    assert_eq!(s.node_lease_duration_seconds, 12);
    assert_eq!(s.kube_reserved.get("cpu").map(String::as_str), Some("100m"));
    assert_eq!(s.system_reserved.get("memory").map(String::as_str), Some("1Gi"));
    // Given thresholds replace the defaults.
    assert_eq!(s.eviction_hard.len(), 1);
    assert_eq!(s.port, 11250);
    assert_eq!(s.pods_per_core, 3);
}

#[test]
fn report_frequency_defaulting_follows_upstream() {
    assert_eq!(ok(&[], Some("nodeStatusUpdateFrequency: 0s\n")).node_status_report_frequency, Duration::from_secs(300));
    let s = ok(&[], Some("nodeStatusUpdateFrequency: 20s\nnodeStatusReportFrequency: 1m\n"));
    assert_eq!(
        (s.node_status_update_frequency, s.node_status_report_frequency),
        (Duration::from_secs(20), Duration::from_secs(60))
    );
    // A flag is applied after the file's defaulting, as upstream: the report
    // frequency stays at its default.
    let s = ok(&["--node-status-update-frequency=3s"], None);
    assert_eq!(
        (s.node_status_update_frequency, s.node_status_report_frequency),
        (Duration::from_secs(3), Duration::from_secs(300))
    );
    let e = err(&["--node-status-update-frequency=0s"], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--node-status-update-frequency"), "{e}");
    let e = err(&[], Some("nodeStatusReportFrequency: -1m\n"));
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "nodeStatusReportFrequency"), "{e}");
}

#[test]
fn cluster_flags_override_the_file() {
    let s = ok(
        &[
            "--register-node=true",
            "--register-with-taints=a=b:NoSchedule",
            "--kube-api-qps=1",
            "--kube-api-burst=2",
            "--kube-reserved=cpu=1",
            "--system-reserved=cpu=2,memory=2Gi",
            "--eviction-hard=nodefs.available<5%,memory.available<50Mi",
            "--port=12000",
            "--pods-per-core=0",
        ],
        Some(CLUSTER_FILE),
    );
    assert!(s.register_node);
    assert_eq!(s.register_with_taints.len(), 1);
    assert_eq!((s.kube_api_qps, s.kube_api_burst), (1, 2));
    assert_eq!(s.kube_reserved.len(), 1);
    assert_eq!(s.system_reserved.len(), 2);
    assert_eq!(s.eviction_hard.get("nodefs.available").map(String::as_str), Some("5%"));
    assert_eq!(s.port, 12000);
    assert_eq!(s.pods_per_core, 0);
    // The last --register-with-taints wins; an empty one clears the file's.
    let s = ok(&["--register-with-taints=a:NoSchedule", "--register-with-taints="], Some(CLUSTER_FILE));
    assert!(s.register_with_taints.is_empty());
}

#[test]
fn node_ip_and_labels_flags() {
    let s = ok(&["--node-ip=10.1.2.3, fd00::3", "--node-labels=a=1,b=2", "--node-labels=b=3"], None);
    assert_eq!(s.node_ips, vec!["10.1.2.3".parse::<IpAddr>().unwrap(), "fd00::3".parse::<IpAddr>().unwrap()]);
    assert_eq!(s.node_labels.get("b").map(String::as_str), Some("3"));
    assert_eq!(s.node_labels.len(), 2);
    let e = err(&["--node-ip=10.0.0.1,10.0.0.2"], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--node-ip"), "{e}");
    assert!(e.to_string().contains("must contain either a single IP or a dual-stack pair of IPs"), "{e}");

    let e = err(&["--node-labels=node-role.kubernetes.io/master="], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--node-labels"), "{e}");
    assert!(
        e.to_string().contains(
            "unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: [node-role.kubernetes.io/master]"
        ),
        "{e}"
    );
    ok(&["--node-labels=node.kubernetes.io/exclude-from-external-load-balancers=true"], None);
    let e = err(&["--node-labels=novalue"], None);
    assert!(e.to_string().contains("malformed pair"), "{e}");
}

#[test]
fn cluster_values_are_validated_with_upstream_messages() {
    let e = err(&[], Some("nodeLeaseDurationSeconds: -1\n"));
    assert!(e.to_string().contains("invalid configuration: nodeLeaseDurationSeconds must be greater than 0"), "{e}");
    assert_eq!(ok(&[], Some("nodeLeaseDurationSeconds: 0\n")).node_lease_duration_seconds, 40);
    let e = err(&["--kube-api-qps=-1"], None);
    assert!(e.to_string().contains("kubeAPIQPS (--kube-api-qps) -1 must not be a negative number"), "{e}");
    let e = err(&[], Some("kubeAPIBurst: -5\n"));
    assert!(e.to_string().contains("kubeAPIBurst (--kube-api-burst) -5 must not be a negative number"), "{e}");
    assert_eq!(ok(&[], Some("kubeAPIQPS: 0\nkubeAPIBurst: 0\n")).kube_api_qps, 0);
    assert_eq!(ok(&[], Some("kubeAPIBurst: 0\n")).kube_api_burst, 100);
    let e = err(&["--event-qps=-1"], None);
    assert!(e.to_string().contains("eventRecordQPS (--event-qps) -1 must not be a negative number"), "{e}");
    let e = err(&[], Some("eventBurst: -2\n"));
    assert!(e.to_string().contains("eventBurst (--event-burst) -2 must not be a negative number"), "{e}");
    let events = ok(&["--event-burst=7"], Some("eventRecordQPS: 3\neventBurst: 4\n"));
    assert_eq!((events.event_record_qps, events.event_burst), (3, 7), "the flag overrides the file");
    let defaults = ok(&[], None);
    assert_eq!((defaults.event_record_qps, defaults.event_burst), (50, 100));
    let e = err(&["--port=70000"], None);
    assert!(e.to_string().contains("port (--port) 70000 must be between 1 and 65535, inclusive"), "{e}");
    assert_eq!(ok(&[], Some("port: 0\n")).port, 10250);
    let e = err(&["--pods-per-core=-2"], None);
    assert!(e.to_string().contains("podsPerCore (--pods-per-core) -2 must not be a negative number"), "{e}");
    let e = err(&[], Some("registerWithTaints: [{key: a, effect: Sometimes}]\n"));
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "registerWithTaints[0]"), "{e}");
    let e = err(&[], Some("registerWithTaints: [{key: a}]\n"));
    assert!(e.to_string().contains("effect is required"), "{e}");
    let e = err(&["--register-with-taints=a=b"], None);
    assert!(e.to_string().contains("invalid taint spec: a=b"), "{e}");
    let e = err(&[], Some("kubeReserved: {gpu: \"1\"}\n"));
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "kubeReserved"), "{e}");
    let e = err(&["--system-reserved=memory=-1"], None);
    assert!(e.to_string().contains("cannot be negative"), "{e}");
    let e = err(&["--eviction-hard=memory.available<0"], None);
    assert!(e.to_string().contains("must be positive"), "{e}");
    let e = err(&[], Some("evictionHard: {disk.available: 1Gi}\n"));
    assert!(e.to_string().contains("unsupported eviction signal disk.available"), "{e}");
}

#[test]
fn enforce_node_allocatable() {
    assert!(ok(&[], None).enforce_pods_allocatable, "default [pods]");
    let file = "enforceNodeAllocatable: [none]\n";
    assert!(!ok(&[], Some(file)).enforce_pods_allocatable);
    assert!(ok(&["--enforce-node-allocatable=pods"], Some(file)).enforce_pods_allocatable, "the flag wins");
    let e = err(&["--enforce-node-allocatable=pods,none"], None).to_string();
    assert!(e.contains("--enforce-node-allocatable") && e.contains("'none'"), "{e}");
    let e = err(&["--enforce-node-allocatable=pods,system-reserved"], None).to_string();
    assert!(
        e.contains("invalid configuration: systemReservedCgroup (--system-reserved-cgroup) must be specified when \"system-reserved\" contained in enforceNodeAllocatable (--enforce-node-allocatable)"),
        "{e}"
    );
    let e = err(&[], Some("enforceNodeAllocatable: [kube-reserved]\n")).to_string();
    assert!(e.contains("kubeReservedCgroup (--kube-reserved-cgroup) must be specified"), "{e}");
    let s = ok(
        &["--enforce-node-allocatable=pods,kube-reserved,system-reserved-compressible", "--kube-reserved-cgroup=/kube"],
        Some("systemReservedCgroup: /system.slice\n"),
    );
    assert!(s.enforce_pods_allocatable);
    assert_eq!((s.enforce_kube_reserved, s.enforce_system_reserved), (ReservedLimits::All, ReservedLimits::CpuOnly));
    assert_eq!((s.kube_reserved_cgroup.as_str(), s.system_reserved_cgroup.as_str()), ("/kube", "/system.slice"));
    let e = err(
        &["--enforce-node-allocatable=kube-reserved,kube-reserved-compressible", "--kube-reserved-cgroup=/k"],
        None,
    );
    assert!(e.to_string().contains("cannot be specified together"), "{e}");
    let e = err(&["--enforce-node-allocatable=everything"], None).to_string();
    assert!(e.contains("invalid option \"everything\""), "{e}");
}

#[test]
fn rotate_certificates_defaults_true_with_a_config_file_and_the_flag_wins() {
    assert!(!ok(&[], None).rotate_certificates, "without a config file the flag's default is false, as upstream");
    assert!(ok(&[], Some("")).rotate_certificates);
    assert!(!ok(&[], Some("rotateCertificates: false\n")).rotate_certificates);
    assert!(!ok(&["--rotate-certificates=false"], Some("rotateCertificates: true\n")).rotate_certificates);
    assert!(ok(&["--rotate-certificates"], None).rotate_certificates);
}

#[test]
fn server_tls_bootstrap_from_the_file_or_the_rotate_server_certificates_flag() {
    let tls_bootstrap = |flags: &[&str], file: Option<&str>| ok(flags, file).server.server_tls_bootstrap;
    assert!(!tls_bootstrap(&[], None));
    assert!(!tls_bootstrap(&[], Some("")));
    assert!(tls_bootstrap(&[], Some("serverTLSBootstrap: true\n")));
    assert!(tls_bootstrap(&["--rotate-server-certificates"], None));
    assert!(!tls_bootstrap(&["--rotate-server-certificates=false"], Some("serverTLSBootstrap: true\n")));
}

#[test]
fn change_detection_strategy() {
    let body = |v: &str| format!("configMapAndSecretChangeDetectionStrategy: {v}\n");
    assert_eq!(ok(&[], Some(&body("Get"))).change_detection, ChangeDetection::Get);
    assert_eq!(ok(&[], Some(&body("Cache"))).change_detection, ChangeDetection::Cache);
    assert_eq!(ok(&[], Some(&body("Watch"))).change_detection, ChangeDetection::Watch);
    let e = err(&[], Some(&body("Poll"))).to_string();
    assert!(e.contains("configMapAndSecretChangeDetectionStrategy") && e.contains("Get, Cache, Watch"), "{e}");
}

#[test]
fn system_container_cgroups() {
    let s = ok(&["--runtime-cgroups=/system.slice/containerd.service"], Some("kubeletCgroups: /kubelet\n"));
    assert_eq!(
        (s.pods.kubelet_cgroups.as_str(), s.pods.runtime_cgroups.as_str()),
        ("/kubelet", "/system.slice/containerd.service")
    );
    assert_eq!(
        ok(&["--kubelet-cgroups=/k"], Some("kubeletCgroups: /kubelet\n")).pods.kubelet_cgroups,
        "/k",
        "the flag wins"
    );
    let s = ok(&["--system-cgroups=/system", "--cgroup-root=/"], None);
    assert_eq!(s.pods.system_cgroups, "/system");
    // Upstream's validation: systemCgroups needs a cgroupRoot, and is never the root itself.
    let e = err(&[], Some("systemCgroups: /system\n")).to_string();
    assert!(
        e.contains("invalid configuration: systemCgroups (--system-cgroups) was specified and cgroupRoot (--cgroup-root) was not specified"),
        "{e}"
    );
    let e = err(&["--system-cgroups=/", "--cgroup-root=/"], None).to_string();
    assert!(e.contains("system container cannot be root (\"/\")"), "{e}");
}

#[test]
fn memory_qos_gate_and_throttling_factor() {
    let s = ok(&[], None);
    assert!(!s.pods.memory_qos, "alpha: off by default");
    assert_eq!(s.pods.memory_throttling_factor, 0.9);
    let s = ok(&["--feature-gates=MemoryQoS=true"], Some("memoryThrottlingFactor: 0.8\n"));
    assert!(s.pods.memory_qos);
    assert_eq!(s.pods.memory_throttling_factor, 0.8);
    let e = err(&[], Some("memoryThrottlingFactor: 1.5\n")).to_string();
    assert!(
        e.contains(
            "invalid configuration: memoryThrottlingFactor 1.5 must be greater than 0 and less than or equal to 1.0"
        ),
        "{e}"
    );
}

#[test]
fn eviction_flags_override_the_file_and_name_themselves_in_errors() {
    let body = "evictionSoft: {memory.available: 2Gi}\nevictionSoftGracePeriod: {memory.available: 1m}\n";
    let s = ok(
        &[
            "--eviction-soft=memory.available<1Gi,nodefs.available<15%",
            "--eviction-soft-grace-period=memory.available=30s,nodefs.available=2m",
            "--eviction-minimum-reclaim=nodefs.available=1Gi",
            "--eviction-max-pod-grace-period=20",
            "--eviction-pressure-transition-period=30s",
        ],
        Some(body),
    );
    assert_eq!(s.eviction.soft["memory.available"], "1Gi");
    assert_eq!(s.eviction.soft_grace_period["nodefs.available"], "2m");
    assert_eq!(s.eviction.minimum_reclaim["nodefs.available"], "1Gi");
    assert_eq!(s.eviction.max_pod_grace_period, 20);
    assert_eq!(s.eviction.pressure_transition_period, std::time::Duration::from_secs(30));
    let e = err(&["--eviction-soft=memory.available<1Gi"], None);
    assert!(matches!(&e, ConfigError::InvalidValue { field, .. } if field == "--eviction-soft-grace-period"), "{e}");
    let e = err(&["--eviction-max-pod-grace-period=-1"], None);
    assert!(e.to_string().contains("--eviction-max-pod-grace-period"), "{e}");
}

#[test]
fn volume_stats_agg_period_defaults_to_a_minute_and_a_negative_one_turns_it_off() {
    let period = |args: &[&str], body: Option<&str>| ok(args, body).server.volume_stats_agg_period;
    assert_eq!(period(&[], None), Some(Duration::from_secs(60)));
    assert_eq!(period(&[], Some("volumeStatsAggPeriod: 0s\n")), Some(Duration::from_secs(60)), "0 is the default");
    assert_eq!(period(&[], Some("volumeStatsAggPeriod: 10s\n")), Some(Duration::from_secs(10)));
    assert_eq!(period(&[], Some("volumeStatsAggPeriod: -1s\n")), None);
    assert_eq!(period(&["--volume-stats-agg-period=2s"], None), Some(Duration::from_secs(2)));
    assert_eq!(period(&["--volume-stats-agg-period=0s"], None), None, "the flag's 0 is not defaulted");
}

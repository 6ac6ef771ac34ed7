use super::*;
use crate::source::manifest::parse_pod;

fn manifest(extra: &str) -> Pod {
    manifest_with_image("busybox:1", extra)
}

fn manifest_with_image(image: &str, extra: &str) -> Pod {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: {image:?}\n{extra}"
    );
    parse_pod(yaml.as_bytes(), "web.yaml").unwrap()
}

#[test]
fn defaults_match_upstream() {
    let pod = prepare(manifest(""), &Origin::File("/etc/kubernetes/manifests/web.yaml"), "Node-1").unwrap();
    assert_eq!(pod.metadata.name.as_deref(), Some("web-node-1"));
    assert_eq!(pod.metadata.namespace.as_deref(), Some("default"));
    let uid = pod.metadata.uid.clone().unwrap();
    assert_eq!(uid.len(), 32);
    let annotations = pod.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations[CONFIG_HASH], uid);
    assert_eq!(annotations[CONFIG_SOURCE], "file");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(spec.node_name.as_deref(), Some("node-1"));
    let tolerations = spec.tolerations.as_ref().unwrap();
    assert_eq!(tolerations[0].effect.as_deref(), Some("NoExecute"));
    assert_eq!(tolerations[0].operator.as_deref(), Some("Exists"));
    assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Pending"));
}

#[test]
fn uid_depends_on_content_origin_and_node() {
    let uid = |pod: Pod, origin: Origin, node: &str| prepare(pod, &origin, node).unwrap().metadata.uid.unwrap();
    let base = uid(manifest(""), Origin::File("/m/a.yaml"), "n1");
    assert_eq!(base, uid(manifest(""), Origin::File("/m/a.yaml"), "n1"), "stable");
    assert_ne!(base, uid(manifest("    args: [x]\n"), Origin::File("/m/a.yaml"), "n1"), "content");
    assert_ne!(base, uid(manifest(""), Origin::File("/m/b.yaml"), "n1"), "path");
    assert_ne!(base, uid(manifest(""), Origin::File("/m/a.yaml"), "n2"), "node");
    let from_url = prepare(manifest(""), &Origin::Url("http://x/p"), "n1").unwrap();
    assert_eq!(from_url.metadata.annotations.unwrap()[CONFIG_SOURCE], "http");
    assert!(from_url.spec.unwrap().tolerations.is_none(), "only file pods get the toleration");
}

#[test]
fn invalid_pods_are_rejected_naming_the_field() {
    let err = prepare(manifest_with_image("", ""), &Origin::File("web.yaml"), "n").unwrap_err();
    assert_eq!(err.field, "spec.containers[0].image");
    let cases = [
        ("  - name: c\n    image: busybox:1\n", "spec.containers[1].name"),
        ("  restartPolicy: Sometimes\n", "spec.restartPolicy"),
        ("  volumes:\n  - name: cfg\n    configMap:\n      name: x\n", "spec.volumes[0]"),
        ("  volumes:\n  - name: data\n    nfs:\n      server: x\n      path: /\n", "spec.volumes[0]"),
        (
            "    env:\n    - name: A\n      valueFrom:\n        secretKeyRef:\n          name: s\n          key: k\n",
            "spec.containers[0].env[0].valueFrom",
        ),
    ];
    for (extra, field) in cases {
        let err = prepare(manifest(extra), &Origin::File("web.yaml"), "n").unwrap_err();
        assert_eq!(err.field, field, "{extra}: {err}");
        assert_eq!(err.origin, "web.yaml");
    }
}

#[test]
fn forbidden_references_use_the_upstream_wording() {
    let err =
        prepare(manifest("  volumes:\n  - name: s\n    secret:\n      secretName: x\n"), &Origin::File("w.yaml"), "n")
            .unwrap_err();
    assert!(err.reason.contains("has forbidden references to API objects"), "{err}");
}

#[test]
fn host_path_and_empty_dir_are_accepted() {
    let extra = "    volumeMounts:\n    - name: d\n      mountPath: /d\n  volumes:\n  - name: d\n    emptyDir: {}\n";
    prepare(manifest(extra), &Origin::File("w.yaml"), "n").unwrap();
}

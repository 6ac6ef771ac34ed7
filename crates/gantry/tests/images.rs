//! Images end to end: pull policy Never with an absent image, and image garbage collection
//! that removes unused images but never a pinned one, an in-use one or the sandbox image.

mod common;

use common::{Env, eventually, pod_yaml, static_name};
use gantry_cri::api::{ImageSpec, ImageStatusRequest};
use gantry_testkit::{BUSYBOX_IMAGE, PAUSE_IMAGE, PinningImageService};

const UNUSED_IMAGE: &str = "gantry.local/gc-unused:v1";
const PINNED_IMAGE: &str = "gantry.local/gc-pinned:v1";

#[tokio::test]
async fn never_pull_policy_with_an_absent_image_waits_with_err_image_never_pull() {
    let Some(env) = Env::start().await else { return };
    let yaml = r#"apiVersion: v1
kind: Pod
metadata:
  name: never
spec:
  containers:
  - name: main
    image: gantry.local/absent:v1
    imagePullPolicy: Never
"#;
    env.write_manifest("never.yaml", yaml);
    let gantry = env.kubelet(&[]);
    let reason = eventually("waiting reason ErrImageNeverPull", &gantry, || async {
        let pod = gantry.pod(&static_name("never"))?;
        let status = pod.status?.container_statuses?.into_iter().next()?;
        status.state?.waiting?.reason.filter(|r| r == "ErrImageNeverPull")
    })
    .await;
    assert_eq!(reason, "ErrImageNeverPull");
}

/// The image id containerd has for `reference`, or None once it is gone.
async fn image_id(env: &Env, reference: &str) -> Option<String> {
    let mut client = env.ctd.image_client().await;
    let request =
        ImageStatusRequest { image: Some(ImageSpec { image: reference.into(), ..Default::default() }), verbose: false };
    client.image_status(request).await.unwrap().into_inner().image.map(|i| i.id)
}

#[tokio::test]
async fn image_gc_removes_unused_images_but_never_pinned_in_use_or_sandbox_images() {
    let Some(env) = Env::start().await else { return };
    env.ctd.import_scratch_image(UNUSED_IMAGE, "unused").await.unwrap();
    env.ctd.import_scratch_image(PINNED_IMAGE, "pinned").await.unwrap();
    let fake_socket = env.ctd.dir().join("pinning-images.sock");
    let fake = PinningImageService::start(&fake_socket, &env.ctd.socket_path(), PINNED_IMAGE).await.unwrap();
    let kept = [PINNED_IMAGE, BUSYBOX_IMAGE, PAUSE_IMAGE];
    let mut kept_ids = Vec::new();
    for reference in kept {
        kept_ids.push(image_id(&env, reference).await.expect("test image imported"));
    }
    let unused_id = image_id(&env, UNUSED_IMAGE).await.expect("scratch image imported");

    // A running pod, started before GC is configured, keeps busybox in use.
    env.write_manifest("busy.yaml", &pod_yaml("busy", "sleep 3600", ""));
    let mut first = env.kubelet(&[]);
    eventually("busy running", &first, || async { env.running(&static_name("busy")).await.first().cloned() }).await;
    first.kill();

    // Any usage is over a 1 % high threshold, and a 0 % low threshold cannot be reached.
    let config = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{config}imageGCHighThresholdPercent: 1\nimageGCLowThresholdPercent: 0\n"))
        .unwrap();
    let endpoint = format!("--image-service-endpoint={}", fake.endpoint());
    let gantry = env.kubelet(&[&endpoint]);
    eventually("the unused image removed", &gantry, || async {
        image_id(&env, UNUSED_IMAGE).await.is_none().then_some(())
    })
    .await;
    eventually("FreeDiskSpaceFailed reported", &gantry, || async {
        gantry.log().contains("FreeDiskSpaceFailed").then_some(())
    })
    .await;

    let removed = fake.removed();
    assert!(removed.contains(&unused_id), "RemoveImage calls: {removed:?}");
    for (reference, id) in kept.iter().zip(&kept_ids) {
        assert!(
            !removed.iter().any(|r| r == id || r == reference),
            "{reference} ({id}) must never be asked to be removed; RemoveImage calls: {removed:?}"
        );
        assert_eq!(image_id(&env, reference).await.as_ref(), Some(id), "{reference} is still there");
    }
    assert!(!env.running(&static_name("busy")).await.is_empty(), "the pod kept running");
}

/// A loopback port nothing listens on (bound, then released).
fn closed_loopback_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// The stand-in image service in front of the environment's containerd (no pinned image).
async fn recording_image_service(env: &Env) -> PinningImageService {
    let socket = env.ctd.dir().join("recording-images.sock");
    PinningImageService::start(&socket, &env.ctd.socket_path(), "none").await.unwrap()
}

fn waiting(gantry: &common::Gantry, pod: &str) -> Option<(String, String)> {
    let status = gantry.pod(pod)?.status?.container_statuses?.into_iter().next()?;
    let waiting = status.state?.waiting?;
    Some((waiting.reason?, waiting.message.unwrap_or_default()))
}

#[tokio::test]
async fn unreachable_registry_gives_err_image_pull_then_back_off_with_events() {
    let Some(env) = Env::start().await else { return };
    let fake = recording_image_service(&env).await;
    let image = format!("127.0.0.1:{}/nope:1", closed_loopback_port());
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: unreachable\nspec:\n  containers:\n  - name: main\n    image: {image}\n"
    );
    env.write_manifest("unreachable.yaml", &yaml);
    let gantry = env.kubelet(&[&format!("--image-service-endpoint={}", fake.endpoint())]);
    let pod = static_name("unreachable");

    let (_, message) = eventually("waiting reason ErrImagePull", &gantry, || async {
        waiting(&gantry, &pod).filter(|(reason, _)| reason == "ErrImagePull")
    })
    .await;
    assert!(message.contains("rpc error"), "the CRI error is the message: {message}");
    let (_, message) = eventually("waiting reason ImagePullBackOff", &gantry, || async {
        waiting(&gantry, &pod).filter(|(reason, _)| reason == "ImagePullBackOff")
    })
    .await;
    assert!(message.starts_with(&format!("Back-off pulling image {image:?}")), "{message}");

    let pulls = eventually("a second pull attempt", &gantry, || async {
        let pulls = fake.pulls();
        (pulls.len() >= 2).then_some(pulls)
    })
    .await;
    let gap = pulls[1].started - pulls[0].started;
    assert!(gap >= std::time::Duration::from_secs(10), "second attempt only {gap:?} after the first");
    assert!(pulls.iter().all(|p| p.image == image && p.auth.is_none()), "anonymous pulls of the image: {pulls:?}");

    let log = gantry.log();
    for expected in [
        format!("Pulling image {image:?}"),
        format!("Failed to pull image {image:?}: rpc error"),
        "Error: ErrImagePull".to_string(),
        format!("Back-off pulling image {image:?}"),
        "Error: ImagePullBackOff".to_string(),
    ] {
        assert!(log.contains(&expected), "event {expected:?} missing\n{}", common::tail(&log, 60));
    }
}

/// Starts two pods whose image must be pulled (policy Always; the stand-in holds each pull
/// for three seconds) and returns the most pulls the stand-in saw at once.
async fn max_concurrent_pulls(pull_config: &str) -> Option<(usize, String)> {
    let env = Env::start().await?;
    let config = std::fs::read_to_string(&env.config).unwrap();
    std::fs::write(&env.config, format!("{config}{pull_config}")).unwrap();
    let fake = recording_image_service(&env).await;
    fake.set_pull_delay(std::time::Duration::from_secs(3));
    for name in ["one", "two"] {
        let yaml =
            pod_yaml(name, "sleep 3600", "").replace("    command:", "    imagePullPolicy: Always\n    command:");
        env.write_manifest(&format!("{name}.yaml"), &yaml);
    }
    let gantry = env.kubelet(&[&format!("--image-service-endpoint={}", fake.endpoint())]);
    for name in ["one", "two"] {
        eventually("pod running", &gantry, || async { env.running(&static_name(name)).await.first().cloned() }).await;
    }
    let pulls: Vec<_> = fake.pulls().into_iter().filter(|p| p.image == BUSYBOX_IMAGE).collect();
    assert_eq!(pulls.len(), 2, "one pull per pod: {pulls:?}");
    Some((fake.max_concurrent_pulls(), gantry.log()))
}

#[tokio::test]
async fn serialized_image_pulls_never_overlap() {
    let Some((max, log)) = max_concurrent_pulls("serializeImagePulls: true\n").await else { return };
    assert_eq!(max, 1, "pulls overlapped");
    assert!(log.contains("including waiting). Image size: "), "Pulled event with upstream message");
}

#[tokio::test]
async fn parallel_image_pulls_overlap_up_to_the_limit() {
    let config = "serializeImagePulls: false\nmaxParallelImagePulls: 2\n";
    let Some((max, _)) = max_concurrent_pulls(config).await else { return };
    assert_eq!(max, 2, "both pods' pulls should run at once");
}

/// The pulls the stand-in saw of `image`, once there is one.
async fn pull_of(gantry: &common::Gantry, fake: &PinningImageService, image: &str) -> gantry_testkit::PullRecord {
    eventually(&format!("a pull of {image}"), gantry, || async { fake.pulls().into_iter().find(|p| p.image == image) })
        .await
}

#[tokio::test]
async fn pull_secrets_for_the_registry_are_passed_and_a_malformed_one_is_reported() {
    use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
    use kube::Api;
    use kube::api::PostParams;

    let Some((env, cluster)) = common::cluster::setup().await else { return };
    let fake = recording_image_service(&env).await;
    let registry = format!("127.0.0.1:{}", closed_loopback_port());
    let admin = cluster.admin().await;
    let post = PostParams::default();
    // Unique per node, so reruns against a real cluster do not collide.
    let (good, broken, account) =
        (format!("regcred-{}", env.node), format!("broken-{}", env.node), format!("puller-{}", env.node));
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), "default");
    let secret = |name: &str, config: String| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": config},
        }))
        .unwrap()
    };
    let config = serde_json::json!({"auths": {"other.example.com": {"username": "nobody", "password": "x"},
        registry.clone(): {"username": "alice", "password": "s3cret"}}});
    secrets.create(&post, &secret(&good, config.to_string())).await.unwrap();
    secrets.create(&post, &secret(&broken, "{not json".into())).await.unwrap();
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    let sa = serde_json::json!({"metadata": {"name": account}, "imagePullSecrets": [{"name": good}]});
    accounts.create(&post, &serde_json::from_value(sa).unwrap()).await.unwrap();

    let kubeconfig = cluster.node_kubeconfig(&env.ctd.dir(), &env.node);
    let gantry = env.kubelet(&[
        &format!("--kubeconfig={}", kubeconfig.display()),
        &format!("--image-service-endpoint={}", fake.endpoint()),
    ]);
    let pod = |name: &str, image: &str, extra: serde_json::Value| -> Pod {
        let mut spec = serde_json::json!({
            "nodeName": env.node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "main", "image": image}],
        });
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap()
    };
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let private = format!("{registry}/private:1");
    let secrets_json = serde_json::json!({"imagePullSecrets": [{"name": broken}, {"name": good}]});
    pods.create(&post, &pod("private", &private, secrets_json)).await.unwrap();
    // The ServiceAccount admission plugin gives this pod its account's pull secrets.
    let via_account = format!("{registry}/via-account:1");
    pods.create(&post, &pod("via-account", &via_account, serde_json::json!({"serviceAccountName": account})))
        .await
        .unwrap();

    for image in [&private, &via_account] {
        let auth = pull_of(&gantry, &fake, image).await.auth.unwrap_or_else(|| panic!("credentials for {image}"));
        assert_eq!((auth.username.as_str(), auth.password.as_str()), ("alice", "s3cret"), "{image}");
    }

    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin, "default");
    let event = eventually("FailedToRetrieveImagePullSecret naming the broken secret", &gantry, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("FailedToRetrieveImagePullSecret")
                && e.involved_object.name.as_deref() == Some("private")
        })
    })
    .await;
    let note = event.message.unwrap_or_default();
    assert!(note.contains(&format!("{broken} (.dockerconfigjson: invalid JSON")), "{note}");
    assert!(!note.contains(&good), "{note}");
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    cluster.cleanup(&env.node).await;
    let _ = secrets.delete(&good, &Default::default()).await;
    let _ = secrets.delete(&broken, &Default::default()).await;
    let _ = accounts.delete(&account, &Default::default()).await;
}

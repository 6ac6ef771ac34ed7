//! Images end to end: pull policy Never with an absent image, and image garbage collection
//! that removes unused images but never a pinned one, an in-use one or the sandbox image.

mod common;

use common::{Env, eventually, pod_yaml, static_name};
use gantry_testkit::{BUSYBOX_IMAGE, PAUSE_IMAGE, PinningImageService};
use k8s_cri::v1::{ImageSpec, ImageStatusRequest};

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

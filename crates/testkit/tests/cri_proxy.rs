//! The CRI proxy in front of a real containerd: calls are forwarded, and scripted faults
//! (failure, hang until released, delay, limited to one pod) apply to the calls they name only;
//! cutting the connections fails the calls in flight, and clients dial again.
//! Needs root and containerd (prints a SKIPPED line otherwise).

use std::time::{Duration, Instant};

use gantry_cri::api::{ListImagesRequest, VersionRequest};
use gantry_testkit::raw::{raw_log_root, raw_run_pod};
use gantry_testkit::{Containerd, CriProxy, cri};

#[tokio::test]
async fn forwards_calls_and_applies_scripted_faults() {
    gantry_testkit::init_test_tracing();
    let Some(ctd) = Containerd::start_or_skip().await else { return };
    let socket = ctd.dir().join("proxy.sock");
    let proxy = CriProxy::start(&socket, &ctd.socket_path()).await.unwrap();
    assert_eq!(proxy.endpoint(), format!("unix://{}", socket.display()));
    let mut runtime = cri::runtime_client(&socket).await.unwrap();
    let mut images = cri::image_client(&socket).await.unwrap();

    let version = runtime.version(VersionRequest::default()).await.unwrap().into_inner();
    assert_eq!(version.runtime_name, "containerd", "answered by the real runtime");

    proxy.fail("Version", None);
    let failed = runtime.version(VersionRequest::default()).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Unavailable);
    assert!(images.list_images(ListImagesRequest::default()).await.is_ok(), "other methods go through");
    proxy.release("Version");
    runtime.version(VersionRequest::default()).await.unwrap();

    proxy.hang("ListImages", None);
    let mut hung = images.clone();
    let call = tokio::spawn(async move { hung.list_images(ListImagesRequest::default()).await });
    let held = Instant::now();
    tokio::time::timeout(Duration::from_secs(10), async {
        while proxy.calls_of("ListImages").len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the hung call arrives");
    assert!(!call.is_finished(), "held until released");
    runtime.version(VersionRequest::default()).await.expect("a hang holds its own method only");
    proxy.release("ListImages");
    let listed = call.await.unwrap().expect("forwarded once released");
    assert!(!listed.into_inner().images.is_empty());
    assert!(held.elapsed() < Duration::from_secs(10));

    proxy.delay("Version", None, Duration::from_millis(400));
    let started = Instant::now();
    runtime.version(VersionRequest::default()).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400), "delayed");
    proxy.release("Version");

    // A fault for another pod does not hold this one; the call names its pod.
    proxy.hang("RunPodSandbox", Some("somebody-else"));
    let logs = raw_log_root(&ctd);
    let run = raw_run_pod(&mut runtime, &logs, &["sleep", "3600"]);
    let pod = tokio::time::timeout(Duration::from_secs(30), run).await.expect("not held").unwrap();
    let calls = proxy.calls_of("RunPodSandbox");
    assert!(calls[0].pod.as_deref().unwrap().starts_with("raw-"), "{calls:?}");
    assert_eq!(proxy.calls_of("StartContainer").len(), 1);
    drop(pod);
    gantry_testkit::remove_all_pods(&ctd).await.unwrap();
}

#[tokio::test]
async fn cut_connections_fail_calls_in_flight_and_clients_dial_again() {
    gantry_testkit::init_test_tracing();
    let Some(ctd) = Containerd::start_or_skip().await else { return };
    let socket = ctd.dir().join("proxy.sock");
    let proxy = CriProxy::start(&socket, &ctd.socket_path()).await.unwrap();
    let mut runtime = cri::runtime_client(&socket).await.unwrap();
    runtime.version(VersionRequest::default()).await.unwrap();

    proxy.hang("Version", None);
    let mut hung = runtime.clone();
    let call = tokio::spawn(async move { hung.version(VersionRequest::default()).await });
    tokio::time::timeout(Duration::from_secs(10), async {
        while proxy.calls_of("Version").len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the hung call arrives");
    proxy.drop_connections();
    let cut = tokio::time::timeout(Duration::from_secs(10), call).await.expect("the cut ends the call at once");
    let status = cut.unwrap().expect_err("a call whose connection was cut fails");
    assert_ne!(status.code(), tonic::Code::Ok);
    proxy.release("Version");

    // The same client dials again; a failed call right after the cut is the channel noticing.
    let answered = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match runtime.version(VersionRequest::default()).await {
                Ok(version) => return version.into_inner(),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    })
    .await
    .expect("served again after the cut");
    assert_eq!(answered.runtime_name, "containerd", "forwarded through the proxy again");
    assert!(proxy.calls_of("Version").len() >= 3, "the new connection reaches the proxy");
}

//! End-to-end: what an operator sees when the runtime endpoint is wrong.

use std::io::{Read, Write};
use std::os::unix::net::UnixListener;
use std::process::Command;

fn start_kubelet(endpoint: &str) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gantry"))
        .args(["kubelet", &format!("--container-runtime-endpoint={endpoint}"), "--root-dir=/tmp/gantry-endpoint-test"])
        .output()
        .expect("run gantry");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn missing_socket_names_the_path_and_asks_about_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("containerd.sock");
    let (ok, stderr) = start_kubelet(&format!("unix://{}", sock.display()));
    assert!(!ok);
    assert!(stderr.contains(&sock.display().to_string()), "{stderr}");
    assert!(stderr.contains("is the runtime running?"), "{stderr}");
}

#[test]
fn unsupported_scheme_is_refused() {
    let (ok, stderr) = start_kubelet("tcp://127.0.0.1:2375");
    assert!(!ok);
    assert!(stderr.contains("tcp://127.0.0.1:2375") && stderr.contains("only unix://"), "{stderr}");
}

/// A socket that answers like the Docker Engine API (HTTP/1.1), not gRPC.
#[test]
fn docker_engine_socket_is_explained_as_not_cri() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("docker.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let body = r#"{"message":"page not found"}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let (ok, stderr) = start_kubelet(&format!("unix://{}", sock.display()));
    assert!(!ok);
    assert!(stderr.contains("is not a CRI v1 runtime"), "{stderr}");
    assert!(stderr.contains("dockershim"), "{stderr}");
    assert!(stderr.contains("containerd") && stderr.contains("CRI-O") && stderr.contains("cri-dockerd"), "{stderr}");
}

/// A gRPC server without the runtime.v1 service (e.g. containerd with the CRI plugin off).
#[test]
fn grpc_without_cri_v1_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("grpc.sock");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let listener = rt.block_on(async { tokio::net::UnixListener::bind(&sock) }).unwrap();
    rt.spawn(async move {
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        // Serves only the image service, so runtime.v1.RuntimeService is Unimplemented.
        let images = gantry_cri::api::image_service_server::ImageServiceServer::new(NoImages);
        let _ = tonic::transport::Server::builder().add_service(images).serve_with_incoming(incoming).await;
    });
    let (ok, stderr) = start_kubelet(&format!("unix://{}", sock.display()));
    assert!(!ok);
    assert!(stderr.contains("is not a CRI v1 runtime"), "{stderr}");
    assert!(stderr.contains("not implemented"), "{stderr}");
}

struct NoImages;

#[tonic::async_trait]
impl gantry_cri::api::image_service_server::ImageService for NoImages {
    async fn list_images(
        &self,
        _: tonic::Request<gantry_cri::api::ListImagesRequest>,
    ) -> Result<tonic::Response<gantry_cri::api::ListImagesResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn image_status(
        &self,
        _: tonic::Request<gantry_cri::api::ImageStatusRequest>,
    ) -> Result<tonic::Response<gantry_cri::api::ImageStatusResponse>, tonic::Status> {
        Ok(tonic::Response::new(Default::default()))
    }
    async fn pull_image(
        &self,
        _: tonic::Request<gantry_cri::api::PullImageRequest>,
    ) -> Result<tonic::Response<gantry_cri::api::PullImageResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }
    async fn remove_image(
        &self,
        _: tonic::Request<gantry_cri::api::RemoveImageRequest>,
    ) -> Result<tonic::Response<gantry_cri::api::RemoveImageResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }
    async fn image_fs_info(
        &self,
        _: tonic::Request<gantry_cri::api::ImageFsInfoRequest>,
    ) -> Result<tonic::Response<gantry_cri::api::ImageFsInfoResponse>, tonic::Status> {
        Err(tonic::Status::unimplemented("no"))
    }
}

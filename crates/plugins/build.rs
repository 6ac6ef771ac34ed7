//! Generates the plugin registration, device plugin, pod-resources and CSI messages, clients
//! and servers from the upstream `.proto` files in `proto/`. The protoc comes from the
//! `protoc-bin-vendored` crate, so building needs no system protobuf compiler.

const PROTOS: [&str; 4] = [
    "proto/pluginregistration/v1/api.proto",
    "proto/deviceplugin/v1beta1/api.proto",
    "proto/podresources/v1/api.proto",
    "proto/csi/v1/csi.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: the build script is single-threaded; prost-build reads PROTOC from here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    // CSI imports protobuf's well-known types, which ship with the vendored protoc.
    let well_known = protoc_bin_vendored::include_path()?;
    // Each file is compiled on its own: they are separate packages importing nothing of each other.
    for proto in PROTOS {
        let dir = std::path::Path::new(proto).parent().expect("proto files are in a directory");
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .compile_protos(&[std::path::Path::new(proto)], &[dir, well_known.as_path()])?;
    }
    Ok(())
}

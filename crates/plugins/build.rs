//! Generates the plugin registration, device plugin and pod-resources messages, clients and
//! servers from the upstream `.proto` files in `proto/`. The protoc comes from the
//! `protoc-bin-vendored` crate, so building needs no system protobuf compiler.

const PROTOS: [&str; 3] = [
    "proto/pluginregistration/v1/api.proto",
    "proto/deviceplugin/v1beta1/api.proto",
    "proto/podresources/v1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: the build script is single-threaded; prost-build reads PROTOC from here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    // Each file is compiled on its own: they are separate packages with no imports.
    for proto in PROTOS {
        let dir = proto.trim_end_matches("/api.proto");
        tonic_prost_build::configure().build_client(true).build_server(true).compile_protos(&[proto], &[dir])?;
    }
    Ok(())
}

//! Generates the CRI v1 messages, client and server from `proto/api.proto`. The protoc comes
//! from the `protoc-bin-vendored` crate, so building needs no system protobuf compiler.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: the build script is single-threaded; prost-build reads PROTOC from here.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=proto/api.proto");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_protos(&["proto/api.proto"], &["proto/"])?;
    Ok(())
}

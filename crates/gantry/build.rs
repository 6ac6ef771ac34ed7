//! Link options for the `gantry` binary.

fn main() {
    // Packed relative relocations (DT_RELR): the dynamic loader reads them once at start, and
    // in the classic format they were ~1.9 MB of the binary that stayed resident (the
    // api_pods bench: file-backed RSS −1.5 MiB). Needs GNU ld ≥ 2.38 and glibc ≥ 2.36, as
    // on Debian 12; the binary then needs glibc ≥ 2.36 wherever it runs.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
}

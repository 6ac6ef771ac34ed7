//! Link options for the `gantry` binary, and the build's git facts for `gantry version`.

use std::process::Command;

fn main() {
    // Packed relative relocations (DT_RELR): the dynamic loader reads them once at start, and
    // in the classic format they were ~1.9 MB of the binary that stayed resident (the
    // api_pods bench: file-backed RSS −1.5 MiB). Needs GNU ld ≥ 2.38 and glibc ≥ 2.36, as
    // on Debian 12; the binary then needs glibc ≥ 2.36 wherever it runs.
    println!("cargo:rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    hot_functions_first();

    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .env("TZ", "UTC")
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = git(&["rev-parse", "HEAD"]).unwrap_or_default();
    let tree_state = match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if s.is_empty() => "clean",
        Some(_) => "dirty",
        None => "",
    };
    // The commit's date, not the clock's, so that a rebuild of the same commit is the same.
    let date = git(&["log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%dT%H:%M:%SZ"]).unwrap_or_default();
    println!("cargo:rustc-env=GANTRY_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=GANTRY_GIT_TREE_STATE={tree_state}");
    println!("cargo:rustc-env=GANTRY_BUILD_DATE={date}");
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for file in ["HEAD", "index", "logs/HEAD"] {
            println!("cargo:rerun-if-changed={dir}/{file}");
        }
    }
}

/// The functions a settled agent runs go first in the code, next to each other. Most of a
/// settled agent's resident memory is pages of its code, and the kernel maps each touched page
/// with the cached pages around it (fault-around, 64 KiB): the 1.8 MiB of functions that 110
/// settled pods run were spread over 12 MiB of such windows. The list comes from callgrind
/// profiles of the density bench (`scripts/hot-functions`); a name the build no longer has is
/// skipped. Release builds on x86_64 Linux only, where rustc links with LLD (Rust ≥ 1.90),
/// the linker that reads the list.
fn hot_functions_first() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let lld_target = var("CARGO_CFG_TARGET_ARCH") == "x86_64"
        && var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "gnu";
    let list = std::path::Path::new(&var("CARGO_MANIFEST_DIR")).join("hot-functions.txt");
    println!("cargo:rerun-if-changed={}", list.display());
    if var("PROFILE") == "release" && lld_target {
        println!("cargo:rustc-link-arg-bins=-Wl,--symbol-ordering-file={}", list.display());
        println!("cargo:rustc-link-arg-bins=-Wl,--no-warn-symbol-ordering");
    }
}

//! What `gantry --version`, `gantry kubelet --version` and `gantry version` print: the Kubernetes
//! version whose kubelet Gantry stands in for (the one the Node reports as `kubeletVersion`),
//! and the build's git commit, as upstream's version info has them.

use gantry_vocab::keys::KUBELET_VERSION;

/// One line, as `kubelet --version` prints it: `Kubernetes v1.34.0-gantry.0.1.0`.
pub fn line() -> String {
    format!("Kubernetes {KUBELET_VERSION}")
}

/// Upstream's `version.Info` fields, from the build.
pub fn info() -> serde_json::Value {
    let numbers: Vec<&str> = KUBELET_VERSION.trim_start_matches('v').split('.').collect();
    serde_json::json!({
        "major": numbers.first().copied().unwrap_or_default(),
        "minor": numbers.get(1).copied().unwrap_or_default(),
        "gitVersion": KUBELET_VERSION,
        "gitCommit": env!("GANTRY_GIT_COMMIT"),
        "gitTreeState": env!("GANTRY_GIT_TREE_STATE"),
        "buildDate": env!("GANTRY_BUILD_DATE"),
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch()),
    })
}

/// Go's names for the architectures, as `platform` carries them (`linux/amd64`).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// `--version` among the kubelet's flags, with pflag's forms: `--version` and
/// `--version=true` print the line, `--version=raw` the whole info, `--version=false` is a
/// no-op (the flag is dropped before the rest is parsed).
pub enum KubeletVersionFlag {
    Absent,
    Print,
    Raw,
    Invalid(String),
}

pub fn kubelet_flag(args: &mut Vec<String>) -> KubeletVersionFlag {
    let end = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let Some(i) = args[..end].iter().position(|a| a == "--version" || a.starts_with("--version=")) else {
        return KubeletVersionFlag::Absent;
    };
    let flag = args.remove(i);
    match flag.split_once('=').map(|(_, v)| v) {
        None | Some("true") => KubeletVersionFlag::Print,
        Some("raw") => KubeletVersionFlag::Raw,
        Some("false") => kubelet_flag(args),
        Some(other) => KubeletVersionFlag::Invalid(other.to_string()),
    }
}

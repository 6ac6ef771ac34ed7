#![no_main]
//! A static pod manifest (YAML or JSON, Pod or PodList): decoding, then the static-pod
//! defaults and validation the file source applies.

use libfuzzer_sys::fuzz_target;
use gantry_agent::source::manifest::parse_pods;
use gantry_agent::source::static_pod::{Origin, prepare};

fuzz_target!(|data: &[u8]| {
    if let Ok(pods) = parse_pods(data, "fuzz.yaml") {
        for pod in pods {
            let _ = prepare(pod, &Origin::File("/etc/kubernetes/manifests/fuzz.yaml"), "node-1");
        }
    }
});

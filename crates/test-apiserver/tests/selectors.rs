//! Field and label selectors on list (watch is covered in watch.rs).

mod common;

use common::{create_pod, start, status};
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn names(list: kube::api::ObjectList<impl kube::Resource + Clone>) -> Vec<String> {
    let mut n: Vec<String> = list.items.iter().filter_map(|o| o.meta().name.clone()).collect();
    n.sort();
    n
}

#[tokio::test]
async fn pod_field_selectors() {
    let (_server, client) = start().await;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap())
        .await
        .unwrap();
    create_pod(&client, "default", "a", Some("n1")).await;
    create_pod(&client, "default", "b", Some("n2")).await;
    create_pod(&client, "other", "c", Some("n1")).await;
    create_pod(&client, "default", "d", None).await;
    Api::<Pod>::namespaced(client.clone(), "default")
        .patch_status("a", &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Running"}})))
        .await
        .unwrap();
    let all: Api<Pod> = Api::all(client.clone());
    let q = |s: &str| ListParams::default().fields(s);
    assert_eq!(names(all.list(&q("spec.nodeName=n1")).await.unwrap()), vec!["a", "c"]);
    assert_eq!(names(all.list(&q("spec.nodeName=")).await.unwrap()), vec!["d"]);
    assert_eq!(names(all.list(&q("spec.nodeName=n1,status.phase=Running")).await.unwrap()), vec!["a"]);
    assert_eq!(names(all.list(&q("status.phase!=Running")).await.unwrap()), vec!["b", "c", "d"]);
    assert_eq!(
        names(all.list(&q("spec.schedulerName=default-scheduler,metadata.namespace=other")).await.unwrap()),
        vec!["c"]
    );
    assert_eq!(names(all.list(&q("metadata.name==b")).await.unwrap()), vec!["b"]);
    let e = status(all.list(&q("spec.foo=bar")).await.unwrap_err());
    assert_eq!((e.code, e.message.as_str()), (400, "field label not supported: spec.foo"));
}

#[tokio::test]
async fn label_selectors() {
    let (_server, client) = start().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    for (name, labels) in [
        ("a", json!({"env": "prod", "tier": "web"})),
        ("b", json!({"env": "staging", "tier": "db"})),
        ("c", json!({"env": "dev"})),
        ("d", json!({})),
    ] {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    let q = |s: &str| ListParams::default().labels(s);
    let got = |l: kube::api::ObjectList<ConfigMap>| names(l).into_iter().filter(|n| n.len() == 1).collect::<Vec<_>>();
    assert_eq!(got(cms.list(&q("env=prod")).await.unwrap()), vec!["a"]);
    assert_eq!(got(cms.list(&q("env==staging")).await.unwrap()), vec!["b"]);
    assert_eq!(got(cms.list(&q("env!=prod")).await.unwrap()), vec!["b", "c", "d"]);
    assert_eq!(got(cms.list(&q("env in (prod,dev)")).await.unwrap()), vec!["a", "c"]);
    assert_eq!(got(cms.list(&q("env notin (prod,dev)")).await.unwrap()), vec!["b", "d"]);
    assert_eq!(got(cms.list(&q("tier")).await.unwrap()), vec!["a", "b"]);
    assert_eq!(got(cms.list(&q("!tier")).await.unwrap()), vec!["c", "d"]);
    assert_eq!(got(cms.list(&q("env,!tier")).await.unwrap()), vec!["c"]);
    assert_eq!(status(cms.list(&q("env in prod")).await.unwrap_err()).code, 400);
}

#[tokio::test]
async fn event_involved_object_selectors() {
    let (_server, client) = start().await;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    for (name, obj) in [("e1", "p1"), ("e2", "p2")] {
        let ev: Event = serde_json::from_value(
            json!({"metadata": {"name": name}, "involvedObject": {"kind": "Pod", "name": obj, "namespace": "default"},
            "reason": "Pulled", "type": "Normal", "source": {"component": "kubelet"}}),
        )
        .unwrap();
        events.create(&PostParams::default(), &ev).await.unwrap();
    }
    let q = |s: &str| ListParams::default().fields(s);
    assert_eq!(names(events.list(&q("involvedObject.name=p2,involvedObject.kind=Pod")).await.unwrap()), vec!["e2"]);
    assert_eq!(names(events.list(&q("source=kubelet,type=Normal")).await.unwrap()).len(), 2);
}

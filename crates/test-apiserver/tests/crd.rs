//! CustomResourceDefinitions: registration, CRUD on custom resources, status subresource,
//! strategic merge patch refused with 415, discovery, deletion.

mod common;

use common::{start, status};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::discovery::{Discovery, Scope};
use serde_json::json;

fn crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "maintenances.gantry.dev"},
        "spec": {
            "group": "gantry.dev", "scope": "Namespaced",
            "names": {"plural": "maintenances", "singular": "maintenance", "kind": "Maintenance", "shortNames": ["mnt"]},
            "versions": [
                {"name": "v1alpha1", "served": true, "storage": true, "subresources": {"status": {}},
                 "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}},
            ]
        }
    }))
    .unwrap()
}

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("gantry.dev", "v1alpha1", "Maintenance"), "maintenances")
}

#[tokio::test]
async fn crd_lifecycle_and_custom_resources() {
    let (_server, client) = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let created = crds.create(&PostParams::default(), &crd()).await.unwrap();
    let conditions = created.status.unwrap().conditions.unwrap();
    assert!(conditions.iter().any(|c| c.type_ == "Established" && c.status == "True"));

    let ar = resource();
    let mnts: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gantry.dev/v1alpha1", "kind": "Maintenance",
        "metadata": {"name": "m1"}, "spec": {"node": "n1"}, "status": {"phase": "ignored-on-create"}
    }))
    .unwrap();
    let m = mnts.create(&PostParams::default(), &obj).await.unwrap();
    assert!(m.data.get("status").is_none(), "status is dropped on create with a status subresource");
    assert_eq!(m.metadata.generation, Some(1));

    // Main endpoint ignores status; spec changes bump generation.
    let m = mnts
        .patch("m1", &PatchParams::default(), &Patch::Merge(json!({"spec": {"node": "n2"}, "status": {"phase": "x"}})))
        .await
        .unwrap();
    assert_eq!(m.metadata.generation, Some(2));
    assert!(m.data.get("status").is_none());
    // /status changes only status.
    let m = mnts
        .patch_status(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"node": "n3"}, "status": {"phase": "Draining"}})),
        )
        .await
        .unwrap();
    assert_eq!(m.data["status"]["phase"], "Draining");
    assert_eq!(m.data["spec"]["node"], "n2");
    assert_eq!(m.metadata.generation, Some(2));

    // Strategic merge patch is not supported for custom resources.
    let e = status(
        mnts.patch("m1", &PatchParams::default(), &Patch::Strategic(json!({"spec": {"node": "n4"}})))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (415, "UnsupportedMediaType"));

    assert_eq!(mnts.list(&ListParams::default()).await.unwrap().items.len(), 1);
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    assert_eq!(all.list(&ListParams::default()).await.unwrap().items.len(), 1);

    // Discovery serves the new group.
    let discovery = Discovery::new(client.clone()).run().await.unwrap();
    let (found, caps) =
        discovery.resolve_gvk(&GroupVersionKind::gvk("gantry.dev", "v1alpha1", "Maintenance")).expect("discovered");
    assert_eq!(found.plural, "maintenances");
    assert_eq!(caps.scope, Scope::Namespaced);
    let aggregated = Discovery::new(client.clone()).run_aggregated().await.unwrap();
    assert!(aggregated.has_group("gantry.dev"));

    // Deleting the CRD removes its resources and stops serving them.
    crds.delete("maintenances.gantry.dev", &DeleteParams::default()).await.unwrap();
    assert_eq!(status(mnts.get("m1").await.unwrap_err()).code, 404);
    assert_eq!(status(mnts.list(&ListParams::default()).await.unwrap_err()).code, 404);
}

#[tokio::test]
async fn cluster_scoped_crd_without_status() {
    let (_server, client) = start().await;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut def = crd();
    def.metadata.name = Some("pools.gantry.dev".into());
    def.spec.names.plural = "pools".into();
    def.spec.names.kind = "Pool".into();
    def.spec.names.singular = Some("pool".into());
    def.spec.names.short_names = None;
    def.spec.scope = "Cluster".into();
    def.spec.versions[0].subresources = None;
    crds.create(&PostParams::default(), &def).await.unwrap();
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("gantry.dev", "v1alpha1", "Pool"), "pools");
    let pools: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "gantry.dev/v1alpha1", "kind": "Pool", "metadata": {"name": "p"}, "status": {"kept": true}})).unwrap();
    let p = pools.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(p.data["status"]["kept"], true, "without a status subresource status is ordinary data");
    assert!(p.metadata.namespace.is_none());

    // A CRD whose name does not match its names is invalid.
    let mut bad = crd();
    bad.metadata.name = Some("wrong.gantry.dev".into());
    assert_eq!(status(crds.create(&PostParams::default(), &bad).await.unwrap_err()).code, 422);
}

//! Object operations with kube-apiserver's generic-registry semantics: create, get, list,
//! update (optimistic concurrency, status subresource isolation, no-op detection), patch,
//! and delete (preconditions, graceful deletion, finalizers). Everything here runs under
//! the store lock, so each operation is atomic and its events are ordered.

use serde_json::{Value, json};

use crate::UserInfo;
use crate::auth::{self, Admission, Operation};
use crate::kinds;
use crate::meta;
use crate::patch::{self, PatchType};
use crate::pods;
use crate::resources::ResourceType;
use crate::selectors::{FieldSelector, LabelSelector};
use crate::status::{ApiError, ApiResult, FieldError, GroupResource, success_status};
use crate::store::StoreInner;

/// Who writes what, where.
pub struct WriteCtx<'a> {
    pub user: &'a UserInfo,
    pub rt: &'a ResourceType,
    /// Empty for cluster-scoped resources.
    pub namespace: &'a str,
    /// "" for the main resource, else the subresource ("status", "ephemeralcontainers").
    pub subresource: &'a str,
    pub dry_run: bool,
}

impl WriteCtx<'_> {
    fn gr(&self) -> GroupResource {
        self.rt.group_resource()
    }

    fn admit(
        &self,
        inner: &StoreInner,
        op: Operation,
        name: &str,
        old: Option<&Value>,
        new: Option<&Value>,
    ) -> ApiResult<()> {
        auth::admit(
            inner,
            &Admission {
                user: self.user,
                rt: self.rt,
                subresource: self.subresource,
                op,
                namespace: self.namespace,
                name,
                old,
                new,
            },
        )
    }
}

/// The object as served through `rt`'s version (custom resources are stored once and
/// served under every version with only apiVersion changed, like `conversion: None`).
pub fn present(rt: &ResourceType, obj: &Value) -> Value {
    let mut out = obj.clone();
    out["apiVersion"] = json!(rt.api_version());
    out["kind"] = json!(rt.kind);
    out
}

pub fn get(inner: &StoreInner, rt: &ResourceType, ns: &str, name: &str) -> ApiResult<Value> {
    inner
        .get(&rt.storage, ns, name)
        .map(|o| present(rt, &o))
        .ok_or_else(|| ApiError::not_found(&rt.group_resource(), name))
}

fn check_type_meta(rt: &ResourceType, obj: &Value) -> ApiResult<()> {
    if !obj.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    }
    if let Some(v) = obj.get("apiVersion").and_then(Value::as_str).filter(|v| !v.is_empty())
        && v != rt.api_version()
    {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({v}) does not match the expected API version ({})",
            rt.api_version()
        )));
    }
    if let Some(k) = obj.get("kind").and_then(Value::as_str).filter(|k| !k.is_empty())
        && k != rt.kind
    {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({k}) does not match the expected kind ({})",
            rt.kind
        )));
    }
    Ok(())
}

/// Fills metadata.namespace from the URL, refusing a different one in the body.
fn reconcile_namespace(ctx: &WriteCtx<'_>, obj: &mut Value) -> ApiResult<()> {
    if !obj["metadata"].is_object() {
        obj["metadata"] = json!({});
    }
    if !ctx.rt.namespaced {
        meta::set_meta(obj, "namespace", None);
        return Ok(());
    }
    match meta::namespace(obj) {
        "" => meta::set_meta(obj, "namespace", Some(json!(ctx.namespace))),
        ns if ns != ctx.namespace => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        _ => {}
    }
    Ok(())
}

const SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
pub(crate) const LABEL_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";

pub(crate) fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Upstream `IsDNS1123Subdomain`: at most 253 characters matching the regex; unlike a label,
/// a dot-separated part has no length limit of its own (a VolumeAttachment's name is
/// `csi-` and 64 hex digits).
fn is_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        })
}

fn validate_name(rt: &ResourceType, name: &str) -> ApiResult<()> {
    if rt.group == "certificates.k8s.io" && rt.plural == "certificatesigningrequests" {
        // Upstream does not care what CSRs are called (the kubelet's names hold base64url):
        // only the path segment rules every name follows apply.
        return validate_path_segment(rt, name);
    }
    let dns_label = matches!(rt.plural.as_str(), "namespaces" | "services") && rt.group.is_empty();
    let ok = if dns_label { is_label(name) } else { is_subdomain(name) };
    if ok {
        return Ok(());
    }
    let msg = if dns_label { LABEL_MSG } else { SUBDOMAIN_MSG };
    Err(ApiError::invalid(&rt.kind, &rt.group, name, vec![FieldError::invalid("metadata.name", &json!(name), msg)]))
}

fn validate_path_segment(rt: &ResourceType, name: &str) -> ApiResult<()> {
    let problem = match name {
        "." | ".." => Some(format!("may not be '{name}'")),
        _ => ["/", "%"].iter().find(|c| name.contains(*c)).map(|c| format!("may not contain '{c}'")),
    };
    match problem {
        None => Ok(()),
        Some(msg) => Err(ApiError::invalid(
            &rt.kind,
            &rt.group,
            name,
            vec![FieldError::invalid("metadata.name", &json!(name), &msg)],
        )),
    }
}

/// Checks that a namespaced write targets an existing namespace that is not terminating.
fn check_namespace(inner: &StoreInner, ctx: &WriteCtx<'_>, name: &str) -> ApiResult<()> {
    if !ctx.rt.namespaced {
        return Ok(());
    }
    match inner.get("namespaces", "", ctx.namespace) {
        None => Err(ApiError::not_found(&GroupResource::new("", "namespaces"), ctx.namespace)),
        Some(ns) if meta::is_deleting(&ns) => Err(ApiError::forbidden(
            &ctx.gr(),
            name,
            &format!("unable to create new content in namespace {} because it is being terminated", ctx.namespace),
        )
        .with_details(json!({"name": name, "group": ctx.rt.group, "kind": ctx.rt.plural,
            "causes": [{"reason": "NamespaceTerminating", "message": format!("namespace {} is being terminated", ctx.namespace), "field": "metadata.namespace"}]}))),
        Some(_) => Ok(()),
    }
}

fn has_spec_semantics(rt: &ResourceType, obj: &Value) -> bool {
    rt.custom || obj.get("spec").is_some()
}

/// POST: create a new object.
pub fn create(inner: &mut StoreInner, ctx: &WriteCtx<'_>, mut obj: Value) -> ApiResult<Value> {
    check_type_meta(ctx.rt, &obj)?;
    reconcile_namespace(ctx, &mut obj)?;
    let generate = meta::str_at(&obj, "/metadata/generateName").to_string();
    let mut name = meta::name(&obj).to_string();
    if name.is_empty() && !generate.is_empty() {
        name = unused_generated_name(inner, ctx, &generate);
    }
    if name.is_empty() {
        return Err(ApiError::invalid(
            &ctx.rt.kind,
            &ctx.rt.group,
            "",
            vec![FieldError::required("metadata.name", "name or generateName is required")],
        ));
    }
    validate_name(ctx.rt, &name)?;
    check_namespace(inner, ctx, &name)?;
    meta::set_meta(&mut obj, "name", Some(json!(name)));
    stamp_system_fields(ctx.rt, &mut obj);
    kinds::prepare_create(inner, ctx, &mut obj)?;
    ctx.admit(inner, Operation::Create, &name, None, Some(&obj))?;
    if inner.get(&ctx.rt.storage, ctx.namespace, &name).is_some() {
        return Err(ApiError::already_exists(&ctx.gr(), &name));
    }
    if ctx.dry_run {
        return Ok(present(ctx.rt, &obj));
    }
    let stored = inner.put(&ctx.rt.storage, obj);
    kinds::after_write(inner, ctx.rt, ctx.namespace, Some(&stored), None);
    Ok(present(ctx.rt, &stored))
}

fn unused_generated_name(inner: &StoreInner, ctx: &WriteCtx<'_>, prefix: &str) -> String {
    let prefix: String = prefix.chars().take(58).collect();
    loop {
        let candidate = format!("{prefix}{}", meta::random_suffix());
        if inner.get(&ctx.rt.storage, ctx.namespace, &candidate).is_none() {
            return candidate;
        }
    }
}

fn stamp_system_fields(rt: &ResourceType, obj: &mut Value) {
    obj["apiVersion"] = json!(rt.api_version());
    obj["kind"] = json!(rt.kind);
    meta::set_meta(obj, "uid", Some(json!(meta::new_uid())));
    meta::set_meta(obj, "creationTimestamp", Some(json!(meta::now())));
    for field in ["resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink", "managedFields"] {
        meta::set_meta(obj, field, None);
    }
    let generation = if has_spec_semantics(rt, obj) { Some(json!(1)) } else { None };
    meta::set_meta(obj, "generation", generation);
}

/// PUT: replace an object (or create it, for resources that allow create-on-update).
/// Returns the object and whether it was created.
pub fn update(inner: &mut StoreInner, ctx: &WriteCtx<'_>, name: &str, mut obj: Value) -> ApiResult<(Value, bool)> {
    check_type_meta(ctx.rt, &obj)?;
    reconcile_namespace(ctx, &mut obj)?;
    match meta::name(&obj) {
        "" => meta::set_meta(&mut obj, "name", Some(json!(name))),
        n if n != name => {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        _ => {}
    }
    let Some(existing) = inner.get(&ctx.rt.storage, ctx.namespace, name) else {
        if ctx.rt.create_on_update && ctx.subresource.is_empty() {
            meta::set_meta(&mut obj, "resourceVersion", None);
            return create(inner, ctx, obj).map(|o| (o, true));
        }
        return Err(ApiError::not_found(&ctx.gr(), name));
    };
    let existing = (*existing).clone();
    update_existing(inner, ctx, name, existing, obj).map(|o| (o, false))
}

/// The shared tail of PUT and PATCH: apply update rules to `obj` against `existing`.
fn update_existing(
    inner: &mut StoreInner,
    ctx: &WriteCtx<'_>,
    name: &str,
    existing: Value,
    obj: Value,
) -> ApiResult<Value> {
    let requested_rv = meta::resource_version(&obj).to_string();
    if !requested_rv.is_empty() && requested_rv != meta::resource_version(&existing) {
        return Err(ApiError::modified(&ctx.gr(), name));
    }
    let body_uid = meta::uid(&obj).to_string();
    if !body_uid.is_empty() && body_uid != meta::uid(&existing) {
        return Err(ApiError::invalid(
            &ctx.rt.kind,
            &ctx.rt.group,
            name,
            vec![FieldError::invalid("metadata.uid", &json!(body_uid), "field is immutable")],
        ));
    }
    let mut new = isolate_subresource(ctx, &existing, obj);
    preserve_system_fields(&existing, &mut new);
    check_new_finalizers(ctx, &existing, &new, name)?;
    kinds::prepare_update(inner, ctx, &existing, &mut new)?;
    bump_generation(ctx.rt, &existing, &mut new);
    if without_rv(&new) == without_rv(&existing) {
        // A no-op update: nothing is written and the resourceVersion stays.
        return Ok(present(ctx.rt, &existing));
    }
    ctx.admit(inner, Operation::Update, name, Some(&existing), Some(&new))?;
    if ctx.dry_run {
        return Ok(present(ctx.rt, &new));
    }
    if should_delete_during_update(&existing, &new) {
        let gone = inner.remove(&ctx.rt.storage, ctx.namespace, name).expect("exists under lock");
        kinds::after_write(inner, ctx.rt, ctx.namespace, None, Some(&gone));
        return Ok(present(ctx.rt, &gone));
    }
    let stored = inner.put(&ctx.rt.storage, new);
    kinds::after_write(inner, ctx.rt, ctx.namespace, Some(&stored), Some(&existing));
    Ok(present(ctx.rt, &stored))
}

fn without_rv(obj: &Value) -> Value {
    let mut o = obj.clone();
    meta::set_meta(&mut o, "resourceVersion", None);
    o
}

/// The main resource never changes `status`; the status subresource changes only `status`
/// (and, for built-in types, metadata other than ownerReferences, as upstream's status
/// strategies allow).
fn isolate_subresource(ctx: &WriteCtx<'_>, existing: &Value, mut obj: Value) -> Value {
    let rt = ctx.rt;
    let copy_from_existing = |obj: &mut Value, field: &str| match existing.get(field) {
        Some(v) => obj[field] = v.clone(),
        None => {
            if let Some(m) = obj.as_object_mut() {
                m.remove(field);
            }
        }
    };
    if ctx.subresource == "ephemeralcontainers" {
        // Upstream's ephemeral containers strategy: only spec.ephemeralContainers changes.
        let mut out = existing.clone();
        match obj.pointer("/spec/ephemeralContainers") {
            Some(list) => out["spec"]["ephemeralContainers"] = list.clone(),
            None => {
                if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
                    spec.remove("ephemeralContainers");
                }
            }
        }
        return out;
    }
    if ctx.subresource == "resize" {
        return crate::resize::keep_resize_fields(existing, &obj);
    }
    if matches!(ctx.subresource, "status" | "approval") {
        if rt.custom {
            let mut out = existing.clone();
            match obj.get("status") {
                Some(s) => out["status"] = s.clone(),
                None => {
                    if let Some(m) = out.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            return out;
        }
        let keys: Vec<String> = obj.as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        for key in keys
            .iter()
            .chain(existing.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>()).unwrap_or_default().iter())
        {
            if !matches!(key.as_str(), "status" | "metadata" | "apiVersion" | "kind") {
                copy_from_existing(&mut obj, key);
            }
        }
        let owners = existing.pointer("/metadata/ownerReferences").cloned();
        meta::set_meta(&mut obj, "ownerReferences", owners);
        return obj;
    }
    if rt.has_status() {
        copy_from_existing(&mut obj, "status");
    }
    obj
}

fn preserve_system_fields(existing: &Value, new: &mut Value) {
    for field in ["uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation"] {
        meta::set_meta(new, field, existing.pointer(&format!("/metadata/{field}")).cloned());
    }
    meta::set_meta(new, "managedFields", None);
    meta::set_meta(new, "selfLink", None);
    new["apiVersion"] = existing["apiVersion"].clone();
    new["kind"] = existing["kind"].clone();
}

fn check_new_finalizers(ctx: &WriteCtx<'_>, existing: &Value, new: &Value, name: &str) -> ApiResult<()> {
    if !meta::is_deleting(existing) {
        return Ok(());
    }
    let old = meta::finalizers(existing);
    let added: Vec<String> = meta::finalizers(new).into_iter().filter(|f| !old.contains(f)).collect();
    if added.is_empty() {
        return Ok(());
    }
    let quoted: Vec<String> = added.iter().map(|f| format!("{f:?}")).collect();
    Err(ApiError::invalid(
        &ctx.rt.kind,
        &ctx.rt.group,
        name,
        vec![FieldError::forbidden(
            "metadata.finalizers",
            &format!(
                "no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                quoted.join(", ")
            ),
        )],
    ))
}

/// metadata.generation counts spec changes (for custom resources: any change outside
/// metadata and status).
fn bump_generation(rt: &ResourceType, existing: &Value, new: &mut Value) {
    let strip = |o: &Value| {
        let mut o = o.clone();
        if let Some(m) = o.as_object_mut() {
            m.remove("metadata");
            m.remove("status");
            m.remove("apiVersion");
            m.remove("kind");
        }
        o
    };
    let changed = if rt.custom { strip(existing) != strip(new) } else { existing.get("spec") != new.get("spec") };
    if changed && has_spec_semantics(rt, new) {
        let generation = existing.pointer("/metadata/generation").and_then(Value::as_i64).unwrap_or(0) + 1;
        meta::set_meta(new, "generation", Some(json!(generation)));
    }
}

/// An update that removes the last finalizer of an object whose deletion is due deletes it.
fn should_delete_during_update(existing: &Value, new: &Value) -> bool {
    let grace = new.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64).unwrap_or(0);
    meta::is_deleting(new) && meta::finalizers(new).is_empty() && !meta::finalizers(existing).is_empty() && grace == 0
}

/// PATCH. Returns the object and whether it was created (server-side apply of a missing
/// object).
pub fn patch(
    inner: &mut StoreInner,
    ctx: &WriteCtx<'_>,
    name: &str,
    kind: PatchType,
    body: &Value,
) -> ApiResult<(Value, bool)> {
    let Some(existing) = inner.get(&ctx.rt.storage, ctx.namespace, name) else {
        if kind == PatchType::Apply && ctx.subresource.is_empty() {
            let mut obj = body.clone();
            if meta::name(&obj).is_empty() {
                meta::set_meta(&mut obj, "name", Some(json!(name)));
            } else if meta::name(&obj) != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({}) does not match the name on the URL ({name})",
                    meta::name(&obj)
                )));
            }
            return create(inner, ctx, obj).map(|o| (o, true));
        }
        return Err(ApiError::not_found(&ctx.gr(), name));
    };
    let existing = (*existing).clone();
    let base = present(ctx.rt, &existing);
    let mut patched = patch::apply(kind, &ctx.rt.kind, !ctx.rt.custom, &base, body)?;
    if kind == PatchType::Apply {
        // Apply configurations carry no resourceVersion unless the caller wants a precondition.
        if body.pointer("/metadata/resourceVersion").is_none() {
            meta::set_meta(&mut patched, "resourceVersion", Some(json!(meta::resource_version(&existing))));
        }
    }
    check_type_meta(ctx.rt, &patched)?;
    reconcile_namespace(ctx, &mut patched)?;
    if meta::name(&patched) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta::name(&patched)
        )));
    }
    update_existing(inner, ctx, name, existing, patched).map(|o| (o, false))
}

/// DeleteOptions, from the body and/or query parameters.
#[derive(Debug, Default, Clone)]
pub struct DeleteOptions {
    pub grace_period_seconds: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub propagation_policy: Option<String>,
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Reads a `DeleteOptions` object (v1; also accepted inside an Eviction).
    pub fn from_value(v: &Value) -> ApiResult<DeleteOptions> {
        if !v.is_object() && !v.is_null() {
            return Err(ApiError::bad_request("DeleteOptions must be a JSON object"));
        }
        let grace = match v.get("gracePeriodSeconds") {
            None | Some(Value::Null) => None,
            Some(g) => Some(g.as_i64().ok_or_else(|| ApiError::bad_request("gracePeriodSeconds must be an integer"))?),
        };
        let s = |p: &str| v.pointer(p).and_then(Value::as_str).map(String::from);
        let policy = s("/propagationPolicy");
        if let Some(p) = &policy
            && !matches!(p.as_str(), "Orphan" | "Background" | "Foreground")
        {
            return Err(ApiError::invalid(
                "DeleteOptions",
                "",
                "",
                vec![FieldError::invalid(
                    "propagationPolicy",
                    &json!(p),
                    "propagationPolicy must be one of Orphan, Background, Foreground",
                )],
            ));
        }
        let dry_run = v.get("dryRun").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        Ok(DeleteOptions {
            grace_period_seconds: grace,
            precondition_uid: s("/preconditions/uid"),
            precondition_rv: s("/preconditions/resourceVersion"),
            propagation_policy: policy,
            dry_run,
        })
    }
}

/// What a DELETE did.
pub enum Deleted {
    /// Removed from storage; the last state.
    Gone(Value),
    /// Still present (graceful deletion or finalizers pending); the current state.
    Pending(Value),
}

/// DELETE with upstream's rules: preconditions, graceful deletion for pods (a second delete
/// may only shorten the grace period), finalizers keep the object until they are removed.
/// `propagationPolicy` is accepted but there is no garbage collector.
pub fn delete(inner: &mut StoreInner, ctx: &WriteCtx<'_>, name: &str, opts: &DeleteOptions) -> ApiResult<Deleted> {
    let Some(existing) = inner.get(&ctx.rt.storage, ctx.namespace, name) else {
        return Err(ApiError::not_found(&ctx.gr(), name));
    };
    let existing = (*existing).clone();
    if let Some(uid) = &opts.precondition_uid
        && uid != meta::uid(&existing)
    {
        let why =
            format!("Precondition failed: UID in precondition: {uid}, UID in object meta: {}", meta::uid(&existing));
        return Err(ApiError::conflict(&ctx.gr(), name, &why));
    }
    if let Some(rv) = &opts.precondition_rv
        && rv != meta::resource_version(&existing)
    {
        let why = format!(
            "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
            meta::resource_version(&existing)
        );
        return Err(ApiError::conflict(&ctx.gr(), name, &why));
    }
    ctx.admit(inner, Operation::Delete, name, Some(&existing), None)?;
    if let Some(handled) = kinds::before_delete(inner, ctx, &existing, opts)? {
        return Ok(handled);
    }
    if ctx.dry_run || opts.dry_run {
        return Ok(Deleted::Pending(present(ctx.rt, &existing)));
    }
    let graceful = ctx.rt.group.is_empty() && ctx.rt.plural == "pods";
    let requested = if graceful { Some(pods::grace_period(&existing, opts.grace_period_seconds)) } else { None };
    let outcome = deletion_outcome(&existing, requested);
    let result = match outcome {
        Outcome::Unchanged => Deleted::Pending(present(ctx.rt, &existing)),
        Outcome::Mark(updated) => {
            let stored = inner.put(&ctx.rt.storage, updated);
            kinds::after_write(inner, ctx.rt, ctx.namespace, Some(&stored), Some(&existing));
            Deleted::Pending(present(ctx.rt, &stored))
        }
        Outcome::Remove => {
            let gone = inner.remove(&ctx.rt.storage, ctx.namespace, name).expect("exists under lock");
            kinds::after_write(inner, ctx.rt, ctx.namespace, None, Some(&gone));
            Deleted::Gone(present(ctx.rt, &gone))
        }
    };
    Ok(result)
}

enum Outcome {
    Unchanged,
    Mark(Value),
    Remove,
}

/// BeforeDelete + the store's graceful/finalizer handling. `requested` is the grace period
/// for graceful types (pods), None for everything else.
fn deletion_outcome(existing: &Value, requested: Option<i64>) -> Outcome {
    let has_finalizers = !meta::finalizers(existing).is_empty();
    let current_grace = existing.pointer("/metadata/deletionGracePeriodSeconds").and_then(Value::as_i64);
    if meta::is_deleting(existing) {
        match (current_grace, requested) {
            // Deletion due already (grace 0 or none): waiting on finalizers, or retry the removal.
            (None | Some(0), _) => return if has_finalizers { Outcome::Unchanged } else { Outcome::Remove },
            (Some(current), Some(period)) if period < current => {
                let mut updated = existing.clone();
                let since = meta::str_at(existing, "/metadata/deletionTimestamp");
                let started =
                    meta::parse_time(since).unwrap_or_else(|| jiff::Timestamp::now().as_second() + current) - current;
                meta::set_meta(&mut updated, "deletionTimestamp", Some(json!(meta::format_time(started + period))));
                meta::set_meta(&mut updated, "deletionGracePeriodSeconds", Some(json!(period)));
                return if period == 0 && !has_finalizers { Outcome::Remove } else { Outcome::Mark(updated) };
            }
            // Graceful deletion is pending; a longer or equal grace period changes nothing.
            _ => return Outcome::Unchanged,
        }
    }
    let period = requested.unwrap_or(0);
    if period == 0 && !has_finalizers {
        return Outcome::Remove;
    }
    let mut updated = existing.clone();
    meta::set_meta(&mut updated, "deletionTimestamp", Some(json!(meta::time_in(period))));
    meta::set_meta(&mut updated, "deletionGracePeriodSeconds", Some(json!(period)));
    Outcome::Mark(updated)
}

/// The response body of a DELETE.
pub fn delete_response(rt: &ResourceType, deleted: Deleted) -> Value {
    match deleted {
        Deleted::Pending(obj) => obj,
        Deleted::Gone(obj) if rt.return_deleted_object => obj,
        Deleted::Gone(obj) => {
            let mut details = json!({"name": meta::name(&obj), "kind": rt.plural, "uid": meta::uid(&obj)});
            if !rt.group.is_empty() {
                details["group"] = json!(rt.group);
            }
            success_status(0, Some(details))
        }
    }
}

/// List options from the query string.
#[derive(Debug, Default)]
pub struct ListOptions {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    pub limit: Option<usize>,
    pub continue_token: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
}

impl ListOptions {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches_object(obj) && self.fields.matches(obj)
    }
}

fn parse_rv(rv: &str) -> ApiResult<u64> {
    rv.parse::<u64>().map_err(|_| {
        ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            vec![FieldError::invalid("resourceVersion", &json!(rv), "must be a valid resource version")],
        )
    })
}

const CONTINUE_EXPIRED: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(json!({"rv": rv, "ns": ns, "name": name}).to_string())
}

fn decode_continue(token: &str) -> ApiResult<(u64, String, String)> {
    use base64::Engine;
    let bad = || {
        ApiError::bad_request(
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        )
    };
    let raw = base64::engine::general_purpose::STANDARD.decode(token).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v.get("rv").and_then(Value::as_u64).ok_or_else(bad)?;
    Ok((rv, meta::str_at(&v, "/ns").to_string(), meta::str_at(&v, "/name").to_string()))
}

/// GET on a collection: the matching objects at a consistent resourceVersion, paged with
/// `limit`/`continue` (later pages are served from the first page's snapshot).
pub fn list(inner: &StoreInner, rt: &ResourceType, ns: Option<&str>, opts: &ListOptions) -> ApiResult<Value> {
    let (list_rv, objects, start) = match (&opts.continue_token, &opts.resource_version) {
        (Some(token), _) => {
            let (rv, sns, sname) = decode_continue(token)?;
            let snap = inner.snapshot_at(&rt.storage, rv).map_err(|_| ApiError::expired(CONTINUE_EXPIRED))?;
            (rv, snap, Some((sns, sname)))
        }
        (None, Some(rv)) if opts.resource_version_match.as_deref() == Some("Exact") => {
            let rv = parse_rv(rv)?;
            let snap = inner
                .snapshot_at(&rt.storage, rv)
                .map_err(|_| ApiError::expired("The resourceVersion for the provided list is too old."))?;
            (rv, snap, None)
        }
        (None, rv) => {
            if let Some(rv) = rv.as_deref().filter(|r| !r.is_empty() && *r != "0") {
                let rv = parse_rv(rv)?;
                if rv > inner.current_rv() {
                    return Err(ApiError::new(504, "Timeout", format!("Too large resource version: {rv}, current: {}", inner.current_rv()))
                        .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1})));
                }
            }
            let current = inner.snapshot_at(&rt.storage, inner.current_rv()).unwrap_or_default();
            (inner.current_rv(), current, None)
        }
    };
    let mut items = Vec::new();
    let mut next_key = None;
    let mut remaining = 0usize;
    for ((ons, oname), obj) in objects.iter() {
        if ns.is_some_and(|n| n != ons) {
            continue;
        }
        if let Some((sns, sname)) = &start
            && (ons.as_str(), oname.as_str()) <= (sns.as_str(), sname.as_str())
        {
            continue;
        }
        if !opts.matches(obj) {
            continue;
        }
        if opts.limit.is_some_and(|l| l > 0 && items.len() >= l) {
            remaining += 1;
            continue;
        }
        next_key = Some((ons.clone(), oname.clone()));
        items.push(list_item(rt, obj));
    }
    let mut metadata = json!({"resourceVersion": list_rv.to_string()});
    if remaining > 0
        && let Some((kns, kname)) = next_key
    {
        metadata["continue"] = json!(encode_continue(list_rv, &kns, &kname));
        metadata["remainingItemCount"] = json!(remaining);
    }
    Ok(json!({"kind": rt.list_kind(), "apiVersion": rt.api_version(), "metadata": metadata, "items": items}))
}

/// Items of built-in lists carry no apiVersion/kind (as upstream's typed lists); custom
/// resource items do.
fn list_item(rt: &ResourceType, obj: &Value) -> Value {
    let mut item = present(rt, obj);
    if !rt.custom
        && let Some(m) = item.as_object_mut()
    {
        m.remove("apiVersion");
        m.remove("kind");
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn graceful_delete_marks_then_shortens() {
        let pod = json!({"metadata": {"name": "p"}});
        let Outcome::Mark(marked) = deletion_outcome(&pod, Some(30)) else { panic!("expected mark") };
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 30);
        assert!(matches!(deletion_outcome(&marked, Some(30)), Outcome::Unchanged));
        assert!(matches!(deletion_outcome(&marked, Some(60)), Outcome::Unchanged));
        let Outcome::Mark(shorter) = deletion_outcome(&marked, Some(10)) else { panic!("expected shorten") };
        assert_eq!(shorter["metadata"]["deletionGracePeriodSeconds"], 10);
        assert!(matches!(deletion_outcome(&marked, Some(0)), Outcome::Remove));
    }

    #[test]
    fn finalizers_hold_deletion() {
        let obj = json!({"metadata": {"name": "c", "finalizers": ["x"]}});
        let Outcome::Mark(marked) = deletion_outcome(&obj, None) else { panic!("expected mark") };
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 0);
        assert!(matches!(deletion_outcome(&marked, None), Outcome::Unchanged));
        let mut cleared = marked.clone();
        cleared["metadata"]["finalizers"] = json!([]);
        assert!(should_delete_during_update(&marked, &cleared));
    }

    #[test]
    fn continue_tokens_round_trip() {
        let t = encode_continue(42, "ns", "n");
        assert_eq!(decode_continue(&t).unwrap(), (42, "ns".to_string(), "n".to_string()));
        assert!(decode_continue("!!").is_err());
    }
}

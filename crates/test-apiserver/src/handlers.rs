//! The HTTP layer: authenticate, route, authorize, decode, dispatch to the operations, and
//! encode the answer (objects, lists, watch streams, Status errors).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use serde_json::{Value, json};

use crate::accounting::RequestKey;
use crate::auth;
use crate::discovery;
use crate::eviction;
use crate::meta;
use crate::ops::{self, DeleteOptions, ListOptions, WriteCtx};
use crate::patch::{self, PatchType};
use crate::resources::{Behavior, ResourceType, Subresource};
use crate::reviews;
use crate::routes::{self, ResourcePath, Route};
use crate::selectors::{FieldSelector, LabelSelector, SelectorError};
use crate::state::State;
use crate::status::{ApiError, ApiResult, GroupResource, success_status};
use crate::watch::{self, WatchRequest};
use crate::{AccessRequest, Decision, UserInfo};

pub type Body = BoxBody<Bytes, Infallible>;

/// Largest request body accepted (kube-apiserver's default is 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// The identity from a verified client certificate: (CN, O values).
pub type CertIdentity = (String, Vec<String>);

/// Serves one request; never fails (errors become Status responses).
pub async fn serve(
    state: Arc<State>,
    cert: Option<Arc<CertIdentity>>,
    connection: u64,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if let Some(e) = state.faults.apply().await {
        tracing::debug!(%method, %path, status = e.code, "request answered by an injected fault");
        return Ok(error_response(&e));
    }
    let response = match handle(state, cert, connection, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    tracing::debug!(%method, %path, status = response.status().as_u16(), "request");
    Ok(response)
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes)).boxed()
}

fn json_response_typed(code: u16, value: &Value, content_type: &str) -> Response<Body> {
    let mut body = serde_json::to_vec(value).unwrap_or_default();
    body.push(b'\n');
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header(header::CONTENT_TYPE, content_type)
        .body(full(body))
        .expect("valid response")
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    json_response_typed(code, value, "application/json")
}

pub fn error_response(e: &ApiError) -> Response<Body> {
    let mut response = json_response(e.code, &e.to_status());
    if let Some(secs) = e.details.as_ref().and_then(|d| d.get("retryAfterSeconds")).and_then(Value::as_u64) {
        response.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    response
}

type Query = HashMap<String, String>;

fn parse_query(q: Option<&str>) -> Query {
    form_urlencoded::parse(q.unwrap_or("").as_bytes()).into_owned().collect()
}

fn flag(query: &Query, key: &str) -> bool {
    matches!(query.get(key).map(String::as_str), Some("true" | "1"))
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

async fn handle(
    state: Arc<State>,
    cert: Option<Arc<CertIdentity>>,
    connection: u64,
    req: Request<Incoming>,
) -> ApiResult<Response<Body>> {
    let user = auth::authenticate(&state, bearer_token(req.headers()), cert.as_deref())?;
    state.accounting.used_by(connection, &user.username);
    let route = routes::parse(req.uri().path());
    match route {
        Route::Resource(rp) => resource_request(state, user, rp, req).await,
        other => non_resource_request(&state, user, other, &req),
    }
}

fn non_resource_request(
    state: &State,
    user: UserInfo,
    route: Route,
    req: &Request<Incoming>,
) -> ApiResult<Response<Body>> {
    let access = AccessRequest {
        user,
        verb: req.method().as_str().to_lowercase(),
        path: Some(req.uri().path().to_string()),
        ..Default::default()
    };
    if let Decision::Deny(r) | Decision::NoOpinion(r) = auth::authorize(state, &access, None) {
        return Err(auth::forbidden(&access, &r));
    }
    if req.method() != Method::GET {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("");
    let aggregated = discovery::wants_aggregated(accept);
    let inner = state.store.lock();
    let registry = &inner.registry;
    let value = match route {
        Route::Version => version(),
        Route::Health => {
            return Ok(Response::builder()
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(full(b"ok".to_vec()))
                .expect("valid response"));
        }
        Route::CoreVersions if aggregated => {
            return Ok(json_response_typed(200, &discovery::aggregated(registry, true), discovery::AGGREGATED));
        }
        Route::Groups if aggregated => {
            return Ok(json_response_typed(200, &discovery::aggregated(registry, false), discovery::AGGREGATED));
        }
        Route::CoreVersions => {
            discovery::core_versions(req.uri().authority().map(|a| a.as_str()).unwrap_or("127.0.0.1"))
        }
        Route::Groups => discovery::group_list(registry),
        Route::Group(g) => discovery::group(registry, &g).ok_or_else(ApiError::no_route)?,
        Route::GroupVersion { group, version } => {
            discovery::resource_list(registry, &group, &version).ok_or_else(ApiError::no_route)?
        }
        Route::Resource(_) | Route::Unknown => return Err(ApiError::no_route()),
    };
    Ok(json_response(200, &value))
}

fn version() -> Value {
    json!({
        "major": "1", "minor": "34", "emulationMajor": "1", "emulationMinor": "34",
        "gitVersion": "v1.34.0-gantry-test", "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.24.0", "compiler": "gc", "platform": "linux/amd64",
    })
}

/// The API verb of a resource request.
fn verb_of(method: &Method, rp: &ResourcePath, query: &Query) -> ApiResult<&'static str> {
    let named = rp.name.is_some();
    Ok(match *method {
        Method::GET | Method::HEAD if flag(query, "watch") => "watch",
        Method::GET | Method::HEAD if named => "get",
        Method::GET | Method::HEAD => "list",
        Method::POST => "create",
        Method::PUT if named => "update",
        Method::PATCH if named => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
    })
}

/// kube-apiserver authorizes a request from its URL before routing it, so a caller not allowed
/// to use a resource that does not exist (a CRD not installed yet) gets 403, not 404. Returns
/// the Forbidden error, if any.
fn authorize_unknown(state: &State, user: UserInfo, rp: &ResourcePath, verb: &str) -> Option<ApiError> {
    let access = access_request(user, verb, rp, rp.name.clone().unwrap_or_default());
    match auth::authorize(state, &access, None) {
        Decision::Deny(r) | Decision::NoOpinion(r) => Some(auth::forbidden(&access, &r)),
        Decision::Allow => None,
    }
}

/// The attributes authorization sees, all from the URL (`name` may come from a field selector).
fn access_request(user: UserInfo, verb: &str, rp: &ResourcePath, name: String) -> AccessRequest {
    AccessRequest {
        user,
        verb: verb.to_string(),
        namespace: rp.namespace.clone().unwrap_or_default(),
        api_group: rp.group.clone(),
        api_version: rp.version.clone(),
        resource: rp.resource.clone(),
        subresource: rp.subresource.clone().unwrap_or_default(),
        name,
        path: None,
    }
}

fn lookup_type(state: &State, rp: &ResourcePath) -> ApiResult<Arc<ResourceType>> {
    let rt = state.store.lock().registry.lookup(&rp.group, &rp.version, &rp.resource).ok_or_else(ApiError::no_route)?;
    if !rt.namespaced && rp.namespace.is_some() {
        return Err(ApiError::no_route());
    }
    if let Some(sub) = &rp.subresource
        && !rt.subresources.iter().any(|s| s.name() == sub)
    {
        return Err(ApiError::no_route());
    }
    Ok(rt)
}

fn selectors(rt: &ResourceType, query: &Query) -> ApiResult<(LabelSelector, FieldSelector)> {
    let bad = |e: SelectorError| ApiError::bad_request(e.to_string());
    let labels = LabelSelector::parse(query.get("labelSelector").map(String::as_str).unwrap_or("")).map_err(bad)?;
    let fields = FieldSelector::parse(query.get("fieldSelector").map(String::as_str).unwrap_or("")).map_err(bad)?;
    fields.check_supported(&rt.field_labels()).map_err(bad)?;
    Ok((labels, fields))
}

async fn read_body(req: Request<Incoming>) -> ApiResult<(HeaderMap, Bytes)> {
    let (parts, body) = req.into_parts();
    let collected = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| ApiError::new(413, "RequestEntityTooLarge", format!("the request body could not be read: {e}")))?;
    Ok((parts.headers, collected.to_bytes()))
}

fn content_type(headers: &HeaderMap) -> String {
    headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_string()
}

/// Decodes a JSON (or YAML) object body.
fn decode(headers: &HeaderMap, body: &[u8]) -> ApiResult<Value> {
    let ct = content_type(headers);
    let media = ct.split(';').next().unwrap_or("").trim();
    let value: Value = match media {
        "application/yaml" | "application/x-yaml" | "text/yaml" => serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error converting YAML to JSON: {e}")))?,
        "application/json" | "" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("couldn't get version/kind; json parse error: {e}")))?,
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {other})"
            )));
        }
    };
    if !value.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    }
    Ok(value)
}

fn list_options(query: &Query, labels: LabelSelector, fields: FieldSelector) -> ApiResult<ListOptions> {
    let limit = match query.get("limit") {
        Some(l) => Some(l.parse::<usize>().map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?),
        None => None,
    };
    Ok(ListOptions {
        labels,
        fields,
        limit,
        continue_token: query.get("continue").filter(|c| !c.is_empty()).cloned(),
        resource_version: query.get("resourceVersion").cloned(),
        resource_version_match: query.get("resourceVersionMatch").filter(|m| !m.is_empty()).cloned(),
    })
}

async fn resource_request(
    state: Arc<State>,
    user: UserInfo,
    rp: ResourcePath,
    req: Request<Incoming>,
) -> ApiResult<Response<Body>> {
    let query = parse_query(req.uri().query());
    let verb = verb_of(req.method(), &rp, &query)?;
    let rt = match lookup_type(&state, &rp) {
        Ok(rt) => rt,
        Err(not_found) => return Err(authorize_unknown(&state, user, &rp, verb).unwrap_or(not_found)),
    };
    let (labels, mut fields) = selectors(&rt, &query)?;
    // GET .../<name>?watch=true watches that one object.
    if verb == "watch"
        && let Some(name) = &rp.name
    {
        fields.requirements.push(crate::selectors::FieldRequirement {
            field: "metadata.name".into(),
            equals: true,
            value: name.clone(),
        });
    }
    let name = rp.name.clone().or_else(|| fields.single_name().map(String::from)).unwrap_or_default();
    state.accounting.count(RequestKey {
        verb: verb.to_string(),
        resource: match &rp.subresource {
            Some(sub) => format!("{}/{sub}", rt.plural),
            None => rt.plural.clone(),
        },
        namespace: rp.namespace.clone().unwrap_or_default(),
        name: name.clone(),
    });
    let access = access_request(user, verb, &rp, name);
    if let Decision::Deny(r) | Decision::NoOpinion(r) = auth::authorize(&state, &access, Some(&fields)) {
        return Err(auth::forbidden(&access, &r));
    }
    if rt.behavior == Behavior::Review && verb != "create" {
        return Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource"));
    }
    if rt.namespaced
        && rp.namespace.is_none()
        && !matches!(verb, "list" | "watch" | "deletecollection")
        && rt.behavior == Behavior::Stored
    {
        return Err(ApiError::no_route());
    }
    let call = Call { state: state.clone(), user: access.user.clone(), rt, rp, query };
    match verb {
        "get" => call.get(),
        "list" => call.list(list_options(&call.query, labels, fields)?),
        "watch" => call.watch(list_options(&call.query, labels, fields)?),
        "deletecollection" => {
            let opts = list_options(&call.query, labels, fields)?;
            let (headers, body) = read_body(req).await?;
            call.delete_collection(opts, &headers, &body)
        }
        _ => {
            let (headers, body) = read_body(req).await?;
            call.write(verb, &headers, &body)
        }
    }
}

/// One resource request, after authorization.
struct Call {
    state: Arc<State>,
    user: UserInfo,
    rt: Arc<ResourceType>,
    rp: ResourcePath,
    query: Query,
}

impl Call {
    fn ns(&self) -> &str {
        self.rp.namespace.as_deref().unwrap_or("")
    }

    fn name(&self) -> &str {
        self.rp.name.as_deref().unwrap_or("")
    }

    fn sub(&self) -> &str {
        self.rp.subresource.as_deref().unwrap_or("")
    }

    fn dry_run(&self) -> bool {
        self.query.get("dryRun").is_some_and(|d| d == "All")
    }

    fn ctx(&self) -> WriteCtx<'_> {
        WriteCtx {
            user: &self.user,
            rt: &self.rt,
            namespace: self.ns(),
            subresource: self.sub(),
            dry_run: self.dry_run(),
        }
    }

    fn get(&self) -> ApiResult<Response<Body>> {
        let inner = self.state.store.lock();
        Ok(json_response(200, &ops::get(&inner, &self.rt, self.ns(), self.name())?))
    }

    fn list(&self, opts: ListOptions) -> ApiResult<Response<Body>> {
        let inner = self.state.store.lock();
        Ok(json_response(200, &ops::list(&inner, &self.rt, self.rp.namespace.as_deref(), &opts)?))
    }

    fn watch(&self, opts: ListOptions) -> ApiResult<Response<Body>> {
        let timeout = match self.query.get("timeoutSeconds") {
            Some(t) => Some(Duration::from_secs(
                t.parse::<u64>().map_err(|_| ApiError::bad_request(format!("invalid timeoutSeconds {t:?}")))?,
            )),
            None => None,
        };
        let req = WatchRequest {
            rt: self.rt.clone(),
            namespace: self.rp.namespace.clone(),
            opts,
            bookmarks: flag(&self.query, "allowWatchBookmarks"),
            send_initial_events: flag(&self.query, "sendInitialEvents"),
            timeout,
        };
        let stream = watch::start(self.state.clone(), req, self.state.epoch())?;
        let body = StreamBody::new(stream.map(|b| Ok::<_, Infallible>(Frame::data(b))));
        Ok(Response::builder()
            .status(200)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CACHE_CONTROL, "no-cache, private")
            .body(BodyExt::boxed(body))
            .expect("valid response"))
    }

    fn write(&self, verb: &str, headers: &HeaderMap, body: &[u8]) -> ApiResult<Response<Body>> {
        match verb {
            "create" => self.create(headers, body),
            "update" => {
                if !matches!(self.sub(), "" | "status" | "approval" | "ephemeralcontainers" | "resize") {
                    return Err(ApiError::method_not_allowed(
                        "the server does not allow this method on the requested resource",
                    ));
                }
                self.authorize_signer()?;
                let obj = decode(headers, body)?;
                let mut inner = self.state.store.lock();
                let (out, created) = ops::update(&mut inner, &self.ctx(), self.name(), obj)?;
                Ok(json_response(if created { 201 } else { 200 }, &out))
            }
            "patch" => self.patch(headers, body),
            "delete" => {
                if !self.sub().is_empty() {
                    return Err(ApiError::method_not_allowed(
                        "the server does not allow this method on the requested resource",
                    ));
                }
                let opts = self.delete_options(headers, body)?;
                let mut inner = self.state.store.lock();
                let deleted = ops::delete(&mut inner, &self.ctx(), self.name(), &opts)?;
                Ok(json_response(200, &ops::delete_response(&self.rt, deleted)))
            }
            _ => Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource")),
        }
    }

    fn create(&self, headers: &HeaderMap, body: &[u8]) -> ApiResult<Response<Body>> {
        let obj = decode(headers, body)?;
        if self.rt.behavior == Behavior::Review {
            return self.review(&obj);
        }
        let sub = self.rt.subresources.iter().find(|s| s.name() == self.sub()).copied();
        let mut inner = self.state.store.lock();
        match (sub, self.rp.name.is_some()) {
            (None, false) => Ok(json_response(201, &ops::create(&mut inner, &self.ctx(), obj)?)),
            (Some(Subresource::Eviction), true) => {
                let before = inner.get(&self.rt.storage, self.ns(), self.name());
                let result = eviction::evict(&mut inner, &self.user, &self.rt, self.ns(), self.name(), &obj);
                inner.evictions.push(eviction::record(self.ns(), self.name(), before.as_deref(), &result));
                let (code, status) = result?;
                Ok(json_response(code, &status))
            }
            (Some(Subresource::Binding), true) => {
                bind(&mut inner, &self.ctx(), self.name(), &obj)?;
                Ok(json_response(201, &success_status(201, None)))
            }
            (Some(Subresource::Token), true) => {
                let out = reviews::token_request(
                    &inner,
                    &self.state.tokens,
                    &self.user,
                    &self.rt,
                    self.ns(),
                    self.name(),
                    &obj,
                )?;
                Ok(json_response(201, &out))
            }
            _ => Err(ApiError::method_not_allowed("the server does not allow this method on the requested resource")),
        }
    }

    /// CSR approval and status writes also need `approve` / `sign` on the CSR's signer, as
    /// the CertificateApproval and CertificateSigning admission plugins check.
    fn authorize_signer(&self) -> ApiResult<()> {
        if self.rt.group != "certificates.k8s.io" || !matches!(self.sub(), "approval" | "status") {
            return Ok(());
        }
        let signer = {
            let inner = self.state.store.lock();
            let csr = inner
                .get(&self.rt.storage, "", self.name())
                .ok_or_else(|| ApiError::not_found(&self.rt.group_resource(), self.name()))?;
            meta::str_at(&csr, "/spec/signerName").to_string()
        };
        let verb = if self.sub() == "approval" { "approve" } else { "sign" };
        crate::csr::authorize_signer(&self.state, &self.user, verb, &signer)
    }

    fn review(&self, obj: &Value) -> ApiResult<Response<Body>> {
        let out = match self.rt.plural.as_str() {
            "tokenreviews" => reviews::token_review(&self.state, obj)?,
            "selfsubjectaccessreviews" => reviews::access_review(&self.state, &self.rt, obj, Some(&self.user), "")?,
            "localsubjectaccessreviews" => reviews::access_review(&self.state, &self.rt, obj, None, self.ns())?,
            _ => reviews::access_review(&self.state, &self.rt, obj, None, "")?,
        };
        Ok(json_response(201, &out))
    }

    fn patch(&self, headers: &HeaderMap, body: &[u8]) -> ApiResult<Response<Body>> {
        if !matches!(self.sub(), "" | "status" | "approval" | "ephemeralcontainers" | "resize") {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
        self.authorize_signer()?;
        let ct = content_type(headers);
        let kind = PatchType::from_content_type(&ct).ok_or_else(|| {
            ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml{}",
                if self.rt.custom { "" } else { ", application/strategic-merge-patch+json" }
            ))
        })?;
        let field_manager = self.query.get("fieldManager").filter(|f| !f.is_empty());
        if kind == PatchType::Apply && field_manager.is_none() {
            return Err(ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        if kind != PatchType::Apply && self.query.contains_key("force") {
            return Err(ApiError::bad_request(
                "PatchOptions.meta.k8s.io \"\" is invalid: force: Forbidden: may not be specified for non-apply patch",
            ));
        }
        let patch_body = patch::parse_body(kind, body)?;
        let mut inner = self.state.store.lock();
        let (out, created) = ops::patch(&mut inner, &self.ctx(), self.name(), kind, &patch_body)?;
        Ok(json_response(if created { 201 } else { 200 }, &out))
    }

    /// DeleteOptions from the query, overridden by a body if one is sent.
    fn delete_options(&self, headers: &HeaderMap, body: &[u8]) -> ApiResult<DeleteOptions> {
        let mut opts = if body.iter().all(u8::is_ascii_whitespace) {
            DeleteOptions::default()
        } else {
            DeleteOptions::from_value(&decode(headers, body)?)?
        };
        if opts.grace_period_seconds.is_none()
            && let Some(g) = self.query.get("gracePeriodSeconds")
        {
            opts.grace_period_seconds =
                Some(g.parse().map_err(|_| ApiError::bad_request(format!("invalid gracePeriodSeconds {g:?}")))?);
        }
        if opts.propagation_policy.is_none() {
            opts.propagation_policy = self.query.get("propagationPolicy").cloned();
        }
        opts.dry_run |= self.dry_run();
        Ok(opts)
    }

    fn delete_collection(&self, list: ListOptions, headers: &HeaderMap, body: &[u8]) -> ApiResult<Response<Body>> {
        let opts = self.delete_options(headers, body)?;
        let mut inner = self.state.store.lock();
        let current = inner.list(&self.rt.storage, self.rp.namespace.as_deref());
        let mut items = Vec::new();
        for obj in current.iter().filter(|o| list.matches(o)) {
            let ns = meta::namespace(obj).to_string();
            let ctx = WriteCtx { namespace: &ns, ..self.ctx() };
            match ops::delete(&mut inner, &ctx, meta::name(obj), &opts) {
                Ok(ops::Deleted::Gone(o) | ops::Deleted::Pending(o)) => items.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        let list = json!({"kind": self.rt.list_kind(), "apiVersion": self.rt.api_version(),
                          "metadata": {"resourceVersion": inner.current_rv().to_string()}, "items": items});
        Ok(json_response(200, &list))
    }
}

/// pods/binding: assigns an unscheduled pod to a node (the scheduler's write).
fn bind(inner: &mut crate::store::StoreInner, ctx: &WriteCtx<'_>, name: &str, binding: &Value) -> ApiResult<()> {
    let gr = GroupResource::new("", "pods");
    let target = meta::str_at(binding, "/target/name").to_string();
    if target.is_empty() {
        return Err(ApiError::invalid(
            "Binding",
            "",
            name,
            vec![crate::status::FieldError::required("target.name", "")],
        ));
    }
    let pod = inner.get("pods", ctx.namespace, name).ok_or_else(|| ApiError::not_found(&gr, name))?;
    if meta::is_deleting(&pod) {
        return Err(ApiError::conflict(
            &gr,
            name,
            &format!("pod {name} is being deleted, cannot be assigned to a host"),
        ));
    }
    let current = meta::str_at(&pod, "/spec/nodeName");
    if !current.is_empty() {
        return Err(ApiError::conflict(&gr, name, &format!("pod {name} is already assigned to node {current:?}")));
    }
    let mut bound = (*pod).clone();
    bound["spec"]["nodeName"] = json!(target);
    let conditions = bound["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let mut conditions: Vec<Value> = conditions.into_iter().filter(|c| c["type"] != "PodScheduled").collect();
    conditions.push(
        json!({"type": "PodScheduled", "status": "True", "lastProbeTime": null, "lastTransitionTime": meta::now()}),
    );
    bound["status"]["conditions"] = json!(conditions);
    let stored = inner.put("pods", bound);
    crate::kinds::after_write(inner, ctx.rt, ctx.namespace, Some(&stored), Some(&pod));
    Ok(())
}

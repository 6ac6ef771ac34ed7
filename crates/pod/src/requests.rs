//! What a container asks for: its CPU and memory requests and limits as numbers, with API
//! defaulting (a request defaults to the limit) and the check that every quantity parses.

use k8s_openapi::api::core::v1::Container;

use gantry_vocab::quantity;

/// CPU in millicores; zero quantities count as unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cpu {
    pub request: Option<i128>,
    pub limit: Option<i128>,
}

/// Memory in bytes; zero quantities count as unset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    pub request: Option<i128>,
    pub limit: Option<i128>,
}

/// One resource of a container in milli-units: (request, limit), the request defaulting to the
/// limit as API defaulting does. Unparsable quantities count as unset here; [`check`] reports them.
fn amounts(c: &Container, name: &str) -> (Option<i128>, Option<i128>) {
    let r = c.resources.as_ref();
    let get = |list: Option<&std::collections::BTreeMap<String, _>>| {
        list.and_then(|l| l.get(name))
            .and_then(|q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity| quantity::parse_milli(&q.0).ok())
            .filter(|v| *v > 0)
    };
    let limit = get(r.and_then(|r| r.limits.as_ref()));
    let request = get(r.and_then(|r| r.requests.as_ref())).or(limit);
    (request, limit)
}

pub fn cpu(c: &Container) -> Cpu {
    let (request, limit) = amounts(c, "cpu");
    Cpu { request, limit }
}

pub fn memory(c: &Container) -> Memory {
    let (request, limit) = amounts(c, "memory");
    let bytes = |m: Option<i128>| m.map(|m| (m + 999) / 1000);
    Memory { request: bytes(request), limit: bytes(limit) }
}

/// A request or limit that is not a valid quantity, naming the container and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("container {container:?}: resources.{list}.{resource}: {source}")]
pub struct BadQuantity {
    pub container: String,
    /// `requests` or `limits`.
    pub list: &'static str,
    pub resource: String,
    pub source: quantity::QuantityError,
}

/// Every request and limit of the container is a valid quantity.
pub fn check(c: &Container) -> Result<(), BadQuantity> {
    let r = c.resources.as_ref();
    for (field, list) in
        [("requests", r.and_then(|r| r.requests.as_ref())), ("limits", r.and_then(|r| r.limits.as_ref()))]
    {
        for (name, q) in list.into_iter().flatten() {
            quantity::parse_milli(&q.0).map_err(|source| BadQuantity {
                container: c.name.clone(),
                list: field,
                resource: name.clone(),
                source,
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn list(items: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        (!items.is_empty()).then(|| items.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
    }

    pub(crate) fn container(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn bad_quantities_name_the_field() {
        let e = check(&container(&[("memory", "lots")], &[])).unwrap_err();
        assert!(e.to_string().contains("resources.requests.memory"), "{e}");
        assert_eq!((e.list, e.resource.as_str()), ("requests", "memory"));
    }
}

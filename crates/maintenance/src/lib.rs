//! Declarative node maintenance (KEP-4212) as a CustomResourceDefinition: the `NodeMaintenance`
//! API (`api`), label and node selector matching (`selector`), the spec rules the CRD's CEL also
//! states (`validate`), the pure drain planner (`plan`) and the pure reconcile step (`decide`).

pub mod api;
pub mod controller;
pub mod decide;
pub mod plan;
pub mod selector;
pub mod validate;

#[cfg(test)]
mod fixtures;

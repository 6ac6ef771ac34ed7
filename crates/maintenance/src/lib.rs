//! Declarative node maintenance (KEP-4212) as a CustomResourceDefinition: the `NodeMaintenance`
//! API (`api`), label and node selector matching (`selector`), the spec rules the CRD's CEL also
//! states (`validate`) and the pure drain planner (`plan`).

pub mod api;
pub mod plan;
pub mod selector;
pub mod validate;

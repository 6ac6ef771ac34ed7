//! Declarative node maintenance (KEP-4212) as a CustomResourceDefinition: the `NodeMaintenance`
//! API (`api`), label and node selector matching (`selector`), the spec rules the CRD's CEL also
//! states (`validate`), the pure drain planner (`plan`), the pure reconcile step (`decide`), leader election rules
//! (`leader`) and the controller that runs them (`controller`), the node agent's static pod hold (`hold`) and the
//! pure side of the `kubectl maintenance` plugin (`cli`).

pub mod api;
pub mod cli;
pub mod controller;
pub mod decide;
pub mod hold;
pub mod leader;
pub mod node_conditions;
pub mod plan;
pub mod selector;
pub mod validate;

#[cfg(test)]
mod fixtures;

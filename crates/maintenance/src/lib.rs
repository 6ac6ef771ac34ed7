//! Declarative node maintenance (KEP-4212) as a CustomResourceDefinition: the `NodeMaintenance`
//! API (`api`), label and node selector matching (`selector`), the spec rules the CRD's CEL also
//! states (`validate`), the pure drain planner (`plan`), the pure reconcile step (`decide`), leader election rules
//! (`leader`), the node agent's static pod hold (`hold`) and the pure side of the `kubectl maintenance` plugin
//! (`cli`).
//!
//! Architecture invariant: pure. Nothing here talks to the API server or reads a clock; the
//! controller that runs these rules is `gantry-maintenance-controller`, so the node agent,
//! which needs only `hold`, compiles no controller.

pub mod api;
pub mod cli;
pub mod decide;
pub mod hold;
pub mod leader;
pub mod node_conditions;
pub mod plan;
pub mod selector;
pub mod validate;

#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;

//! The pure side of the `kubectl maintenance` plugin (`gantry maintenance`): flag parsing into
//! API objects (`selector`), kubectl-style tables (`table`) and the dry-run drain listing
//! (`dry_run`). The binary does the API calls and prints what these return.

pub mod dry_run;
pub mod selector;
pub mod table;

use crate::api::{NodeMaintenance, NodeMaintenanceSpec, NodeSelector, Stage};

/// A flag value the plugin cannot use; the message names the flag.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid {flag} {value:?}: {reason}")]
pub struct FlagError {
    pub flag: &'static str,
    pub value: String,
    pub reason: String,
}

impl FlagError {
    pub fn new(flag: &'static str, value: &str, reason: impl Into<String>) -> Self {
        FlagError { flag, value: value.to_string(), reason: reason.into() }
    }
}

/// `--stage` of `create`: a maintenance starts Idle, Cordon or Drain (Complete is `complete`).
pub fn parse_stage(value: &str) -> Result<Stage, FlagError> {
    match value {
        "Idle" => Ok(Stage::Idle),
        "Cordon" => Ok(Stage::Cordon),
        "Drain" => Ok(Stage::Drain),
        _ => Err(FlagError::new("--stage", value, "must be one of Idle, Cordon, Drain")),
    }
}

/// The object name, checked as the API server checks it (a DNS-1123 subdomain).
pub fn check_name(name: &str) -> Result<(), FlagError> {
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > 253 || !name.chars().all(valid_char) {
        return Err(FlagError::new(
            "NAME",
            name,
            "must be a lowercase RFC 1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 characters",
        ));
    }
    if !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err(FlagError::new("NAME", name, "must start and end with a lowercase letter or digit"));
    }
    Ok(())
}

/// The object `create` sends. The drain plan is left empty so the controller writes back the
/// KEP's default plan.
pub fn new_maintenance(name: &str, node_selector: NodeSelector, stage: Stage, reason: &str) -> NodeMaintenance {
    let mut m = NodeMaintenance::new(
        name,
        NodeMaintenanceSpec { node_selector, stage, reason: reason.to_string(), ..Default::default() },
    );
    m.metadata.name = Some(name.to_string());
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_flag_accepts_the_three_starting_stages() {
        assert_eq!(parse_stage("Drain"), Ok(Stage::Drain));
        let err = parse_stage("Complete").unwrap_err();
        assert_eq!(err.flag, "--stage");
        assert!(err.to_string().contains("Idle, Cordon, Drain"), "{err}");
    }

    #[test]
    fn names_are_dns_subdomains() {
        assert!(check_name("kernel-upgrade.1").is_ok());
        for bad in ["", "Upper", "-lead", "trail-", "under_score"] {
            assert_eq!(check_name(bad).unwrap_err().flag, "NAME", "{bad}");
        }
    }

    #[test]
    fn created_object_has_no_plan_so_the_default_is_written_back() {
        let m = new_maintenance("m1", NodeSelector::default(), Stage::Cordon, "kernel");
        assert_eq!(m.metadata.name.as_deref(), Some("m1"));
        assert!(m.spec.drain_plan.is_empty());
        let json = serde_json::to_value(&m).unwrap();
        assert_eq!(json["apiVersion"], "maintenance.gantry.dev/v1alpha1");
        assert_eq!(json["spec"]["stage"], "Cordon");
        assert_eq!(json["spec"]["reason"], "kernel");
    }
}

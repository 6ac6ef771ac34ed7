//! Leader election over a `coordination.k8s.io/v1` Lease, the pure part: given the Lease as
//! last read and when this replica first saw that version of it, whether to create, take
//! over, renew, or wait; and whether a leader must step down. Semantics and defaults follow
//! client-go's `leaderelection` (as controller-runtime uses it): a Lease is expired when its
//! record has not changed for `leaseDurationSeconds` *as observed on this replica's clock*
//! (so clock skew between replicas does not matter), an empty holder means released, and a
//! leader that cannot renew within the renew deadline stops acting.
//!
//! The I/O side (reading and writing the Lease with resourceVersion preconditions) is in
//! `controller::election`.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// The Lease the controller replicas compete for.
pub const LEASE_NAME: &str = "gantry-maintenance-controller";
/// Where the Lease lives when neither the flag nor the in-cluster namespace says otherwise.
pub const DEFAULT_NAMESPACE: &str = "kube-system";

/// controller-runtime's defaults: 15 s lease, 10 s renew deadline, 2 s retry period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub lease_duration: Duration,
    pub renew_deadline: Duration,
    pub retry_period: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// The Lease as this replica last read it, and when (on the local monotonic clock, in
/// nanoseconds since any fixed origin) the record was first seen with this content.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    pub spec: LeaseSpec,
    pub since_nanos: u128,
}

/// What to do with the Lease now.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// No Lease exists: create it holding it ourselves.
    Create(LeaseSpec),
    /// Write this spec (with the read resourceVersion as precondition): a renewal when we
    /// hold it, a take-over when it expired or was released.
    Write(LeaseSpec),
    /// Someone else holds a valid Lease: try again after the retry period.
    Wait { holder: String },
}

/// Whether a Lease held by someone else has expired: its record did not change for its
/// duration, measured from when this replica first saw it.
pub fn expired(observed: &Observed, now_nanos: u128, timing: &Timing) -> bool {
    let duration = observed
        .spec
        .lease_duration_seconds
        .map(|s| Duration::from_secs(u64::try_from(s).unwrap_or(0)))
        .unwrap_or(timing.lease_duration);
    now_nanos.saturating_sub(observed.since_nanos) >= duration.as_nanos()
}

fn holder(spec: &LeaseSpec) -> &str {
    spec.holder_identity.as_deref().unwrap_or_default()
}

/// One try to acquire or renew, as client-go's `tryAcquireOrRenew`.
pub fn try_acquire_or_renew(
    identity: &str,
    observed: Option<&Observed>,
    now_nanos: u128,
    now: Timestamp,
    timing: &Timing,
) -> Step {
    let fresh = |acquire_time: Option<MicroTime>, transitions: i32| LeaseSpec {
        holder_identity: Some(identity.to_string()),
        lease_duration_seconds: Some(timing.lease_duration.as_secs() as i32),
        acquire_time: acquire_time.or(Some(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..Default::default()
    };
    let Some(observed) = observed else { return Step::Create(fresh(None, 0)) };
    let current = holder(&observed.spec);
    let transitions = observed.spec.lease_transitions.unwrap_or(0);
    if current == identity {
        return Step::Write(fresh(observed.spec.acquire_time.clone(), transitions));
    }
    if !current.is_empty() && !expired(observed, now_nanos, timing) {
        return Step::Wait { holder: current.to_string() };
    }
    Step::Write(fresh(None, transitions + 1))
}

/// Whether a leader whose last successful renewal was at `last_renew_nanos` must stop
/// acting: it could not renew within the renew deadline.
pub fn must_step_down(last_renew_nanos: u128, now_nanos: u128, timing: &Timing) -> bool {
    now_nanos.saturating_sub(last_renew_nanos) >= timing.renew_deadline.as_nanos()
}

/// The Lease written on a clean shutdown so a successor takes over at once: no holder and a
/// one-second duration, as client-go's `ReleaseOnCancel`.
pub fn released(observed: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: observed.lease_transitions,
        ..Default::default()
    }
}

/// `<hostname>_<uuid>`, as controller-runtime names a candidate.
pub fn identity(hostname: &str, uuid: &str) -> String {
    format!("{hostname}_{uuid}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u128 = 1_000_000_000;

    fn held_by(who: &str, since: u128) -> Observed {
        Observed {
            spec: LeaseSpec {
                holder_identity: Some(who.to_string()),
                lease_duration_seconds: Some(15),
                lease_transitions: Some(3),
                acquire_time: Some(MicroTime(Timestamp::UNIX_EPOCH)),
                ..Default::default()
            },
            since_nanos: since,
        }
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_000).unwrap()
    }

    #[test]
    fn no_lease_is_created_held_by_us_with_no_transitions() {
        let step = try_acquire_or_renew("me", None, 0, now(), &Timing::default());
        let Step::Create(spec) = step else { panic!("{step:?}") };
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.renew_time, Some(MicroTime(now())));
    }

    #[test]
    fn a_valid_lease_of_another_replica_makes_us_wait() {
        let observed = held_by("other", 10 * SEC);
        let step = try_acquire_or_renew("me", Some(&observed), 24 * SEC, now(), &Timing::default());
        assert_eq!(step, Step::Wait { holder: "other".into() });
    }

    #[test]
    fn an_expired_lease_is_taken_over_and_counts_a_transition() {
        let observed = held_by("other", 10 * SEC);
        assert!(expired(&observed, 25 * SEC, &Timing::default()));
        let Step::Write(spec) = try_acquire_or_renew("me", Some(&observed), 25 * SEC, now(), &Timing::default()) else {
            panic!()
        };
        assert_eq!(spec.holder_identity.as_deref(), Some("me"));
        assert_eq!(spec.lease_transitions, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(now())), "a new holder has a new acquire time");
    }

    #[test]
    fn a_released_lease_is_taken_over_at_once() {
        let observed = Observed { spec: released(&held_by("other", 0).spec, now()), since_nanos: 10 * SEC };
        let step = try_acquire_or_renew("me", Some(&observed), 10 * SEC, now(), &Timing::default());
        assert!(matches!(step, Step::Write(ref s) if s.holder_identity.as_deref() == Some("me")), "{step:?}");
    }

    #[test]
    fn our_own_lease_is_renewed_keeping_acquire_time_and_transitions() {
        let observed = held_by("me", 0);
        let Step::Write(spec) = try_acquire_or_renew("me", Some(&observed), 100 * SEC, now(), &Timing::default())
        else {
            panic!()
        };
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.acquire_time, Some(MicroTime(Timestamp::UNIX_EPOCH)));
        assert_eq!(spec.renew_time, Some(MicroTime(now())));
    }

    #[test]
    fn expiry_uses_the_lease_duration_written_in_the_lease() {
        let mut observed = held_by("other", 0);
        observed.spec.lease_duration_seconds = Some(1);
        assert!(expired(&observed, SEC, &Timing::default()));
        assert!(!expired(&observed, SEC - 1, &Timing::default()));
    }

    #[test]
    fn a_leader_steps_down_once_the_renew_deadline_passes_without_renewal() {
        let timing = Timing::default();
        assert!(!must_step_down(5 * SEC, 14 * SEC, &timing));
        assert!(must_step_down(5 * SEC, 15 * SEC, &timing));
    }

    #[test]
    fn release_clears_the_holder_and_keeps_the_transitions() {
        let spec = released(&held_by("me", 0).spec, now());
        assert_eq!(spec.holder_identity, None);
        assert_eq!(spec.lease_duration_seconds, Some(1));
        assert_eq!(spec.lease_transitions, Some(3));
    }

    #[test]
    fn identity_is_hostname_underscore_uuid() {
        assert_eq!(identity("node-a", "1234"), "node-a_1234");
    }
}

//! Status conditions (pure): setting one keeps its lastTransitionTime unless its status flips,
//! so an unchanged world gives an unchanged status and no write.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// One condition's wanted state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Want {
    /// Ready, Progressing, Degraded.
    pub type_: &'static str,
    /// True or False.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Human-readable detail.
    pub message: String,
}

impl Want {
    /// A condition's wanted state.
    pub fn new(
        type_: &'static str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// The conditions after applying `wants` to `previous` at time `now` for `generation`.
pub fn merge(
    previous: &[Condition],
    wants: &[Want],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    wants
        .iter()
        .map(|w| {
            let status = if w.status { "True" } else { "False" }.to_string();
            let since = previous
                .iter()
                .find(|c| c.type_ == w.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: w.type_.to_string(),
                status,
                reason: w.reason.clone(),
                message: w.message.clone(),
                observed_generation: generation,
                last_transition_time: since,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_condition_keeps_its_transition_time() {
        let t0 = Timestamp::from_second(1_000).expect("t0");
        let t1 = Timestamp::from_second(2_000).expect("t1");
        let w = [Want::new("Ready", true, "Ready", "all good")];
        let first = merge(&[], &w, Some(1), t0);
        let second = merge(&first, &w, Some(1), t1);
        assert_eq!(first, second);
    }

    #[test]
    fn a_flipped_condition_gets_a_new_transition_time() {
        let t0 = Timestamp::from_second(1_000).expect("t0");
        let t1 = Timestamp::from_second(2_000).expect("t1");
        let first = merge(&[], &[Want::new("Ready", true, "Ready", "")], Some(1), t0);
        let second = merge(
            &first,
            &[Want::new("Ready", false, "Rolling", "")],
            Some(1),
            t1,
        );
        assert_eq!(second[0].last_transition_time, Time(t1));
        assert_eq!(second[0].status, "False");
    }
}

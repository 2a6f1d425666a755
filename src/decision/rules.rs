//! The decision's section of the configuration: the output subjects, the
//! reply allowlist, the size limit and the mode's reply rule.

use super::Rules;
use super::reply::{BadPattern, ReplyPolicy};
use crate::config::{Config, Mode};

/// The rules a configuration implies cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RulesError {
    #[error("allowed_reply_subjects or subjects.*: {0}")]
    Pattern(#[from] BadPattern),
}

impl Rules {
    /// The rules `config` implies. A resolved configuration's subjects are
    /// valid patterns already; the reply policy refuses them on its own too,
    /// as it is also built from other sources (tests, benchmarks).
    pub fn from_config(config: &Config) -> Result<Rules, RulesError> {
        let reply_policy =
            ReplyPolicy::new(&config.allowed_reply_subjects, &config.own_subjects())?;
        Ok(Rules {
            gen_subject: config.subjects.gen_jobs.as_str().into(),
            dead_letter_subject: config.subjects.dead_letter.as_str().into(),
            release_subject: config.subjects.kv_release.as_str().into(),
            deadline_skew_ms: config.deadline.clock_skew_ms,
            reply_policy,
            max_payload_bytes: config.max_payload_bytes,
            use_nats_reply: config.mode == Mode::Core,
            missing_disagg_request_id: config.trtllm.missing_disagg_request_id,
            kv_hold_ms: config.kv_hold_ms,
        })
    }
}

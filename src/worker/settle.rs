//! Which settlement follows what happened to a result: the one place that
//! says when an input is acked, redelivered or terminated.
//!
//! Core NATS has nothing to settle (at most once); JetStream carries these out.

use super::Handled;
use crate::decision::Outcome;
use crate::transport::Settlement;

pub fn settlement(handled: &Handled) -> Settlement {
    match handled {
        // Undecodable input is dead-lettered, then never redelivered.
        Handled::Published(Outcome::DeadLetter { .. }) => Settlement::Term,
        Handled::Published(_) => Settlement::Ack,
        // No output yet: try again later (with a slot, or once NATS takes it).
        Handled::Deferred(_) | Handled::Failed(_) => Settlement::Nak,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{Backend, DeadLetterCode, ErrorCode, FinishReason};

    #[test]
    fn table() {
        let decode = Outcome::Decode {
            backend: Backend::Trtllm,
            minted: true,
        };
        let terminal = Outcome::Terminal {
            finish_reason: FinishReason::Eos,
        };
        let error = Outcome::Error {
            code: ErrorCode::InvalidBootstrap,
        };
        let fenced = Outcome::Error {
            code: ErrorCode::IdentityUnavailable,
        };
        let dead = Outcome::DeadLetter {
            code: DeadLetterCode::Malformed,
        };
        let cases = [
            (Handled::Published(decode.clone()), Settlement::Ack),
            (Handled::Published(terminal), Settlement::Ack),
            (Handled::Published(error), Settlement::Ack),
            (Handled::Published(fenced.clone()), Settlement::Ack),
            (Handled::Published(dead.clone()), Settlement::Term),
            (Handled::Deferred(fenced), Settlement::Nak),
            (Handled::Failed(decode), Settlement::Nak),
            (Handled::Failed(dead), Settlement::Nak),
        ];
        for (handled, expected) in cases {
            assert_eq!(settlement(&handled), expected, "{handled:?}");
        }
    }
}

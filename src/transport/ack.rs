//! Settling an input after its output: the mechanism. Which settlement an
//! input gets is the worker's policy (`worker::settle`), decided in one place
//! from what happened to the input.

/// What to do with an input once it is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settlement {
    /// Its output is published: never deliver it again.
    Ack,
    /// It has no output yet (fenced, or the publish failed): deliver it again later.
    Nak,
    /// It can never be handled (dead-lettered): never deliver it again, and
    /// mark it as terminated rather than done.
    Term,
}

/// The transport's handle for settling one input.
#[derive(Debug)]
pub enum Ack {
    /// Core NATS: at most once; there is nothing to acknowledge.
    Core,
}

impl Ack {
    /// Carries out a settlement. Failures are logged: the transport's own
    /// redelivery covers them.
    pub async fn settle(self, settlement: Settlement) {
        match self {
            Ack::Core => {
                let _ = settlement;
            }
        }
    }
}

//! A core-mode batch's outputs, in order, checked as the client checks them
//! and not yet sent. The runner gives each batch one, the pipeline puts the
//! batch's outputs in it ([`super::CoreSink::put`]), and the runner sends it
//! once the batch is decided ([`super::CoreSink::send`]) and counts what
//! went out: nothing is counted as published before it is.
//!
//! Why a batch's outputs wait for its end: each output sent on its own costs
//! a send and a receive on the client's command channel, and in the default
//! layout (one runtime thread, which the client's connection task shares)
//! that task writes nothing of a batch before the batch ends anyway.

use async_nats::message::OutboundMessage;

/// Outputs put in by one batch, in the order they are to go out.
#[derive(Debug, Default)]
pub struct Outbox {
    pub(super) messages: Vec<OutboundMessage>,
}

impl Outbox {
    /// Room for `outputs` outputs (a batch's results: one output each).
    pub fn with_capacity(outputs: usize) -> Outbox {
        Outbox {
            messages: Vec::with_capacity(outputs),
        }
    }

    /// How many outputs it holds.
    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }
}

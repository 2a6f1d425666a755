//! The identity against a real etcd (contract 5): the slot claim order, slot
//! exhaustion, concurrent workers, fencing on lease loss and recovery, the
//! revoke on shutdown, the ID floor that keeps IDs unique across successive
//! holders of a slot, and the `slots` command that lists it all.

mod support;

mod claim;
mod floor;
mod partition;
mod recovery;
mod slots_cli;

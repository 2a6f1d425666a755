//! A fence: a message a test sends through the server to a subscription of
//! its own. The server routes to one subscription in order, so when the
//! fence comes back, everything the server had routed there before it has
//! arrived too (a flush would only write the socket).

use crate::common::poll_until;
use async_nats::Client;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The fences of one recording subscription.
#[derive(Clone)]
pub struct Fence {
    client: Client,
    /// Under the subscription's subjects, on no subject a worker uses.
    prefix: &'static str,
    back: Arc<Mutex<Vec<String>>>,
}

impl Fence {
    /// Fences sent on `client` under `prefix`.
    pub fn new(client: &Client, prefix: &'static str) -> Fence {
        Fence {
            client: client.clone(),
            prefix,
            back: Arc::default(),
        }
    }

    /// For the recording task: true when `subject` is a fence (noted as
    /// come back), which the recording leaves out.
    pub fn came_back(&self, subject: &str) -> bool {
        let fence = subject.starts_with(self.prefix);
        if fence {
            self.back.lock().unwrap().push(subject.to_string());
        }
        fence
    }

    /// Sends a fence and returns once it came back.
    pub async fn pass(&self) {
        let subject = format!("{}.{}", self.prefix, self.client.new_inbox());
        self.client
            .publish(subject.clone(), "".into())
            .await
            .expect("publish a fence");
        let back = poll_until(Duration::from_secs(30), || async {
            self.back.lock().unwrap().contains(&subject)
        })
        .await;
        assert!(back, "the fence {subject} came back within 30 s");
    }
}

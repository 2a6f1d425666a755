//! JetStream mode loads the cancels the server kept again after every
//! reconnect, before it pulls: a cancel published while a worker's link
//! to nats-server was down (its live subscription never saw it) still
//! refuses the handoff of a result stored meanwhile.

use crate::common;
use crate::common::deadline_support::*;
use crate::common::fault_proxy::{Fault, FaultProxy};
use crate::common::jetstream_support::{self, LibWorker};

use common::Nats;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_a_cancel_sent_while_the_worker_was_cut_off_is_honoured_after_it_reconnects() {
    let nats = Nats::start();
    let mut config = jetstream_support::config(&nats);
    let test = common::worker_support::client(&nats.url()).await;
    let js = async_nats::jetstream::new(test.clone());
    jetstream_support::setup(&js, &config).await;
    let watch = Watch::start(&test).await;

    let proxy = FaultProxy::start(nats.addr());
    config.nats.url = format!("nats://{}", proxy.addr());
    let worker = LibWorker::start(&config, jetstream_support::fixed_identity(9)).await;

    // The worker pulls: a result before the cut gets its decode job.
    js_publish(&js, PREFILL, plain(&result(KEPT, "trtllm", false))).await;
    watch.wait(1, || jetstream_support::drained(&js)).await;
    assert_eq!(watch.jobs().get(KEPT).map(Vec::len), Some(1));

    // Cut: every open connection reset, new ones accepted and never
    // answered, so the worker stays away until the heal.
    proxy.set(Fault::BlackHole);
    proxy.reset();
    let away = "cancelled-while-away";
    js_publish(&js, CANCEL, cancel(away, false)).await;
    js_publish(&js, PREFILL, plain(&result(away, "trtllm", false))).await;
    proxy.set(Fault::Pass);

    // Every answer is in once the result is acked.
    watch.wait(3, || jetstream_support::drained(&js)).await;
    assert!(jetstream_support::drained(&js).await, "the result is acked");
    // The result may be answered twice: a reply sent while the client
    // re-established its connection once more (a connection the black hole
    // had accepted) is not confirmed, so the result is redelivered and
    // answered again. Every answer must be the cancel's.
    let replies = watch.replies().get(away).cloned().unwrap_or_default();
    assert!(
        !replies.is_empty() && replies.iter().all(|r| r == "cancelled"),
        "the kept cancel was loaded before the result was pulled: {replies:?}"
    );
    // The release notice follows its answer unconfirmed (a side output):
    // an answer cut off by the reconnect can lose its notice, but the
    // acked answer's went out before its ack on the same connection.
    let releases = watch.releases().get(away).map_or(0, Vec::len);
    assert!(
        (1..=replies.len()).contains(&releases),
        "a release notice for the acked answer, none without an answer: \
         {releases} for {} answers",
        replies.len()
    );
    assert!(!watch.jobs().contains_key(away), "no decode job");
    assert_eq!(
        watch.count(),
        1 + replies.len() + releases,
        "nothing else was published"
    );
    worker.stop().await.expect("stop");
}

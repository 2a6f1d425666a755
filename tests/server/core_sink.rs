//! Core mode's sink against a real nats-server: inside a batch
//! (`core_sink::gather`) outputs are checked at once and kept, and leave in
//! one command, in order, when the batch sends them; outside one, each
//! leaves at once.

use crate::common;
use crate::common::worker_support::{client, round_trip};

use async_nats::{HeaderMap, HeaderValue, Message, Subscriber};
use bytes::Bytes;
use common::Nats;
use futures::{FutureExt as _, StreamExt as _};
use prefill_handoff::transport::{CoreSink, PublishError, Sink, Target, core_sink};

const GEN: &str = "batch.gen";
const REPLY: &str = "batch.reply";

fn headers(i: usize) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if i % 3 != 2 {
        let value = HeaderValue::from(format!("h-{i}").as_str());
        headers.insert("Handoff-Test", value);
    }
    headers
}

/// What `subscriber` holds now: everything the server routed to it before
/// the observer's round trip, nothing else.
async fn received_now(observer: &async_nats::Client, subscriber: &mut Subscriber) -> Vec<Message> {
    round_trip(observer).await;
    let mut got = Vec::new();
    while let Some(Some(message)) = subscriber.next().now_or_never() {
        got.push(message);
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_keeps_its_outputs_until_sent_then_they_arrive_once_in_order() {
    let nats = Nats::start_with_max_payload(Some(4096));
    let publisher = client(&nats.url()).await;
    let observer = client(&nats.url()).await;
    let mut outputs = observer.subscribe("batch.>").await.expect("subscribe");
    round_trip(&observer).await;
    let sink = Sink::Core(CoreSink::new(publisher.clone(), GEN));

    let work = async {
        for i in 0..7 {
            let subject = if i % 2 == 0 { GEN } else { REPLY };
            let payload = Bytes::from(format!("out-{i}"));
            let sent = sink
                .publish(subject, headers(i), payload, Target::Subject)
                .await;
            assert!(sent.is_ok(), "output {i} is taken: {sent:?}");
        }
        // Refused at once, as the client refuses them, and not kept.
        let bad = sink
            .publish(
                "batch.bad subject",
                HeaderMap::new(),
                Bytes::from("x"),
                Target::Subject,
            )
            .await;
        assert!(
            matches!(bad, Err(PublishError::InvalidSubject { .. })),
            "{bad:?}"
        );
        let big = sink
            .publish(
                REPLY,
                headers(0),
                Bytes::from(vec![b'x'; 8192]),
                Target::Subject,
            )
            .await;
        assert!(matches!(big, Err(PublishError::TooLarge(_))), "{big:?}");
        "done"
    };
    let mut gathering = std::pin::pin!(core_sink::gather(work, 2));
    assert_eq!(gathering.as_mut().await, "done");
    let kept = core_sink::kept(gathering.as_mut());
    assert_eq!(
        kept.len(),
        7,
        "the seven outputs are kept, the two refusals not"
    );

    round_trip(&publisher).await;
    let early = received_now(&observer, &mut outputs).await;
    assert!(
        early.is_empty(),
        "nothing leaves before the batch sends: {early:?}"
    );

    assert_eq!(sink.send_kept(kept).await, Ok(()));
    round_trip(&publisher).await;
    let got = received_now(&observer, &mut outputs).await;
    assert_eq!(got.len(), 7, "each output once: {got:?}");
    for (i, message) in got.iter().enumerate() {
        let subject = if i % 2 == 0 { GEN } else { REPLY };
        assert_eq!(message.subject.as_str(), subject, "output {i}");
        assert_eq!(message.payload, Bytes::from(format!("out-{i}")), "in order");
        let header = message
            .headers
            .as_ref()
            .and_then(|h| h.get("Handoff-Test"))
            .map(|v| v.as_str().to_string());
        let expected = (i % 3 != 2).then(|| format!("h-{i}"));
        assert_eq!(header, expected, "output {i}'s headers");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outside_a_batch_an_output_leaves_at_once() {
    let nats = Nats::start();
    let publisher = client(&nats.url()).await;
    let observer = client(&nats.url()).await;
    let mut outputs = observer.subscribe("batch.>").await.expect("subscribe");
    round_trip(&observer).await;
    let sink = Sink::Core(CoreSink::new(publisher.clone(), GEN));

    let sent = sink
        .publish(REPLY, headers(1), Bytes::from("alone"), Target::Subject)
        .await;
    assert!(sent.is_ok(), "{sent:?}");
    round_trip(&publisher).await;
    let got = received_now(&observer, &mut outputs).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].payload, Bytes::from("alone"));

    // An empty batch sends nothing and succeeds.
    assert_eq!(sink.send_kept(Vec::new()).await, Ok(()));
}

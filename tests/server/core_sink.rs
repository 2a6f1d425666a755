//! Core mode's sink against a real nats-server: given a batch's outbox,
//! outputs are checked at once and put in it, and leave in order when the
//! outbox is sent; without one, each leaves at once. An outbox sent after
//! the client is gone reports nothing out.

use crate::common;
use crate::common::worker_support::{client, round_trip};

use async_nats::{HeaderMap, HeaderValue, Message, Subscriber};
use bytes::Bytes;
use common::Nats;
use futures::{FutureExt as _, StreamExt as _};
use prefill_handoff::transport::{CoreSink, Outbox, PublishError, Sink, Target};

const GEN: &str = "batch.gen";
const REPLY: &str = "batch.reply";

fn headers(i: usize) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if i % 3 != 2 {
        let value = HeaderValue::from_lossy(&format!("h-{i}"));
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

    let mut outbox = Outbox::with_capacity(2);
    {
        for i in 0..7 {
            let subject = if i % 2 == 0 { GEN } else { REPLY };
            let payload = Bytes::from(format!("out-{i}"));
            let sent = sink
                .publish(
                    subject,
                    headers(i),
                    payload,
                    Target::Subject,
                    Some(&mut outbox),
                )
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
                Some(&mut outbox),
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
                Some(&mut outbox),
            )
            .await;
        assert!(matches!(big, Err(PublishError::TooLarge(_))), "{big:?}");
    }
    assert_eq!(
        outbox.len(),
        7,
        "the seven outputs are in the outbox, the two refusals not"
    );

    round_trip(&publisher).await;
    let early = received_now(&observer, &mut outputs).await;
    assert!(
        early.is_empty(),
        "nothing leaves before the batch sends: {early:?}"
    );

    assert_eq!(sink.send(outbox).await, 7, "all seven went out");
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
        .publish(
            REPLY,
            headers(1),
            Bytes::from("alone"),
            Target::Subject,
            None,
        )
        .await;
    assert!(sent.is_ok(), "{sent:?}");
    round_trip(&publisher).await;
    let got = received_now(&observer, &mut outputs).await;
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].payload, Bytes::from("alone"));

    // An empty outbox sends nothing.
    assert_eq!(sink.send(Outbox::default()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outbox_sent_after_the_client_is_gone_reports_nothing_out() {
    let nats = Nats::start();
    let (closed_tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let publisher = async_nats::ConnectOptions::new()
        .event_callback(move |event| {
            let closed_tx = closed_tx.clone();
            async move {
                if matches!(event, async_nats::Event::Closed) {
                    let _ = closed_tx.send(());
                }
            }
        })
        .connect(nats.url())
        .await
        .expect("connect");
    let observer = client(&nats.url()).await;
    let mut outputs = observer.subscribe("batch.>").await.expect("subscribe");
    round_trip(&observer).await;
    let sink = Sink::Core(CoreSink::new(publisher.clone(), GEN));

    let mut outbox = Outbox::default();
    for i in 0..3 {
        let payload = Bytes::from(format!("out-{i}"));
        let put = sink
            .publish(GEN, headers(i), payload, Target::Subject, Some(&mut outbox))
            .await;
        assert!(put.is_ok(), "{put:?}");
    }
    // The client's connection task ends: nothing can be sent through it.
    publisher.drain().await.expect("drain");
    let gone = tokio::time::timeout(std::time::Duration::from_secs(10), closed.recv());
    assert_eq!(gone.await.expect("the drained client closes"), Some(()));

    assert_eq!(sink.send(outbox).await, 0, "nothing went out");
    round_trip(&observer).await;
    let got = received_now(&observer, &mut outputs).await;
    assert!(got.is_empty(), "{got:?}");
}

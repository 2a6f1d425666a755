//! Durable mode on a 3-node NATS cluster with R3 streams made by `setup`:
//! the server leading the prefill stream is SIGKILLed a third of the way in
//! and restarted later. Nothing is lost, GEN holds each decode job once, and
//! the prefill stream ends empty.

use crate::common;
use crate::common::jetstream_support;

use async_nats::jetstream;
use common::cluster::NatsCluster;
use common::poll_until;
use jetstream_support::{
    Collector, Expect, Input, LibWorker, PREFILL, check_outputs, count, fixed_identity, mixed,
    setup, stream_contents, wait_drained,
};
use prefill_handoff::config::{Config, MissingDisaggRequestId, Mode};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const RESULTS: usize = 6000;

fn cluster_config(cluster: &NatsCluster) -> Config {
    let mut config = Config::default();
    config.nats.url = cluster.urls();
    config.mode = Mode::Jetstream;
    config.jetstream.ack_wait_secs = 2;
    config.jetstream.nak_delay_ms = 100;
    config.jetstream.max_deliver = 100;
    config.jetstream.replicas = 3;
    config.max_in_flight = 64;
    config.jetstream.batch = 32;
    config.shutdown_timeout_secs = 5;
    // The traffic's TensorRT-LLM results carry no ID: the worker mints.
    config.trtllm.missing_disagg_request_id = MissingDisaggRequestId::Mint;
    config.resolve().expect("valid test config")
}

/// Publishes one input until the prefill stream stores it. `Nats-Msg-Id`
/// makes a retry of a publish that was stored but whose ack was lost a
/// duplicate the stream drops.
async fn publish_until_stored(js: &jetstream::Context, input: &Input) {
    let stored = poll_until(Duration::from_secs(60), || async {
        let mut headers = input.headers();
        headers.insert("Nats-Msg-Id", format!("in-{}", input.request_id).as_str());
        match js
            .publish_with_headers(PREFILL, headers, input.payload.clone().into())
            .await
        {
            Ok(ack) => ack.await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(stored, "{} not stored within 60 s", input.request_id);
}

/// The server (index) leading a stream's replicas.
async fn stream_leader(js: &jetstream::Context, cluster: &NatsCluster, name: &str) -> usize {
    let mut stream = js.get_stream(name).await.expect("stream");
    let info = stream.info().await.expect("stream info");
    let leader = info
        .cluster
        .as_ref()
        .and_then(|c| c.leader.clone())
        .expect("a replicated stream has a leader");
    cluster.index_of(&leader).expect("a server of the cluster")
}

/// A client of the whole cluster (every node's URL), as the workers connect.
async fn connect_cluster(cluster: &NatsCluster) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .connect(
            prefill_handoff::connect::parse_url(&cluster.urls())
                .expect("server URLs")
                .addrs,
        )
        .await
        .expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jetstream_cluster_prefill_stream_leader_killed_loses_nothing() {
    let mut cluster = NatsCluster::start();
    let config = cluster_config(&cluster);
    let client = connect_cluster(&cluster).await;
    let js = jetstream::new(client.clone());
    setup(&js, &config).await;
    for name in ["LLM_PREFILL", "LLM_GEN"] {
        let mut s = js.get_stream(name).await.expect("stream");
        let info = s.info().await.expect("info");
        assert_eq!(info.config.num_replicas, 3, "{name} is R3");
    }
    // Replies and dead letters are core NATS messages: a subscriber on a
    // server that stays up sees every one the cluster routes. (A capture
    // stream would drop the ones published while its own leader moves.)
    let leader = stream_leader(&js, &cluster, "LLM_PREFILL").await;
    let watcher = async_nats::connect(cluster.url((leader + 1) % 3))
        .await
        .expect("connect the collector");
    let collector = Collector::start(&watcher).await;

    let workers: Vec<LibWorker> =
        futures::future::join_all((1..=3).map(|m| LibWorker::start(&config, fixed_identity(m))))
            .await;

    let inputs: Vec<Input> = (0..RESULTS).map(mixed).collect();
    let started = Instant::now();
    let mut killed = None;
    for (i, chunk) in inputs.chunks(200).enumerate() {
        let at = i * 200;
        if at == RESULTS / 3 {
            assert_eq!(
                stream_leader(&js, &cluster, "LLM_PREFILL").await,
                leader,
                "the prefill stream's leader moved before the kill"
            );
            cluster.kill(leader);
            eprintln!(
                "n{leader} (prefill stream leader) SIGKILLed after {at} results, {:.1} s in",
                started.elapsed().as_secs_f64()
            );
            killed = Some(leader);
        }
        if at == 2 * RESULTS / 3
            && let Some(leader) = killed
        {
            cluster.restart(leader);
            eprintln!("n{leader} restarted after {at} results");
        }
        futures::future::join_all(chunk.iter().map(|input| publish_until_stored(&js, input))).await;
    }
    assert!(killed.is_some(), "the leader was killed");
    assert!(
        wait_drained(&js, Duration::from_secs(180)).await,
        "the work queue did not drain"
    );
    eprintln!(
        "{RESULTS} results handled in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let gen_jobs = stream_contents(&js, "LLM_GEN").await;
    let mut in_gen: BTreeMap<String, usize> = BTreeMap::new();
    for job in &gen_jobs {
        *in_gen.entry(job.request_id.clone()).or_default() += 1;
    }
    let twice: Vec<_> = in_gen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "GEN holds decode jobs twice: {twice:?}");

    // Decode jobs as GEN stored them; the rest as the collector saw them,
    // once it has seen each (the last ones may still be crossing a route),
    // and behind a fence.
    let live: Vec<(String, Expect)> = inputs
        .iter()
        .filter(|i| i.expect != Expect::Gen)
        .map(|i| (i.request_id.clone(), i.expect))
        .collect();
    poll_until(Duration::from_secs(30), || async {
        let seen = count(&collector.all());
        live.iter().all(|key| seen.contains_key(key))
    })
    .await;
    collector.fence().await;
    let mut seen = gen_jobs;
    seen.extend(
        collector
            .all()
            .into_iter()
            .filter(|s| s.kind != Expect::Gen),
    );
    let repeated = check_outputs(&inputs, &seen);
    assert!(
        repeated.iter().all(|(_, kind, _)| *kind != Expect::Gen),
        "decode jobs repeated: {repeated:?}"
    );
    eprintln!(
        "repeated replies or dead letters (a delivery whose ack was lost): {}: {:?}",
        repeated.len(),
        &repeated[..repeated.len().min(20)]
    );
    let left = js
        .get_stream("LLM_PREFILL")
        .await
        .expect("prefill stream")
        .get_info()
        .await
        .expect("info")
        .state
        .messages;
    assert_eq!(left, 0, "the prefill stream ends empty");
    for worker in workers {
        let _ = worker.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_cluster_setup_raises_replicas_in_place() {
    let cluster = NatsCluster::start();
    let mut config = cluster_config(&cluster);
    config.jetstream.replicas = 1;
    let client = connect_cluster(&cluster).await;
    let js = jetstream::new(client);
    setup(&js, &config).await;
    let stored = Input {
        request_id: "kept".into(),
        payload: b"kept".to_vec(),
        json: false,
        expect: Expect::Dead,
    };
    publish_until_stored(&js, &stored).await;

    config.jetstream.replicas = 3;
    let report = prefill_handoff::setup::ensure(&js, &config)
        .await
        .expect("1 -> 3 in place");
    for name in ["LLM_PREFILL", "LLM_GEN"] {
        let change = &report
            .objects
            .iter()
            .find(|(n, _)| *n == format!("stream {name}"))
            .expect("reported")
            .1;
        assert_eq!(change.to_string(), "updated (num_replicas 1 → 3)", "{name}");
        let mut s = js.get_stream(name).await.expect("stream");
        assert_eq!(s.info().await.expect("info").config.num_replicas, 3);
    }
    let mut prefill = js.get_stream("LLM_PREFILL").await.expect("stream");
    assert_eq!(
        prefill.info().await.expect("info").state.messages,
        1,
        "the update kept the stored result"
    );
    let again = prefill_handoff::setup::ensure(&js, &config)
        .await
        .expect("again");
    assert!(
        again
            .objects
            .iter()
            .all(|(_, c)| c.to_string() == "unchanged"),
        "{again}"
    );
}

//! The harness itself: servers start on free ports, die and come back.

use crate::common;

use common::{Etcd, Nats};
use std::net::TcpStream;

#[test]
fn nats_and_etcd_start_kill_and_restart() {
    let mut nats = Nats::start();
    let mut etcd = Etcd::start();
    assert!(TcpStream::connect(("127.0.0.1", nats.port)).is_ok());
    assert!(etcd.etcdctl(&["put", "/k", "v"]).is_some());

    nats.kill();
    assert!(TcpStream::connect(("127.0.0.1", nats.port)).is_err());
    nats.restart();
    assert!(TcpStream::connect(("127.0.0.1", nats.port)).is_ok());

    etcd.kill();
    assert!(etcd.etcdctl(&["get", "/k"]).is_none());
    etcd.restart();
    assert_eq!(
        etcd.get_prefix("/k"),
        vec![("/k".to_string(), "v".to_string())]
    );
}

#[test]
fn a_nats_cluster_and_an_etcd_cluster_lose_and_regain_any_node() {
    use common::cluster::{EtcdCluster, NatsCluster};
    let mut nats = NatsCluster::start();
    assert_eq!(nats.urls().split(',').count(), 3);
    let leader = nats.meta_leader(0).expect("a meta leader");
    let i = nats.index_of(&leader).expect("a named server");
    nats.kill(i);
    let other = (i + 1) % 3;
    assert!(
        common::poll_until_blocking(std::time::Duration::from_secs(30), || nats
            .meta_leader(other)
            .is_some_and(|l| l != leader)),
        "a new meta leader among the other two"
    );
    nats.restart(i);
    assert!(nats.wait_meta_leader(std::time::Duration::from_secs(30)));

    let mut etcd = EtcdCluster::start();
    etcd.etcdctl_checked(&["put", "/k", "v"]);
    let leader = etcd.leader().expect("a leader");
    etcd.kill(leader);
    assert!(
        common::poll_until_blocking(std::time::Duration::from_secs(30), || etcd
            .leader()
            .is_some_and(|l| l != leader)),
        "a new etcd leader"
    );
    assert!(etcd.etcdctl_checked(&["get", "/k"]).contains('v'));
    etcd.restart(leader);
    assert!(etcd.etcdctl_checked(&["get", "/k"]).contains('v'));
}

//! The harness itself: servers start on free ports, die and come back.

mod common;

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

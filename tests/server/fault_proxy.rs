//! The harness's fault proxy (`tests/common/fault_proxy.rs`): each fault
//! does what it says, switched while connections are open.

use crate::common;

use common::Nats;
use common::fault_proxy::{Fault, FaultProxy};
use common::worker_support::client;
use futures::StreamExt;
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An upstream that echoes what it reads and closes when its peer does.
async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

async fn round_trip(stream: &mut TcpStream, bytes: &[u8]) -> Vec<u8> {
    stream.write_all(bytes).await.unwrap();
    let mut back = vec![0; bytes.len()];
    stream.read_exact(&mut back).await.unwrap();
    back
}

#[tokio::test]
async fn passes_delays_holds_and_releases_in_order() {
    let proxy = FaultProxy::start(echo().await);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut stream, b"one").await, b"one");

    proxy.set(Fault::Latency(Duration::from_millis(50)));
    assert_eq!(round_trip(&mut stream, b"two").await, b"two");

    proxy.set(Fault::BlackHole);
    stream.write_all(b"three").await.unwrap();
    let mut back = [0u8; 5];
    let held = tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut back)).await;
    assert!(held.is_err(), "nothing comes back through a black hole");
    // A connection opened meanwhile is accepted, and carries nothing.
    let mut late = TcpStream::connect(proxy.addr()).await.unwrap();
    late.write_all(b"late").await.unwrap();
    let mut none = [0u8; 4];
    let held = tokio::time::timeout(Duration::from_secs(1), late.read_exact(&mut none)).await;
    assert!(held.is_err(), "nor on a new connection");

    proxy.set(Fault::Pass);
    let healed = tokio::time::timeout(Duration::from_secs(30), stream.read_exact(&mut back)).await;
    healed.expect("held bytes go on after the heal").unwrap();
    assert_eq!(&back, b"three");
    late.read_exact(&mut none).await.unwrap();
    assert_eq!(&none, b"late");
    assert_eq!(round_trip(&mut stream, b"four").await, b"four");
}

#[tokio::test]
async fn a_close_during_a_black_hole_is_passed_on_after_the_heal() {
    let proxy = FaultProxy::start(echo().await);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut stream, b"x").await, b"x");
    proxy.set(Fault::BlackHole);
    stream.shutdown().await.unwrap();
    let mut rest = Vec::new();
    let open = tokio::time::timeout(Duration::from_secs(1), stream.read_to_end(&mut rest)).await;
    assert!(open.is_err(), "the upstream does not see the close yet");
    proxy.set(Fault::Pass);
    let closed = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut rest)).await;
    closed
        .expect("the close goes through after the heal")
        .unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn reset_aborts_open_connections_and_accepts_new_ones() {
    let proxy = FaultProxy::start(echo().await);
    let mut stream = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut stream, b"x").await, b"x");
    proxy.reset();
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut buf))
        .await
        .expect("the reset arrives");
    let err = read.expect_err("an RST, not a clean end of stream");
    assert_eq!(err.kind(), ErrorKind::ConnectionReset, "{err}");
    let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(round_trip(&mut again, b"y").await, b"y");
}

#[tokio::test]
async fn a_nats_client_behind_a_black_hole_hears_nothing_until_the_heal() {
    let nats = Nats::start();
    let proxy = FaultProxy::start(nats.addr());
    let test = client(&format!("nats://{}", proxy.addr())).await;
    let mut echo = test.subscribe("fault.echo").await.unwrap();
    test.publish("fault.echo", "before".into()).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), echo.next()).await;
    assert_eq!(&first.unwrap().unwrap().payload[..], b"before");

    proxy.set(Fault::BlackHole);
    test.publish("fault.echo", "during".into()).await.unwrap();
    let stuck = tokio::time::timeout(Duration::from_secs(2), echo.next()).await;
    assert!(stuck.is_err(), "nothing goes through a black hole");
    proxy.set(Fault::Pass);
    let after = tokio::time::timeout(Duration::from_secs(30), echo.next()).await;
    let after = after
        .expect("what was held arrives after the heal")
        .unwrap();
    assert_eq!(&after.payload[..], b"during");
}

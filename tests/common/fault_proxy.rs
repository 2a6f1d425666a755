//! A TCP proxy on 127.0.0.1 between a worker and nats-server or etcd, whose
//! link can be made to fail the quiet ways production links fail, switched
//! while it runs:
//!
//! - [`Fault::Pass`]: bytes go through as they come;
//! - [`Fault::Latency`]: each chunk waits that long before it goes on;
//! - [`Fault::BlackHole`]: bytes are accepted (the sender's writes succeed
//!   until its buffers fill) but nothing is forwarded and nothing is closed,
//!   in either direction, also on connections opened meanwhile. As in a TCP
//!   partition, what was held goes on, in order, once the link passes again;
//!   an end of stream seen meanwhile is passed on after the heal too.
//!
//! and [`FaultProxy::reset`] aborts every open connection (RST both ways).
//!
//! It runs on a thread and runtime of its own, so any test (any runtime, or
//! none) can use it; dropping it stops it and closes its connections.

use std::io;
use std::net::SocketAddr;
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the link does to the bytes it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    Latency(Duration),
    BlackHole,
}

pub struct FaultProxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Bumped by [`FaultProxy::reset`]; `None` stops the proxy.
    resets: watch::Sender<Option<u64>>,
    thread: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// A proxy to `upstream`, passing bytes, listening on a free loopback
    /// port.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("the proxy's address");
        let (fault, fault_rx) = watch::channel(Fault::Pass);
        let (resets, resets_rx) = watch::channel(Some(0));
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("the proxy's runtime");
            runtime.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("a tokio listener");
                accept(listener, upstream, fault_rx, resets_rx).await;
            });
        });
        FaultProxy {
            addr,
            fault,
            resets,
            thread: Some(thread),
        }
    }

    /// `host:port` to give the client instead of the upstream's.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches what the link does, for open connections and new ones.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Aborts every connection open now (RST to both ends); new ones are
    /// accepted as before.
    pub fn reset(&self) {
        self.resets.send_modify(|n| *n = n.map(|n| n + 1));
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.resets.send_replace(None);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    mut resets: watch::Receiver<Option<u64>>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(connection(client, upstream, fault.clone(), resets.clone()));
            }
            changed = resets.changed() => {
                if changed.is_err() || resets.borrow().is_none() {
                    break;
                }
            }
        }
    }
    connections.shutdown().await;
}

/// One client connection and its upstream, until either end closes (and the
/// link passes) or a reset.
async fn connection(
    client: TcpStream,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
    mut resets: watch::Receiver<Option<u64>>,
) {
    resets.mark_unchanged();
    let Ok(server) = TcpStream::connect(upstream).await else {
        // Nothing to carry: the client sees its connection refused late.
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, fault.clone());
    let down = pump(server_read, client_write, fault);
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (false, false);
    // Ends when both directions ended cleanly, either failed (the other is
    // dropped: an RST), or a reset (both dropped).
    while !(up_done && down_done) {
        tokio::select! {
            r = &mut up, if !up_done => match r {
                Ok(()) => up_done = true,
                Err(_) => return,
            },
            r = &mut down, if !down_done => match r {
                Ok(()) => down_done = true,
                Err(_) => return,
            },
            _ = resets.changed() => return,
        }
    }
}

/// Carries one direction until its source ends (passing the end on once the
/// link is not a black hole) or either side fails. Dropped before that (a
/// reset, or the other direction failed), it aborts the connection.
async fn pump(
    mut from: OwnedReadHalf,
    to: OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
) -> io::Result<()> {
    let mut to = Abort(Some(to));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = from.read(&mut buf).await?;
        let current = *fault
            .wait_for(|f| *f != Fault::BlackHole)
            .await
            .map_err(io::Error::other)?;
        let Some(sink) = to.0.as_mut() else {
            return Ok(());
        };
        if n == 0 {
            sink.shutdown().await?;
            // Ended cleanly: no RST.
            to.0.take();
            return Ok(());
        }
        if let Fault::Latency(delay) = current {
            tokio::time::sleep(delay).await;
        }
        sink.write_all(&buf[..n]).await?;
    }
}

/// A write half that, dropped before its stream ended cleanly, aborts the
/// connection (SO_LINGER 0: an RST, not a FIN).
struct Abort(Option<OwnedWriteHalf>);

impl Drop for Abort {
    fn drop(&mut self) {
        if let Some(half) = self.0.take() {
            let _ = half.as_ref().set_zero_linger();
            // No FIN on drop: the socket closes, with the RST, once its
            // read half is dropped too.
            half.forget();
        }
    }
}

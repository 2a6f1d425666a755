//! A TCP proxy that delays every byte by a fixed one-way time, in both
//! directions: the benchmark's stand-in for a nats-server on another host
//! (`scripts/bench.sh`, the `*-rtt` scenarios). `tc netem` would do this in
//! the kernel, but the benchmark machines have no netem module.
//!
//! Plain threads and blocking sockets, not tokio: tokio's timers have a
//! resolution of one millisecond, too coarse for a 0.5 ms one-way delay,
//! where `std::thread::sleep` wakes within tens of microseconds. Each
//! direction of a connection has a reader thread, which stamps each chunk
//! with the time it is due, and a writer thread, which sleeps until the
//! first chunk is due and then writes every chunk already due in one write.
//! Chunks are never held back for each other, so the delay adds latency,
//! not a bandwidth limit.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// Bytes read at once from one side.
const CHUNK: usize = 64 * 1024;

/// Accepts connections on `listener` until it fails, relaying each to a new
/// connection to `upstream` with `delay` added in each direction.
pub fn serve(listener: TcpListener, upstream: SocketAddr, delay: Duration) -> io::Result<()> {
    loop {
        let (client, _) = listener.accept()?;
        match TcpStream::connect(upstream) {
            Ok(server) => {
                if let Err(e) = relay(client, server, delay) {
                    eprintln!("delay_proxy: cannot relay a connection: {e}");
                }
            }
            // The client sees its connection closed, as if the server were down.
            Err(e) => eprintln!("delay_proxy: cannot reach {upstream}: {e}"),
        }
    }
}

/// Starts the four threads of one proxied connection.
fn relay(client: TcpStream, server: TcpStream, delay: Duration) -> io::Result<()> {
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    direction(client.try_clone()?, server.try_clone()?, delay)?;
    direction(server, client, delay)
}

/// Relays what `from` sends to `to`, each chunk `delay` after it was read.
/// When `from` ends, `to` is shut down for writing once the rest is written.
fn direction(mut from: TcpStream, mut to: TcpStream, delay: Duration) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::Builder::new()
        .name("proxy-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay, buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // Unblocks a writer waiting on the other side's data, if the
            // peer closed without reading.
            let _ = from.shutdown(Shutdown::Read);
        })?;
    thread::Builder::new()
        .name("proxy-write".into())
        .spawn(move || {
            let mut out = Vec::with_capacity(CHUNK);
            // A chunk taken from the channel but not yet due.
            let mut next = None;
            while let Some((due, chunk)) = next.take().or_else(|| rx.recv().ok()) {
                sleep_until(due);
                out.clear();
                out.extend_from_slice(&chunk);
                // Everything else already due goes out in the same write.
                let now = Instant::now();
                while let Ok((due, chunk)) = rx.try_recv() {
                    if due > now {
                        next = Some((due, chunk));
                        break;
                    }
                    out.extend_from_slice(&chunk);
                }
                if to.write_all(&out).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

/// Sleeps until `due`; returns at once when it has passed.
fn sleep_until(due: Instant) {
    let now = Instant::now();
    if due > now {
        thread::sleep(due - now);
    }
}

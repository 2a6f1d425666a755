//! The TCP shell around `http.rs`: accept, read one bounded request head,
//! answer, close.

use super::http::{self, MAX_HEAD_BYTES};
use super::{Metrics, Readiness};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// Connections served at once; more wait in the listen backlog.
const MAX_CONNECTIONS: usize = 64;
/// A client gets this long to send its request and read the answer.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(
        "cannot listen on metrics_addr {addr:?}: {source}; set metrics_addr (or --metrics-addr) to a free host:port such as 127.0.0.1:9464"
    )]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// The running metrics and health server.
pub struct Server {
    /// The address actually bound (useful with port 0).
    pub local_addr: SocketAddr,
    /// Ends after the shutdown future completes.
    pub task: JoinHandle<()>,
}

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until
/// `shutdown` completes. Call from inside a tokio runtime.
pub async fn serve(
    addr: &str,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Server, ServeError> {
    let bind_error = |source| ServeError::Bind {
        addr: addr.to_string(),
        source,
    };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local_addr = listener.local_addr().map_err(bind_error)?;
    tracing::info!(%local_addr, "metrics and health endpoints listening");
    let task = tokio::spawn(accept_loop(listener, metrics, readiness, shutdown));
    Ok(Server { local_addr, task })
}

async fn accept_loop(
    listener: TcpListener,
    metrics: Metrics,
    readiness: Readiness,
    shutdown: impl Future<Output = ()>,
) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            _ = &mut shutdown => return,
            permit = limit.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let stream = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off briefly
                    // rather than spin.
                    tracing::warn!(error = %e, "metrics server accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let (metrics, readiness) = (metrics.clone(), readiness.clone());
        tokio::spawn(async move {
            let _permit = permit;
            if tokio::time::timeout(IO_TIMEOUT, answer(stream, &metrics, &readiness))
                .await
                .is_err()
            {
                tracing::debug!("metrics client too slow; connection closed");
            }
        });
    }
}

/// Reads one request head (at most [`MAX_HEAD_BYTES`]) and answers it.
async fn answer(mut stream: TcpStream, metrics: &Metrics, readiness: &Readiness) {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let response = loop {
        match stream.read(&mut chunk).await {
            // The client closed early: answer what arrived (likely a 400).
            Ok(0) => break http::respond(&buf, metrics, readiness),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return,
        }
        if let Some(end) = http::head_end(&buf) {
            break http::respond(&buf[..end], metrics, readiness);
        }
        if buf.len() > MAX_HEAD_BYTES {
            break http::too_large();
        }
    };
    if stream.write_all(&response).await.is_ok() {
        let _ = stream.shutdown().await;
    }
}

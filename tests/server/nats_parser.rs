//! The NATS client's parser of what the server sends, driven through a
//! real connection to a fake server (a loopback listener that speaks INFO,
//! answers the handshake, then sends hostile bytes). What the server sends
//! is parsed into messages or a protocol error, never a panic: an error
//! ends that connection and the client reconnects; a header block a
//! publisher wrote that cannot be parsed is delivered marked and the
//! connection lives on (vendor/patches/).

use async_nats::header::HEADER_BLOCK_ERROR;
use async_nats::{Client, Message, Subscriber};
use futures::StreamExt as _;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::net::{TcpListener, TcpStream};

const WAIT: Duration = Duration::from_secs(20);

/// A fake server's end of one client connection.
struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Accepts the client's next connection and answers its handshake, up
    /// to its subscription (sid `1`, subject `s`).
    async fn accept(listener: &TcpListener) -> Conn {
        let accepted = tokio::time::timeout(WAIT, listener.accept()).await;
        let (stream, _) = accepted.expect("the client connects").expect("accept");
        let mut conn = Conn {
            reader: BufReader::new(stream),
        };
        let info = r#"INFO {"server_id":"fake","server_name":"fake","version":"2.9.10","go":"go","host":"127.0.0.1","port":4222,"headers":true,"max_payload":1048576,"proto":1}"#;
        conn.send(format!("{info}\r\n").as_bytes()).await;
        // CONNECT, then PING; a reconnect sends its SUB before the PING's
        // answer is read, a first connection after it.
        let mut subscribed = false;
        while !subscribed {
            let line = conn.line().await;
            if line.starts_with("PING") {
                conn.send(b"PONG\r\n").await;
            }
            subscribed = line.starts_with("SUB s ");
        }
        conn
    }

    async fn line(&mut self) -> String {
        let mut line = String::new();
        let read = tokio::time::timeout(WAIT, self.reader.read_line(&mut line)).await;
        let n = read.expect("the client writes").expect("read");
        assert!(n > 0, "the client closed the connection");
        line
    }

    async fn send(&mut self, bytes: &[u8]) {
        let stream = self.reader.get_mut();
        stream.write_all(bytes).await.expect("write");
        stream.flush().await.expect("flush");
    }
}

/// A client connected to a fake server, subscribed to `s`.
async fn connected() -> (TcpListener, Conn, Client, Subscriber) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let connecting = async_nats::ConnectOptions::new()
        .retry_on_initial_connect()
        .max_reconnects(None)
        .reconnect_delay_callback(|_| Duration::from_millis(10))
        .connect(addr.to_string());
    let client = connecting.await.expect("client");
    let subscribing = client.subscribe("s");
    let (conn, subscriber) = tokio::join!(Conn::accept(&listener), subscribing);
    (listener, conn, client, subscriber.expect("subscribe"))
}

async fn next(subscriber: &mut Subscriber) -> Message {
    let next = tokio::time::timeout(WAIT, subscriber.next()).await;
    next.expect("a message comes")
        .expect("the subscription is open")
}

/// An `HMSG` on `s`, sid 1, reply `r`, with this header block and payload.
fn hmsg(block: &[u8], body: &[u8]) -> Vec<u8> {
    let total = block.len() + body.len();
    let mut op = format!("HMSG s 1 r {} {total}\r\n", block.len()).into_bytes();
    op.extend_from_slice(block);
    op.extend_from_slice(body);
    op.extend_from_slice(b"\r\n");
    op
}

/// The inputs that panicked the client's connection task (nats-io/nats.rs
/// PR #1612) and a few more kinds of garbage: each ends the connection as
/// a protocol error, and the client reconnects and goes on receiving.
#[tokio::test]
async fn protocol_errors_end_the_connection_not_the_client() {
    let max = usize::MAX;
    let rows: [(&str, Vec<u8>); 6] = [
        ("a bare -ERR", b"-ERR\r\n".to_vec()),
        (
            "MSG length near usize::MAX",
            format!("MSG s 1 {max}\r\n").into_bytes(),
        ),
        (
            "MSG length near usize::MAX, minus the line",
            format!("MSG s 1 {}\r\n", max - 14).into_bytes(),
        ),
        (
            "HMSG total near usize::MAX",
            format!("HMSG s 1 10 {max}\r\n").into_bytes(),
        ),
        ("an unknown operation", b"GARBAGE 1 2 3\r\n".to_vec()),
        (
            "a MSG line that is not UTF-8",
            b"MSG s\xff 1 1\r\nx\r\n".to_vec(),
        ),
    ];
    let (listener, mut conn, _client, mut subscriber) = connected().await;
    for (name, op) in rows {
        conn.send(&op).await;
        // The next connection: the client survived the op and reconnected.
        conn = Conn::accept(&listener).await;
        conn.send(b"MSG s 1 5\r\nafter\r\n").await;
        let message = next(&mut subscriber).await;
        assert_eq!(message.payload, &b"after"[..], "{name}");
    }
}

/// A header block the client cannot parse is the publisher's (the server
/// forwards it as written): the message comes out marked with why, with
/// its subject, reply and payload, and the connection goes on.
#[tokio::test]
async fn an_unparsable_header_block_is_delivered_marked_and_the_connection_lives_on() {
    let rows: [(&str, &[u8], &str); 7] = [
        (
            "a line feed in a header value",
            b"NATS/1.0\r\nX-Evil: a\nb\r\n\r\n",
            "no colon",
        ),
        ("no colon", b"NATS/1.0\r\nno colon here\r\n\r\n", "no colon"),
        ("a bad name", b"NATS/1.0\r\nX\x01Evil: v\r\n\r\n", ""),
        ("not UTF-8", b"NATS/1.0\r\nX-Evil: \xff\r\n\r\n", "utf-8"),
        ("no version line", b"HTTP/1.1\r\nX: v\r\n\r\n", "NATS/1.0"),
        ("a bad status", b"NATS/1.0 abc\r\n\r\n", "status"),
        (
            "the client's marker, forged",
            b"NATS/1.0\r\nasync-nats-header-block-error: pretend\r\n\r\n",
            "reserved by the client",
        ),
    ];
    let (_listener, mut conn, _client, mut subscriber) = connected().await;
    for (name, block, why) in rows {
        conn.send(&hmsg(block, b"body")).await;
        conn.send(b"MSG s 1 5\r\nafter\r\n").await;
        let marked = next(&mut subscriber).await;
        assert_eq!(marked.payload, &b"body"[..], "{name}");
        assert_eq!(marked.reply.as_deref(), Some("r"), "{name}");
        assert_eq!(marked.status, None, "{name}");
        let headers = marked.headers.expect("the marker");
        assert_eq!(headers.len(), 1, "{name}: the marker alone: {headers:?}");
        let reason = headers.get(HEADER_BLOCK_ERROR).expect("the marker");
        assert!(reason.as_str().contains(why), "{name}: {reason:?}");
        // Same connection: it was not dropped.
        let after = next(&mut subscriber).await;
        assert_eq!(after.payload, &b"after"[..], "{name}");
    }
}

/// What the stock client does with bytes inside a value that the worker
/// used to dead-letter: a lone CR becomes a space (upstream's fix of the
/// panic), a NUL stays; either way the message is delivered unmarked.
#[tokio::test]
async fn a_lone_cr_becomes_a_space_and_a_well_formed_block_is_unmarked() {
    let (_listener, mut conn, _client, mut subscriber) = connected().await;
    let rows: [(&[u8], &str); 3] = [
        (b"NATS/1.0\r\nX-Evil: a\rb\r\n\r\n", "a b"),
        (b"NATS/1.0\r\nX-Evil: a\x00b\r\n\r\n", "a\0b"),
        (b"NATS/1.0\r\nX-Evil: plain\r\n\r\n", "plain"),
    ];
    for (block, value) in rows {
        conn.send(&hmsg(block, b"body")).await;
        let message = next(&mut subscriber).await;
        let headers = message.headers.expect("headers");
        assert!(headers.get(HEADER_BLOCK_ERROR).is_none(), "{headers:?}");
        let got = headers.get("X-Evil").map(|v| v.as_str().to_string());
        assert_eq!(got.as_deref(), Some(value));
        assert_eq!(message.payload, &b"body"[..]);
    }
}

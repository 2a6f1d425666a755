//! The patched async-nats parser (vendor/async-nats, docs/vendor-async-nats.md):
//! what the server sends is parsed into ops or an error, never a panic.
//! Driven through the crate's fuzz hook, with no socket.

use async_nats::ServerOp;
use async_nats::connection::parse_server_ops;

#[test]
fn the_fuzz_hook_parses_server_ops_without_a_socket() {
    let ops = parse_server_ops(b"PING\r\n+OK\r\nMSG a.b 7 5\r\nhello\r\nPONG\r\n")
        .expect("well-formed ops parse");
    assert_eq!(ops.len(), 4);
    assert_eq!(ops[0], ServerOp::Ping);
    assert_eq!(ops[1], ServerOp::Ok);
    let ServerOp::Message {
        sid,
        subject,
        payload,
        ..
    } = &ops[2]
    else {
        panic!("expected a message, got {:?}", ops[2]);
    };
    assert_eq!((*sid, subject.as_str(), &payload[..]), (7, "a.b", &b"hello"[..]));
    assert_eq!(ops[3], ServerOp::Pong);
}

#[test]
fn an_incomplete_trailing_op_is_left_unparsed() {
    let ops = parse_server_ops(b"PING\r\nMSG a.b 7 5\r\nhel").expect("no error");
    assert_eq!(ops, vec![ServerOp::Ping]);
}

//! `prefill-handoff slots` against a real etcd with live leases.

use super::support::*;
use crate::common::{Etcd, free_port};
use etcd_client::PutOptions;
use prefill_handoff::identity::Lease;
use std::process::{Command, Output};

fn slots(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_prefill-handoff"))
        .arg("slots")
        .args(args)
        .output()
        .expect("run prefill-handoff slots")
}

fn stdout(out: &Output) -> String {
    assert!(
        out.status.success(),
        "slots failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_claimed_slots_with_their_instances_then_slotless_instances() {
    let etcd = Etcd::start();
    let config = config(&etcd, 10);
    let a = Lease::start(&config, registration())
        .await
        .expect("start a");
    let b = Lease::start(&config, registration())
        .await
        .expect("start b");
    let mut held_slots = vec![held(&a.identity()), held(&b.identity())];
    held_slots.sort_by_key(|(_, m)| *m);

    // An instance that holds no slot (registered, still claiming).
    let mut c = client(&etcd).await;
    let slotless = c.lease_grant(60, None).await.expect("grant").id();
    let record = serde_json::json!({
        "host": "other-node", "pid": 4242, "machine_id": null, "version": "0.1.0",
        "subjects": [], "started_at": "2025-01-01T00:00:00Z"
    });
    c.put(
        format!("/llm/handoff/instances/{}", hex(slotless)),
        record.to_string(),
        Some(PutOptions::new().with_lease(slotless)),
    )
    .await
    .expect("put a slotless instance");

    let endpoint = etcd.endpoint();
    let json = stdout(&slots(&["--etcd-endpoints", &endpoint, "--json"]));
    let entries: Vec<serde_json::Value> = serde_json::from_str(&json).expect("a JSON array");
    assert_eq!(entries.len(), 3, "{json}");
    for (entry, (lease_id, machine_id)) in entries.iter().zip(&held_slots) {
        assert_eq!(entry["machine_id"], machine_id.get(), "{json}");
        assert_eq!(entry["lease"], hex(*lease_id));
        assert_eq!(entry["pid"], std::process::id());
        assert!(entry["host"].as_str().is_some_and(|h| !h.is_empty()));
        assert!(entry["age_secs"].is_u64(), "{json}");
    }
    assert_eq!(entries[2]["machine_id"], serde_json::Value::Null);
    assert_eq!(entries[2]["lease"], hex(slotless));
    assert_eq!(entries[2]["host"], "other-node");
    assert!(entries[2]["age_secs"].as_u64().is_some_and(|s| s > 0));

    let table = stdout(&slots(&["--etcd-endpoints", &endpoint]));
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("MACHINE_ID  LEASE"), "{table}");
    for (row, (lease_id, machine_id)) in lines[1..3].iter().zip(&held_slots) {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[0], machine_id.to_string(), "{table}");
        assert_eq!(cells[1], hex(*lease_id));
        assert_eq!(cells[3], std::process::id().to_string());
    }
    assert!(lines[3].starts_with("-  "), "{table}");
    assert_eq!(
        lines[4], "2 of 1021 slots claimed, 1 instance(s) without a slot",
        "{table}"
    );

    // Another namespace has nothing.
    let other = stdout(&slots(&[
        "--etcd-endpoints",
        &endpoint,
        "--namespace",
        "other",
        "--json",
    ]));
    assert_eq!(other.trim(), "[]");

    // A shut-down worker disappears from the listing at once.
    a.shutdown().await;
    let after: Vec<serde_json::Value> =
        serde_json::from_str(&stdout(&slots(&["--etcd-endpoints", &endpoint, "--json"])))
            .expect("JSON");
    assert_eq!(after.len(), 2);
    b.shutdown().await;
}

#[test]
fn an_unreachable_etcd_exits_1_naming_the_endpoint() {
    let endpoint = format!("http://127.0.0.1:{}", free_port());
    let out = slots(&["--etcd-endpoints", &endpoint]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&endpoint), "{stderr}");
}

//! Clusters for the tests of a deployment past one machine: a 3-node
//! nats-server cluster with JetStream (named servers `n0`..`n2`, full-mesh
//! routes, a store directory each) and a 3-member etcd (`e0`..`e2`), all on
//! free loopback ports. Any one node can be SIGKILLed and restarted with its
//! data kept; every process dies with its handle.

use super::{free_port, http_send, poll_until_blocking, start_nats_server, wait_for_port};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const START: Duration = Duration::from_secs(30);

/// One server of a [`NatsCluster`].
struct NatsNode {
    name: String,
    port: u16,
    route_port: u16,
    http_port: u16,
    child: Option<Child>,
}

/// Three nats-servers with JetStream, routed to each other.
pub struct NatsCluster {
    nodes: Vec<NatsNode>,
    dir: tempfile::TempDir,
}

impl NatsCluster {
    /// Starts three servers and waits until JetStream has a meta leader.
    pub fn start() -> NatsCluster {
        let nodes = (0..3)
            .map(|i| NatsNode {
                name: format!("n{i}"),
                port: free_port(),
                route_port: free_port(),
                http_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = NatsCluster {
            nodes,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        for i in 0..3 {
            cluster.spawn(i);
        }
        assert!(
            cluster.wait_meta_leader(START),
            "the NATS cluster elected no JetStream meta leader:\n{}",
            cluster.log(0)
        );
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let routes: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, n)| format!("nats-route://127.0.0.1:{}", n.route_port))
            .collect();
        let node = &self.nodes[i];
        let store = self.dir.path().join(format!("store-{}", node.name));
        let conf = self.dir.path().join(format!("{}.conf", node.name));
        let text = format!(
            "server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{http}\n\
             jetstream {{ store_dir: {store:?} }}\n\
             cluster {{ name: handoff, listen: 127.0.0.1:{route}, routes: [{routes}] }}\n",
            name = node.name,
            port = node.port,
            http = node.http_port,
            store = store.display().to_string(),
            route = node.route_port,
            routes = routes.join(", "),
        );
        std::fs::write(&conf, text).expect("write the node's config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", node.name)))
            .expect("log file");
        let port = node.port;
        self.nodes[i].child = Some(start_nats_server(&conf, log, port, START));
    }

    /// Every client URL, comma-separated: what `nats.url` takes.
    pub fn urls(&self) -> String {
        (0..3).map(|i| self.url(i)).collect::<Vec<_>>().join(",")
    }

    pub fn url(&self, i: usize) -> String {
        format!("nats://127.0.0.1:{}", self.nodes[i].port)
    }

    /// The index of the server named `name` (`n0`..`n2`).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// SIGKILL one server; its store is kept.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed server again with its store and ports.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    /// The JetStream meta leader as server `i` sees it (`/jsz`).
    pub fn meta_leader(&self, i: usize) -> Option<String> {
        // HTTP/1.0: the monitoring server answers without chunks and closes.
        let reply = http_send(
            ("127.0.0.1", self.nodes[i].http_port),
            b"GET /jsz HTTP/1.0\r\nHost: test\r\n\r\n",
        )
        .ok()?;
        let jsz: serde_json::Value = serde_json::from_str(&reply.body).ok()?;
        jsz["meta_cluster"]["leader"]
            .as_str()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
    }

    /// Waits until every running server knows the same meta leader.
    pub fn wait_meta_leader(&self, timeout: Duration) -> bool {
        poll_until_blocking(timeout, || {
            let running: Vec<usize> = (0..3).filter(|i| self.nodes[*i].child.is_some()).collect();
            let leaders: Vec<Option<String>> =
                running.iter().map(|i| self.meta_leader(*i)).collect();
            leaders.iter().all(Option::is_some) && leaders.windows(2).all(|w| w[0] == w[1])
        })
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.nodes[i].name)))
            .unwrap_or_default()
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
    }
}

/// One member of an [`EtcdCluster`].
struct EtcdMember {
    name: String,
    port: u16,
    peer_port: u16,
    child: Option<Child>,
}

/// A 3-member etcd.
pub struct EtcdCluster {
    members: Vec<EtcdMember>,
    dir: tempfile::TempDir,
}

impl EtcdCluster {
    /// Starts three members and waits until the cluster has a leader.
    pub fn start() -> EtcdCluster {
        let members = (0..3)
            .map(|i| EtcdMember {
                name: format!("e{i}"),
                port: free_port(),
                peer_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = EtcdCluster {
            members,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        for i in 0..3 {
            cluster.spawn(i);
        }
        assert!(
            poll_until_blocking(START, || cluster.leader().is_some()),
            "the etcd cluster elected no leader"
        );
        cluster
    }

    fn spawn(&mut self, i: usize) {
        let initial: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let member = &self.members[i];
        let client = format!("http://127.0.0.1:{}", member.port);
        let peer = format!("http://127.0.0.1:{}", member.peer_port);
        let bin = std::env::var("HANDOFF_TEST_ETCD").unwrap_or_else(|_| "etcd".into());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", member.name)))
            .expect("log file");
        // The initial-cluster flags only matter on the first start; a
        // restart reads the membership from its data directory.
        let child = Command::new(bin)
            .args(["--name", &member.name, "--data-dir"])
            .arg(self.dir.path().join(&member.name))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "handoff-test"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd (is it installed? scripts/install-deps.sh)");
        let port = member.port;
        self.members[i].child = Some(child);
        assert!(
            wait_for_port(port, START),
            "etcd member {i} did not listen on {port}"
        );
    }

    /// Every client URL, comma-separated: what `etcd.endpoints` takes.
    #[allow(
        dead_code,
        reason = "the cluster tests use it; the server binary includes this module for its own cluster checks"
    )]
    pub fn endpoints(&self) -> String {
        (0..3)
            .map(|i| self.endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].port)
    }

    /// The running members' endpoints, comma-separated.
    fn running_endpoints(&self) -> String {
        (0..3)
            .filter(|i| self.members[*i].child.is_some())
            .map(|i| self.endpoint(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the current leader, as a running member reports it.
    pub fn leader(&self) -> Option<usize> {
        (0..3)
            .filter(|i| self.members[*i].child.is_some())
            .find(|i| {
                let out =
                    self.etcdctl_at(&self.endpoint(*i), &["endpoint", "status", "-w", "json"]);
                let Some(out) = out else { return false };
                let Ok(json) = serde_json::from_str::<serde_json::Value>(&out) else {
                    return false;
                };
                let status = &json[0]["Status"];
                let me = status["header"]["member_id"].as_u64();
                me.is_some() && me == status["leader"].as_u64()
            })
    }

    /// Runs `etcdctl` against the running members; `None` when it fails.
    #[allow(
        dead_code,
        reason = "the cluster tests use it; the server binary includes this module for its own cluster checks"
    )]
    pub fn etcdctl(&self, args: &[&str]) -> Option<String> {
        self.etcdctl_at(&self.running_endpoints(), args)
    }

    /// Runs `etcdctl` against the running members and panics when it fails:
    /// for checks whose empty answer means something (no keys left).
    pub fn etcdctl_checked(&self, args: &[&str]) -> String {
        let endpoints = self.running_endpoints();
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(&endpoints)
            .arg("--command-timeout=5s")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run etcdctl: {e}"));
        assert!(
            out.status.success(),
            "etcdctl {args:?} at {endpoints} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn etcdctl_at(&self, endpoints: &str, args: &[&str]) -> Option<String> {
        let out = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg("--endpoints")
            .arg(endpoints)
            .arg("--command-timeout=3s")
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// SIGKILL one member; its data directory is kept.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts a killed member again with its data.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        self.spawn(i);
    }

    #[allow(
        dead_code,
        reason = "the cluster tests use it; the server binary includes this module for its own cluster checks"
    )]
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(format!("{}.log", self.members[i].name)),
        )
        .unwrap_or_default()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

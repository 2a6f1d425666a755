"""Tests of scripts/deploy/kustomize.py, and of what it renders from
deploy/kubernetes: python3 -m unittest discover -s scripts/deploy
(scripts/check-deploy.sh runs them)."""

import tempfile
import textwrap
import unittest
from pathlib import Path

import kustomize

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy/kubernetes"


def write(directory: Path, files: dict) -> None:
    for name, text in files.items():
        (directory / name).write_text(textwrap.dedent(text))


def find(objs, kind, name=None):
    hits = [o for o in objs if o["kind"] == kind
            and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind} {name}: {len(hits)} found"
    return hits[0]


POD = """\
    apiVersion: apps/v1
    kind: DaemonSet
    metadata: {name: w}
    spec:
      selector: {matchLabels: {app: w}}
      template:
        metadata: {labels: {app: w}}
        spec:
          containers:
            - name: c
              image: i
              env: [{name: A, value: "1"}, {name: B, value: "2"}]
              volumeMounts: [{name: config, mountPath: /etc/w}]
          volumes:
            - {name: config, configMap: {name: cfg}}
"""


class Renderer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = Path(self.tmp.name)
        (self.dir / "base").mkdir()
        (self.dir / "over").mkdir()

    def tearDown(self):
        self.tmp.cleanup()

    def test_patches_merge_lists_by_key_and_generated_names_are_followed(self):
        write(self.dir / "base", {
            "kustomization.yaml": """\
                namespace: ns
                resources: [pod.yaml]
                configMapGenerator:
                  - {name: cfg, files: [w.toml]}
            """,
            "pod.yaml": POD,
            "w.toml": "a = 1\n",
        })
        write(self.dir / "over", {
            "kustomization.yaml": "resources: [../base]\npatches: [{path: p.yaml}]\n",
            "p.yaml": """\
                apiVersion: apps/v1
                kind: DaemonSet
                metadata: {name: w}
                spec:
                  template:
                    spec:
                      containers:
                        - name: c
                          env: [{name: B, value: "3"}, {name: C, value: "4"}]
                          volumeMounts: [{name: tls, mountPath: /tls}]
            """,
        })
        objs = kustomize.build(self.dir / "over")
        pod = find(objs, "DaemonSet")["spec"]["template"]["spec"]
        container = pod["containers"][0]
        self.assertEqual(container["image"], "i")
        self.assertEqual(container["env"], [{"name": "A", "value": "1"},
                                            {"name": "B", "value": "3"},
                                            {"name": "C", "value": "4"}])
        self.assertEqual([m["mountPath"] for m in container["volumeMounts"]], ["/etc/w", "/tls"])
        cm = find(objs, "ConfigMap")
        self.assertRegex(cm["metadata"]["name"], r"^cfg-[a-z0-9]{10}$")
        self.assertEqual(cm["metadata"]["namespace"], "ns")
        self.assertEqual(pod["volumes"][0]["configMap"]["name"], cm["metadata"]["name"])

    def test_a_changed_file_changes_the_generated_name(self):
        names = []
        for content in ("a = 1\n", "a = 2\n"):
            write(self.dir / "base", {
                "kustomization.yaml": "configMapGenerator: [{name: cfg, files: [w.toml]}]\n",
                "w.toml": content,
            })
            names.append(find(kustomize.build(self.dir / "base"), "ConfigMap")["metadata"]["name"])
        self.assertNotEqual(names[0], names[1])

    def test_an_unsupported_field_is_an_error_not_ignored(self):
        write(self.dir / "base", {"kustomization.yaml": "resources: []\nimages: [{name: i}]\n"})
        with self.assertRaisesRegex(kustomize.KustomizeError, "images"):
            kustomize.build(self.dir / "base")

    def test_a_patch_that_matches_nothing_is_an_error(self):
        write(self.dir / "base", {
            "kustomization.yaml": "resources: [pod.yaml]\npatches: [{path: p.yaml}]\n",
            "pod.yaml": POD,
            "p.yaml": "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: other}\n",
        })
        with self.assertRaisesRegex(kustomize.KustomizeError, "matches 0"):
            kustomize.build(self.dir / "base")

    def test_labels_without_selectors_leave_selectors_alone(self):
        write(self.dir / "base", {
            "kustomization.yaml": """\
                resources: [pod.yaml]
                labels: [{pairs: {team: x}, includeSelectors: false}]
            """,
            "pod.yaml": POD,
        })
        ds = find(kustomize.build(self.dir / "base"), "DaemonSet")
        self.assertEqual(ds["metadata"]["labels"], {"team": "x"})
        self.assertEqual(ds["spec"]["selector"], {"matchLabels": {"app": "w"}})


class Manifests(unittest.TestCase):
    """What the project's own kustomizations render."""

    def pods(self, directory):
        objs = kustomize.build(directory)
        return objs, [(o, kustomize.pod_spec(o)) for o in objs if kustomize.pod_spec(o)]

    def test_no_volume_is_mounted_inside_another(self):
        # kubernetes/kubernetes#44214: a mount inside a ConfigMap volume's
        # directory breaks the ConfigMap's atomic updates.
        for directory in (KUBE / "base", KUBE / "overlays/tls"):
            for obj, spec in self.pods(directory)[1]:
                for c in spec["containers"]:
                    paths = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts", [])]
                    for a in paths:
                        for b in paths:
                            self.assertFalse(a != b and b.startswith(a),
                                             f"{obj['kind']} {c['name']}: {b} inside {a}")

    def test_every_object_is_in_the_namespace_and_every_config_map_exists(self):
        for directory in (KUBE / "base", KUBE / "overlays/tls"):
            objs, pods = self.pods(directory)
            for obj in objs:
                self.assertEqual(obj["metadata"].get("namespace"), "llm-serving", obj["kind"])
            maps = {o["metadata"]["name"] for o in objs if o["kind"] == "ConfigMap"}
            for obj, spec in pods:
                for volume in spec.get("volumes", []):
                    if "configMap" in volume:
                        self.assertIn(volume["configMap"]["name"], maps)

    def test_pods_are_locked_down(self):
        for obj, spec in self.pods(KUBE / "overlays/tls")[1]:
            self.assertTrue(spec["securityContext"]["runAsNonRoot"])
            self.assertEqual(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault")
            for c in spec["containers"]:
                sc = c["securityContext"]
                self.assertTrue(sc["readOnlyRootFilesystem"], c["name"])
                self.assertFalse(sc["allowPrivilegeEscalation"], c["name"])
                self.assertEqual(sc["capabilities"]["drop"], ["ALL"], c["name"])
                res = c["resources"]
                self.assertEqual(res["requests"]["memory"], res["limits"]["memory"], c["name"])

    def test_the_service_monitor_scrapes_a_port_of_the_service(self):
        objs = kustomize.build(KUBE / "base")
        service = find(objs, "Service")
        monitor = find(objs, "ServiceMonitor")
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        self.assertLessEqual(wanted, service["metadata"]["labels"].items())
        ports = {p["name"] for p in service["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            self.assertIn(endpoint["port"], ports)


if __name__ == "__main__":
    unittest.main()

"""A small kustomize build, enough for deploy/kubernetes: prints the
manifests a kustomization directory describes, as one YAML stream.

    python3 scripts/deploy/kustomize.py deploy/kubernetes/overlays/tls

No kustomize binary can be installed from Debian's or PyPI's packages, and
the project checks its manifests on machines that have only those. This
implements what the project's kustomizations use, the way kustomize does:
`resources` (files and directories), `components`, `namespace`, `labels`,
`configMapGenerator` (files, with a content hash in the name and the
references to it in pod templates rewritten) and `patches` with a path
(strategic merge: maps merged, lists of containers, volumes, env and the
like merged by their key). Any other field is an error, not ignored: a
kustomization that needs more needs the real kustomize (`kubectl apply -k`).
The hash suffix is not byte-for-byte kustomize's.
"""

import hashlib
import json
import sys
from pathlib import Path

import yaml

KNOWN = {"apiVersion", "kind", "resources", "components", "namespace", "labels",
         "configMapGenerator", "patches"}
# Strategic merge keys of the lists the manifests patch (Kubernetes' own
# patchMergeKey for each field).
MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name",
              "env": "name", "envFrom": None, "ports": "containerPort",
              "volumeMounts": "mountPath", "tolerations": None, "args": None}


class KustomizeError(Exception):
    pass


def load_docs(path: Path) -> list:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def merge(base, patch, field=None):
    """Strategic merge of `patch` into `base` (new object)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        if any(k.startswith("$") for k in patch):
            raise KustomizeError(f"patch directive not supported: {sorted(patch)}")
        out = dict(base)
        for key, value in patch.items():
            out[key] = merge(base[key], value, key) if key in base else value
        return out
    if isinstance(base, list) and isinstance(patch, list):
        key = MERGE_KEYS.get(field)
        if key is None:
            return patch
        out = list(base)
        for item in patch:
            at = next((i for i, b in enumerate(out) if b.get(key) == item.get(key)), None)
            if at is None:
                out.append(item)
            else:
                out[at] = merge(out[at], item)
        return out
    return patch


def identity(obj: dict) -> tuple:
    return (obj.get("kind"), obj.get("metadata", {}).get("name"))


def name_hash(obj: dict) -> str:
    text = json.dumps({"kind": obj["kind"], "name": obj["metadata"]["name"],
                       "data": obj.get("data", {})}, sort_keys=True)
    # Like kustomize: ten hex digits with the vowel-like ones replaced, so
    # the suffix never spells a word.
    table = str.maketrans("013ae", "ghkmt")
    return hashlib.sha256(text.encode()).hexdigest()[:10].translate(table)


def generate_config_maps(kust: dict, root: Path) -> tuple:
    """The ConfigMaps and a map from each generator name to its hashed name."""
    objs, renames = [], {}
    for gen in kust.get("configMapGenerator", []):
        unknown = set(gen) - {"name", "files"}
        if unknown:
            raise KustomizeError(f"configMapGenerator field not supported: {sorted(unknown)}")
        data = {}
        for spec in gen["files"]:
            key, _, file = spec.rpartition("=")
            data[key or Path(file).name] = (root / file).read_text()
        obj = {"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": gen["name"]}, "data": data}
        hashed = f"{gen['name']}-{name_hash(obj)}"
        renames[gen["name"]] = hashed
        obj["metadata"]["name"] = hashed
        objs.append(obj)
    return objs, renames


def pod_spec(obj: dict):
    spec = obj.get("spec", {})
    if "template" in spec:
        return spec["template"].get("spec", {})
    if "jobTemplate" in spec:
        return spec["jobTemplate"]["spec"]["template"].get("spec", {})
    return spec if obj.get("kind") == "Pod" else None


def rename_config_maps(obj: dict, renames: dict) -> None:
    spec = pod_spec(obj)
    if not spec:
        return
    for volume in spec.get("volumes", []):
        cm = volume.get("configMap")
        if cm and cm.get("name") in renames:
            cm["name"] = renames[cm["name"]]
    for container in spec.get("containers", []) + spec.get("initContainers", []):
        for source in container.get("envFrom", []):
            ref = source.get("configMapRef")
            if ref and ref.get("name") in renames:
                ref["name"] = renames[ref["name"]]
        for var in container.get("env", []):
            ref = var.get("valueFrom", {}).get("configMapKeyRef")
            if ref and ref.get("name") in renames:
                ref["name"] = renames[ref["name"]]


def add_labels(obj: dict, pairs: dict, selectors: bool, templates: bool) -> None:
    obj.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    spec = obj.get("spec", {})
    if (selectors or templates) and "template" in spec:
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)
    if selectors and "selector" in spec:
        sel = spec["selector"]
        target = sel.setdefault("matchLabels", {}) if obj["kind"] != "Service" else sel
        target.update(pairs)


def build(directory: Path, component: bool = False) -> list:
    path = directory / "kustomization.yaml"
    if not path.is_file():
        raise KustomizeError(f"{directory}: no kustomization.yaml")
    kust = yaml.safe_load(path.read_text()) or {}
    unknown = set(kust) - KNOWN
    if unknown:
        raise KustomizeError(f"{path}: field not supported: {sorted(unknown)}")
    want = "Component" if component else "Kustomization"
    if kust.get("kind", "Kustomization") != want:
        raise KustomizeError(f"{path}: kind {kust.get('kind')}, expected {want}")

    objs = []
    for entry in kust.get("resources", []):
        target = directory / entry
        objs += build(target) if target.is_dir() else load_docs(target)
    generated, renames = generate_config_maps(kust, directory)
    objs += generated
    for entry in kust.get("components", []):
        objs += build(directory / entry, component=True)
    seen = set()
    for obj in objs:
        if identity(obj) in seen:
            raise KustomizeError(f"{path}: {identity(obj)} defined twice")
        seen.add(identity(obj))
        rename_config_maps(obj, renames)

    for entry in kust.get("patches", []):
        if set(entry) != {"path"}:
            raise KustomizeError(f"{path}: only patches with a path are supported: {entry}")
        for patch in load_docs(directory / entry["path"]):
            at = [i for i, o in enumerate(objs) if identity(o) == identity(patch)]
            if len(at) != 1:
                raise KustomizeError(f"{path}: patch {identity(patch)} matches {len(at)} resources")
            objs[at[0]] = merge(objs[at[0]], patch)

    for entry in kust.get("labels", []):
        unknown = set(entry) - {"pairs", "includeSelectors", "includeTemplates"}
        if unknown:
            raise KustomizeError(f"{path}: labels field not supported: {sorted(unknown)}")
        for obj in objs:
            add_labels(obj, entry["pairs"], entry.get("includeSelectors", False),
                       entry.get("includeTemplates", False))
    if "namespace" in kust:
        for obj in objs:
            obj.setdefault("metadata", {})["namespace"] = kust["namespace"]
    return objs


def main(argv: list) -> int:
    if len(argv) != 1:
        print("usage: kustomize.py DIRECTORY", file=sys.stderr)
        return 2
    try:
        objs = build(Path(argv[0]))
    except (KustomizeError, OSError, yaml.YAMLError) as err:
        print(f"kustomize.py: {err}", file=sys.stderr)
        return 1
    sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Render a kustomize directory offline, for CI and for people without the kustomize binary.

Implements only the subset of kustomize that tidal's manifests use, and refuses any other
kustomization key with a ValueError, so the output never silently differs from
``kubectl kustomize``:

- ``resources``: YAML files (multi-document) or directories holding a kustomization.yaml;
- ``namespace``: set on every namespaced object;
- ``labels``: ``pairs`` added to ``metadata.labels`` (``includeSelectors`` must be false);
- ``images``: ``name`` -> ``newName`` / ``newTag`` on containers and init containers;
- ``configMapGenerator``: ``files`` and ``literals``, with
  ``generatorOptions.disableNameSuffixHash: true`` (no hash suffix to propagate);
- ``patches``: strategic-merge patches from files (``path``), each naming its target by
  apiVersion, kind and metadata.name. Maps merge key by key; the lists Kubernetes merges by key
  (containers and volumes by name, volumeMounts by mountPath, ...) merge item by item; other
  lists are replaced; ``$patch: delete`` on a list item removes it.

Usage: ``python -m infra.render infra/k8s/overlays/prod > prod.yaml``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

KUSTOMIZATION_FILE = "kustomization.yaml"
SUPPORTED_KEYS = {
    "apiVersion",
    "kind",
    "resources",
    "namespace",
    "labels",
    "images",
    "configMapGenerator",
    "generatorOptions",
    "patches",
}
# Kinds that live outside namespaces (the ones that could appear in tidal's manifests).
CLUSTER_SCOPED_KINDS = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "CustomResourceDefinition",
}
# Strategic-merge keys of the Kubernetes lists our patches touch (from the OpenAPI
# x-kubernetes-patch-merge-key annotations of core/v1 and apps/v1).
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "env": "name",
    "envFrom": None,
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
}


def _load_documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def _resource_id(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj.get("apiVersion", ""), obj.get("kind", ""), obj.get("metadata", {}).get("name", ""))


def strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    """Merge ``patch`` into a copy of ``base`` with the strategic-merge subset described above."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = copy.deepcopy(base)
        for k, v in patch.items():
            if v is None:
                merged.pop(k, None)
            elif k in merged:
                merged[k] = strategic_merge(merged[k], v, key=k)
            else:
                merged[k] = copy.deepcopy(v)
        return merged
    merge_key = MERGE_KEYS.get(key or "")
    if isinstance(base, list) and isinstance(patch, list) and merge_key:
        merged_list = copy.deepcopy(base)
        for item in patch:
            if not isinstance(item, dict) or merge_key not in item:
                raise ValueError(f"patch item of list {key!r} lacks its merge key {merge_key!r}")
            index = next(
                (i for i, old in enumerate(merged_list) if old.get(merge_key) == item[merge_key]),
                None,
            )
            if item.get("$patch") == "delete":
                if index is not None:
                    merged_list.pop(index)
            elif index is None:
                merged_list.append(copy.deepcopy(item))
            else:
                merged_list[index] = strategic_merge(merged_list[index], item)
        return merged_list
    return copy.deepcopy(patch)


def _apply_images(obj: dict[str, Any], images: list[dict[str, str]]) -> None:
    pod_spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    for container in pod_spec.get("containers", []) + pod_spec.get("initContainers", []):
        image = container.get("image", "")
        name, _, tag = image.partition(":")
        for rule in images:
            if rule["name"] == name:
                container["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag)}"


def _generate_configmaps(directory: Path, kustomization: dict[str, Any]) -> list[dict[str, Any]]:
    generators = kustomization.get("configMapGenerator", [])
    options = kustomization.get("generatorOptions", {})
    if generators and not options.get("disableNameSuffixHash"):
        raise ValueError(
            f"{directory}: configMapGenerator needs generatorOptions.disableNameSuffixHash: true "
            "(render.py does not implement hash suffixes)"
        )
    objects = []
    for gen in generators:
        data: dict[str, str] = {}
        for entry in gen.get("files", []):
            key, _, rel = entry.rpartition("=") if "=" in entry else (None, "", entry)
            file_path = (directory / rel).resolve()
            if directory.resolve() not in file_path.parents:
                raise ValueError(f"{directory}: file {rel!r} lies outside the kustomization root")
            data[key or file_path.name] = file_path.read_text()
        for literal in gen.get("literals", []):
            key, _, value = literal.partition("=")
            data[key] = value
        metadata: dict[str, Any] = {"name": gen["name"]}
        if options.get("labels"):
            metadata["labels"] = dict(options["labels"])
        configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data}
        objects.append(configmap)
    return objects


def render(directory: str | Path) -> list[dict[str, Any]]:
    """Return the objects a kustomization directory produces, in resource order."""
    directory = Path(directory)
    kfile = directory / KUSTOMIZATION_FILE
    if not kfile.is_file():
        raise ValueError(f"{directory} has no {KUSTOMIZATION_FILE}")
    kustomization = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(kustomization) - SUPPORTED_KEYS
    if unknown:
        raise ValueError(
            f"{kfile}: keys {sorted(unknown)} are not implemented by render.py; "
            f"supported: {sorted(SUPPORTED_KEYS)}"
        )
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        objects.extend(render(path) if path.is_dir() else _load_documents(path))
    objects.extend(_generate_configmaps(directory, kustomization))

    for patch_entry in kustomization.get("patches", []):
        if set(patch_entry) != {"path"}:
            raise ValueError(f"{kfile}: only file patches ({{path: ...}}) are supported")
        for patch in _load_documents(directory / patch_entry["path"]):
            target = _resource_id(patch)
            matches = [i for i, obj in enumerate(objects) if _resource_id(obj) == target]
            if len(matches) != 1:
                raise ValueError(f"{kfile}: patch target {target} matched {len(matches)} objects")
            objects[matches[0]] = strategic_merge(objects[matches[0]], patch)

    for obj in objects:
        metadata = obj.setdefault("metadata", {})
        if "namespace" in kustomization and obj.get("kind") not in CLUSTER_SCOPED_KINDS:
            metadata["namespace"] = kustomization["namespace"]
        for label_set in kustomization.get("labels", []):
            if label_set.get("includeSelectors"):
                raise ValueError(f"{kfile}: labels.includeSelectors is not supported")
            metadata.setdefault("labels", {}).update(label_set.get("pairs", {}))
        _apply_images(obj, kustomization.get("images", []))
    return objects


def main(argv: list[str]) -> int:
    """Print the rendered manifests of the kustomization directory given as the argument."""
    if len(argv) != 1:
        print("usage: python -m infra.render <kustomization directory>", file=sys.stderr)
        return 2
    yaml.safe_dump_all(render(argv[0]), sys.stdout, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
